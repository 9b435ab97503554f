"""A simulation run kept in a directory, so that an interrupted one resumes where it stopped.

RUN_DIR/run.json says what was simulated (the trace or session-level workload and its hash, the
session model, every input); RUN_DIR/policies/NAME.json holds a finished policy's figures,
RUN_DIR/sweep.json the sensitivity sweep's headline figures. A policy already in the directory
for the same run.json is not simulated again; a directory that holds another run is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TypedDict

from fabric.errors import TraceError

from .costs import INPUTS, Costs
from .policies import NAMES
from .results import Json, compare, figures
from .sessions import ModelledSession, SessionModel, build_sessions, workload_sessions
from .simulate import simulate
from .trace import Training, read_trace
from .workload import read_workload

TRACED_SESSIONS = 4  # sessions whose lease timelines the report draws
HEADLINE = ("gpu_hours_provisioned", "gpu_hours_held", "gpu_hours_busy", "busy_of_held",
            "share_under_100ms", "delay_p50_s", "delay_p99_s", "wait_p99_s", "peak_hosts")
SWEPT_POLICIES = ("reservation", "notebookos", "fresh", "llfabric")
# (parameter, values): each varied alone around the default model and inputs
SWEEP: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("before_first_h", (0.0, 12.0)),
    ("after_last_h", (0.0, 8.0)),
    ("no_gpu_share", (0.0, 0.5)),
    ("split_gap_min", (120.0,)),
    ("cells_per_gap", (0, 10)),
    ("session_gb", (0.5, 8.0)),
    ("gpu_gb", (0.5, 8.0)),  # the device memory every policy but reservation moves per cell
    ("subscribed_ratio", (3.0, 10.0)),
    ("scaling_factor", (1.10,)),
    ("buffer_hosts", (0.0, 6.0)),
    ("linger_s", (0.0, 300.0)),
)
# inputs a session-level workload gives itself: not swept on one
GIVEN_BY_WORKLOAD = ("before_first_h", "after_last_h", "no_gpu_share", "split_gap_min")

Progress = Callable[[str, float, float], None]  # (label, simulated seconds, horizon seconds)


def _write(path: Path, data: object) -> None:
    """Whole or not at all: an interrupt never leaves half a file to resume from."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_json(path: Path) -> Json:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} is not JSON: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise TraceError(f"{path} holds no JSON object", path=str(path))
    return data


def _traced(sessions: list[ModelledSession]) -> frozenset[int]:
    """A few sessions with many cells, for the lease timelines."""
    busiest = sorted(sessions, key=lambda s: -len(s.cells))[:TRACED_SESSIONS]
    return frozenset(s.index for s in busiest)


def _run_policies(sessions: list[ModelledSession], costs: Costs, names: Iterable[str], label: str,
                  progress: Progress | None, traced: frozenset[int] = frozenset()
                  ) -> Iterable[tuple[str, dict]]:
    horizon = max(s.start_s for s in sessions)
    for name in names:
        tell = (lambda t, n=name: progress(f"{label}{n}", t, horizon)) if progress else None
        yield name, figures(simulate(sessions, name, costs, traced=traced, progress=tell))


class TraceInfo(TypedDict):
    """The file a run's sessions are made from, as its run.json describes it."""

    path: str
    kind: str  # workload or trace
    sha256: str
    trainings: int
    hours: float


class Source:
    """What the sessions are made from: a training trace (CSV) or a session-level workload
    (NotebookOS's workload-template JSON), read and checked once."""

    def __init__(self, path: Path, workload: bool) -> None:
        self.path, self.workload = Path(path), workload
        if workload:
            self.sessions = read_workload(self.path)
            self.trainings: list[Training] = [t for _, _, group in self.sessions for t in group]
        else:
            self.trainings = read_trace(self.path)

    def build(self, model: SessionModel) -> list[ModelledSession]:
        if self.workload:
            return workload_sessions(self.sessions, model)
        return build_sessions(self.trainings, model)

    @property
    def hours(self) -> float:
        """From its first training's start to its last's end."""
        start = min(t.submit_min for t in self.trainings)
        return (max(t.submit_min + t.duration_min for t in self.trainings) - start) / 60

    def describe(self) -> TraceInfo:
        return {"path": str(self.path), "kind": "workload" if self.workload else "trace",
                "sha256": hashlib.sha256(self.path.read_bytes()).hexdigest(),
                "trainings": len(self.trainings), "hours": self.hours}


def _inputs(model: SessionModel, costs: Costs) -> dict:
    """Every input with its value in this run: a cost's, or the session model's."""
    return {name: {**asdict(INPUTS[name]), "value": getattr(costs, name) if hasattr(costs, name)
                   else getattr(model, name)} for name in INPUTS}


def simulate_run(trace: Path, run_dir: Path, model: SessionModel, costs: Costs,
                 policies: Iterable[str] = NAMES, sweep: bool = False,
                 progress: Progress | None = None, workload: bool = False) -> dict[str, dict]:
    """Simulate every policy (and the sweep) into `run_dir`; returns the policies' figures.
    `trace` is a session-level workload's JSON where `workload` is set."""
    source = Source(trace, workload)
    described = {"trace": source.describe(), "model": asdict(model),
                 "inputs": _inputs(model, costs)}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "policies").mkdir(exist_ok=True)
    if (run_dir / "run.json").exists():
        before = read_json(run_dir / "run.json")
        if {k: before.get(k) for k in described} != described:
            raise TraceError(f"{run_dir} holds another run (its run.json differs): choose a new "
                             "directory", path=str(run_dir))
    sessions = source.build(model)
    described["sessions"] = len(sessions)
    described["cells"] = sum(len(s.cells) for s in sessions)
    _write(run_dir / "run.json", described)
    done = {}
    for name in policies:
        path = run_dir / "policies" / f"{name}.json"
        if not path.exists():
            for _, figs in _run_policies(sessions, costs, [name], "", progress, _traced(sessions)):
                _write(path, figs)
        done[name] = read_json(path)
    if sweep:
        _sweep(source, model, costs, run_dir, progress)
    return done


def _sweep(source: Source, model: SessionModel, costs: Costs, run_dir: Path,
           progress: Progress | None) -> None:
    path = run_dir / "sweep.json"
    rows = read_json(path)["rows"] if path.exists() else []
    finished = {(r["parameter"], r["value"]) for r in rows}
    for parameter, values in SWEEP:
        if source.workload and parameter in GIVEN_BY_WORKLOAD:
            continue
        for value in values:
            if (parameter, value) in finished:
                continue
            if hasattr(model, parameter):
                varied, varied_costs = replace(model, **{parameter: value}), costs
            else:
                varied, varied_costs = model, costs.with_inputs(**{parameter: value})
            sessions = source.build(varied)
            by_policy = dict(_run_policies(sessions, varied_costs, SWEPT_POLICIES,
                                           f"sweep {parameter}={value:g}: ", progress))
            saved = compare(by_policy, source.hours)
            rows.append({"parameter": parameter, "value": value, "sessions": len(sessions),
                         "policies": {n: {**{k: f[k] for k in HEADLINE}, **saved[n]}
                                      for n, f in by_policy.items()}})
            _write(path, {"rows": rows})
