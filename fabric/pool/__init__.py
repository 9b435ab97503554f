"""Processes: zygotes, workers and leases. Only this package and the server fork and signal."""

from . import criu, cuda, gpus, parking
from .leases import Lease, Leases
from .pool import Pool, WorkerHandle

__all__ = ["Lease", "Leases", "Pool", "WorkerHandle", "criu", "cuda", "gpus", "parking"]
