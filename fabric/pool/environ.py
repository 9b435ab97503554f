"""The environment variables workers start with: what the operator lists, never the rest of the
server's.

A server's environment may hold its operator's secrets (cloud keys, tokens); a host serving
several users must not hand them to every user's cells. So workers (and the zygotes and cold
starts they come from) get a clean environment: a standard PATH, a UTF-8 locale, the server's
account (HOME, USER, LOGNAME: a worker that becomes its session's user takes theirs), what the
`worker_env` setting lists, and, where llfabric runs from a source checkout, the PYTHONPATH that
finds it. A session adds its own on top: its environment's folder (`worker.env`) and the
variables its cells set (`snapshot.ambient`).

`worker_env` entries, separated by spaces or commas: `NAME` passes the server's value (if it has
one), `NAME=VALUE` sets one, `*` passes the server's whole environment. Empty, the default: `*`
on a single user's host (the server runs as that user: their cells see their own environment,
as a kernel they start would), nothing more on a host serving several users.
"""

from __future__ import annotations

import os
import pwd
import re
import site
import sys
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def worker_environ(listed: str, separate: bool, server: Mapping[str, str]) -> dict[str, str]:
    """The environment workers start with, from the `worker_env` setting `listed`, the mode
    (`separate`: a host serving several users) and the server's own environment `server`;
    ConfigError for an entry that names no variable."""
    entries = [e for e in re.split(r"[\s,]+", listed.strip()) if e]
    if not entries and not separate:
        entries = ["*"]
    if "*" in entries:
        return {**server, **_set(entries)}
    account = pwd.getpwuid(os.getuid())
    clean = {"PATH": f"{Path(sys.executable).parent}:{_PATH}", "LANG": "C.UTF-8",
             "HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name,
             **_runtime_path()}
    for entry in entries:
        if "=" not in entry and entry in server:
            clean[entry] = server[entry]
    return {**clean, **_set(entries)}


def _set(entries: list[str]) -> dict[str, str]:
    """The `NAME=VALUE` entries; ConfigError for one whose name is not a variable's."""
    values = {}
    for entry in entries:
        name, equals, value = entry.partition("=")
        if entry != "*" and not _NAME.fullmatch(name):
            raise ConfigError(f"worker_env: {entry!r} is not NAME, NAME=VALUE or *",
                              key="worker_env")
        if equals:
            values[name] = value
    return values


def _runtime_path() -> dict[str, str]:
    """PYTHONPATH naming the folder llfabric is imported from, where the interpreter would not
    find it by itself (a source checkout); {} where it is installed."""
    root = str(Path(__file__).resolve().parents[2])
    installed = {str(Path(p).resolve()) for p in (*site.getsitepackages(),
                                                  site.getusersitepackages())}
    return {} if root in installed else {"PYTHONPATH": root}
