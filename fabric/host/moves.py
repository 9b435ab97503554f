"""The moves a cluster's front door asks of a host: what it holds of a session (so the door
places the session by it), and a session carried off to another host or taken in from one, with
the pinned worker that alone held its unsaveable values (`pool.migration`)."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

from ..closure import closure, plan
from ..errors import FabricError, SessionBusy
from ..messages import Held, Immigrated
from ..pool import Pool, criu, migration
from ..pool.lifecycle import Life
from ..protocol import Wire
from ..session import Session
from ..snapshot import Store
from ..snapshot.commit import head_manifest

log = logging.getLogger(__name__)


def held(store: Store, stored: str, session: Session | None, source: str) -> Held:
    """The bytes of the session's state (of `source`'s closure, if given) this host holds on
    its disk, and in a worker it keeps for the session (`session`, if open here)."""
    head = store.head(stored)
    manifest = (session.manifest if session is not None and session.head == head
                else head_manifest(store, stored, head))
    groups = closure(plan(source), manifest).groups if source else manifest.groups
    return Held(sum(g.size for g in groups if store.has(g.blob)),
                session.status()["memory"] if session is not None else 0)


async def hand_over(session: Session, store: Store, wake_dir: str) -> Wire | None:
    """Before the session closes here for another host: its pinned worker dumped for that host
    (its server wakes restored workers in `wake_dir`) and put in this host's store; the image,
    as the `emigrate` reply carries it. A worker that cannot be dumped leaves its values to be
    recomputed there, or reported lost."""
    try:
        handed = await session.hand_over(wake_dir)
    except SessionBusy:
        raise  # its running cell is not cut short: the door moves sessions between cells
    except FabricError as exc:  # a dump or restore that failed: it closes all the same
        log.warning("session %s moves without its pinned worker: %s", session.name,
                    exc.message)
        return None
    if handed is None:
        return None
    image, life = handed
    try:
        return (await asyncio.to_thread(migration.pack, store, image, life)).to_wire()
    except FabricError as exc:  # a full disk, say: its values go as a dump's would
        log.warning("session %s moves without its pinned worker: %s", session.name,
                    exc.message)
        return None
    finally:
        criu.remove(image.images)


async def take_in(session: Session, pool: Pool, store: Store, wire: Wire) -> Immigrated:
    """Take another host's pinned worker into the session (see `messages.Immigrate`)."""
    carried = migration.Carried.from_wire(wire)
    if carried.base != session.head:
        return Immigrated(False, "it was dumped at another version than the session's head "
                          "here")
    images = Path(tempfile.mkdtemp(prefix="m", dir=pool.socket_dir / "cool"))
    image = await asyncio.to_thread(migration.unpack, store, carried, images)
    image.user = session.agent.user  # restored into a cage of its user's
    session.arrive(Life.arrived(pool, image, carried.base, set(carried.holds),
                                carried.unsaved))
    return Immigrated(True, bytes=image.size)
