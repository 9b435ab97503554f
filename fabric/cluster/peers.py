"""The peer tier: blobs read from the disks of a cluster's other hosts, before the remote tier.

Each host serves its store's blobs to its peers (`PeerServer`, a socket of its own beside the
clients' one) and reads theirs (`Peers`). Only the cluster's peer key is admitted there: the
front door makes it and gives it, with the list of peers, to every host (the `peers` file, which the
host agent rewrites as hosts come and go). A blob comes whole in one frame (an object's chunks
are blobs of their own, at most the store's chunk size) and is checked against its name by the
store, like any tier's: a peer that sends the wrong bytes is caught, never trusted.

Without a remote tier, the peers are where commits are kept too: a host that commits asks
others to keep the version (`keep`: each pulls what it lacks through its own peer tier and
takes the version as its head of the session), and a host that opens a session takes the newest
head its peers hold (`heads`; their manifests come checked by the cluster's key, `manifest`).

Wire (msgpack maps, one request, one reply): ``{"op": "sizes", "ids": [...]}`` answers
``{"sizes": [size or None, ...]}``; ``{"op": "read", "id": ID}`` answers ``{"size": n}`` and
the blob as a second frame (``{"size": None}`` alone if it is gone); ``{"op": "manifest",
"id": ID}`` the same for a manifest; ``{"op": "head", "session": S}`` answers ``{"head": ID or
None}``; ``{"op": "keep", "session": S, "head": ID}`` answers ``{"kept": true}`` once the
version is whole on this host's disk. An error answers ``{"error": message}``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from .. import auth, protocol
from ..errors import FabricError, ProtocolError, StoreError
from ..snapshot.store import Store
from ..snapshot.tiers import Buffer, valid_id, write_atomic

log = logging.getLogger(__name__)

PEER = "peer"  # the user name the peer key is admitted as
ASK_TIMEOUT = 5.0  # seconds a peer may take to say what it holds, or give a manifest
READ_TIMEOUT = 60.0  # seconds for one blob (at most a chunk) to come
KEEP_TIMEOUT = 600.0  # seconds a peer may take to pull a version it keeps
MAX_IDS = 100_000  # blob ids one `sizes` request may ask about
# CurveZMQ encrypts in libzmq's I/O threads, about 200 MiB/s each: the store's copies run on
# several threads, and each end gives them as many I/O threads
IO_THREADS = 4


@dataclass(frozen=True)
class Peer:
    name: str
    address: str  # where its PeerServer listens
    server_key: str  # its CURVE public key


class PeerServer:
    """This host's store, for its peers, from a thread and a loop of its own: a server loop
    busy, or waiting on a peer itself, must never keep its peers waiting."""

    def __init__(self, store: Store, bind: str, keys: auth.Keys) -> None:
        self.store, self.disk, self.bind, self.keys = store, store.disk, bind, keys
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._task = self._loop.create_task(self.serve())
            self._loop.call_soon(started.set)
            try:
                self._loop.run_until_complete(self._task)
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("the peer server failed: peers read from the remote instead")
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="peer-server", daemon=True)
        self._thread.start()
        started.wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._task is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)
            self._thread.join(10)

    async def serve(self) -> None:
        context = zmq.asyncio.Context(io_threads=IO_THREADS)
        authenticator = auth.Authenticator(context, self.keys)
        admitting = asyncio.ensure_future(authenticator.serve())
        socket = context.socket(zmq.ROUTER)
        socket.linger = 0
        public, secret = self.keys.server_pair()
        socket.curve_server = True
        socket.curve_publickey, socket.curve_secretkey = public.encode(), secret.encode()
        socket.zap_domain = auth.DOMAIN
        socket.setsockopt(zmq.MAXMSGSIZE, 1 << 20)  # requests are small maps
        socket.bind(self.bind)
        answering: set[asyncio.Task] = set()

        async def answer(frames: list[bytes]) -> None:
            try:  # off the loop, several at once: each is a disk read of a chunk
                reply = await asyncio.to_thread(self._answer, frames[-1])
            except FabricError as exc:
                reply = [protocol.pack({"error": exc.message})]
            await socket.send_multipart([frames[0], *reply], copy=False)

        try:
            while True:
                task = asyncio.ensure_future(answer(await socket.recv_multipart()))
                answering.add(task)
                task.add_done_callback(answering.discard)
        finally:
            for task in answering:
                task.cancel()
            admitting.cancel()
            socket.close()
            authenticator.close()
            context.term()

    def _answer(self, frame: bytes) -> list[bytes | memoryview]:
        request = protocol.unpack(frame, 1 << 20)
        match request:
            case {"op": "sizes", "ids": list(ids)} if len(ids) <= MAX_IDS:
                return [protocol.pack({"sizes": [self._size(i) for i in ids]})]
            case {"op": "read", "id": str(ident)}:
                size = self._size(ident)
                if size is None:
                    return [protocol.pack({"size": None})]
                data = bytearray(size)
                if self.disk.read_into(ident, memoryview(data)) != size:
                    return [protocol.pack({"size": None})]
                return [protocol.pack({"size": size}), data]
            case {"op": "manifest", "id": str(ident)}:
                found = self.store.manifest_data(ident)
                return [protocol.pack({"size": None if found is None else len(found)}),
                        *([found] if found is not None else [])]
            case {"op": "head", "session": str(session)}:
                return [protocol.pack({"head": self.store.head(session)})]
            case {"op": "keep", "session": str(session), "head": str(head)} if valid_id(head):
                self.store.keep(session, head)
                return [protocol.pack({"kept": True})]
        raise ProtocolError(f"not a peer request: {str(request)[:200]}")

    def _size(self, ident: object) -> int | None:
        """A blob's size; None if this host lacks it, or holds something else under its name."""
        try:
            return self.disk.size(ident) if valid_id(ident) else None
        except StoreError:
            return None


