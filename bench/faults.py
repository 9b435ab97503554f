"""Hostile and unlucky users against real servers.

Each probe sets up a real server, does what such a user would (plants a FIFO where their blobs
are, leaves a value whose repr never ends, starts 2,000 children, presses Ctrl-C, has their key
revoked mid-cell, floods the output, flips a byte of the head manifest, kills a saver with -9,
fills the disk, sends malformed frames, names and notebooks) and checks what llfabric promises.
Most probes are the integration tests' own checks, run against a server set up as their module
sets one up; this adds what each left behind. It prints a table:

    probe  outcome  lost  leaked  seconds  what

`lost`: committed versions (those a probe noted before its hostile action, and those the
sessions' heads reach at its end) whose manifest or data no longer reads, must be 0; `leaked`:
processes left (working in the probe's folder, or children of this one), slots held once no cell
runs, store temp files that outlive the store's own sweep of crash leftovers, must be 0. It ends
with `faults: P probes, F failed`. Probes that need root (OS users, cgroups, a tmpfs) say
`skipped` and why where it is missing.

    python bench/faults.py [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / folder) for folder in ("support", "integration", "snapshot")]

import psutil  # noqa: E402
import pytest  # noqa: E402
import test_auth  # noqa: E402
import test_bad_input  # noqa: E402
import test_clients  # noqa: E402
import test_containment  # noqa: E402
import test_crash  # noqa: E402
import test_faults  # noqa: E402
import test_fuzz_protocol  # noqa: E402
import test_hostile_values  # noqa: E402
import test_runtime_dir  # noqa: E402
import test_server  # noqa: E402
import test_untrusted_files  # noqa: E402
import test_user_files  # noqa: E402
import test_users  # noqa: E402
from helpers import (  # noqa: E402
    RunningServer,
    execute,
    keyed_serving,
    open_session,
    serving,
    small_disk,
    text,
    wait_until,
)

from fabric import users  # noqa: E402
from fabric.auth import Keys, write_client_key  # noqa: E402
from fabric.errors import StoreError  # noqa: E402
from fabric.snapshot import Manifest, Store, history  # noqa: E402


@dataclass
class Ledger:
    """What a probe lost and left behind: committed versions that no longer read, processes,
    slots and store temp files."""

    folder: Path
    recorded: dict[Path, set[str]] = field(default_factory=dict)  # store root: manifest ids
    damaged: set[str] = field(default_factory=set)  # the probe's own injuries
    lost: set[str] = field(default_factory=set)
    leaked: list[str] = field(default_factory=list)

    def committed(self, root: Path) -> None:
        """Note every version committed in the store at `root` (and its users' parts) now:
        each must still read at the end."""
        for store in users.stores(Store(root)):
            self.recorded[store.root] = {ident for session in store.sessions()
                                         for ident, _ in history.log(store, session)}

    def settle(self, server: RunningServer) -> None:
        """Once no cell runs, count the slots still held, other than by a worker lingering on
        its lease for its session's next cell."""
        with server.client() as client:
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not any(s.running
                                           for s in client.status().sessions),
                           "every cell ended", timeout=30)
            leases = client.status().leases.leases
        self.leaked += [f"slot {e.slot} held by {e.session}" for e in leases
                        if e.session is not None and not e.lingering]

    def account(self, root: Path) -> None:
        """Check every store under `root`: the versions noted and those its sessions' heads
        reach all read, with their data; no temp file is left once the store's own sweep of
        crash leftovers ran."""
        for found in sorted(root.rglob("manifests")):
            if not found.is_dir() or found.parent.parent.name == "users":
                continue
            for store in users.stores(Store(found.parent)):
                self._check(store)

    def _check(self, store: Store) -> None:
        history.gc(store, grace=0)  # the store's own sweep of what a crash left: not a leak
        reached = set()
        for session in store.sessions():
            with contextlib.suppress(StoreError):  # a head the probe damaged on purpose
                reached |= {ident for ident, _ in history.log(store, session)}
                reached -= set(store.index(session).thinned)  # retention freed their data
        for ident in (self.recorded.get(store.root, set()) | reached) - self.damaged:
            try:
                manifest = Manifest.decode(store.get_manifest(ident))
                for group in manifest.groups:
                    store.get_object(group.blob)
            except StoreError:
                self.lost.add(ident)
        self.leaked += [str(p) for p in store.root.rglob(".tmp-*")]

    def processes(self) -> None:
        """The processes the probe left: children of this one, and any working in its folder
        (a cell's children, orphaned or not); given time to go, then counted and killed."""
        def left() -> list[psutil.Process]:
            found = {p.pid: p for p in psutil.Process().children(recursive=True)}
            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    if p.cwd().startswith(str(self.folder)):
                        found[p.pid] = p
            return [p for p in found.values() if _alive(p)]

        with contextlib.suppress(AssertionError):
            wait_until(lambda: not left(), "the probe's processes ended", timeout=15)
        stray = left()
        self.leaked += [f"pid {p.pid}" for p in stray]
        for p in stray:  # this probe's own: they must not disturb the next
            with contextlib.suppress(psutil.Error):
                p.kill()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class Probe:
    name: str
    promise: str
    run: Callable[[Path, Ledger], None]


