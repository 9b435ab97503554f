"""The remote tier: a store's blobs, manifests and session heads kept at an fsspec URL as well.

A shared directory (``file:///mnt/shared/llfabric``), ``memory://`` in tests, or any URL whose
fsspec package is installed (``s3://`` with s3fs). The layout mirrors the store's: blobs under
``blobs/<first two hex digits>/<id>``, ``manifests/<id>``, ``sessions/<name>/head``. Everything
read from it is checked like any other read (a blob against its hash, a manifest against its hash
and the store's signature), so a remote that loses or alters data is caught, never trusted.

Writes go to a temporary name first and are then moved into place: on a filesystem a reader never
sees half a file, and on an object store the move is a whole-object copy.

A session's head there has one authority however many hosts share the remote: each move claims
``sessions/<name>/after/<parent>`` (the version it was built on) with an exclusive create, so of
two hosts that commit on the same version one is refused (`RemoteTier.move`); ``head`` is then
written as a hint, and a reader follows the claims past it (`RemoteTier.adopt`), so a host lost
between the two writes leaves nothing behind. A version's name (a tag) is a file of its own,
``sessions/<name>/tags/<the tag's hex>``, so that two hosts naming versions never overwrite
each other's names.

Each call to the remote runs on a thread of its own, given `Remote.timeout` seconds: one that
fails, or does not answer in time, is a `RemoteFailed` (a `RemoteFull` for a full remote) that
names the remote and the cause, and one that hangs is left to finish on its thread. A commit
whose claim went through after it was reported failed (its answer lost, or late) leaves a claim
behind that names a version no head reached: this host's next move passes over it
(`RemoteTier.move`), so the session is never stuck behind its own failed commit.

A remote filled behind the commits (`Remote.behind`) is a `BehindTier` in the store's order: the
same files, read like a peer's, and written by the host's backlog (`fabric.snapshot.behind`).
"""

from __future__ import annotations

import errno
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigError, RemoteFailed, RemoteFull, StaleHead, StoreError
from .tiers import Buffer, Role, valid_id

log = logging.getLogger(__name__)
T = TypeVar("T")

ROOT = "first"  # the claim of a session's first version, which has no parent
TIMEOUT = 60.0


