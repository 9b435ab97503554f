"""The training trace: one row per GPU training burst, in the Tiresias job-list format.

`job_id,num_gpu,submit_time,iterations,model_name,duration,interval`, times in whole minutes
(see ../shared/traces/README.md). Every row is checked; the first bad one stops the read with
its line number, so a simulation never runs on a silently mangled trace.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from fabric.errors import TraceError

COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")


@dataclass(frozen=True)
class Training:
    """One training burst: `gpus` GPUs on one host from `submit_min` for `duration_min`."""

    job_id: int
    gpus: int
    submit_min: int
    duration_min: int


def _integer(value: str, column: str, path: Path, line: int, least: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} is {value!r}, not an integer",
                         path=str(path), line=line) from None
    if number < least:
        raise TraceError(f"{path}:{line}: {column} is {number}, below {least}",
                         path=str(path), line=line)
    return number


def read_trace(path: Path, max_gpus: int = 8) -> list[Training]:
    """Every training of the trace at `path`, in job_id order. A training may not ask for more
    than `max_gpus` GPUs (a gang never spans hosts, so more could never be placed)."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read the trace {path}: {exc.strerror}", path=str(path)) from exc
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != COLUMNS:
            raise TraceError(f"{path}: the header is {header}, expected {','.join(COLUMNS)}",
                             path=str(path), line=1)
        trainings = []
        for line, row in enumerate(reader, start=2):
            if len(row) != len(COLUMNS):
                raise TraceError(f"{path}:{line}: {len(row)} fields, expected {len(COLUMNS)}",
                                 path=str(path), line=line)
            gpus = _integer(row[1], "num_gpu", path, line, 1)
            if gpus > max_gpus:
                raise TraceError(f"{path}:{line}: num_gpu {gpus} exceeds a host's {max_gpus}",
                                 path=str(path), line=line)
            trainings.append(Training(_integer(row[0], "job_id", path, line, 0), gpus,
                                      _integer(row[2], "submit_time", path, line, 0),
                                      _integer(row[5], "duration", path, line, 1)))
    if not trainings:
        raise TraceError(f"{path}: no trainings", path=str(path))
    trainings.sort(key=lambda t: t.job_id)
    if len({t.job_id for t in trainings}) != len(trainings):
        raise TraceError(f"{path}: a job_id appears twice", path=str(path))
    return trainings