PROBES: dict[str, Probe] = {}


def probe(name: str, promise: str) -> Callable:
    def register(run: Callable[[Path, Ledger], None]) -> Callable:
        PROBES[name] = Probe(name, promise, run)
        return run
    return register


@contextlib.contextmanager
def _server(ledger: Ledger, store: Path, **settings: object) -> Iterator[RunningServer]:
    """`serving` on `store`, its slots counted once the probe's cells end."""
    with serving(store, **settings) as running:
        yield running
        ledger.settle(running)


_KEYS: list[Keys] = []


def _keys() -> Keys:
    """The run's CURVE keys (one set: the containment tests admit each user once); alice's
    client key for the server's readiness ping."""
    if not _KEYS:
        root = Path(tempfile.mkdtemp(prefix="llf-keys-"))
        _KEYS.append(Keys(root))
        write_client_key(root / "client.key", _KEYS[0].new_client("alice"))
    return _KEYS[0]


@contextlib.contextmanager
def _keyed(ledger: Ledger, store: Path, **settings: object) -> Iterator[RunningServer]:
    with keyed_serving(store, _keys().root, **settings) as running:
        yield running
        ledger.settle(running)


# -- a host several users share --------------------------------------------------------------

@probe("server-env", "a separate user's cell sees what worker_env lists, none of the "
                     "server's secrets")
def _server_env(folder: Path, ledger: Ledger) -> None:
    with test_users.os_users(2) as two, test_users.serving_users(
            folder / "store", {**os.environ, **test_users.SERVER_ENV},
            **test_users.SHARED_HOST) as server:
        test_users.test_a_users_cells_see_what_the_operator_lists_and_nothing_else_of_the_servers(
            two, server)


@probe("planted-blobs", "a FIFO, device, link or 3 GiB sparse file in a user's blobs hangs no "
                        "one and loses nothing")
def _planted_blobs(folder: Path, ledger: Ledger) -> None:
    with test_users.os_users(2) as (alice, bob):
        test_user_files.check_planted_files(folder / "store", alice, bob)


# -- values and processes a cell leaves ------------------------------------------------------

@probe("looping-repr", "a value whose repr/dir/attributes loop is described without calling "
                       "them; the next cell runs")
def _looping_repr(folder: Path, ledger: Ledger) -> None:
    with _server(ledger, folder / "store", **test_hostile_values.HOSTILE) as server, \
            server.client() as client:
        test_hostile_values.test_describing_a_value_runs_none_of_its_code_that_can_block(
            client, open_session(client, folder), folder)


@probe("save-swallows-interrupt", "a save that never ends and swallows its interrupt is "
                                  "killed; its slot is back, the commit before kept")
def _endless_save(folder: Path, ledger: Ledger) -> None:
    with _server(ledger, folder / "store", **test_hostile_values.HOSTILE) as server, \
            server.client() as client:
        test_hostile_values.test_a_save_that_swallows_its_interrupt_is_killed_and_its_loss_told(
            server, client, open_session(client, folder), folder)


