"""The content-addressed store: the source of truth of every session.

Layout under the store root::

    blobs/ab/<xxh3-128 hex>      immutable bytes, named by their hash
    manifests/<hex>              msgpack manifests, named by the hash of their bytes
    sessions/<name>/head         the id of the session's latest committed manifest

Every write goes to a temporary file, is fsync'd, renamed into place and the directory fsync'd,
so a crash leaves either the old or the new file, never a torn one. A manifest is written only
after all its blobs are durable, and the head moves only after its manifest is: a committed head
never points at missing data.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import xxhash

from ..errors import StoreError


def blob_id(data: bytes | memoryview) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _valid_id(ident: str) -> bool:
    return len(ident) == 32 and all(c in "0123456789abcdef" for c in ident)


def _read_verified(path: Path, ident: str, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise StoreError(f"{what} {ident} is missing from {path.parent}", **{what: ident}) from exc
    if blob_id(data) != ident:
        raise StoreError(f"{what} {ident} is corrupt (hash mismatch)", **{what: ident})
    return data


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` durably: temp file, fsync, rename, directory fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Store:
    """Blobs, manifests and session heads on local disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        for sub in ("blobs", "manifests", "sessions"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # blobs
    def _blob_path(self, ident: str) -> Path:
        if not _valid_id(ident):
            raise StoreError(f"invalid blob id {ident!r}")
        return self.root / "blobs" / ident[:2] / ident

    def put(self, data: bytes) -> str:
        """Store `data` under its hash; return the hash. Existing blobs are not rewritten."""
        ident = blob_id(data)
        path = self._blob_path(ident)
        if not path.exists():
            write_atomic(path, data)
        return ident

    def has(self, ident: str) -> bool:
        return self._blob_path(ident).exists()

    def get(self, ident: str) -> bytes:
        """Read a blob and check it against its name before anyone unpickles it."""
        return _read_verified(self._blob_path(ident), ident, "blob")

    # manifests
    def put_manifest(self, data: bytes) -> str:
        ident = blob_id(data)
        path = self.root / "manifests" / ident
        if not path.exists():
            write_atomic(path, data)
        return ident

    def get_manifest(self, ident: str) -> bytes:
        if not _valid_id(ident):
            raise StoreError(f"invalid manifest id {ident!r}")
        return _read_verified(self.root / "manifests" / ident, ident, "manifest")

    # session heads
    def _head_path(self, session: str) -> Path:
        if not session or "/" in session or session.startswith("."):
            raise StoreError(f"invalid session name {session!r}")
        return self.root / "sessions" / session / "head"

    def head(self, session: str) -> str | None:
        try:
            ident = self._head_path(session).read_text().strip()
        except FileNotFoundError:
            return None
        if not _valid_id(ident):
            raise StoreError(f"session {session} has a corrupt head", session=session)
        return ident

    def set_head(self, session: str, manifest: str) -> None:
        if not _valid_id(manifest):  # "../blobs" exists too: only a manifest id may be a head
            raise StoreError(f"invalid manifest id {manifest!r}", session=session)
        if not (self.root / "manifests" / manifest).is_file():
            raise StoreError(f"refusing to commit missing manifest {manifest}", session=session)
        write_atomic(self._head_path(session), manifest.encode() + b"\n")

    def sessions(self) -> list[str]:
        return sorted(p.name for p in (self.root / "sessions").iterdir() if (p / "head").exists())
