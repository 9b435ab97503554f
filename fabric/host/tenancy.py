"""Whose a session is: each user reaches only their own sessions, within the per-user limits.

The host's own user (who runs it) keeps plain session names in the store; another user's are
prefixed with theirs ('~' is in no valid session or user name). With `users = "separate"` each
user's sessions live in their own part of the store and their cells run as their OS user
(`fabric.users`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from .. import auth, users
from ..config import Config
from ..errors import Forbidden, LimitReached, StoreError
from ..snapshot import Manifest, Store, history
from ..snapshot.remote import Remote

log = logging.getLogger(__name__)


class Tenancy:
    def __init__(self, config: Config, store: Store, separate: bool) -> None:
        self.config = config
        self.store = store
        self.separate = separate
        self.owner = auth.owner_name()
        self._parts: dict[str, Store] = {}  # each user's part of the store, when separate
        self.running: dict[str, int] = {}  # cells each user runs now

    def stored(self, user: str, name: str) -> str:
        """Where a user's session lives in the store."""
        return name if user == self.owner else f"{user}~{name}"

    def user_of(self, stored: str) -> str:
        user, prefixed, _ = stored.partition("~")
        return user if prefixed else self.owner

    def public_name(self, user: str, stored: str) -> str:
        """The name `user` knows their session by (`stored` undone)."""
        return stored[len(self.stored(user, "")):]

    def mine(self, user: str, stored: Iterable[str]) -> list[str]:
        """Those of the `stored` names that are `user`'s."""
        return [name for name in stored if self.user_of(name) == user]

    def account(self, user: str) -> users.Account | None:
        """The OS account `user`'s cells run as (None: the host's own, in single mode)."""
        return users.account(user, self.config.store) if self.separate else None

    def store_of(self, user: str) -> Store:
        """Where `user`'s sessions live: the store, or their own part of it."""
        if not self.separate:
            return self.store
        if user not in self._parts:
            account = self.account(user)
            assert account is not None  # separate: every user has one
            remote = self.config.remote_tier
            if isinstance(remote, Remote):  # each user's part of it
                remote = replace(remote, url=f"{remote.url.rstrip('/')}/users/{user}")
            self._parts[user] = Store(Path(account.store), key=self.store.key,
                                      owner=(account.uid, account.gid), remote=remote,
                                      tiers=self.config.tiers.split(","))
        return self._parts[user]

    def stores(self) -> list[Store]:
        """Every store a retention pass thins: the store, or each user's part of it."""
        return users.stores(self.store) if self.separate else [self.store]

    def check_owner(self, user: str, op: str) -> None:
        """Requests only a cluster's front door sends, as the user who runs the hosts: a
        carried image is restored as whoever it was dumped as."""
        if user != self.owner:
            raise Forbidden(f"only {self.owner}, who runs this host, sends {op!r}", user=user)

    # limits
    def check_limit(self, user: str, key: str, used: int, what: str) -> None:
        limit = getattr(self.config, key)
        if limit and used >= limit:
            raise LimitReached(f"user {user} has {used} {what}, the most this server allows "
                               f"({key} = {limit})", user=user, limit=limit)

    def check_cell(self, user: str) -> None:
        """Refuse a cell past the user's running cells or stored bytes."""
        self.check_limit(user, "user_cells", self.running.get(user, 0), "running cells")
        if self.config.user_bytes:
            self.check_limit(user, "user_bytes", self.stored_bytes(user), "bytes stored")

    def admit(self, user: str, stored: str, manifest: Manifest) -> None:
        """Refuse a commit that would take the user past `user_bytes`, before it is written."""
        if not self.config.user_bytes:
            return
        used = self.stored_bytes(user, but=stored) + history.size(manifest)
        if used > self.config.user_bytes:
            raise LimitReached(
                f"the commit of session {self.public_name(user, stored)} is refused: user "
                f"{user} would store {used} bytes, past this server's limit (user_bytes = "
                f"{self.config.user_bytes}); the session stays at its last version. Free space "
                "with `llfabric store rm` or a smaller retention", user=user,
                limit=self.config.user_bytes, used=used)

    def stored_bytes(self, user: str, but: str | None = None) -> int:
        """The bytes of the state at the head of each of `user`'s sessions in the store
        (`but` one)."""
        total, store = 0, self.store_of(user)
        for name in store.sessions():
            if self.user_of(name) == user and name != but:
                head = store.head(name)
                if head is None:
                    continue
                try:
                    manifest = Manifest.decode(store.get_manifest(head))
                except StoreError as exc:  # not this check's to report: the session's own use is
                    log.warning("not counting session %s: %s", name, exc.message)
                    continue
                total += history.size(manifest)
        return total