@probe("children-on-close", "2,000 children of a cell die when its session closes")
def _children_on_close(folder: Path, ledger: Ledger) -> None:
    spawn = ("import subprocess\nkids = [subprocess.Popen(['sleep', '6001']).pid "
             "for _ in range(2000)]\nprint(kids)")
    with _server(ledger, folder / "store") as server, server.client() as client:
        name = open_session(client, folder)
        pids = test_containment._children(execute(client, name, spawn)[1])
        assert len(pids) == 2000
        client.call("close", session=name)
    test_containment._all_gone(pids, "on close")


def _contained_probe(test: Callable) -> Callable[[Path, Ledger], None]:
    """A containment test against a server with per-worker memory and per-user pids limits."""
    def run(folder: Path, ledger: Ledger) -> None:
        test_containment._contained()
        with _keyed(ledger, folder / "store", **test_containment.LIMITED) as server:
            test(server, _keys(), folder)
    return run


probe("children-on-interrupt", "a cell that swallows its interrupt is stopped, and its "
                               "children with it")(_contained_probe(
    test_containment.test_stopping_a_cell_that_swallows_its_interrupt_kills_its_children))
probe("fork-bomb", "a user at user_pids stops there; another user's cells fork and run")(
    _contained_probe(test_containment.test_a_user_at_the_pids_limit_stops_there_and_others_go_on))
probe("oom", "a cell past worker_memory is told it ran out of memory; the session goes on")(
    _contained_probe(test_containment.test_a_cell_past_worker_memory_is_told_it_ran_out_of_memory))
probe("forked-worker", "an os.fork() copy of the worker leaves when its cell's code ends")(
    _contained_probe(test_containment.test_a_forked_copy_of_the_worker_leaves_when_its_cell_ends))


@probe("children-on-retire", "a retired worker's children die with it")
def _children_on_retire(folder: Path, ledger: Ledger) -> None:
    test_containment.test_a_retired_worker_leaves_no_process_behind(folder)


@probe("children-on-sigterm", "a cell's children die when the server is stopped")
def _children_on_sigterm(folder: Path, ledger: Ledger) -> None:
    test_containment.test_a_stopped_server_leaves_no_process_behind(folder, "terminated")


@probe("children-on-kill-9", "a cell's children die when the server is killed outright")
def _children_on_kill(folder: Path, ledger: Ledger) -> None:
    test_containment.test_a_stopped_server_leaves_no_process_behind(folder, "killed")


# -- clients ---------------------------------------------------------------------------------

def _server_probe(test: Callable, settings: dict) -> Callable[[Path, Ledger], None]:
    """A test taking (server, client, folder), against a server with its module's `settings`."""
    def run(folder: Path, ledger: Ledger) -> None:
        with _server(ledger, folder / "store", **settings) as server, \
                server.client() as client:
            test(server, client, folder)
    return run


def _clients_probe(test: Callable) -> Callable[[Path, Ledger], None]:
    """A client test against a server set up as tests/integration/test_clients.py's."""
    return _server_probe(test, test_clients.CLIENTS)


probe("second-client", "a second client refused a running session leaves its cell alone")(
    _clients_probe(test_clients.test_a_client_refused_a_cell_leaves_anothers_running_cell_alone))
probe("ctrl-c", "Ctrl-C on llfabric run interrupts the cell and frees its slot")(
    _clients_probe(test_clients.test_ctrl_c_interrupts_the_cell_and_frees_its_slot))
probe("ctrl-c-twice", "a second Ctrl-C detaches; llfabric stop ends the cell")(
    _clients_probe(test_clients.test_a_second_ctrl_c_detaches_and_stop_ends_the_cell))


@probe("dead-server", "llfabric run reports a server killed mid-cell within seconds")
def _dead_server(folder: Path, ledger: Ledger) -> None:
    test_clients.test_a_run_whose_server_dies_mid_cell_reports_it_within_seconds(folder)


@probe("output-flood", "64 MiB of lines and a 64 MiB write: memory stays flat, the rest is "
                       "summarised")
def _output_flood(folder: Path, ledger: Ledger) -> None:
    with _server(ledger, folder / "store", **test_clients.CLIENTS) as server:
        test_clients.check_flood(server, folder, 64)


def _keyed_probe(test: Callable) -> Callable[[Path, Ledger], None]:
    """A key test against a tcp:// server set up as tests/integration/test_auth.py's."""
    def run(folder: Path, ledger: Ledger) -> None:
        with _keyed(ledger, folder / "store", **test_auth.TCP) as server:
            test((server, _keys()), folder)
    return run


