"""A host's wall clock that jumps on demand, while the machine's stays put: on the path of a
host's processes (its server, zygotes and workers), this startup hook shifts Python's
`time.time` and `time.time_ns` by the seconds written in the file that `CLOCK_SKEW` names,
beside the host's store (`LLFABRIC_STORE`'s folder), read again at most every `REREAD_S`.

What reads the clock from C (CRIU, ZeroMQ, datetime.now) does not see the jump; what llfabric
stamps and ages by the wall clock (versions, retention, leases) does.
"""

import os
import time
from pathlib import Path

REREAD_S = 0.2

_name, _store = os.environ.get("CLOCK_SKEW"), os.environ.get("LLFABRIC_STORE")
if _name and _store:
    _control = Path(_store).parent / _name
    _time, _time_ns, _monotonic = time.time, time.time_ns, time.monotonic
    _skew = {"seconds": 0.0, "read": float("-inf")}

    def _offset() -> float:
        now = _monotonic()
        if now - _skew["read"] >= REREAD_S:
            _skew["read"] = now
            try:
                _skew["seconds"] = float(_control.read_text() or 0)
            except (OSError, ValueError):
                _skew["seconds"] = 0.0
        return _skew["seconds"]

    time.time = lambda: _time() + _offset()
    time.time_ns = lambda: _time_ns() + int(_offset() * 1e9)
