"""A host serving several users (`users = "separate"`): each user's cells run as their OS user.

A user (the connecting OS user on ipc://, the name a CURVE key is admitted under on tcp://) maps
to the OS account of that name; a user with none, or root, runs nothing. The store's root is
the server's (0711: users pass through it to their part, and read nothing in it), its key 0600;
each user has a part of it, `users/<name>/` (the server's, 0711), whose `blobs/` belongs to
them and is closed to others (0700): their workers write blobs there and nowhere else in the
store. The server writes that part's manifests and heads (`manifests/`, `sessions/`: its own,
0700), signed with the root's key, which no worker ever reads.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from .errors import ConfigError, Forbidden, UnsafePath
from .private import check_dir
from .snapshot import Store
from .worker.account import Account

MODES = ("single", "separate")
# what switching users needs: CAP_CHOWN (the users' parts of the store), CAP_DAC_OVERRIDE (the
# server reads and collects what users' workers wrote), CAP_SETGID, CAP_SETUID
_NEEDED = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 6: "CAP_SETGID", 7: "CAP_SETUID"}


def check_mode(mode: str) -> bool:
    """Whether `mode` separates users; a server that cannot switch users is refused."""
    if mode not in MODES:
        raise ConfigError(f"users must be one of {', '.join(MODES)}, not {mode!r}", key="users")
    if mode == "single":
        return False
    missing = [name for bit, name in _NEEDED.items() if not effective_capabilities() >> bit & 1]
    if missing:
        raise ConfigError(f"users = \"separate\" runs each user's cells as that user, and this "
                          f"server lacks {', '.join(missing)}: run it as root, or grant it those "
                          "capabilities", key="users")
    return True


def effective_capabilities() -> int:
    """This process's effective capability set, as a bit mask (linux/capability.h)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def dumps_others() -> bool:
    """Whether CRIU, run by this server, can dump a worker that became its user: it reads the
    worker's resource limits, which takes CAP_SYS_RESOURCE (24) across users."""
    return bool(effective_capabilities() >> 24 & 1)


def account(user: str, store: Path) -> Account:
    """The OS account `user` runs as, with their part of `store` made ready; Forbidden if the
    host has no such account, or it is root."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError as exc:
        raise Forbidden(f"user {user} has no OS account on this host, and this server runs "
                        "each user's cells as their own account: ask its admin to add one",
                        user=user) from exc
    if entry.pw_uid == 0:
        raise Forbidden("this server runs no user code as root: connect as another user",
                        user=user)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid,
                   os.getgrouplist(entry.pw_name, entry.pw_gid), entry.pw_dir,
                   str(part(store, entry.pw_name, entry.pw_uid, entry.pw_gid)))


def part(store: Path, name: str, uid: int, gid: int) -> Path:
    """`users/<name>/` of `store` (the server's, 0711) with the user's `blobs/` in it (theirs,
    0700), made or checked. A user owns no folder the server writes in: they could swap it for
    a link to another user's part."""
    root = store / "users" / name
    for folder in (store, store / "users", root):
        folder.mkdir(mode=0o711, exist_ok=True)
        check_dir(folder, owners={os.geteuid()}, closed=0o022)
        os.chmod(folder, 0o711)  # passed through, never listed
    blobs = root / "blobs"
    try:
        blobs.mkdir(mode=0o700)
        os.chown(blobs, uid, gid)
    except FileExistsError:
        pass
    check_dir(blobs, owners={uid}, closed=0o077)
    return root


def stores(store: Store) -> list[Store]:
    """`store` and every user's part of it, each signing with `store`'s key."""
    users = store.root / "users"
    found = [store]
    if users.is_dir():
        for root in sorted(users.iterdir()):
            st = os.lstat(root)
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(f"refusing {root}: not a user's directory", path=str(root))
            found.append(Store(root, key=store.key))
    return found
