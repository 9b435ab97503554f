"""A session-level workload: NotebookOS's workload-template JSON, so that any trace of sessions an
operator has can be simulated (`llfabric simulate --workload FILE`).

`{"sessions": [{"start_tick", "stop_tick", "trainings": [{"start_tick", "duration_in_ticks",
"gpus", "vram", "cpus", "memory"}, ...]}, ...]}`, ticks of 60 seconds; other keys are allowed and
ignored. Every field is checked; the first bad one stops the read with the line of the object that
holds it and the field's path, so a simulation never runs on a silently mangled workload.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from pathlib import Path

from fabric.errors import TraceError

from .trace import Training

TRAINING_FIELDS = ("start_tick", "duration_in_ticks", "gpus", "vram", "cpus", "memory")

Workload = list[tuple[float, float, list[Training]]]  # (open tick, close tick, trainings)


class _Object(dict):
    """A JSON object that knows the line it starts on."""

    line = 0


def _decoder(text: str) -> json.JSONDecoder:
    """A decoder whose objects carry their line (the pure-Python scanner, which can be told how
    to make objects; the C one cannot)."""
    decoder = json.JSONDecoder()

    # The ignores: typeshed leaves out what the pure-Python scanner is made of (JSONObject,
    # py_make_scanner, a decoder's parse_object and scan_once).
    def parse_object(s_and_end: tuple[str, int], *args: object) -> tuple[_Object, int]:
        s, end = s_and_end
        pairs, after = json.decoder.JSONObject(  # pyright: ignore[reportAttributeAccessIssue]
            s_and_end, *args)
        obj = _Object(pairs)
        obj.line = s.count("\n", 0, end) + 1
        return obj, after

    decoder.parse_object = parse_object  # pyright: ignore[reportAttributeAccessIssue]
    decoder.scan_once = json.scanner.py_make_scanner(  # pyright: ignore[reportAttributeAccessIssue]
        decoder)
    return decoder


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, line: int, where: str, what: str) -> TraceError:
        return TraceError(f"{self.path}:{line}: {where} {what}", path=str(self.path), line=line)

    def object(self, value: object, line: int, where: str) -> _Object:
        if not isinstance(value, _Object):
            raise self.fail(line, where, f"is {json.dumps(value)[:40]}, not an object")
        return value

    def number(self, obj: _Object, key: str, where: str, least: float = 0,
               integer: bool = False) -> float:
        if key not in obj:
            raise self.fail(obj.line, f"{where}.{key}", "is missing")
        value = obj[key]
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            wanted = "an integer" if integer else "a number"
            raise self.fail(obj.line, f"{where}.{key}",
                            f"is {json.dumps(value)[:40]}, not {wanted}")
        if value < least:
            raise self.fail(obj.line, f"{where}.{key}", f"is {value}, below {least}")
        return value


def read_workload(path: Path, max_gpus: int = 8) -> Workload:
    """Every session of the workload at `path`: (open tick, close tick, its trainings in start
    order, times in minutes). A training may not ask for more than `max_gpus` GPUs (a gang never
    spans hosts)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read the workload {path}: {exc}", path=str(path)) from exc
    try:
        data = _decoder(text).decode(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not JSON: {exc.msg}", path=str(path),
                         line=exc.lineno) from None
    check = _Reader(path)
    top = check.object(data, 1, "the file")
    sessions = top.get("sessions")
    if not isinstance(sessions, list) or not sessions:
        raise check.fail(top.line, "sessions", "must be a list of at least one session")
    workload: Workload = []
    job = 0
    for i, raw in enumerate(sessions):
        where = f"sessions[{i}]"
        session = check.object(raw, top.line, where)
        opened = check.number(session, "start_tick", where, integer=True)
        closed = check.number(session, "stop_tick", where, least=opened, integer=True)
        trainings_raw = session.get("trainings")
        if not isinstance(trainings_raw, list) or not trainings_raw:
            raise check.fail(session.line, f"{where}.trainings", "must be a list of at least one "
                             "training")
        trainings = []
        for k, raw_training in enumerate(trainings_raw):
            at = f"{where}.trainings[{k}]"
            training = check.object(raw_training, session.line, at)
            values = {key: check.number(training, key, at, integer=key != "vram" and
                                        key != "memory") for key in TRAINING_FIELDS}
            start, length = int(values["start_tick"]), int(values["duration_in_ticks"])
            if length < 1:
                raise check.fail(training.line, f"{at}.duration_in_ticks", f"is {length}, "
                                 "below 1")
            if int(values["gpus"]) > max_gpus:
                raise check.fail(training.line, f"{at}.gpus", f"is {int(values['gpus'])}, more "
                                 f"than a host's {max_gpus}")
            if not (opened <= start and start + length <= closed):
                raise check.fail(training.line, at, f"runs ticks {start}-{start + length}, "
                                 f"outside its session's {opened}-{closed}")
            trainings.append(Training(job, int(values["gpus"]), start, length))
            job += 1
        trainings.sort(key=lambda t: t.submit_min)
        workload.append((float(opened), float(closed), trainings))
    return workload
