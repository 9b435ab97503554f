"""Snapshots: the codec, the content-addressed store and manifests (the source of truth)."""

from .codec import dumps, loads
from .manifest import Group, Manifest
from .store import Store, blob_id

__all__ = ["Group", "Manifest", "Store", "blob_id", "dumps", "loads"]
