"""A simulation run kept in a directory, so that an interrupted one resumes where it stopped.

RUN_DIR/run.json says what was simulated (the trace and its hash, the session model, every cost
input); RUN_DIR/policies/NAME.json holds a finished policy's figures, RUN_DIR/sweep.json the
sensitivity sweep's headline figures. A policy already in the directory for the same run.json is
not simulated again; a directory that holds another run is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from pathlib import Path

from fabric.errors import TraceError

from .costs import INPUTS, Costs
from .policies import NAMES
from .results import compare, figures
from .sessions import Session, SessionModel, build_sessions
from .simulate import simulate
from .trace import read_trace

TRACED_SESSIONS = 4  # sessions whose lease timelines the report draws
HEADLINE = ("gpu_hours_provisioned", "gpu_hours_held", "share_under_100ms", "delay_p50_s",
            "delay_p99_s", "wait_p99_s", "peak_hosts")
# (parameter, values): each varied alone around the default model
SWEEP: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("split_gap_min", (30.0, 480.0)),
    ("cells_per_gap", (0, 10)),
    ("first_think_s", (5.0,)),
    ("session_gb", (0.5, 8.0)),
    ("gpu_gb", (0.5,)),  # the device memory every GPU policy but pinned moves per cell
    ("subscription_limit", (6.0,)),
)

Progress = Callable[[str, float, float], None]  # (label, simulated seconds, horizon seconds)


def _write(path: Path, data: object) -> None:
    """Whole or not at all: an interrupt never leaves half a file to resume from."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} is not JSON: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise TraceError(f"{path} holds no JSON object", path=str(path))
    return data


def _traced(sessions: list[Session]) -> frozenset[int]:
    """A few sessions with many cells, for the lease timelines."""
    busiest = sorted(sessions, key=lambda s: -len(s.cells))[:TRACED_SESSIONS]
    return frozenset(s.index for s in busiest)


def _run_policies(sessions: list[Session], costs: Costs, names: Iterable[str], label: str,
                  progress: Progress | None, traced: frozenset[int] = frozenset()
                  ) -> Iterable[tuple[str, dict]]:
    horizon = max(s.start_s for s in sessions)
    for name in names:
        tell = (lambda t, n=name: progress(f"{label}{n}", t, horizon)) if progress else None
        yield name, figures(simulate(sessions, name, costs, traced=traced, progress=tell))


def simulate_run(trace: Path, run_dir: Path, model: SessionModel, costs: Costs,
                 policies: Iterable[str] = NAMES, sweep: bool = False,
                 progress: Progress | None = None) -> dict[str, dict]:
    """Simulate every policy (and the sweep) into `run_dir`; returns the policies' figures."""
    trainings = read_trace(trace)
    described = {
        "trace": {"path": str(trace), "sha256": hashlib.sha256(trace.read_bytes()).hexdigest(),
                  "trainings": len(trainings)},
        "model": asdict(model),
        "inputs": {name: {**asdict(INPUTS[name]), "value": getattr(costs, name)}
                   for name in INPUTS},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "policies").mkdir(exist_ok=True)
    if (run_dir / "run.json").exists():
        before = read_json(run_dir / "run.json")
        if {k: before.get(k) for k in described} != described:
            raise TraceError(f"{run_dir} holds another run (its run.json differs): choose a new "
                             "directory", path=str(run_dir))
    sessions = build_sessions(trainings, model)
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
        _sweep(trainings, model, costs, run_dir, progress)
    return done


def _sweep(trainings: list, model: SessionModel, costs: Costs, run_dir: Path,
           progress: Progress | None) -> None:
    path = run_dir / "sweep.json"
    rows = read_json(path)["rows"] if path.exists() else []
    finished = {(r["parameter"], r["value"]) for r in rows}
    for parameter, values in SWEEP:
        for value in values:
            if (parameter, value) in finished:
                continue
            if hasattr(model, parameter):
                varied, varied_costs = replace(model, **{parameter: value}), costs
            else:
                varied, varied_costs = model, costs.with_inputs(**{parameter: value})
            sessions = build_sessions(trainings, varied)
            by_policy = dict(_run_policies(sessions, varied_costs, NAMES,
                                           f"sweep {parameter}={value:g}: ", progress))
            saved = compare(by_policy)
            rows.append({"parameter": parameter, "value": value, "sessions": len(sessions),
                         "policies": {n: {**{k: f[k] for k in HEADLINE}, **saved[n]}
                                      for n, f in by_policy.items()}})
            _write(path, {"rows": rows})
