"""A systemd unit that runs `llfabric serve` as a host's service.

Its state lives in /var/lib/llfabric and its socket in /run/llfabric (both made 0700 by systemd),
its log goes to the journal, and it restarts on failure. The hardening is what CRIU tolerates:
CRIU traces workers, enters their namespaces, writes /proc/sys and reads the cgroup tree, so
`NoNewPrivileges`, `ProtectKernelTunables`, `ProtectControlGroups`, system call filters and
private namespaces are left off; the rest of the system is read-only to it but for /var/lib,
/run and the users' homes (their cells' working directories).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .errors import ConfigError

UNIT_PATH = Path("/etc/systemd/system/llfabric.service")
STATE = Path("/var/lib/llfabric")


def executable() -> str:
    """The `llfabric` command of this installation."""
    beside = Path(sys.executable).parent / "llfabric"
    return str(beside) if beside.is_file() else shutil.which("llfabric") or str(beside)


def unit(command: str, store: str | None = None, bind: str | None = None) -> str:
    """The unit's text: `command serve`, on `store` (default /var/lib/llfabric) and `bind`
    (default an ipc:// socket in /run/llfabric)."""
    args = [command, "serve", "--store", store or str(STATE)]
    if bind:
        args += ["--bind", bind]
    state = "" if store else "StateDirectory=llfabric\nStateDirectoryMode=0700\n"
    return f"""[Unit]
Description=llfabric: notebook cells on warm workers, GPUs held only while a cell runs
After=network-online.target nvidia-persistenced.service
Wants=network-online.target

[Service]
Type=simple
ExecStart={" ".join(map(_quoted, args))}
Environment=LLFABRIC_RUNTIME_DIR=/run/llfabric
RuntimeDirectory=llfabric
RuntimeDirectoryMode=0700
{state}Restart=on-failure
RestartSec=5
# SIGTERM to the server, which retires its workers; what is left is killed after the timeout
KillMode=mixed
TimeoutStopSec=90
LimitNOFILE=1048576
TasksMax=infinity
StandardOutput=journal
StandardError=journal
ProtectSystem=full
ProtectClock=yes
ProtectKernelLogs=yes
RestrictRealtime=yes

[Install]
WantedBy=multi-user.target
"""


def _quoted(arg: str) -> str:
    """`arg` as one word of an ExecStart= line."""
    if any(c in arg for c in "\n\r\0"):
        raise ConfigError(f"a service argument cannot hold a line break: {arg!r}")
    if not any(c in arg for c in " \t\"'\\$%;"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")\
        .replace("%", "%%") + '"'
