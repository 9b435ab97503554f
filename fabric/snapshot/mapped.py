"""Large buffers loaded as private, copy-on-write mappings of their chunk files.

Each chunk file is mapped where its part of the buffer lies, over an anonymous reservation of the
buffer's size, so a buffer of many chunks is one contiguous range. Its pages come from the page
cache without a copy through user space and stay shared with the cache until the program writes
them (a write copies that page alone). The pages are faulted in for reading up front, on the
loading thread, and hashed as every load's chunks are: a mapping is handed out only verified.

The store never writes a blob in place (a new file is renamed over the name), so a mapped range
keeps the bytes that were verified; a gc that unlinks a mapped chunk leaves its mapping intact.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

from .tiers import open_regular

PAGE = mmap.PAGESIZE
SMALLEST = 1 << 20  # a chunk size under this maps no faster than it reads
_MADV_POPULATE_READ = 22  # Linux 5.14: page tables filled for reading, copy-on-write kept
_PROT = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED = 0x10  # Linux's; the mmap module does not name it


def _load_libc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


_libc = _load_libc()


def _mapper() -> ctypes.CDLL:
    """The C library whose mmap a `Region` maps with (only where `mappable` holds)."""
    if _libc is None:
        raise OSError("file mappings need Linux")
    return _libc


def mappable(chunk: int) -> bool:
    """Whether buffers cut in `chunk`-byte pieces can be mapped piece by piece."""
    return _libc is not None and chunk >= SMALLEST and chunk % PAGE == 0


class Region:
    """Writable private memory for one large buffer, parts of which files are mapped over.
    Unmapped as a whole when the last view of it goes."""

    def __init__(self, nbytes: int) -> None:
        self.memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        anchor = ctypes.c_char.from_buffer(self.memory)
        self.address = ctypes.addressof(anchor)
        del anchor  # its export of the mapping would keep it from ever being unmapped
        self.view = memoryview(self.memory)

    def map(self, offset: int, path: Path, size: int) -> bool:
        """Map the file at `path`, which must hold `size` bytes, at `offset`; False (the range
        left as it was) if it is missing or of another size."""
        fd = open_regular(path)  # StoreError for what is not a file the store wrote
        if fd is None:
            return False
        try:
            if os.fstat(fd).st_size != size:
                return False
            address, length = self.address + offset, -(-size // PAGE) * PAGE
            if _mapper().mmap(address, length, _PROT, mmap.MAP_PRIVATE | _MAP_FIXED, fd,
                          0) != address:
                error = ctypes.get_errno()
                self._anonymous(address, length)
                raise OSError(error, f"cannot map {path}: {os.strerror(error)}")
            _mapper().madvise(address, length, _MADV_POPULATE_READ)  # else the hash faults them in
            return True
        finally:
            os.close(fd)

    @staticmethod
    def _anonymous(address: int, length: int) -> None:
        """Put fresh memory back where a failed MAP_FIXED may have unmapped the range."""
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED
        if _mapper().mmap(address, length, _PROT, flags, -1, 0) != address:
            raise MemoryError("cannot remap a load's buffer after a failed file mapping")
