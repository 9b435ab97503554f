"""Who a client is: its CURVE key on tcp://, its OS user on ipc://.

Keys live in the key directory (`key_dir`, default ~/.config/llfabric, mode 0700)::

    server.key              the server's key pair, made on its first start (0600)
    authorized/<user>.pub   the public key of each admitted client; the file name is its user
    client.key              this machine's client key: its pair and the server's public key

`llfabric keys new USER` admits a user and writes the client key file they install as their
client.key. The server runs a ZAP handler (ZeroMQ's authentication hook): a tcp:// client is
admitted only with a key under authorized/, an ipc:// one is the user its uid names (the kernel's
SO_PEERCRED, which libzmq passes in the ZAP request's address). The handler names the user in the
connection's `User-Id`, which every request then carries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils import z85

from .errors import AlreadyExists, BadKey, Forbidden, InvalidName
from .private import private_dir, read_private, write_new
from .protocol import as_session_name, valid_session_name

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq sends its authentication requests
DOMAIN = b"llfabric"
KEY_PROPERTY = "Client-Key"  # the admitted key, as connection metadata every request carries


@dataclass(frozen=True)
class ClientKey:
    """What a client needs for CURVE: its own key pair and the server's public key."""

    user: str
    public: str
    secret: str
    server: str

    def apply(self, socket: zmq.Socket) -> None:
        socket.curve_publickey = self.public.encode()
        socket.curve_secretkey = self.secret.encode()
        socket.curve_serverkey = self.server.encode()


class Keys:
    """The key directory of a server or a client."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def authorized(self) -> Path:
        return self.root / "authorized"

    def server_pair(self) -> tuple[str, str]:
        """The server's (public, secret) key, made on first use."""
        path = private_dir(self.root) / "server.key"
        if not path.exists() and not path.is_symlink():
            public, secret = zmq.curve_keypair()
            with contextlib.suppress(FileExistsError):  # a concurrent first start made it
                write_new(path, json.dumps({"public": public.decode(),
                                            "secret": secret.decode()}).encode())
        data = _json(path)
        return _key(data, "public", path), _key(data, "secret", path)

    def new_client(self, user: str) -> ClientKey:
        """Admit `user` with a fresh key pair; the client key file's content for them."""
        if not valid_session_name(user):
            raise InvalidName(f"{user!r} is not a user name: 1-128 letters, digits, '-', '_' "
                              "and '.'", user=user)
        server, _ = self.server_pair()
        path = private_dir(self.authorized) / f"{user}.pub"
        public, secret = zmq.curve_keypair()
        try:
            write_new(path, public + b"\n")
        except FileExistsError as exc:
            raise AlreadyExists(f"user {user} already has a key; `llfabric keys revoke {user}` "
                              "first to replace it", user=user) from exc
        return ClientKey(user, public.decode(), secret.decode(), server)

    def users(self) -> dict[str, str]:
        """Admitted users and their public keys."""
        if not self.authorized.is_dir():
            return {}
        out = {}
        for path in sorted(self.authorized.glob("*.pub")):
            key = self._public(path) if valid_session_name(path.stem) else None
            if key is not None:
                out[path.stem] = key
        return out

    def revoke(self, user: str) -> bool:
        """Stop admitting `user`, at once also on connections already open."""
        if not valid_session_name(user):
            return False
        try:
            (self.authorized / f"{user}.pub").unlink()
        except FileNotFoundError:
            return False
        return True

    def admits(self, user: str, public: str) -> bool:
        return valid_session_name(user) and self._public(self.authorized / f"{user}.pub") == public

    def _public(self, path: Path) -> str | None:
        try:
            key = path.read_text().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return None
        return key if len(key) == 40 else None

    def client(self) -> ClientKey:
        """This machine's client key (client.key), for connecting to a tcp:// server."""
        path = self.root / "client.key"
        if not path.exists():
            raise Forbidden(f"a tcp:// server needs a client key, and {path} does not exist: "
                            "ask the server's admin to run `llfabric keys new YOUR_NAME` and "
                            f"put the file it writes at {path}", path=str(path))
        return self.client_from(path)

    @staticmethod
    def client_from(path: Path) -> ClientKey:
        """A client key file, as `llfabric keys new` writes it."""
        data = _json(path)
        return ClientKey(str(data.get("user", "")), _key(data, "public", path),
                         _key(data, "secret", path), _key(data, "server", path))


def write_client_key(path: Path, key: ClientKey) -> None:
    write_new(path, json.dumps(key.__dict__, indent=1).encode() + b"\n")


def _json(path: Path) -> dict:
    try:
        data = json.loads(read_private(path))
    except ValueError as exc:
        raise BadKey(f"{path} is not a key file: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise BadKey(f"{path} is not a key file", path=str(path))
    return data


def _key(data: dict, field: str, path: Path) -> str:
    key = data.get(field)
    if not isinstance(key, str) or len(key) != 40:
        raise BadKey(f"{path} has no valid {field} key", path=str(path))
    return key


def user_of_uid(uid: int) -> str:
    """The user name of an OS account, as a session-name-safe word."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid{uid}"
    return as_session_name(name)


def peer_uid(address: str) -> int | None:
    """The uid in libzmq's ipc peer address (``...:uid:gid:pid``), if it carries one."""
    parts = address.rsplit(":", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return int(parts[1])


class Authenticator:
    """The ZAP handler of one server's context: admits and names every connecting client."""

    def __init__(self, context: zmq.asyncio.Context, keys: Keys | None,
                 refused: Callable[[], None] = lambda: None) -> None:
        self.keys = keys  # None: ipc only, no CURVE
        self.refused = refused  # told of each connection turned away
        self.socket = context.socket(zmq.REP)
        self.socket.linger = 0
        self.socket.bind(ZAP_ENDPOINT)

    async def serve(self) -> None:
        while True:
            request = await self.socket.recv_multipart()
            try:
                status, user, metadata = self.decide(request)
            except Exception:  # a malformed request: refused, never a dead handler
                log.exception("bad ZAP request")
                status, user, metadata = b"500", "", b""
            if status != b"200":
                self.refused()
            rid = request[1] if len(request) > 1 else b""
            await self.socket.send_multipart([b"1.0", rid, status, b"OK" if status == b"200"
                                              else b"refused", user.encode(), metadata])

    def decide(self, request: list[bytes]) -> tuple[bytes, str, bytes]:
        """(status, user, metadata) for one ZAP request."""
        if len(request) < 6 or request[0] != b"1.0":
            return b"400", "", b""
        address, mechanism = request[3].decode(errors="replace"), request[5]
        if mechanism == b"NULL":  # only ipc binds allow it: the peer's uid is the user
            uid = peer_uid(address)
            if uid is None:
                log.warning("refused a client at %s: no peer credentials", address)
                return b"400", "", b""
            return b"200", user_of_uid(uid), b""
        if mechanism == b"CURVE" and self.keys is not None and len(request) == 7:
            public = z85.encode(request[6]).decode()
            for user, key in self.keys.users().items():
                if key == public:
                    return b"200", user, _property(KEY_PROPERTY, public)
            log.warning("refused a client at %s: its key %s is not authorized", address, public)
        return b"400", "", b""

    def close(self) -> None:
        self.socket.close()


def _property(name: str, value: str) -> bytes:
    """One ZMTP metadata property, the format of a ZAP reply's metadata frame."""
    raw = value.encode()
    return bytes([len(name)]) + name.encode() + struct.pack(">I", len(raw)) + raw


def owner_name() -> str:
    """The server's own user: its sessions keep their plain names in the store."""
    return user_of_uid(os.geteuid())
