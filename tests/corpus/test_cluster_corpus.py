"""Corpus differential on a cluster: a notebook run through a front door over three hosts must
give the outputs of a plain ipykernel while its session keeps moving between hosts.

A local Ray cluster (a head and two nodes, one slot each, each on a test host of its own where
the machine allows it, as tests/cluster/test_cluster.py starts it) and the front door over it
serve the module. While `llfabric run` executes the
notebook, its cells back to back, a `Hopper` drains the host the session is on about every
second and lets it take sessions again once the session left: the door moves the session
between two cells, through the remote tier, to another host, where its next cell must run on
the state the last one committed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import clusters
import pytest
from helpers import RunningServer, serving, wait_until
from notebook_compare import (
    TEST_TIMEOUT_S,
    VOLATILE_CELLS,
    compare,
    nb_id,
    notebook_env,
    plain_run,
    run_fabric,
)

from fabric.client import Client
from fabric.messages import Moved

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "corpus" / "notebooks"
if not SHARED.is_dir():  # the shared checkout sits beside the repo or inside it
    SHARED = REPO / "shared" / "corpus" / "notebooks"

# Fast notebooks whose later cells read what earlier ones built or changed in place: a move that
# lost or staled a commit shows in the outputs.
NOTEBOOKS = [
    # a Series and a DataFrame changed in place (a new key, a new column, an iloc assignment)
    SHARED / "PythonDataScienceHandbook" / "03.02-Data-Indexing-and-Selection.ipynb",
    # a class defined in a cell, its instances linked into a graph over cells, a graph drawn
    SHARED / "nn-zero-to-hero" / "micrograd_lecture_first_half_roughly.ipynb",
    # this project's corpus: numpy's global random state seeded in one cell and drawn from in
    # the next, a list changed through another name for it, errors raised on purpose
    REPO / "corpus" / "pydata-book" / "ch02.ipynb",
]
# A model trained in a loop: tensors that require grad cannot be saved, and a cell makes a
# folder, so none is run again: their pinned worker moves with the session (two minutes here:
# `make test-deep`; tests/cluster/test_pressure.py moves a pinned worker in CI).
PINNED = SHARED / "pytorch-deep-learning" / "01_pytorch_workflow.ipynb"

HOP_EVERY_S = 0.5  # how long the session stays on a host, at least, before it is sent away
LOOK_EVERY_S = 0.2  # how often the status is read for the host it is on
MOVE_WITHIN_S = 30.0  # how long a drained host may keep the session (a cell runs meanwhile)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[clusters.RayCluster]:
    # Hosts' servers, and the cells' workers they start, inherit the environment of the node
    # processes Ray starts now: the notebooks' environment, as the plain kernel's.
    with clusters.ray_cluster(notebook_env()) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def door(ray_cluster: clusters.RayCluster,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("cluster")
    with ray_cluster.serving(root / "door", notebook_env(),
                             remote=f"file://{root}/remote") as running:
        with running.client() as client:
            wait_until(lambda: len(client.status().hosts) == 3, "three hosts", 180)
            if isinstance(ray_cluster, clusters.NamespacedRay):  # each on a test host of its own
                assert all(h.address.startswith(f"tcp://{ray_cluster.host(h.node).address}:")
                           for h in client.status().hosts)
        yield running


class Hopper:
    """While it runs, drains the host `session` is on, waits until the session is on another
    host, undoes the drain, and again after `HOP_EVERY_S`. Cells run back to back, as `llfabric
    run` sends them: the drain (which waits for a running cell) or else the next cell's placement
    (which takes no draining host) moves the session between two cells. `moves` (from, to) are
    the hosts the status showed it on in turn, `drained` the drains' replies' moves of it,
    `errors` what failed."""

    def __init__(self, door: RunningServer, session: str) -> None:
        self.door, self.session = door, session
        self.moves: list[tuple[str, str]] = []
        self.drained: list[Moved] = []
        self.errors: list[str] = []
        self.host: str | None = None  # where the status last showed the session
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._guarded, args=(step,), daemon=True)
                        for step in (self._look, self._hop)]
        self.drains: list[threading.Thread] = []

    def __enter__(self) -> Hopper:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        for thread in self.threads + self.drains:
            thread.join(120)

    def _guarded(self, step: Callable[[Client], None]) -> None:
        try:
            with self.door.client(timeout=300) as client:
                step(client)
        except Exception as exc:  # the test reports it, not a thread's traceback
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _look(self, client: Client) -> None:
        while not self.halt.wait(LOOK_EVERY_S):
            status = client.status()
            host = next((s.host for s in status.sessions if s.session == self.session),
                        None)
            if host is None:  # not open yet, closed, or between two hosts
                continue
            if self.host is not None and host != self.host:
                self.moves.append((self.host, host))
            self.host = host

    def _hop(self, client: Client) -> None:
        while not self.halt.is_set():
            host = self.host
            if host is None:
                self.halt.wait(LOOK_EVERY_S)
                continue
            # the drain answers once it moved the session, or left it to the next cell: on a
            # client of its own, while this one lets the host take sessions again
            drain = threading.Thread(target=self._guarded, args=(
                lambda own, host=host: self._drain(own, host),), daemon=True)
            drain.start()
            self.drains.append(drain)
            deadline = time.monotonic() + MOVE_WITHIN_S
            while self.host == host and time.monotonic() < deadline \
                    and not self.halt.wait(LOOK_EVERY_S / 2):
                pass
            client.call("drain", host=host, undo=True)
            self.halt.wait(HOP_EVERY_S)

    def _drain(self, client: Client, host: str) -> None:
        reply = client.call("drain", host=host)
        self.drained += [m for m in reply.moved if m.session == self.session]


@pytest.mark.slow
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("nb_path", [pytest.param(p, id=nb_id(p)) for p in NOTEBOOKS]
                         + [pytest.param(PINNED, id=nb_id(PINNED), marks=pytest.mark.deep)])
def test_notebook_matches_plain_while_its_session_hops_hosts(
        nb_path: Path, door: RunningServer, tmp_path: Path) -> None:
    plain = plain_run(nb_path, tmp_path / "plain")
    session = f"hop-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with Hopper(door, session) as hopper:
        fabric = run_fabric(door, nb_path, tmp_path / "fabric", session=session)
    took = time.monotonic() - started
    diffs = compare(plain, fabric, VOLATILE_CELLS.get(nb_id(nb_path), {}))
    assert diffs == [], (f"output differs from plain after moves {hopper.moves}:\n"
                         + "\n".join(diffs))
    assert not hopper.errors, hopper.errors
    # a run the hopper never moved would pass without testing moves at all
    assert hopper.moves or hopper.drained, f"the session never moved in the {took:.0f} s"
    print(f"{nb_id(nb_path)}: {len(hopper.moves)} moves ({len(hopper.drained)} by a drain) "
          f"in {took:.0f} s")