@dataclass(frozen=True)
class Remote:
    """A store's remote tier, as configured (`remote`, `remote_timeout`, `remote_writes`)."""

    url: str
    timeout: float = TIMEOUT  # seconds one call to it may take before it counts as failed
    # filled behind the commits (`fabric.snapshot.behind`), not before each is acknowledged
    behind: bool = False


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of `url` and the path in it; ConfigError says what is missing."""
    try:
        import fsspec  # pyright: ignore[reportMissingTypeStubs]
    except ImportError as exc:
        raise ConfigError("a remote tier needs fsspec: pip install 'llfabric[remote]'",
                          key="remote") from exc
    try:
        found: tuple[Any, str] = fsspec.core.url_to_fs(url)  # pyright: ignore
        return found
    except (ImportError, ValueError) as exc:  # no package for the protocol, or a bad URL
        raise ConfigError(f"remote {url!r} cannot be used: {exc}", key="remote") from exc


class RemoteTier:
    """A durable far tier several hosts share (`fabric.snapshot.tiers.Shared`)."""

    name, role, durable = "remote", Role.FAR, True

    def __init__(self, url: str, timeout: float = TIMEOUT,
                 abandoned: Callable[[str], bool] = lambda _: False) -> None:
        """`timeout`: the seconds one call may take; `abandoned`: whether a manifest is one of
        this host's whose commit was reported failed, so that a claim naming it is passed
        over (`move`)."""
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.root = self.root.rstrip("/")
        self.timeout, self.abandoned = timeout, abandoned

    def __str__(self) -> str:
        return self.url

    def _blob(self, ident: str) -> str:
        return f"{self.root}/blobs/{ident[:2]}/{ident}"

    # the Tier protocol: blobs
    def has(self, ident: str) -> bool:
        return self.size(ident) is not None

    def size(self, ident: str) -> int | None:
        try:
            return int(self._call("be read", lambda: self.fs.size(self._blob(ident))))
        except FileNotFoundError:
            return None

    def read_into(self, ident: str, out: memoryview) -> int | None:
        data = self.get(f"blobs/{ident[:2]}/{ident}")
        if data is None:
            return None
        out[:min(len(data), out.nbytes)] = data[:out.nbytes]
        return len(data)

    def write(self, ident: str, data: Buffer) -> None:
        self.put(f"blobs/{ident[:2]}/{ident}", data)

    # manifests, heads and tags (`fabric.snapshot.tiers.Shared`)
    def manifest(self, ident: str) -> bytes | None:
        return self.get(f"manifests/{ident}")

    def put_manifest(self, ident: str, data: bytes) -> None:
        if self.get(f"manifests/{ident}") != data:
            self.put(f"manifests/{ident}", data)

    def head(self, session: str) -> str | None:
        found = self.get(f"sessions/{session}/head")
        return None if found is None else found.decode(errors="replace").strip()

    def adopt(self, session: str) -> str | None:
        found = self.get(f"sessions/{session}/head")
        if found is None:
            return None
        ident = self._checked(session, found)
        while (after := self.get(f"sessions/{session}/after/{ident}")) is not None:
            ident = self._checked(session, after)  # a host lost before it wrote the head
        return ident

    def move(self, session: str, manifest: str, parent: str | None) -> None:
        """Claim the move from `parent`, past any claim of this host's own abandoned commits
        (`abandoned`), then write the head as a hint: once the claim holds, the move is made,
        and a hint not written only costs a reader a step (`adopt`)."""
        base = parent or ROOT
        while (taken := self.claim(f"sessions/{session}/after/{base}",
                                   manifest.encode() + b"\n")) is not None:
            ident = self._checked(session, taken)
            if ident == manifest:
                break
            if not self.abandoned(ident):
                raise StaleHead(
                    f"session {session} moved on from {base} on another host (to {ident}) "
                    "before this commit: it is refused and nothing was overwritten",
                    session=session, parent=parent)
            base = ident
        try:
            self.put(f"sessions/{session}/head", manifest.encode() + b"\n")
        except RemoteFailed as exc:
            log.warning("session %s: its head hint is not written (%s); its claim stands",
                        session, exc.message)

    def tags(self, session: str) -> dict[str, str]:
        """The tags of the session, those whose files this tier's writers made (others are
        passed over)."""
        tags: dict[str, str] = {}
        for name, found in self.files(f"sessions/{session}/tags").items():
            try:  # a tag may be any name: its file's is its hex
                tag, ident = bytes.fromhex(name).decode(), found.decode().strip()
            except ValueError:
                continue
            if valid_id(ident):
                tags[tag] = ident
        return tags

    def put_tag(self, session: str, tag: str, manifest: str) -> None:
        self.put(f"sessions/{session}/tags/{tag.encode().hex()}", manifest.encode())

    def forget(self, session: str) -> bool:
        return self.remove(f"sessions/{session}", True)

    def _checked(self, session: str, found: bytes) -> str:
        ident = found.decode(errors="replace").strip()
        if not valid_id(ident):
            raise StoreError(f"session {session} has a corrupt head on {self.url}",
                             session=session)
        return ident

    # any file under the URL
    def get(self, name: str) -> bytes | None:
        """The file `name` (relative to the URL), None if it is not there."""
        try:
            return bytes(self._call("be read", lambda: self.fs.cat_file(f"{self.root}/{name}")))
        except FileNotFoundError:
            return None

    def put(self, name: str, data: Buffer) -> None:
        path = f"{self.root}/{name}"
        parent, _, leaf = path.rpartition("/")
        temporary = f"{parent}/.tmp-{uuid.uuid4().hex}-{leaf}"

        def write() -> None:
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(temporary, bytes(data))
            self.fs.mv(temporary, path)

        self._call("be written", write)

    def files(self, folder: str) -> dict[str, bytes]:
        """The files in `folder` (relative to the URL), by name; none if it is not there."""
        def read() -> dict[str, bytes]:
            paths = self.fs.ls(f"{self.root}/{folder}", detail=False)
            return {path.rsplit("/", 1)[-1]: bytes(data)
                    for path, data in self.fs.cat(paths, on_error="omit").items()}

        try:
            return self._call("be read", read)
        except FileNotFoundError:
            return {}

    def claim(self, name: str, data: bytes) -> bytes | None:
        """Create the file `name` holding `data` unless it exists (the backend's exclusive
        create: atomic on a file system, and on object stores that take conditional writes);
        None when this call created it, else what the file holds."""
        path = f"{self.root}/{name}"

        def create() -> None:
            self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
            with self.fs.open(path, "xb") as f:
                f.write(data)

        try:
            self._call("be written", create)
        except FileExistsError:
            return self.get(name) or b""
        return None

    def remove(self, name: str, recursive: bool = False) -> bool:
        """Remove the file `name` (`recursive`: the folder); False if it was not there."""
        path = f"{self.root}/{name}"
        try:
            self._call("be written", lambda: self.fs.rm(path, recursive=True) if recursive
                       else self.fs.rm_file(path))
        except FileNotFoundError:
            return False
        return True

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """`call`, one request to the remote, on a thread of its own for `timeout` seconds.
        FileNotFoundError and FileExistsError are answers and pass as they are; any other
        failure, or no answer in time, is RemoteFailed (RemoteFull: no space), saying that the
        remote cannot `what` and why. A call past its time is left to end on its thread, which
        holds no exit up."""
        answer: Future[T] = Future()

        def run() -> None:
            try:
                answer.set_result(call())
            except BaseException as exc:  # handed to the caller, whatever it is
                answer.set_exception(exc)

        threading.Thread(target=run, name="remote-call", daemon=True).start()
        try:
            return answer.result(self.timeout)
        except (FileNotFoundError, FileExistsError):
            raise
        except Exception as exc:
            raise self._failed(what, exc, answer.done()) from exc

    def _failed(self, what: str, exc: Exception, answered: bool) -> RemoteFailed:
        if not answered:
            return RemoteFailed(f"the remote tier {self.url} cannot {what}: no answer in "
                                f"{self.timeout:g} s (remote_timeout)", remote=self.url,
                                cause="timeout")
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return RemoteFull(f"the remote tier {self.url} is full: it cannot {what} ({exc})",
                              remote=self.url, cause="full")
        cause = "timeout" if isinstance(exc, TimeoutError) else \
            "refused" if isinstance(exc, PermissionError) else "error"
        shown = str(exc) or type(exc).__name__
        return RemoteFailed(f"the remote tier {self.url} cannot {what}: {shown}",
                            remote=self.url, cause=cause)


class BehindTier:
    """A remote filled behind the commits (`fabric.snapshot.behind`), as a far tier read like
    a peer (`fabric.snapshot.tiers.Located`): never counted durable, and one that cannot
    answer holds nothing."""

    name, role, durable, copies = "remote", Role.FAR, False, 1

    def __init__(self, remote: RemoteTier) -> None:
        self.remote = remote
        self.committed = threading.Event()  # a commit left the remote behind: the sender wakes

    def __str__(self) -> str:
        return str(self.remote)

    def has(self, ident: str) -> bool:
        return self.remote.has(ident)

    def size(self, ident: str) -> int | None:
        return self.remote.size(ident)

    def read_into(self, ident: str, out: memoryview) -> int | None:
        return self.remote.read_into(ident, out)

    def write(self, ident: str, data: Buffer) -> None:
        self.remote.write(ident, data)

    # `Located`: what a remote that lags is asked; one that cannot answer holds nothing
    def locate(self, idents: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        try:
            for ident in idents:
                if (size := self.remote.size(ident)) is not None:
                    found[ident] = size
        except RemoteFailed as exc:
            log.warning("%s", exc.message)
        return found

    def manifest(self, ident: str) -> bytes | None:
        try:
            return self.remote.manifest(ident)
        except RemoteFailed as exc:
            log.warning("%s", exc.message)
            return None

    def heads(self, session: str) -> list[str]:
        try:
            head = self.remote.adopt(session)
        except StoreError as exc:
            log.warning("the remote's head of session %s is not read: %s", session, exc.message)
            return []
        return [] if head is None else [head]

    def keep(self, session: str, head: str) -> list[str]:
        return []  # one copy: no commit is spread to it
