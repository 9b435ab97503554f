"""The content-addressed store: the source of truth of every session.

Layout under the store root::

    key                          this store's secret: manifests are signed with it
    blobs/ab/<xxh3-128 hex>      immutable bytes, named by their hash: chunks, object indexes, ...
    manifests/<hex>              signed msgpack manifests, named by the hash of their bytes
    sessions/<name>/head         the id of the session's latest committed manifest
    sessions/<name>/index        its tags, thinned versions and retention override (msgpack)
    changed/<name>               the session changed since upkeep last looked (`take_changed`)
    chunks                       the chunks each object names, as read (`chunklists`)
    ledger                       what upkeep's last passes learned (`ledger`)

A group of variables is stored as an *object*: an index blob holding the pickle stream, small
buffers inline and, for each large buffer, the ids of its chunks (CHUNK bytes each). Chunks are
written and read in parallel, shared by every object that holds the same bytes, and the index's
id is the group's fingerprint: it is computed by hashing the buffers, without writing anything.
A state loads as one stream of chunk reads (`get_objects`): the chunks of the next groups are
read and verified on the store's threads while the caller unpickles the current one.

Every write goes to a temporary file, is fsync'd, renamed into place and the directory fsync'd,
so a crash leaves either the old or the new file, never a torn one. Chunks are durable before
their index, the index before a manifest names it, the manifest before the head moves: a committed
head never points at missing data. Everything read is checked against its hash, and manifests
against their signature, before anyone unpickles it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import hmac
import logging
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard, TypeVar, cast

import xxhash

from ..errors import ConfigError, DiskFull, StaleHead, StoreError
from .chunklists import ChunkLists
from .codec import Encoded
from .layers import CACHE_BYTES, ORDER, Place, build
from .manifest import Manifest
from .mapped import Region, mappable
from .packing import UnpackError, pack, unpack
from .peers import PeerList
from .remote import Remote
from .tiers import (
    Buffer,
    DiskTier,
    Located,
    Role,
    Shared,
    Tier,
    open_regular,
    read_regular,
    valid_id,
    write_atomic,
)

log = logging.getLogger(__name__)

CHUNK = 16 << 20  # large enough for full-speed sequential I/O, small enough to dedup parts
INLINE = 64 << 10  # buffers below this stay in the index: a file each would cost more than bytes
THREADS = 4
PARALLEL = 64 << 20  # bytes from which hashing on THREADS threads pays for starting them
AHEAD = 256 << 20  # bytes a load reads ahead of the object being unpickled
_OBJECT = b"LLFO\x01"
_MANIFEST = b"LLFM\x01"
_TAG = hashlib.sha256().digest_size
# the most bytes each file read whole may hold, far past any the store writes: a larger one is
# refused unread rather than loaded into the server's memory
MANIFEST_BYTES = 256 << 20
HEAD_BYTES = 4096
INDEX_BYTES = 256 << 20

Progress = Callable[[int, int], None]  # bytes done, bytes in all
Chunked = tuple[int, list[str]]  # a large buffer of an object: its bytes, its chunks' ids
# the chunk ids of large buffers cut in pieces of a size: `hash_chunks`, or `written.Hashing`
ChunkIds = Callable[[list[memoryview], int], list[list[str]]]
T = TypeVar("T")


def blob_id(data: Buffer) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def hash_parts(parts: list[memoryview]) -> list[str]:
    """The ids of `parts`, hashed on a few threads when they are many bytes (xxhash releases the
    interpreter: 1 GiB hashes in about half the time on two cores); fewer hash here, faster than
    threads start on a busy host."""
    if len(parts) <= 1 or sum(part.nbytes for part in parts) < PARALLEL:
        return [blob_id(part) for part in parts]
    with ThreadPoolExecutor(min(THREADS, len(parts))) as pool:
        return list(pool.map(blob_id, parts))


def hash_chunks(views: list[memoryview], chunk: int) -> list[list[str]]:
    """The ids of each view's `chunk`-byte pieces, all hashed in one batch."""
    cuts = [[view[start:start + chunk] for start in range(0, view.nbytes, chunk)]
            for view in views]
    ids = iter(hash_parts([part for cut in cuts for part in cut]))
    return [[next(ids) for _ in cut] for cut in cuts]


@dataclass(frozen=True)
class ObjectIndex:
    """An object's index, checked: its pickle stream, the chunk size it was cut with, and its
    buffers: small ones inline, large ones in chunks."""

    stream: bytes
    chunk: int
    buffers: list[bytes | Chunked]

    @property
    def large(self) -> list[Chunked]:
        return [entry for entry in self.buffers if not isinstance(entry, bytes)]


class _Reporter:
    """Calls `progress` once a transfer has run for a second, then about every second."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0
        self.started = self.last = time.monotonic()

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.progress is not None and now - self.started >= 1 and \
                (now - self.last >= 1 or self.done == self.total):
            self.last = now
            self.progress(self.done, self.total)


def load_key(path: Path) -> bytes:
    """The store's signing key at `path`, made on first use."""
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-key-")
        try:
            os.write(fd, os.urandom(32))
            os.fsync(fd)
            os.close(fd)
            os.link(tmp, path)  # atomic and exclusive: two first users agree on one key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = path.read_bytes()
    if len(key) != 32:
        raise StoreError(f"the store key {path} is damaged")
    return key