probe("revoked-key", "revoking a key stops its user's running cell")(
    _keyed_probe(test_auth.test_a_revoke_stops_the_users_running_cell))
probe("refused-keys", "a revoked key and a wrong server key are told at once")(
    _keyed_probe(test_auth.test_a_refused_key_and_a_wrong_server_key_are_told_at_once))


# -- the store -------------------------------------------------------------------------------

@probe("head-manifest", "a flipped byte in the head manifest: store log lists what is intact, "
                        "verify --repair restores the head, the session runs on")
def _head_manifest(folder: Path, ledger: Ledger) -> None:
    store = folder / "store"
    with _server(ledger, store) as server, server.client() as client:
        name = open_session(client, folder)
        for i in (1, 2, 3):
            execute(client, name, f"x = {i}")
    ledger.committed(store)
    head = Store(store).head(name)
    test_faults._flip(store / "manifests" / head)
    ledger.damaged.add(head)
    shown = test_untrusted_files._cli(store, "log", name)
    assert shown.returncode == 1 and "verify --repair" in shown.stderr, shown.stderr
    assert [line.split()[0] for line in shown.stdout.splitlines()] == ["2", "1"], shown.stdout
    repaired = test_untrusted_files._cli(store, "verify", "--repair")
    assert repaired.returncode == 0, repaired.stderr
    with _server(ledger, store) as server, server.client() as client:
        client.call("open", session=name, cwd=str(folder))
        assert text(execute(client, name, "print(x)")[1]) == "2\n"


def _faults_probe(test: Callable) -> Callable[[Path, Ledger], None]:
    """A store fault against a server set up as tests/integration/test_faults.py's."""
    return _server_probe(test, test_faults.FAULTS)


probe("flipped-chunk", "a value whose chunk was flipped is refused as corrupt, and recomputing "
                       "it repairs the chunk")(
    _faults_probe(test_faults.test_a_recomputed_value_repairs_its_corrupt_chunk))
probe("corrupt-head-commit", "no commit on a corrupt head; other sessions go on")(
    _faults_probe(test_faults.test_no_commit_on_a_corrupt_head_and_the_others_go_on))


@probe("kill-9-saves", "a saver killed with -9 eight times mid-write (objects, manifest, head) "
                       "never breaks the committed head")
def _kill_9_saves(folder: Path, ledger: Ledger) -> None:
    test_crash.test_kill_9_at_random_points_never_breaks_the_committed_head(folder)


@probe("full-disk", "a commit on a full disk is disk_full, leaves no chunk, and the session "
                    "goes on from its last commit")
def _full_disk(folder: Path, ledger: Ledger) -> None:
    with small_disk("48m") as disk:
        test_bad_input.test_a_full_disk_at_commit_is_disk_full_and_leaves_no_chunks(disk, folder)
        ledger.account(disk)  # before it is unmounted


# -- malformed input -------------------------------------------------------------------------

@probe("bad-frames", f"{test_fuzz_protocol.FRAMES} fuzzed frames are each answered, none an "
                     "internal error; the server serves on")
def _bad_frames(folder: Path, ledger: Ledger) -> None:
    with _server(ledger, folder / "store") as server, \
            test_fuzz_protocol.dealer_on(server.address) as dealer:
        test_fuzz_protocol.test_every_frame_gets_an_answer_that_is_not_an_internal_error(dealer)
        test_fuzz_protocol.test_the_server_serves_on_after_the_fuzzing(server)


@probe("bad-names", "a 10,000-character session name is a clear error; notebooks with any "
                    "file name run")
def _bad_names(folder: Path, ledger: Ledger) -> None:
    test_untrusted_files.test_an_overlong_session_name_is_a_clear_error(folder / "named")
    with _server(ledger, folder / "store") as server:
        for name in ("my analysis.ipynb", "données.ipynb"):
            test_bad_input.test_run_names_the_session_after_any_notebook_file(server, name,
                                                                              folder)


@probe("bad-notebook", "llfabric run of a file that is no notebook says so; the server serves "
                       "on")
