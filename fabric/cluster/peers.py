"""The peer tier's network: a cluster's hosts serve their stores to one another.

Each host serves its store's blobs to its peers (`PeerServer`, a socket of its own beside the
clients' one) and reaches theirs (`Peers`, a `PeerLink` to each), for its store's peer tier
(`fabric.snapshot.peers`), which decides what to read from which host. Only the cluster's
peer key is admitted there: the front door makes it and gives it, with the list of peers, to
every host (the `peers` file, which the host agent rewrites as hosts come and go). A blob comes
whole in one frame (an object's chunks are blobs of their own, at most the store's chunk size)
and is checked against its name by the store, like any tier's: a peer that sends the wrong
bytes is caught, never trusted.

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
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from .. import auth, protocol
from ..errors import FabricError, ProtocolError, StoreError
from ..snapshot.store import Store
from ..snapshot.tiers import valid_id, write_atomic

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
        loop, task, thread = self._loop, self._task, self._thread
        if loop is not None and task is not None and thread is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
            thread.join(10)

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

    def _answer(self, frame: bytes) -> list[bytes | bytearray | memoryview]:
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
    """The other hosts, as the peer tier reaches them (`fabric.snapshot.peers.PeerList`): the
    list comes from `path` (re-read when it changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: float | None = None
        self._links: list[PeerLink] = []
        self._key: auth.ClientKey | None = None
        self._local = threading.local()  # a socket per thread and peer: zmq's are not shared

    def __call__(self) -> list[PeerLink]:
        self._load()
        return self._links

    def _load(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            self._links, self._key = [], None
            return
        if mtime == self._seen:
            return
        data = json.loads(self.path.read_text())
        key = data["key"]
        self._key = auth.ClientKey(PEER, key["public"], key["secret"], "")
        self._links = [PeerLink(self, Peer(p["name"], p["address"], p["server_key"]))
                       for p in data["peers"]]
        self._seen = mtime
        self._local = threading.local()

    def ask(self, peer: Peer, request: dict, timeout: float) -> tuple[dict, bytes | None]:
        """`request` asked of `peer` over this thread's socket to it: its reply and the frame
        after it, if any; StoreError if it does not answer in `timeout` seconds, or refuses."""
        key = self._key
        if key is None:  # the peers file is gone: so are its peers
            raise StoreError(f"peer {peer.name} is no longer one", peer=peer.name)
        sockets = self._local.__dict__.setdefault("sockets", {})
        socket = sockets.get(peer.address)
        if socket is None:
            socket = sockets[peer.address] = _context().socket(zmq.DEALER)
            socket.linger = 0
            auth.ClientKey(PEER, key.public, key.secret, peer.server_key).apply(socket)
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


class PeerLink:
    """One other host's store over its peer socket (`fabric.snapshot.peers.PeerStore`)."""

    def __init__(self, peers: Peers, peer: Peer) -> None:
        self.peers, self.peer = peers, peer

    @property
    def name(self) -> str:
        return self.peer.name

    def sizes(self, idents: list[str]) -> list[int | None]:
        reply, _ = self.peers.ask(self.peer, {"op": "sizes", "ids": idents}, ASK_TIMEOUT)
        sizes = reply.get("sizes", [])
        return [size if isinstance(size, int) else None for size in sizes][:len(idents)]

    def read(self, ident: str) -> bytes | None:
        return self._blob({"op": "read", "id": ident}, READ_TIMEOUT)

    def manifest(self, ident: str) -> bytes | None:
        return self._blob({"op": "manifest", "id": ident}, ASK_TIMEOUT)

    def head(self, session: str) -> str | None:
        reply, _ = self.peers.ask(self.peer, {"op": "head", "session": session}, ASK_TIMEOUT)
        return reply["head"] if isinstance(reply.get("head"), str) else None

    def keep(self, session: str, head: str) -> None:
        self.peers.ask(self.peer, {"op": "keep", "session": session, "head": head},
                       KEEP_TIMEOUT)

    def _blob(self, request: dict, timeout: float) -> bytes | None:
        """A blob or manifest the reply's second frame holds whole; None if the peer lacks it."""
        reply, data = self.peers.ask(self.peer, request, timeout)
        return data if data is not None and reply.get("size") == len(data) else None


@functools.cache
def _context() -> zmq.Context:
    return zmq.Context(io_threads=IO_THREADS)


def write_peers(path: Path, key: tuple[str, str], peers: list[dict]) -> None:
    """The peers file a host reads (`Peers`): the peer key pair and the other hosts."""
    body = {"key": {"public": key[0], "secret": key[1]}, "peers": peers}
    write_atomic(path, json.dumps(body).encode())
    os.chmod(path, 0o600)
