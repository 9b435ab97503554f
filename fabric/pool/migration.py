"""A pinned worker carried to another host: the worker that alone holds a session's unsaveable
values is dumped (`lifecycle.cool`, waking to the other host's server), its image put in this
host's store piece by piece (`pack`), and the map of those pieces (`Carried`) handed over; the
other host fetches the pieces through its tiers (a peer first, each checked against its name)
and lays the image out again (`unpack`) for its server to restore when the session's next draft
or cell wants the worker.

The map comes from outside the receiving host, so it is checked like any input: file names
relative and inside the image's folder, blob ids well formed, the rest of the declared types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from ..errors import ProtocolError
from ..protocol import Wire
from ..snapshot.store import Store
from ..snapshot.tiers import valid_id
from . import criu
from .lifecycle import CoolImage, Life


@dataclass(frozen=True)
class Carried:
    """A dumped worker's image as pieces in the sending host's store, and what it holds."""

    files: list[tuple[str, list[str]]]  # each image file: its path in the image, its blobs
    init: bool
    parked: bool
    device: str | None
    base: str | None  # the head manifest its state matches
    holds: list[str]
    unsaved: list[str]

    def to_wire(self) -> Wire:
        return {**asdict(self), "files": [[name, blobs] for name, blobs in self.files]}

    @classmethod
    def from_wire(cls, wire: object) -> Carried:
        """The map checked; ProtocolError says what is wrong with it."""
        if not isinstance(wire, dict) or set(wire) != set(cls.__dataclass_fields__):
            raise ProtocolError("a carried worker's image is a map of "
                                f"{sorted(cls.__dataclass_fields__)}")
        files = wire["files"]
        if not isinstance(files, list) or not all(
                isinstance(f, list) and len(f) == 2 and _inside(f[0]) and isinstance(f[1], list)
                and all(valid_id(b) for b in f[1]) for f in files):
            raise ProtocolError("a carried image's files are [path inside the image, [blob "
                                "id, ...]] pairs")
        if not all(isinstance(wire[k], bool) for k in ("init", "parked")) or not all(
                wire[k] is None or isinstance(wire[k], str) for k in ("device", "base")) \
                or not all(isinstance(wire[k], list) and all(isinstance(n, str) for n in wire[k])
                           for k in ("holds", "unsaved")):
            raise ProtocolError("a carried image's init and parked are booleans, its device "
                                "and base strings or null, its holds and unsaved lists of names")
        return cls(**{**wire, "files": [(name, blobs) for name, blobs in files]})


def _inside(name: object) -> bool:
    """Whether `name` is a relative path that stays inside the folder it is laid out in."""
    if not isinstance(name, str) or not name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in path.parts)


def pack(store: Store, image: CoolImage, life: Life) -> Carried:
    """Put `image`'s files in `store` in chunk-sized pieces, off its remote tier: the receiving
    host reads them from this one's peer server."""
    files = []
    for path in sorted(p for p in image.images.rglob("*") if p.is_file()):
        blobs = []
        with open(path, "rb") as f:
            while piece := f.read(store.chunk):
                blobs.append(store.put(piece, remote=False))
        files.append((path.relative_to(image.images).as_posix(), blobs))
    return Carried(files, image.init, image.parked, image.device, life.base,
                   sorted(life.holds), list(life.unsaved))


def unpack(store: Store, carried: Carried, images: Path) -> CoolImage:
    """Fetch `carried`'s pieces into `store` and lay its image out in `images`, an empty folder
    of its own; StoreError if a piece cannot be had whole (the folder is then removed)."""
    try:
        store.fetch(b for _, blobs in carried.files for b in blobs)
        for name, blobs in carried.files:
            path = images / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                for blob in blobs:
                    f.write(store.get(blob))
    except BaseException:
        criu.remove(images)
        raise
    return CoolImage(images, carried.init, carried.parked, carried.device)