def _bad_notebook(folder: Path, ledger: Ledger) -> None:
    garbage = folder / "garbage.ipynb"
    garbage.write_bytes(b'{"cells": [{"cell_type": "code", "source": 7}]\x00\xff')
    with _server(ledger, folder / "store") as server:
        result = subprocess.run([*test_clients.LLFABRIC, "run", str(garbage), "--connect",
                                 server.address], cwd=REPO, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert "garbage.ipynb" in result.stderr, result.stderr
        with server.client() as client:
            assert client.ping(timeout=5) and server.alive()


@probe("lone-surrogate", "a lone surrogate in a cell's output and error prints replaced; the "
                         "session goes on")
def _lone_surrogate(folder: Path, ledger: Ledger) -> None:
    with _server(ledger, folder / "store", keep_warm=0) as server, server.client() as client:
        test_server.test_a_lone_surrogate_prints_replaced(client, open_session(client, folder))


@probe("unloadable-value", "a value that cannot be loaded is told as such and can be deleted")
def _unloadable_value(folder: Path, ledger: Ledger) -> None:
    with _server(ledger, folder / "store", keep_warm=0) as server, server.client() as client:
        test_server.test_a_value_that_cannot_be_loaded_can_still_be_deleted(
            client, open_session(client, folder))


@probe("lost-index", "a deleted index is reported, and rebuilt saying what was lost")
def _lost_index(folder: Path, ledger: Ledger) -> None:
    test_untrusted_files.test_a_lost_index_is_reported_and_rebuilt_saying_what_was_lost(folder)


@probe("linked-head", "a head manifest that is a symbolic link is refused, not read through")
def _linked_head(folder: Path, ledger: Ledger) -> None:
    test_untrusted_files.test_a_linked_head_manifest_is_refused(folder)


@probe("runtime-folder", "a SIGKILLed server's runtime folder goes when the next server starts")
def _runtime_folder(folder: Path, ledger: Ledger) -> None:
    test_runtime_dir.test_a_killed_servers_runtime_folder_goes_when_the_next_server_starts(folder)


# -- the run ---------------------------------------------------------------------------------

@dataclass
class Row:
    probe: str
    outcome: str
    lost: int
    leaked: int
    seconds: float
    detail: str


def run_probe(probe: Probe, scratch: Path) -> Row:
    folder = scratch / probe.name
    folder.mkdir()
    ledger = Ledger(folder)
    start = time.monotonic()
    outcome, detail = "ok", probe.promise
    try:
        probe.run(folder, ledger)
    except pytest.skip.Exception as skipped:
        outcome, detail = "skipped", skipped.msg
    except Exception as exc:  # a probe's failure is its row's
        outcome = "failed"
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        detail = f"{type(exc).__name__}: {first}"
    ledger.processes()
    ledger.account(folder)
    if ledger.lost or ledger.leaked:
        outcome = "failed"
        detail += f" [left: {', '.join([*sorted(ledger.lost)[:3], *ledger.leaked[:3]])}]"
    return Row(probe.name, outcome, len(ledger.lost), len(ledger.leaked),
               time.monotonic() - start, detail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", choices=list(PROBES),
                        help="run this probe (repeatable); default: all")
    parser.add_argument("--list", action="store_true", help="list the probes and exit")
    args = parser.parse_args()
    if args.list:
        width = max(map(len, PROBES))
        for probe in PROBES.values():
            print(f"{probe.name:<{width}}  {probe.promise}")
        return 0
    chosen = [PROBES[name] for name in args.only or PROBES]
    scratch = Path(tempfile.mkdtemp(prefix="llf-faults-", dir="/tmp"))
    scratch.chmod(0o755)  # other OS users' cells work in their probe's folders
    rows = []
    width = max(len(p.name) for p in chosen)
    print(f"{'probe':<{width}}  {'outcome':<7}  lost  leaked  {'s':>5}  what", flush=True)
    try:
        for probe in chosen:
            row = run_probe(probe, scratch)
            rows.append(row)
            print(f"{row.probe:<{width}}  {row.outcome:<7}  {row.lost:>4}  {row.leaked:>6}  "
                  f"{row.seconds:>5.1f}  {row.detail}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for keys in _KEYS:
            shutil.rmtree(keys.root, ignore_errors=True)
    failed = sum(row.outcome == "failed" for row in rows)
    print(f"faults: {len(rows)} probes, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