class BlobStore:
    """Blobs and the objects chunked into them, in this store's tiers nearest first, behind a
    memory cache: all a worker sees of the store."""

    def __init__(self, root: Path, cache_bytes: int = CACHE_BYTES, chunk: int = CHUNK,
                 owner: tuple[int, int] | None = None, remote: str | Remote = "",
                 peers: PeerList | None = None, copies: int = 1,
                 tiers: Sequence[str | Tier] = ORDER, chunk_lists: Path | None = None) -> None:
        """`owner`: the (uid, gid) of the user whose part of a store this is, whose blobs folder
        the server writes in as them (`DiskTier`). `tiers`: where its blobs live, nearest
        first, by kind or as tier objects (`fabric.snapshot.layers`): `remote`, an fsspec URL
        where manifests, heads and (`replicate`) blobs are kept too, and read from (`fetch`)
        when this disk lacks them (`RemoteTier`); `peers`, a cluster's other hosts, read from
        before the remote (`PeerTier`); `copies`, the hosts, this one included, each commit is
        kept on where no durable tier holds it (`fabric.snapshot.commit.spread`).
        `chunk_lists`: the file the chunks each object names are remembered in (`chunklists`);
        None: in memory only."""
        self.root = Path(root)
        self.chunk = chunk  # for new objects; each index records the size it was cut with
        (self.root / "blobs").mkdir(mode=0o700, parents=True, exist_ok=True)
        self.tiers = build(tiers, Place(self.root / "blobs", owner, cache_bytes, remote, peers,
                                        copies))
        disk = next(t for t in self.tiers if t.role is Role.LOCAL)
        if not isinstance(disk, DiskTier):
            raise ConfigError("a store's local tier is its blobs folder (a DiskTier)",
                              key="tiers")
        self.disk = disk
        self.near = [t for t in self.tiers if t.role is not Role.FAR]  # read in place
        self.far = [t for t in self.tiers if t.role is Role.FAR]  # copied onto the disk first
        # the far tiers a commit's blobs go to before its head moves (`replicate`)
        self.durable = [t for t in self.far if t.durable]
        self.sourced: collections.Counter[str] = collections.Counter()  # bytes `fetch` copied
        self.sourced_seconds: collections.defaultdict[str, float] = \
            collections.defaultdict(float)  # and the seconds it took, by tier
        self.replicated = 0  # bytes `replicate` copied to durable far tiers
        # object id -> the chunks its index names: an id names one content, so this never goes
        # stale; gc, which asks for every live object's, reads each index once, ever
        self._chunks = ChunkLists(chunk_lists)

    # blobs
    def _checked(self, ident: str) -> str:
        if not valid_id(ident):
            raise StoreError(f"invalid blob id {ident!r}")
        return ident

    def put(self, data: Buffer, remote: bool = True) -> str:
        """Store `data` under its hash; return the hash. An intact copy is not rewritten.
        Not `remote`: kept off the durable far tiers (what only this host's peers read)."""
        ident = blob_id(data)
        self.store_blob(ident, data, remote)
        return ident

    def store_blob(self, ident: str, data: Buffer, remote: bool = True) -> bool:
        """`put` of `data` whose hash `ident` the caller computed; False if an intact copy was
        on disk already."""
        if self._intact(ident, memoryview(data).nbytes):
            self.disk.touch(ident)
            return False
        for tier in self.near:
            tier.write(ident, data)  # the memory tier takes only small blobs
        if remote:  # the server's own blobs (a catalog): small
            for tier in self.durable:
                tier.write(ident, data)
        return True

    def _intact(self, ident: str, size: int) -> bool:
        """Whether the disk holds the blob whole: `size` bytes that hash to its name. A save
        checks before it skips a write, so that a corrupt copy is rewritten rather than kept:
        streamed, this costs a fraction of the write it saves (100 MB: ~35 ms from the page
        cache, ~80 ms from disk, against ~150 ms to write and fsync)."""
        try:
            return self.disk.size(ident) == size and self.disk.digest(ident) == ident
        except StoreError:  # not a file the store wrote: the write replaces it
            return False

    def repair(self, ident: str, sources: Iterable[Tier] = ()) -> bool:
        """Rewrite a corrupt or missing disk copy of a blob from a good copy in another tier of
        this store or in `sources` (another store's, say); False if none has one."""
        for tier in [t for t in self.near if t is not self.disk] + list(sources):
            size = tier.size(self._checked(ident))
            if size is None:
                continue
            data = bytearray(size)
            if tier.read_into(ident, memoryview(data)) == size and blob_id(data) == ident:
                self.disk.write(ident, data)
                return True
        return False

    def has(self, ident: str) -> bool:
        """Whether the blob is durable (a memory tier does not count)."""
        return self.disk.has(self._checked(ident))

    def tier(self, kind: type[T]) -> T:
        """This store's tier of `kind`; StoreError if it has none."""
        for tier in self.tiers:
            if isinstance(tier, kind):
                return tier
        raise StoreError(f"the store {self.root} has no {kind.__name__}")

    # far tiers: blobs go to the durable ones at each commit, and come back when the disk lacks
    def replicate(self, idents: Iterable[str], to: Sequence[Tier] | None = None) -> int:
        """Copy to each durable far tier (or each of `to`) each of `idents` (blobs, objects with
        their chunks) that it lacks, read from this disk and verified first; the bytes copied
        (none without one)."""
        targets = self.durable if to is None else to
        if not targets:
            return 0
        wanted = [i for ident in idents for i in (ident, *self._chunks_of(ident))]
        copied = sum(self._copy([i for i in wanted if not tier.has(i)], self.disk, tier)
                     for tier in targets)
        if to is None:  # a commit's, before its head moves
            self.replicated += copied
        return copied

    def fetch(self, idents: Iterable[str]) -> int:
        """Copy onto this disk each of `idents` (blobs, objects with their chunks) that it
        lacks, each from the nearest far tier that holds it, verified. The bytes copied (none
        without a far tier)."""
        if not self.far:
            return 0
        idents = [self._checked(i) for i in idents]
        copied = self._source([i for i in idents if not self.disk.has(i)])
        chunks = [c for ident in idents for c in self._chunks_of(ident) if not self.disk.has(c)]
        return copied + self._source(chunks)

    def _source(self, idents: list[str]) -> int:
        """Copy `idents` onto this disk from the far tiers in order, from each those it holds
        (the last is asked for all that are left, and says which it lacks). What a tier that is
        not durable fails to give comes from the next; a durable one's failure is the fetch's."""
        copied, began = 0, time.monotonic()
        for tier in self.far:
            if not idents:
                break
            if isinstance(tier, Located):
                wanted = list(tier.locate(idents))
            else:
                wanted = idents if tier is self.far[-1] else [i for i in idents if tier.has(i)]
            if not wanted:
                continue
            try:
                got = self._copy(wanted, tier, self.disk)
                self.sourced[tier.name] += got
                copied += got
            except StoreError as exc:
                if tier.durable:
                    raise
                log.warning("the %s tier could not give state: %s; the next tier will",
                            tier.name, exc.message)
            idents = [i for i in idents if not self.disk.has(i)]
            began = self._timed(tier.name, began)
        return copied

    def _timed(self, tier: str, began: float) -> float:
        """Count the seconds since `began` as `tier`'s (`sourced_seconds`); now."""
        now = time.monotonic()
        self.sourced_seconds[tier] += now - began
        return now

    def _chunks_of(self, ident: str) -> list[str]:
        return self.object_chunks(ident) if self.is_object(ident) else []

    def _copy(self, idents: list[str], source: Tier, target: Tier) -> int:
        """Copy blobs between tiers on the store's threads, each checked against its name (an
        error names the source as `str` gives it)."""
        where = str(source)

        def copy(ident: str) -> int:
            size = source.size(ident)
            if size is None:
                raise StoreError(f"blob {ident} is missing from {where}", blob=ident)
            data = bytearray(size)
            if source.read_into(ident, memoryview(data)) != size or blob_id(data) != ident:
                raise StoreError(f"blob {ident} in {where} is corrupt (hash mismatch)",
                                 blob=ident)
            target.write(ident, data)
            return size

        with ThreadPoolExecutor(THREADS) as pool:
            return sum(pool.map(copy, dict.fromkeys(idents)))

    def get(self, ident: str, limit: int | None = None, cache: bool = True) -> bytes:
        """Read a blob and check it against its name before anyone unpickles it; one this host
        lacks (or holds as something other than a file) is fetched first, from a peer or the
        remote tier (`fetch`). `limit`: the most bytes its reader expects: a larger blob is
        refused unread. Not `cache`: read past the memory tier, and not kept there (what only
        upkeep reads, once)."""
        refused = None
        near = self.near if cache else [t for t in self.near if t.role is not Role.CACHE]
        for attempt in range(2):
            for tier in near:
                try:
                    size = tier.size(self._checked(ident))
                except StoreError as exc:  # a user's FIFO or link, say: as if missing
                    refused = exc
                    continue
                if size is None:
                    continue
                if limit is not None and size > limit:
                    raise StoreError(f"blob {ident} holds {size} bytes, more than the {limit} "
                                     "its reader expects: refused unread", blob=ident)
                out = bytearray(size)
                self._read_into(ident, memoryview(out), near)
                return bytes(out)
            if attempt == 0 and not self.fetch([ident]):
                break
        if refused is not None:
            raise StoreError(f"blob {ident} is refused: {refused.message}", blob=ident)
        raise StoreError(f"blob {ident} is missing from {self.disk.root}", blob=ident)

    def _read_into(self, ident: str, out: memoryview, near: list[Tier] | None = None) -> None:
        """Fill `out` from the first of the `near` tiers (all near ones by default) that holds
        the blob, checked, and give it to those before it."""
        near = self.near if near is None else near
        for i, tier in enumerate(near):
            size = tier.read_into(ident, out)
            if size is None:
                continue
            if size != len(out) or blob_id(out) != ident:
                raise StoreError(f"blob {ident} is corrupt (hash mismatch)", blob=ident)
            for upper in near[:i]:
                upper.write(ident, out)
            return
        raise StoreError(f"blob {ident} is missing from {self.disk.root}", blob=ident)

    # objects: a pickled group, its buffers chunked
    def fingerprint(self, encoded: Encoded, chunk_ids: ChunkIds = hash_chunks
                    ) -> tuple[str, bytes, list[tuple[str, memoryview]]]:
        """The object's id, its index and its chunks, from hashing alone (no I/O); `chunk_ids`
        names the chunks of its large buffers (`written.Hashing` hashes only what changed)."""
        large = [view for view in encoded.buffers if view.nbytes >= INLINE]  # flat byte views
        named = iter(chunk_ids(large, self.chunk))
        chunks: list[tuple[str, memoryview]] = []
        buffers: list[object] = []
        for view in encoded.buffers:
            if view.nbytes < INLINE:
                buffers.append(bytes(view))
                continue
            ids = next(named)
            chunks += [(ident, view[i * self.chunk:(i + 1) * self.chunk])
                       for i, ident in enumerate(ids)]
            buffers.append([view.nbytes, ids])
        index = _OBJECT + pack({"stream": encoded.stream, "chunk": self.chunk,
                                 "buffers": buffers})
        return blob_id(index), index, chunks

    def put_object(self, encoded: Encoded, known: str | None = None,
                   progress: Progress | None = None, writes: Writes | None = None,
                   chunk_ids: ChunkIds = hash_chunks) -> str:
        """Store a pickled group durably; return its id. Nothing is written if it equals `known`
        (the group as last loaded or saved) and is still on disk, and otherwise only chunks
        missing or corrupt on disk: an index already there is no proof that its chunks are
        intact. A chunk `known` has too is trusted as `known` is: kept, unread, if on disk.
        With `writes`, the writes are only begun: durable once `writes.finish()`."""
        ident, index, chunks = self.fingerprint(encoded, chunk_ids)
        if ident == known and self.reuse(ident):
            return ident
        kept = set[str]()
        if known is not None and chunks:
            with contextlib.suppress(StoreError):  # its index unreadable: nothing is trusted
                kept = set(self.object_chunks(known))
        reporter = _Reporter(progress, sum(part.nbytes for _, part in chunks))
        if writes is not None:
            writes.add(ident, index, chunks, reporter, kept)
            return ident
        own = Writes(self)
        own.add(ident, index, chunks, reporter, kept)
        for exc in own.finish().values():
            raise exc
        return ident

    def reuse(self, ident: str) -> bool:
        """Name the object `ident` again, unwritten: a gc running meanwhile keeps it. False if
        this disk no longer has it (it must be written again)."""
        try:
            self.disk.touch(ident)
        except FileNotFoundError:
            return False
        return True

    def object_index(self, ident: str, cache: bool = True) -> ObjectIndex:
        """An object's index, validated as input from outside; `cache`: see `get`."""
        data = self.get(ident, cache=cache)
        try:
            if not data.startswith(_OBJECT):
                raise ValueError("not an object index")
            raw = unpack(data[len(_OBJECT):])
            if not isinstance(raw, dict):
                raise ValueError("not a map")
            fields = cast(dict[str, object], raw)
            stream, chunk, buffers = fields["stream"], fields["chunk"], fields["buffers"]
            if not isinstance(stream, bytes) or not isinstance(buffers, list) or \
                    not isinstance(chunk, int) or chunk <= 0:
                raise ValueError("bad fields")
            entries = [buf if isinstance(buf, bytes) else _chunked(buf, chunk)
                       for buf in cast(list[object], buffers)]
        except (ValueError, TypeError, KeyError, UnpackError) as exc:
            raise StoreError(f"object {ident} is malformed: {exc}", blob=ident) from exc
        return ObjectIndex(stream, chunk, entries)

    def get_object(self, ident: str, progress: Progress | None = None) -> Encoded:
        """Read an object into fresh writable buffers, every chunk verified."""
        (encoded,) = self.get_objects([ident], progress)
        return encoded

    def get_objects(self, idents: Sequence[str],
                    progress: Progress | None = None) -> Iterator[Encoded]:
        """Read objects in order into fresh writable buffers, every chunk verified before its
        object is yielded. The chunks of the next objects (up to AHEAD bytes) are read while the
        caller unpickles the current one, so neither the disk nor the threads wait between
        groups; a whole state loads as one stream of reads rather than one burst per group."""
        indexes = [self.object_index(ident) for ident in idents]
        reporter = _Reporter(progress, sum(nbytes for index in indexes
                                           for nbytes, _ in index.large))

        def read(chunk: tuple[str, memoryview, Region | None, int]) -> None:
            ident, out, region, offset = chunk
            if region is None or not self._map(ident, out, region, offset):
                self._read_into(ident, out)
            reporter.add(out.nbytes)

        pending: collections.deque[tuple[Encoded, list[Future[None]], int]] = \
            collections.deque()
        ahead, following = 0, iter(indexes)
        with ThreadPoolExecutor(THREADS) as pool:
            try:
                for _ in indexes:
                    while not pending or ahead < AHEAD:
                        if (index := next(following, None)) is None:
                            break
                        encoded, reads = _allocated(index)
                        size = sum(read[1].nbytes for read in reads)
                        pending.append((encoded, [pool.submit(read, r) for r in reads], size))
                        ahead += size
                    encoded, futures, size = pending.popleft()
                    for future in futures:
                        future.result()
                    ahead -= size
                    yield encoded
            finally:  # an abandoned or failed load stops reading what nobody will use
                for _, futures, _ in pending:
                    for future in futures:
                        future.cancel()

    def _map(self, ident: str, out: memoryview, region: Region, offset: int) -> bool:
        """Map a chunk's disk copy where `out` lies in `region` and verify it; False if the disk
        has no copy of its size (the tiers are read instead, which says what is wrong)."""
        if not region.map(offset, self.disk.path(self._checked(ident)), out.nbytes):
            return False
        if blob_id(out) != ident:
            raise StoreError(f"blob {ident} is corrupt (hash mismatch)", blob=ident)
        return True

    def is_object(self, ident: str) -> bool:
        """Whether a blob on disk starts as an object index does (a cheap peek, unverified)."""
        if not valid_id(ident):
            return False
        try:
            fd = open_regular(self.disk.path(ident))
        except StoreError:  # not a file the store wrote: no object
            return False
        if fd is None:
            return False
        with open(fd, "rb") as f:
            return f.read(len(_OBJECT)) == _OBJECT

    def object_chunks(self, ident: str) -> list[str]:
        """The chunks an object names: as remembered (`chunklists`), else from its index, read
        past the memory tier (gc asks for every live object's: they would only crowd out what
        workers read)."""
        chunks = self._chunks.get(ident)
        if chunks is None:
            index = self.object_index(ident, cache=False)
            chunks = tuple(cid for _, ids in index.large for cid in ids)
            self._chunks.add(ident, chunks)
        return list(chunks)

    def forget_object(self, ident: str) -> None:
        """Drop what is remembered of a blob gc removed."""
        self._chunks.forget(ident)


