"""Small hand-made traces for the fleet tests."""

from __future__ import annotations

import random
from pathlib import Path

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def write_trace(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    """rows: (num_gpu, submit_time, duration), numbered in order."""
    path.write_text(HEADER + "".join(f"{i},{g},{s},0,resnet50,{d},0\n"
                                     for i, (g, s, d) in enumerate(rows)))
    return path


def random_rows(count: int, seed: int = 1) -> list[tuple[int, int, int]]:
    """Sessions of a few trainings each, their submit times rising within a session and
    dropping at the next one, as the production trace's generator wrote them."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        start = rng.randrange(0, 600)
        for _ in range(rng.randrange(1, 6)):
            rows.append((rng.choice((1, 1, 4, 8)), start, rng.randrange(1, 30)))
            start += rows[-1][2] + rng.randrange(0, 20)
    return rows[:count]
