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
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import ConfigError, StaleHead, StoreError
from .tiers import Buffer, Role, valid_id

ROOT = "first"  # the claim of a session's first version, which has no parent


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

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.root = self.root.rstrip("/")

    def __str__(self) -> str:
        return self.url

    def _blob(self, ident: str) -> str:
        return f"{self.root}/blobs/{ident[:2]}/{ident}"

    # the Tier protocol: blobs
    def has(self, ident: str) -> bool:
        return self.size(ident) is not None

    def size(self, ident: str) -> int | None:
        try:
            return int(self.fs.size(self._blob(ident)))
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
        taken = self.claim(f"sessions/{session}/after/{parent or ROOT}",
                           manifest.encode() + b"\n")
        if taken is not None and self._checked(session, taken) != manifest:
            raise StaleHead(
                f"session {session} moved on from {parent} on another host (to "
                f"{taken.decode(errors='replace').strip()}) before this commit: it is refused "
                "and nothing was overwritten", session=session, parent=parent)
        self.put(f"sessions/{session}/head", manifest.encode() + b"\n")

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
            return bytes(self.fs.cat_file(f"{self.root}/{name}"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"the remote tier {self.url} cannot be read: {exc}") from exc

    def put(self, name: str, data: Buffer) -> None:
        path = f"{self.root}/{name}"
        parent, _, leaf = path.rpartition("/")
        temporary = f"{parent}/.tmp-{uuid.uuid4().hex}-{leaf}"
        try:
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(temporary, bytes(data))
            self.fs.mv(temporary, path)
        except OSError as exc:
            raise StoreError(f"the remote tier {self.url} cannot be written: {exc}") from exc

    def files(self, folder: str) -> dict[str, bytes]:
        """The files in `folder` (relative to the URL), by name; none if it is not there."""
        try:
            paths = self.fs.ls(f"{self.root}/{folder}", detail=False)
            return {path.rsplit("/", 1)[-1]: bytes(data)
                    for path, data in self.fs.cat(paths, on_error="omit").items()}
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"the remote tier {self.url} cannot be read: {exc}") from exc

    def claim(self, name: str, data: bytes) -> bytes | None:
        """Create the file `name` holding `data` unless it exists (the backend's exclusive
        create: atomic on a file system, and on object stores that take conditional writes);
        None when this call created it, else what the file holds."""
        path = f"{self.root}/{name}"
        try:
            self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
            with self.fs.open(path, "xb") as f:
                f.write(data)
        except FileExistsError:
            return self.get(name) or b""
        except OSError as exc:
            raise StoreError(f"the remote tier {self.url} cannot be written: {exc}") from exc
        return None

    def remove(self, name: str, recursive: bool = False) -> bool:
        """Remove the file `name` (`recursive`: the folder); False if it was not there."""
        try:
            if recursive:
                self.fs.rm(f"{self.root}/{name}", recursive=True)
            else:
                self.fs.rm_file(f"{self.root}/{name}")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"the remote tier {self.url} cannot be written: {exc}") from exc
        return True
