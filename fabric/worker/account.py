"""The OS account a worker runs its cells as, on a host serving several users, and the drop to it.

A worker starts as the server's user (a zygote's fork, a template's copy, a cold start); its
first message (`Become`) names the session's account, and the worker becomes that user before
it loads or runs anything of the session's: supplementary groups, then gid, then uid (the order
in which each step is still permitted), for good: real, effective and saved ids alike. It then
makes itself non-dumpable, so that no other user's process may trace it or read its memory
through /proc.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from ..errors import Forbidden

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 2, 4


@dataclass(frozen=True)
class Account:
    """Who a session's cells run as, and the part of the store they write (theirs alone)."""

    name: str
    uid: int
    gid: int
    groups: list[int]
    home: str
    store: str


def become(account: Account) -> None:
    """Drop this process to `account` for good; Forbidden if that cannot be done whole."""
    if account.uid == 0:
        raise Forbidden("refusing to run user code as root on a host serving several users",
                        user=account.name)
    libc = ctypes.CDLL(None, use_errno=True)
    signal = ctypes.c_int(0)
    libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(signal))
    try:
        os.setgroups(account.groups)
        os.setgid(account.gid)
        os.setuid(account.uid)
    except OSError as exc:
        raise Forbidden(f"cannot become user {account.name} (uid {account.uid}): {exc}; the "
                        "server needs root, or CAP_SETUID and CAP_SETGID",
                        user=account.name) from exc
    if os.getresuid() != (account.uid,) * 3 or os.getresgid() != (account.gid,) * 3:
        raise Forbidden(f"the worker did not fully become user {account.name}",
                        user=account.name)
    # A change of uid clears the parent-death signal: set it again, so that the worker still
    # dies with its zygote; and a process that may not be traced keeps its memory its own.
    if libc.prctl(_PR_SET_PDEATHSIG, signal.value) != 0 or \
            libc.prctl(_PR_SET_DUMPABLE, 0) != 0:
        raise Forbidden(f"prctl failed: {os.strerror(ctypes.get_errno())}", user=account.name)
    os.environ.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
    os.chdir(account.home if os.path.isdir(account.home) else "/")