class Peers:
    """The other hosts' blobs, as a read-only tier; the list comes from `path` (re-read when
    it changes)."""

    durable = False  # a peer may go at any time: a commit never counts on one

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: float | None = None
        self._peers: list[Peer] = []
        self._key: auth.ClientKey | None = None
        self._local = threading.local()  # a socket per thread and peer: zmq's are not shared
        self._where: dict[str, tuple[Peer, int]] = {}  # blob -> where `locate` found it, size

    def _load(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._peers, self._key = [], None
            return
        if mtime == self._seen:
            return
        data = json.loads(self.path.read_text())
        key = data["key"]
        self._key = auth.ClientKey(PEER, key["public"], key["secret"], "")
        self._peers = [Peer(p["name"], p["address"], p["server_key"]) for p in data["peers"]]
        self._seen = mtime
        self._local = threading.local()

    def locate(self, idents: list[str]) -> dict[str, int]:
        """Which of `idents` some peer holds (their sizes); the peer is remembered for `read`."""
        self._load()
        found: dict[str, int] = {}
        for peer in self._peers:
            wanted = [i for i in idents if i not in found]
            if not wanted:
                break
            try:
                reply, _ = self._ask(peer, {"op": "sizes", "ids": wanted}, ASK_TIMEOUT)
            except StoreError as exc:
                log.info("peer %s cannot say what it holds: %s", peer.name, exc.message)
                continue
            for ident, size in zip(wanted, reply.get("sizes", []), strict=False):
                if isinstance(size, int):
                    found[ident], self._where[ident] = size, (peer, size)
        return found

    # the Tier protocol, for the blobs `locate` found
    def has(self, ident: str) -> bool:
        return ident in self._where

    def size(self, ident: str) -> int | None:
        known = self._where.get(ident)
        return known[1] if known is not None else self.locate([ident]).get(ident)

    def read_into(self, ident: str, out: memoryview) -> int | None:
        if ident not in self._where:
            return None
        peer, _ = self._where[ident]
        reply, data = self._ask(peer, {"op": "read", "id": ident}, READ_TIMEOUT)
        if data is None or reply.get("size") != len(data):
            return None
        out[:min(len(data), out.nbytes)] = data[:out.nbytes]
        return len(data)

    def write(self, ident: str, data: Buffer) -> None:
        raise StoreError("the peer tier is read-only")

    # manifests and heads (`fabric.snapshot.tiers.Located`)
    def manifest(self, ident: str) -> bytes | None:
        self._load()
        for _, reply, data in self._answers(self._peers, {"op": "manifest", "id": ident},
                                            ASK_TIMEOUT, f"give manifest {ident}"):
            if data is not None and reply.get("size") == len(data):
                return data
        return None

    def heads(self, session: str) -> list[str]:
        self._load()
        return [reply["head"] for _, reply, _ in self._answers(
            self._peers, {"op": "head", "session": session}, ASK_TIMEOUT,
            f"say its head of {session}") if isinstance(reply.get("head"), str)]

    def keep(self, session: str, head: str, copies: int) -> list[str]:
        """Peers are asked in an order of the session's own (each session's copies spread over
        the hosts, and go to the same ones while they last)."""
        self._load()
        order = sorted(self._peers, key=lambda p: zlib.crc32(f"{session}/{p.name}".encode()))
        kept: list[str] = []
        for peer, _, _ in self._answers(order, {"op": "keep", "session": session, "head": head},
                                        KEEP_TIMEOUT, f"keep session {session}'s version"):
            kept.append(peer.name)
            if len(kept) == copies:
                break
        return kept

    def _answers(self, peers: list[Peer], request: dict, timeout: float,
                 what: str) -> Iterator[tuple[Peer, dict, bytes | None]]:
        """`request` asked of each of `peers` in turn: the answers of those that give one (one
        that cannot, `what` it was asked, is logged and passed over)."""
        for peer in peers:
            try:
                reply, data = self._ask(peer, request, timeout)
            except StoreError as exc:
                log.warning("peer %s cannot %s: %s", peer.name, what, exc.message)
                continue
            yield peer, reply, data

    def _ask(self, peer: Peer, request: dict, timeout: float) -> tuple[dict, bytes | None]:
        sockets = self._local.__dict__.setdefault("sockets", {})
        socket = sockets.get(peer.address)
        if socket is None:
            socket = sockets[peer.address] = _context().socket(zmq.DEALER)
            socket.linger = 0
            auth.ClientKey(PEER, self._key.public, self._key.secret,
                           peer.server_key).apply(socket)
            socket.connect(peer.address)
        socket.send(protocol.pack(request))
        if not socket.poll(int(timeout * 1000)):
            socket.close()  # a late answer must not meet the next request
            del sockets[peer.address]
            raise StoreError(f"peer {peer.name} did not answer within {timeout:.0f} s",
                             peer=peer.name)
        frames = socket.recv_multipart()
        reply = protocol.unpack(frames[0], 1 << 20)
        if "error" in reply:
            raise StoreError(f"peer {peer.name} refused: {reply['error']}", peer=peer.name)
        return reply, frames[1] if len(frames) > 1 else None


@functools.cache
def _context() -> zmq.Context:
    return zmq.Context(io_threads=IO_THREADS)


def write_peers(path: Path, key: tuple[str, str], peers: list[dict]) -> None:
    """The peers file a host reads (`Peers`): the peer key pair and the other hosts."""
    body = {"key": {"public": key[0], "secret": key[1]}, "peers": peers}
    write_atomic(path, json.dumps(body).encode())
    os.chmod(path, 0o600)
