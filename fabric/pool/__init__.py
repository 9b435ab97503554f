"""The server's side of processes: zygotes, workers, their lifecycle and leases, and each session's
workers, which run its cells on them (`agent`). Only this package and the server fork and signal;
what runs inside the processes is `fabric.worker`."""

from . import criu, cuda, gpus, lifecycle, parking
from .leases import Lease, Leases
from .pool import Pool, WorkerHandle

__all__ = ["Lease", "Leases", "Pool", "WorkerHandle", "criu", "cuda", "gpus", "lifecycle",
           "parking"]
