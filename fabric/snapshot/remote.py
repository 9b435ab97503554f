"""The remote tier: a store's blobs, manifests and session heads kept at an fsspec URL as well.

A shared directory (``file:///mnt/shared/llfabric``), ``memory://`` in tests, or any URL whose
fsspec package is installed (``s3://`` with s3fs). The layout mirrors the store's: blobs under
``blobs/<first two hex digits>/<id>``, ``manifests/<id>``, ``sessions/<name>/head``. Everything
read from it is checked like any other read (a blob against its hash, a manifest against its hash
and the store's signature), so a remote that loses or alters data is caught, never trusted.

Writes go to a temporary name first and are then moved into place: on a filesystem a reader never
sees half a file, and on an object store the move is a whole-object copy.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import ConfigError, StoreError
from .tiers import Buffer


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of `url` and the path in it; ConfigError says what is missing."""
    try:
        import fsspec
    except ImportError as exc:
        raise ConfigError("a remote tier needs fsspec: pip install 'llfabric[remote]'",
                          key="remote") from exc
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:  # no package for the protocol, or a bad URL
        raise ConfigError(f"remote {url!r} cannot be used: {exc}", key="remote") from exc


class RemoteTier:
    durable = True

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.root = self.root.rstrip("/")

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

    # any file under the URL: manifests and heads
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

    def remove(self, name: str) -> bool:
        """Remove the file `name`; False if it was not there."""
        try:
            self.fs.rm_file(f"{self.root}/{name}")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"the remote tier {self.url} cannot be written: {exc}") from exc
        return True
