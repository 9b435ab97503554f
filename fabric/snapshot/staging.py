"""Loaded bytes onto a GPU through pinned staging buffers, the host's copy overlapping the bus.

A load's bytes lie in pageable memory (the store's read buffers, or its mappings of chunk
files), which CUDA copies through a bounce buffer of its own, piece by piece, each piece waiting
for the last. Here they go through two pinned buffers in turn: while one piece crosses the bus
by DMA, the host copies the next (reads it, from a mapping) into the other buffer, so a large
tensor loads near the slower of the two rather than at their sum. The store meanwhile reads the
groups that follow (`Store.get_objects`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PIECE = 64 << 20  # bytes per staged copy: large enough for full DMA speed, two kept pinned


def from_numpy(array: Any) -> torch.Tensor:
    """A tensor over the numpy array `array`'s memory (torch's stub leaves the array untyped)."""
    import torch

    return torch.from_numpy(array)  # pyright: ignore[reportUnknownMemberType]


def to_device(host: Any, device: int) -> Any:
    """A new storage on GPU `device` holding the bytes of the uint8 array `host`."""
    import torch

    source = from_numpy(host)
    total = source.numel()
    out = torch.empty(total, dtype=torch.uint8, device=f"cuda:{device}")
    if total <= PIECE:  # one piece: nothing to overlap
        out.copy_(source)
        return out.untyped_storage()
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream()
        # freed, they go back to torch's pinned cache, which reuses them only once these copies
        # are done
        buffers = [torch.empty(PIECE, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        copied = [torch.cuda.Event(), torch.cuda.Event()]  # each buffer's last copy
        for piece, start in enumerate(range(0, total, PIECE)):
            buffer, done = buffers[piece % 2], copied[piece % 2]
            size = min(PIECE, total - start)
            done.synchronize()  # the buffer's last piece has crossed
            buffer[:size].copy_(source[start:start + size])
            out[start:start + size].copy_(buffer[:size], non_blocking=True)
            done.record(stream)
    return out.untyped_storage()  # later work on the stream waits for the copies
