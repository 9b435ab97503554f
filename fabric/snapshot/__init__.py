"""Snapshots: the codec, the content-addressed store, manifests and their commits (the source
of truth)."""

from . import history
from .codec import Encoded, dumps, loads
from .manifest import Group, Manifest
from .store import Store, blob_id

__all__ = ["Encoded", "Group", "Manifest", "Store", "blob_id", "dumps", "history", "loads"]
