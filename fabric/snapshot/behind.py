"""The remote tier filled behind the commits (`remote_writes = "behind"`).

A commit is acknowledged once it is durable on this host's disk; the remote is brought up to
each session's head afterwards, on a thread of the host's (`Backlog`). What the remote holds of a
session is recorded on this disk, ``<store>/behind/<session>`` (the head last sent there), and
written only once the remote holds that version whole: its blobs, its manifest and those of the
versions before it, and the claim of its move (`RemoteTier.move`). A session whose head differs
from its record is pending, so nothing is dropped: a failed pass is retried with a growing delay,
and a restarted host sends what its last run left. The backlog is in the host's status and
metrics.

Read from, the tier is like a peer (`fabric.snapshot.remote.BehindTier`): never counted
durable, and not the authority on heads, since it lags this disk: a host takes the newest of
its own head and the remote's. Hosts that serve the same sessions from one remote write it
before each commit instead (`remote_writes = "commit"`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from ..errors import StoreError
from .manifest import Manifest
from .remote import BehindTier
from .tiers import read_regular, valid_id, write_atomic

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger(__name__)

RECORDS = "behind"  # <store>/behind/<session>: the head the remote holds, as last sent
IDLE = 30.0  # seconds between passes when no commit wakes the sender
FIRST_RETRY, LAST_RETRY = 1.0, 300.0  # the delay after a failed pass, doubled up to the last


class BacklogState(TypedDict):
    """What the remote filled behind lacks, for the host's status (`status.BacklogStatus`,
    which says what each is) and metrics."""

    remote: str
    sessions: int
    versions: int
    sent_bytes: int
    failing: str
    retry_in: float


class Backlog:
    """Sends what a store's remote filled behind lacks, on a thread of its own."""

    def __init__(self, store: Store, tier: BehindTier) -> None:
        self.store, self.tier = store, tier
        self.folder = store.root / RECORDS
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.pending: dict[str, int] = {}  # session -> versions the remote lacks, last counted
        self.sent_bytes = 0
        self.failing = ""
        self.retry_at = 0.0  # monotonic time of the next try after a failed pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, store: Store) -> Backlog | None:
        """The backlog of `store`'s remote filled behind; None if it has none."""
        tier = next((t for t in store.far if isinstance(t, BehindTier)), None)
        return None if tier is None else cls(store, tier)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="remote-backlog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current call to the remote; what is unsent stays recorded, for the
        next start (the thread is not waited for: a call may hang until its deadline)."""
        self._stop.set()
        self.tier.committed.set()

    def status(self) -> BacklogState:
        return {"remote": str(self.tier), "sessions": len(self.pending),
                "versions": sum(self.pending.values()), "sent_bytes": self.sent_bytes,
                "failing": self.failing,
                "retry_in": max(0.0, self.retry_at - time.monotonic()) if self.failing else 0.0}

    def _run(self) -> None:
        delay = FIRST_RETRY
        while not self._stop.is_set():
            if self.failing and time.monotonic() < self.retry_at:  # a commit during the wait
                self._guarded(self.count)
            else:
                self.failing = self._guarded(self.send)
                if self.failing:
                    self.retry_at, delay = time.monotonic() + delay, min(delay * 2, LAST_RETRY)
                else:
                    delay = FIRST_RETRY
            wait = self.retry_at - time.monotonic() if self.failing else IDLE
            self.tier.committed.wait(max(0.0, wait))
            self.tier.committed.clear()

    def _guarded(self, step: Callable[[], object]) -> str:
        """Run `step`; why it failed, if it did: the thread goes on whatever befalls a pass."""
        try:
            failed = step()
        except Exception as exc:
            log.exception("the remote backlog's pass failed")
            return f"{type(exc).__name__}: {exc}"
        return failed if isinstance(failed, str) else ""

    def count(self) -> dict[str, int]:
        """Count, and keep in `pending`, the versions the remote lacks of each session."""
        pending: dict[str, int] = {}
        for session in self.store.sessions():
            try:
                head, sent = self.store.head(session), self.sent(session)
                if head is not None and head != sent:
                    lag = self._version(head) - (self._version(sent) if sent else 0)
                    pending[session] = max(1, lag)  # a head brought back counts as one
            except StoreError as exc:
                log.warning("session %s: its backlog is not counted: %s", session, exc.message)
        self.pending = pending
        return pending

    def send(self) -> str:
        """One pass: send every session's head the remote lacks; why one failed ("" if none
        did: a session that fails does not hold the others up)."""
        failed = ""
        for session in self.count():
            if self._stop.is_set():
                break
            try:
                self.send_session(session)
            except StoreError as exc:
                log.warning("session %s is not sent to the remote yet: %s", session,
                            exc.message)
                failed = failed or exc.message
        self.count()
        return failed

    def send_session(self, session: str) -> None:
        """Bring the remote up to the session's head: the versions since the one it holds
        (their blobs this disk still has, and their manifests), then the head's move there,
        then the record of it."""
        head, sent = self.store.head(session), self.sent(session)
        if head is None or head == sent:
            return
        for ident, manifest in self._since(head, sent):
            blobs = [b for b in [g.blob for g in manifest.groups] + manifest.blobs()
                     if ident == head or self._whole(b)]  # older: what retention left
            self.sent_bytes += self.store.replicate(blobs, [self.tier])
            data = self.store.manifest_data(ident)
            if data is None:
                raise StoreError(f"manifest {ident} of session {session} is missing",
                                 session=session)
            self.tier.remote.put_manifest(ident, data)
        self.tier.remote.move(session, head, sent)
        write_atomic(self.folder / session, head.encode() + b"\n")

    def sent(self, session: str) -> str | None:
        """The head the remote holds of the session, as this host last sent it."""
        found = read_regular(self.folder / session, 64)
        ident = None if found is None else found.decode(errors="replace").strip()
        return ident if valid_id(ident) else None

    def _since(self, head: str, sent: str | None) -> list[tuple[str, Manifest]]:
        """The versions from the one after `sent` to `head`, oldest first (all of them if
        `sent` is not among `head`'s ancestors: a head brought back to an older version)."""
        versions: list[tuple[str, Manifest]] = []
        ident: str | None = head
        while ident is not None and ident != sent:
            manifest = Manifest.decode(self.store.get_manifest(ident))
            versions.append((ident, manifest))
            ident = manifest.parent
        return versions[::-1]

    def _whole(self, blob: str) -> bool:
        """Whether this disk holds the blob, and each chunk if it is an object's index."""
        return self.store.has(blob) and all(map(self.store.has, self.store.object_chunks(blob)
                                                if self.store.is_object(blob) else []))

    def _version(self, ident: str) -> int:
        return Manifest.decode(self.store.get_manifest(ident)).version
