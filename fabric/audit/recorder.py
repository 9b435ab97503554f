"""Audit a notebook's closures: run it cell by cell in this process and check every closure.

For each code cell, the audit builds the manifest the server would hold for the live namespace
(groups, code refs, packages, module aliases, from the worker's own grouping), computes the
cell's closure with the server's own `closure()`, then runs the cell in a namespace that records
every global lookup. A session variable the cell looked up outside its closure is a *miss*: on a
fresh worker that cell would have failed or computed something else. Lookups by name through the
`__main__` module (pickle finding a notebook class, `getattr(sys.modules["__main__"], name)`) reach
the namespace too: IPython's main module forwards them to it.

With `verify`, each cell also runs a second time, concurrently, in a forked child that holds only
the cell's closure, rebuilt through the codec exactly as a worker loads it from the store, plus
the ambient state carried as workers carry it, in a copy of the working directory. The audit returns
both runs' outputs and a fingerprint of every variable either run changed, for comparison.

Torch runs single-threaded here: OpenMP's thread pool does not survive a fork, and both runs must
compute the same floating-point sums.

Run it in a process of its own (``python -m fabric.audit``, or ``llfabric audit``): it executes
the notebook's code in the calling interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..closure import Closure, closure, group_variables
from ..closure.plan import plan
from ..closure.static import analyze_uncached
from ..errors import AuditFailed
from ..snapshot import Group, Manifest, ambient, codec
from .fingerprint import fingerprints


class RecordingNamespace(dict):
    """A namespace that notes the names the cell's code looks up in it.

    CPython looks globals up through `__getitem__` when the globals dict is not exactly a dict,
    so this sees the cell's own lookups and those of every notebook function it calls. Only
    lookups while `active` count (IPython's own, such as its prefilter probing the first word of
    a line, are not the cell's). A lookup of a name the cell has already bound is not a need; a
    function's `global x; x = ...` binds without passing here, so its later reads still count
    (an over-report, never a hidden miss).
    """

    active = False

    def start(self) -> None:
        self.reads: set[str] = set()
        self.bound: set[str] = set()

    def _note(self, key: str) -> None:
        if self.active and key not in self.bound:
            self.reads.add(key)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        if self.active:
            self.bound.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._note(key)
        if self.active:
            self.bound.discard(key)
        super().__delitem__(key)


@dataclass
class CellAudit:
    index: int  # among the notebook's code cells
    head: str  # the cell's first line
    session_variables: int
    session_bytes: int
    closure_variables: int
    closure_bytes: int
    import_closure: list[str]
    whole: bool  # the closure is the whole session
    forced_by: str  # whole: the construct that forced it (`globals()` in the cell, ...)
    analysis_seconds: float  # static analysis of the cell, cold
    draft_seconds: float  # the slowest analysis of a half-typed prefix of the cell
    closure_seconds: float  # the server's closure computation; cold unless the notebook ran
    # the same source before, as the server's cache would be
    grouping_seconds: float  # the worker's grouping of the namespace before the cell
    bounded: bool  # the grouping walk hit its budget
    touched: list[str]  # session variables the cell looked up
    touched_bytes: int  # bytes of the groups holding them: what it had to load at least
    misses: list[str]  # looked up, but not in the closure
    status: str = "ok"
    outputs: list[dict] = field(default_factory=list)
    closure_outputs: list[dict] | None = None  # verify: the closure-only run's outputs
    variable_diffs: list[str] = field(default_factory=list)  # verify: state that differs


def session_manifest(namespace: dict, names: list[str]) -> tuple[Manifest, dict[str, int], Any]:
    """The manifest the server would commit for `names` of `namespace`, with each group's
    estimated bytes; blobs are named by group, not by content (nothing is written)."""
    aliases = {n: namespace[n].__name__ for n in names
               if isinstance(namespace[n], types.ModuleType)}
    state = [n for n in names if n not in aliases]
    grouping = group_variables(namespace, state)
    groups, sizes = [], {}
    for index, members in enumerate(grouping.groups):
        blob = f"{index:032x}"
        sizes[blob] = sum(grouping.sizes.get(n, 0) for n in members)
        groups.append(Group(blob, tuple(members), sizes[blob]))
    manifest = Manifest(
        session="audit", groups=tuple(groups), imports=aliases,
        refs={n: tuple(r) for n, r in grouping.refs.items() if r},
        packages={n: tuple(p) for n, p in grouping.packages.items() if p},
        hooks=tuple(ambient.notebook_hooks()))
    return manifest, sizes, grouping


class Auditor:
    """Runs cells one by one in a worker's IPython shell over a `RecordingNamespace`, and
    audits each against the closure the server would compute for it."""

    def __init__(self, verify: bool = False) -> None:
        from ..worker.shell import OutStream, make_shell

        self.namespace = RecordingNamespace()
        self.shell = make_shell(self.namespace)
        self.outputs: list[dict] = []
        self.shell.sink = self._collect
        self.streams = [OutStream("stdout", self.shell), OutStream("stderr", self.shell)]
        self.verify = verify
        self.namespace.start()
        run_code = self.shell.run_code

        async def recording_run_code(*args: Any, **kwargs: Any) -> Any:
            self.namespace.active = True  # the cell's code, not IPython's handling of it
            try:
                return await run_code(*args, **kwargs)
            finally:
                self.namespace.active = False

        self.shell.run_code = recording_run_code
        prefilter = self.shell.prefilter_manager
        assert prefilter is not None, "an InteractiveShell makes its prefilter manager"
        find_handler = prefilter.find_handler

        def quiet_find_handler(line_info: Any) -> Any:
            # IPython probing a line's first word is not the cell's lookup, nor when a magic
            # (`%time x = ...`) transforms its line while the cell's code runs
            active, self.namespace.active = self.namespace.active, False
            try:
                return find_handler(line_info)
            finally:
                self.namespace.active = active

        prefilter.find_handler = quiet_find_handler
        _single_threaded_torch()

    def _collect(self, kind: str, **fields: Any) -> None:
        # a stream's chunks fall where its timed flushes do, which a loaded machine moves:
        # adjacent chunks are kept as one, as Jupyter shows them
        last = self.outputs[-1] if self.outputs else None
        if (kind == "stream" and last is not None and last["output_type"] == "stream"
                and last["name"] == fields["name"]):
            last["text"] += fields["text"]
        else:
            self.outputs.append({"output_type": kind, **fields})

    def run(self, sources: list[str], on_cell: Any = None) -> list[CellAudit]:
        audits = []
        for index, source in enumerate(sources):
            audit = self.cell(index, source)
            audits.append(audit)
            if on_cell is not None:
                on_cell(audit)
        return audits

    def cell(self, index: int, source: str) -> CellAudit:
        ns = self.namespace
        names = self.shell.user_variables()
        start = time.perf_counter()
        manifest, sizes, grouping = session_manifest(ns, names)
        grouping_seconds = time.perf_counter() - start
        analysis_seconds, draft_seconds = _analysis_times(source)
        start = time.perf_counter()
        cl = closure(plan(source), manifest)
        closure_seconds = time.perf_counter() - start
        before = {n: id(ns[n]) for n in names}

        child = self._fork_closure_run(cl, source) if self.verify else None
        ns.start()
        status, outputs = self._run(source)
        touched_names = ns.reads
        session = set(manifest.variables()) | set(manifest.imports)
        touched = sorted(touched_names & session)
        variables = manifest.variables()
        touched_groups = {variables[n].blob for n in touched if n in variables}
        audit = CellAudit(
            index=index, head=source.strip().split("\n", 1)[0][:80],
            session_variables=len(variables), session_bytes=sum(sizes.values()),
            closure_variables=sum(1 for n in cl.names if n in variables),
            closure_bytes=sum(g.size for g in cl.groups),
            import_closure=sorted(cl.modules), whole=cl.whole, forced_by=cl.forced_by,
            analysis_seconds=analysis_seconds, draft_seconds=draft_seconds,
            closure_seconds=closure_seconds, grouping_seconds=grouping_seconds,
            bounded=grouping.bounded, touched=touched,
            touched_bytes=sum(sizes[b] for b in touched_groups),
            misses=sorted(set(touched) - cl.names), status=status, outputs=outputs)
        if child is not None:
            self._compare(audit, child, before)
        return audit

    def _run(self, source: str) -> tuple[str, list[dict]]:
        self.outputs = []
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.streams
        try:
            result = self.shell.run_cell(source, store_history=True)
        finally:
            for stream in self.streams:
                stream.flush()
            sys.stdout, sys.stderr = saved
        ok = result.error_in_exec is None and result.error_before_exec is None
        return ("ok" if ok else "error"), self.outputs

    # verify: the same cell on its closure alone
    def _fork_closure_run(self, cl: Closure, source: str) -> tuple[int, Path, Path]:
        workdir = Path(tempfile.mkdtemp(prefix="llfabric-audit-"))
        copy = workdir / "cwd"
        shutil.copytree(os.getcwd(), copy, symlinks=True)
        result = workdir / "result.json"
        state = ambient.capture({}, os.environ)  # a fork reseeds `random`: carry it as workers do
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ambient.restore(state)
                # the fork kept IPython's %%script event loop but not the thread that runs it
                self.shell.magics_manager.registry["ScriptMagics"].event_loop = None
                os.chdir(copy)
                self._keep_only(cl)
                status, outputs = self._run(source)
                names = self.shell.user_variables()
                result.write_text(json.dumps({
                    "status": status, "outputs": outputs, "names": names,
                    "fingerprints": fingerprints(self.namespace, names)}))
            except BaseException:  # the parent reports it
                result.write_text(json.dumps({"crash": traceback.format_exc()}))
                code = 1
            finally:
                os._exit(code)
        return pid, workdir, result

    def _keep_only(self, cl: Closure) -> None:
        """Trim the namespace to the closure, rebuilt from pickles as a worker loads it.

        If part of the closure cannot be pickled, the session is pinned to its live worker, which
        keeps what it holds: the namespace stays as it is (objects that cannot be pickled, such
        as an autograd graph, may hold others in ways no walk sees).
        """
        ns = self.namespace
        try:
            blobs = [codec.dumps({n: ns[n] for n in g.names}, ns) for g in cl.groups]
        except Exception:
            return
        for name in self.shell.user_variables():
            del ns[name]
        for alias, module in cl.imports.items():
            ns[alias] = importlib.import_module(module)
        for blob in blobs:  # private memory, as a worker's read from the store gives it
            ns.update(codec.loads(blob.stream, ns, [bytearray(b) for b in blob.buffers]))

    def _compare(self, audit: CellAudit, child: tuple[int, Path, Path],
                 before: dict[str, int]) -> None:
        pid, workdir, result = child
        _, status = os.waitpid(pid, 0)
        report: dict[str, Any]
        try:
            report = json.loads(result.read_text())
        except (OSError, ValueError):
            report = {"crash": f"no result (wait status {status})"}
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if "crash" in report:
            audit.variable_diffs.append(f"the closure-only run failed: {report['crash']}")
            return
        audit.closure_outputs = report["outputs"]
        if report["status"] != audit.status:
            audit.variable_diffs.append(f"status {report['status']} on the closure only, "
                                        f"{audit.status} on the whole session")
        ns = self.namespace
        now = self.shell.user_variables()
        changed = {n for n in now if before.get(n) != id(ns[n])}
        changed |= {n for n in before if n not in ns}
        ours = fingerprints(ns, sorted(set(report["names"]) | changed))
        theirs = report["fingerprints"]
        for name in sorted(set(ours) | set(theirs)):
            if ours.get(name) != theirs.get(name):
                audit.variable_diffs.append(
                    f"{name}: {theirs.get(name, 'absent')} on the closure only, "
                    f"{ours.get(name, 'absent')} on the whole session")


def _analysis_times(source: str) -> tuple[float, float]:
    """Cold static analysis of the cell, and the slowest of its prefixes as typed (drafts)."""
    def timed(text: str) -> float:
        start = time.perf_counter()
        analyze_uncached(text)
        return time.perf_counter() - start

    cut = [len(source) * k // 4 for k in (1, 2, 3)]
    return timed(source), max((timed(source[:n]) for n in cut if n), default=0.0)


def _single_threaded_torch() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # read by torch when the notebook imports it
    if (torch := sys.modules.get("torch")) is not None:
        torch.set_num_threads(1)


def audit_notebook(notebook: Path, workdir: Path, verify: bool = False,
                   env: dict[str, str] | None = None, timeout: float | None = None,
                   log: Path | None = None) -> list[dict]:
    """Audit `notebook` in a fresh interpreter, working in a fresh copy of its folder under
    `workdir` (notebooks write next to themselves); the audits of its cells, as dicts.
    AuditFailed when that interpreter fails, with the tail of `log`."""
    copy = workdir / notebook.parent.name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(notebook.parent, copy)
    result = workdir / f"{notebook.stem}.audit.json"
    command = [sys.executable, "-m", "fabric.audit", notebook.name, str(result)]
    with open(log or os.devnull, "w") as stderr:
        done = subprocess.run(command + (["--verify"] if verify else []), cwd=copy, env=env,
                              timeout=timeout, stdout=stderr, stderr=stderr)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:] if log is not None else ""
        raise AuditFailed(f"the audit failed:\n{tail}", returncode=done.returncode, log=tail)
    return json.loads(result.read_text())