class Store(BlobStore):
    """The blob store with what names its contents: manifests signed with the store's key, and
    each session's head, tags and index."""

    def __init__(self, root: Path, cache_bytes: int = CACHE_BYTES, chunk: int = CHUNK,
                 key: bytes | None = None, signs: bool = True,
                 owner: tuple[int, int] | None = None, remote: str | Remote = "",
                 peers: PeerList | None = None, copies: int = 1,
                 tiers: Sequence[str | Tier] = ORDER) -> None:
        """`key`: the signing key of the store this one is a user's part of (else the root's
        own `key`, made on first use); without `signs`, blobs only: a worker's view, which never
        reads the key (user code could read it from the worker's memory). The rest: see
        `BlobStore`."""
        super().__init__(root, cache_bytes, chunk, owner, remote, peers, copies, tiers,
                         Path(root) / "chunks" if signs else None)
        for sub in ("manifests", "sessions", "changed"):
            (self.root / sub).mkdir(mode=0o700, exist_ok=True)
        # the far tiers that hold sessions' heads (their authority, where there is one), and peers
        self._shared = [t for t in self.far if isinstance(t, Shared)]
        self._located = [t for t in self.far if isinstance(t, Located)]
        self._key = (key or load_key(self.root / "key")) if signs else None

    @property
    def key(self) -> bytes:
        """The signing key, for the users' parts of this store (`fabric.users`)."""
        if self._key is None:
            raise StoreError("this view of the store holds no signing key: only the server "
                             "signs manifests")
        return self._key

    # manifests
    def _sign(self, body: bytes) -> bytes:
        return hmac.new(self.key, body, hashlib.sha256).digest()

    def put_manifest(self, body: bytes) -> str:
        data = _MANIFEST + self._sign(body) + body
        ident = blob_id(data)
        path = self.root / "manifests" / ident
        if not path.exists():
            write_atomic(path, data)
        for tier in self._shared:
            tier.put_manifest(ident, data)
        return ident

    def get_manifest(self, ident: str) -> bytes:
        """A manifest's body, once its hash and its signature by this store's key both check;
        one this disk lacks comes from a far tier, and is kept here once it checks."""
        if not valid_id(ident):
            raise StoreError(f"invalid manifest id {ident!r}")
        data = self.manifest_data(ident)
        if data is None:
            path = self.root / "manifests" / ident
            data = self._manifest_elsewhere(ident)
            if data is None:
                raise StoreError(f"manifest {ident} is missing from {path.parent}",
                                 manifest=ident)
            body = self._checked_manifest(ident, data)
            write_atomic(path, data)
            return body
        return self._checked_manifest(ident, data)

    def _manifest_elsewhere(self, ident: str) -> bytes | None:
        """A manifest as a far tier holds it (unchecked), None if none does: asked first of
        those that hold sessions' heads, which hold every committed manifest, then of peers."""
        for tier in [*self._shared, *self._located]:
            if (data := tier.manifest(ident)) is not None:
                return data
        return None

    def repair_manifest(self, ident: str) -> bool:
        """Rewrite a corrupt or missing manifest from a far tier's copy, once it checks; False
        if none has a good one."""
        data = self._manifest_elsewhere(ident) if valid_id(ident) else None
        if data is None:
            return False
        try:
            self._checked_manifest(ident, data)
        except StoreError:
            return False
        write_atomic(self.root / "manifests" / ident, data)
        return True

    def _checked_manifest(self, ident: str, data: bytes) -> bytes:
        if blob_id(data) != ident:
            raise StoreError(f"manifest {ident} is corrupt (hash mismatch)", manifest=ident)
        head, tag, body = data[:len(_MANIFEST)], data[len(_MANIFEST):len(_MANIFEST) + _TAG], \
            data[len(_MANIFEST) + _TAG:]
        if head != _MANIFEST or not hmac.compare_digest(tag, self._sign(body)):
            raise StoreError(f"manifest {ident} is not signed by this store's key",
                             manifest=ident)
        return body

    def manifest_data(self, ident: str) -> bytes | None:
        """A manifest as this disk holds it (signed), for a peer that checks it; None if not."""
        if not valid_id(ident):
            return None
        try:
            return read_regular(self.root / "manifests" / ident, MANIFEST_BYTES)
        except StoreError as exc:  # a link, say: never read through
            raise StoreError(f"manifest {ident} is refused: {exc.message}",
                             manifest=ident) from exc

    def manifests(self) -> list[str]:
        return sorted(p.name for p in (self.root / "manifests").iterdir()
                      if valid_id(p.name))

    # session heads
    def _head_path(self, session: str) -> Path:
        if not valid_session(session):
            shown = repr(session[:60]) + (f"... ({len(session)} characters)"
                                          if len(session) > 60 else "")
            raise StoreError(f"invalid session name {shown}: 1-255 bytes, no '/', not "
                             "starting with '.'")
        return self.root / "sessions" / session / "head"

    def head(self, session: str) -> str | None:
        """The session's head; where this disk has none, the first far tier's that holds
        sessions' heads."""
        found = read_regular(self._head_path(session), HEAD_BYTES)
        ident = found.decode(errors="replace").strip() if found is not None else \
            next((h for t in self._shared if (h := t.head(session)) is not None), None)
        if ident is None:
            return None
        if not valid_id(ident):
            raise StoreError(f"session {session} has a corrupt head", session=session)
        return ident

    def adopt_head(self, session: str) -> str | None:
        """Take the session's head from the far tier that holds sessions' heads (a remote) as
        this disk's, and return it: hosts that share it take turns serving a session, and it
        may have moved on elsewhere since this disk last saw it; this disk's if it has none
        there. Without such a tier: the newest head this disk and its peers hold, if it has
        peers; else this disk's."""
        if not self._shared:
            return self._adopt_newest(session) if self._located else self.head(session)
        ident = self._shared[0].adopt(session)
        if ident is None:
            return self.head(session)
        with self.locked(session):
            self._write_head(session, ident)
            self.adopt_tags(session)
        return ident

    def adopt_tags(self, session: str) -> None:
        """Take the names other hosts gave the session's versions (`set_index` puts them on
        the far tiers that hold sessions' heads, one file each), if there are any; the caller
        holds `locked(session)`."""
        if not self._shared:
            return
        tags = {t: i for tier in self._shared for t, i in tier.tags(session).items()}
        index = self.index(session)
        if tags and any(index.tags.get(t) != i for t, i in tags.items()):
            index.tags.update(tags)
            self._write_index(session, index)

    def _adopt_newest(self, session: str) -> str | None:
        """Without a far tier that holds heads: the newest head this disk and the peers hold
        of the session (a commit is on `copies` hosts, so one that lost its host is still on
        another)."""
        newest, version = self.head(session), -1
        if newest is not None:
            version = self._version(newest)
        for ident in (i for tier in self._located for i in tier.heads(session)):
            try:
                if valid_id(ident) and (found := self._version(ident)) > version:
                    newest, version = ident, found
            except StoreError as exc:  # one peer's bad answer does not stop the others'
                log.warning("a peer's head of session %s is refused: %s", session, exc.message)
        if newest is not None:
            with self.locked(session):
                self._write_head(session, newest)
        return newest

    def _version(self, manifest: str) -> int:
        return Manifest.decode(self.get_manifest(manifest)).version

    def keep(self, session: str, head: str) -> None:
        """Hold another host's version `head` of the session whole (its manifest, checked, and
        every blob it names, fetched from the peers), and take it as the head unless this disk
        has a newer one; StoreError if it cannot be had whole."""
        manifest = Manifest.decode(self.get_manifest(head))
        if manifest.session != session:
            raise StoreError(f"manifest {head} is of session {manifest.session}, not {session}",
                             session=session)
        wanted = [g.blob for g in manifest.groups] + manifest.blobs()
        self.fetch(wanted)
        missing = [b for b in wanted if not self.disk.has(b)]
        if missing or any(not self.disk.has(c) for b in wanted for c in self._chunks_of(b)):
            raise StoreError(f"session {session}'s version {manifest.version} is not whole on "
                             "any peer", session=session)
        with self.locked(session):
            current = self.head(session)
            if current is None or self._version(current) < manifest.version:
                self._write_head(session, head)

    def set_head(self, session: str, manifest: str, parent: str | None,
                 held: bool = False) -> None:
        """Move the session's head to `manifest` if it is still at `parent`, the version the
        manifest was built on (compare-and-set): StaleHead, and nothing written, if another
        commit or a checkout moved it meanwhile. `held`: the caller holds `locked(session)`."""
        if not valid_id(manifest):  # "../blobs" exists too: only a manifest id may be a head
            raise StoreError(f"invalid manifest id {manifest!r}", session=session)
        if not (self.root / "manifests" / manifest).is_file():
            raise StoreError(f"refusing to commit missing manifest {manifest}", session=session)
        with contextlib.nullcontext() if held else self.locked(session):
            current = self.head(session)
            if current != parent:
                raise StaleHead(
                    f"session {session} has moved to {current} since {parent}, the version "
                    "this commit was built on: it is refused and nothing was overwritten",
                    session=session, head=current, parent=parent)
            for tier in self._shared:  # first: one it refuses leaves this disk's unmoved
                tier.move(session, manifest, parent)
            self._write_head(session, manifest)

    @contextlib.contextmanager
    def locked(self, session: str) -> Generator[None, None, None]:
        """Hold the session's lock: its head and index change under it, in any process or
        thread (flock locks an open file, so two threads of one process exclude each other)."""
        path = self._head_path(session)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _flocked(path.parent / "lock"):
            yield

    def index(self, session: str) -> Index:
        """The session's tags, thinned versions and retention override, checked as input."""
        data = read_regular(self._head_path(session).with_name("index"), INDEX_BYTES)
        if data is None:
            return Index()
        try:
            return Index.decode(data)
        except (ValueError, TypeError, KeyError, UnpackError) as exc:
            raise StoreError(f"session {session} has a malformed index: {exc}",
                             session=session) from exc

    def set_index(self, session: str, index: Index) -> None:
        """Write the session's index; the caller holds `locked(session)`. Its new names go to
        the far tiers that hold sessions' heads too, where the host that opens the session next
        finds them."""
        before = self.index(session).tags if self._shared else index.tags
        self._write_index(session, index)
        for tag, ident in index.tags.items():
            if before.get(tag) != ident:
                for tier in self._shared:
                    tier.put_tag(session, tag, ident)

    def restore_head(self, session: str, manifest: str, damaged: str | None) -> None:
        """Point the session's head at `manifest`, whatever it was: for a head that cannot be
        read, brought back to an intact version (`history.restore_head`). The `damaged`
        manifest it named, if any, is set aside in `damaged/`, out of the store's view."""
        with self.locked(session):
            self._write_head(session, manifest)
        if damaged is not None and valid_id(damaged):
            aside = self.root / "damaged"
            aside.mkdir(mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.root / "manifests" / damaged, aside / damaged)

    def stamps(self, sessions: Collection[str] | None = None) -> dict[str, tuple[int, ...]]:
        """What changes whenever a session's head or index is written, in any process: each
        file's inode, size and modification and change times (zeros for one that is not
        there). Every write replaces the file, and no one can set a change time, so an equal
        stamp means neither was written since. Of `sessions`, or of every session folder (those
        without a head too) from one listing, each file stat'ed by its name in the folder (no
        path walked again), for a pass that checks them all."""
        if sessions is not None:
            for session in sessions:
                if not valid_session(session):
                    self._head_path(session)  # raises, saying what names a session
            return {s: _stamp(os.path.join(self.root, "sessions", s)) for s in sessions}
        fd = os.open(self.root / "sessions", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return {e.name: _stamp(e.name, fd) for e in os.scandir(fd) if valid_session(e.name)}
        finally:
            os.close(fd)

    def has_index(self, session: str) -> bool:
        """Whether the session's index is there: every head this store writes has one, so a
        session without it lost its names and retention policy."""
        return os.path.lexists(self._head_path(session).with_name("index"))

    def _write_head(self, session: str, manifest: str) -> None:
        path = self._head_path(session)
        if not os.path.lexists(path) and not self.has_index(session):  # its first head
            self._write_index(session, Index())
        write_atomic(path, manifest.encode() + b"\n")
        self._changed(session)

    def _write_index(self, session: str, index: Index) -> None:
        write_atomic(self._head_path(session).with_name("index"), index.encode())
        self._changed(session)

    def _changed(self, session: str) -> None:
        """Mark the session changed, after the write that changed it: upkeep's next pass looks
        at it again (`take_changed`). Not synced: a server starts by looking at every session."""
        fd = os.open(self.root / "changed" / session,
                     os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)

    def take_changed(self) -> list[str]:
        """The sessions whose head or index was written, or that were removed, since the last
        call (in any process), their marks taken: taken before the caller reads them, so a
        write meanwhile marks its session again for the next call."""
        taken: list[str] = []
        for entry in os.scandir(self.root / "changed"):
            with contextlib.suppress(FileNotFoundError):  # another process took it first
                os.unlink(entry.path)
                if not entry.name.startswith("."):
                    taken.append(entry.name)
        return sorted(taken)

    def remove_session(self, session: str) -> bool:
        """Forget the session: its head, index and lock go; gc frees what only it named."""
        folder = self._head_path(session).parent
        elsewhere = any([tier.forget(session) for tier in self._shared])
        if not folder.is_dir():
            return elsewhere
        with self.locked(session):
            for name in ("index", "head"):  # the head last: a session without one is gone
                (folder / name).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        self._changed(session)
        return True

    def sessions(self) -> list[str]:
        """The sessions this host holds (retention, gc and status go through them); one only on
        the remote tier is opened by its name (`head`) and joins them at its first commit here."""
        return sorted(p.name for p in (self.root / "sessions").iterdir() if (p / "head").exists())


class Writes:
    """The writes of one save, on the store's threads: the chunks of each object handed over
    are written while the caller pickles the next group (I/O, fsync and hashing release the
    interpreter), and its index once its chunks are durable."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._chunks = ThreadPoolExecutor(THREADS)
        self._indexes = ThreadPoolExecutor(1)  # its tasks wait on chunk writes: a pool apart
        self._objects: dict[str, Future[None]] = {}

    def add(self, ident: str, index: bytes, chunks: list[tuple[str, memoryview]],
            reporter: _Reporter, kept: Collection[str] = ()) -> None:
        """Write an object: its chunks, then its index. Those in `kept` (the chunks of the
        version it replaces, durable when that was saved or loaded) are only touched if the disk
        has them whole, without being read again."""
        if ident in self._objects:  # the same object twice in one save
            return
        written: list[str] = []

        def put_chunk(chunk: tuple[str, memoryview]) -> None:
            if chunk[0] in kept and self._keep(*chunk):
                pass
            elif self.store.store_blob(*chunk):
                written.append(chunk[0])
            reporter.add(chunk[1].nbytes)

        puts = [self._chunks.submit(put_chunk, chunk) for chunk in chunks]

        def put_index() -> None:
            wait(puts)
            try:
                for put in puts:
                    put.result()
                self.store.store_blob(ident, index)
            except DiskFull:  # what it wrote is garbage no index names: freed now, not at gc
                for chunk_id in written:
                    self.store.disk.remove(chunk_id)
                raise

        self._objects[ident] = self._indexes.submit(put_index)

    def _keep(self, ident: str, data: memoryview) -> bool:
        try:
            if self.store.disk.size(ident) == data.nbytes:
                self.store.disk.touch(ident)  # a gc running meanwhile keeps it
                return True
        except (StoreError, FileNotFoundError):  # not the store's file, or just collected
            pass
        return False

    def finish(self) -> dict[str, Exception]:
        """Wait for every write: the objects whose writes failed, with why; a full disk raises
        DiskFull, as nothing more of the save can be written."""
        failed: dict[str, Exception] = {}
        try:
            for ident, future in self._objects.items():
                try:
                    future.result()
                except Exception as exc:  # each object its own error
                    failed[ident] = exc
        finally:
            self._indexes.shutdown()
            self._chunks.shutdown()
        for exc in failed.values():
            if isinstance(exc, DiskFull):
                raise exc
        return failed


@dataclass
class Index:
    """What a session records besides its head: tags (name -> manifest id), thinned versions
    (manifest id -> when their data was released; 0 once gc has freed it) and a retention
    policy of its own (last, hourly, daily), if any."""

    tags: dict[str, str] = field(default_factory=dict[str, str])
    thinned: dict[str, float] = field(default_factory=dict[str, float])
    policy: dict[str, int] = field(default_factory=dict[str, int])

    def encode(self) -> bytes:
        return pack({"tags": self.tags, "thinned": self.thinned, "policy": self.policy})

    @classmethod
    def decode(cls, data: bytes) -> Index:
        raw = unpack(data)
        if not isinstance(raw, dict):
            raise ValueError("not a map")
        fields = cast(dict[str, dict[object, object]], raw)
        tags, thinned, policy = fields["tags"], fields["thinned"], fields["policy"]
        if not all(isinstance(k, str) and valid_id(v) for k, v in tags.items()):
            raise ValueError("bad tags")
        if not all(valid_id(k) and isinstance(v, int | float) for k, v in thinned.items()):
            raise ValueError("bad thinned versions")
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in policy.items()):
            raise ValueError("bad policy")
        return cls(cast(dict[str, str], dict(tags)),
                   {cast(str, k): float(cast(float, v)) for k, v in thinned.items()},
                   cast(dict[str, int], dict(policy)))


def _stamp(folder: str, dir_fd: int | None = None) -> tuple[int, ...]:
    """`Store.stamps` of the session folder `folder` (relative to `dir_fd`, if given)."""
    return _file_stamp(f"{folder}/head", dir_fd) + _file_stamp(f"{folder}/index", dir_fd)


def _file_stamp(path: str, dir_fd: int | None) -> tuple[int, ...]:
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return (0, 0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def valid_session(name: object) -> TypeGuard[str]:
    """Whether `name` may name a session: 1-255 bytes (a file name's limit), no '/', not
    starting with '.'."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name \
        and not name.startswith(".") and len(name.encode(errors="surrogateescape")) <= 255


@contextlib.contextmanager
def _flocked(path: Path) -> Generator[None, None, None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _chunked(entry: object, chunk: int) -> Chunked:
    """A large buffer's entry in an object index, checked: [bytes, [chunk id, ...]]."""
    nbytes, ids = cast(list[object], entry)
    if not isinstance(nbytes, int) or nbytes < 0 or not isinstance(ids, list):
        raise ValueError("bad buffer entry")
    named = cast(list[object], ids)
    if len(named) != -(-nbytes // chunk) or not all(map(valid_id, named)):
        raise ValueError("bad buffer entry")
    return nbytes, cast(list[str], named)


def _allocated(index: ObjectIndex
               ) -> tuple[Encoded, list[tuple[str, memoryview, Region | None, int]]]:
    """An object's buffers, small ones filled from its index, and the chunk reads that fill the
    large ones: (chunk id, the part of its buffer it fills, the region to map the chunk's file
    into where chunks can be mapped, and the part's offset in it)."""
    chunk = index.chunk
    buffers: list[memoryview] = []
    reads: list[tuple[str, memoryview, Region | None, int]] = []
    for entry in index.buffers:
        if isinstance(entry, bytes):
            buffers.append(memoryview(bytearray(entry)))
            continue
        nbytes, ids = entry
        region = Region(nbytes) if nbytes and mappable(chunk) else None
        view = region.view if region is not None else _allocate(nbytes)
        buffers.append(view)
        reads += [(cid, view[i * chunk:(i + 1) * chunk], region, i * chunk)
                  for i, cid in enumerate(ids)]
    return Encoded(index.stream, buffers), reads


def _allocate(nbytes: int) -> memoryview:
    """Writable memory for a large buffer, its pages mapped up front: faulting them in one by one
    while reading costs as much as the read."""
    if nbytes == 0:
        return memoryview(bytearray())
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return memoryview(mmap.mmap(-1, nbytes, flags=flags))
