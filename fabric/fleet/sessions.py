"""Notebook sessions modelled from the training trace, which has no session ids.

What the trace gives: the trace's generator numbered each session's trainings consecutively, so a
drop of submit_time along job_id starts a new session (the boundary heuristic; the session-level
excerpt NotebookOS's authors published of this trace has each of its sessions as one such run).
What it cannot give, and the model assumes instead (each assumption a parameter of
`SessionModel`, swept by `llfabric simulate --sweep`; the session shapes' defaults and sources
are in `costs.INPUTS`):

- when the notebook opens and closes: `before_first_h` before its first training and
  `after_last_h` after its last (what a reservation holds besides the trainings' window);
- which trainings use no GPU: a share `no_gpu_share` of all trainings, drawn among the 1-GPU rows
  (the generator wrote a GPU-less training as one GPU);
- optionally, a boundary the heuristic misses: with `split_gap_min`, a run of trainings is also
  cut where the next one starts more than that many minutes after the run's last training ended;
- the seconds under the trace's whole minutes: each start and duration gets a uniform draw
  in [0, 60) s, from a seeded generator, so one model always yields the same sessions;
- the cells that are not trainings (inspecting, plotting, editing code): `cells_per_gap` short
  cells of `small_cell_s` between two trainings, on the GPUs of the training before them, fewer
  where the gap is too short; the gap's think time is split among the cells at random;
- the think time before a session's first cell (`first_think_s`): nothing in the trace says.

A session runs its cells one at a time; trainings of one session that overlap in the trace
(a gap below zero) run one after the other, with no think time between them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from dataclasses import replace as _replace

from .costs import INPUTS
from .trace import Training

MIN_THINK_S = 1.0  # a small cell is only modelled where its user has at least this to think


@dataclass(frozen=True)
class SessionModel:
    split_gap_min: float | None = None  # None: cut at drops of submit_time only
    cells_per_gap: int = 3
    small_cell_s: float = 5.0
    first_think_s: float = 30.0
    before_first_h: float = INPUTS["before_first_h"].value
    after_last_h: float = INPUTS["after_last_h"].value
    no_gpu_share: float = INPUTS["no_gpu_share"].value
    seed: int = 0


@dataclass(frozen=True)
class ModelledCell:
    """One cell: the user thinks `think_s` after the previous cell ended, then runs it."""

    think_s: float
    run_s: float
    gpus: int
    training: bool


@dataclass(frozen=True)
class ModelledSession:
    index: int
    start_s: float  # when the first cell is executed
    cells: tuple[ModelledCell, ...]
    before_s: float = 0.0  # open this long before the first cell is executed
    after_s: float = 0.0  # and closed this long after the last cell ends

    @property
    def max_gpus(self) -> int:
        return max(c.gpus for c in self.cells)


def runs(trainings: list[Training], split_gap_min: float | None) -> list[list[Training]]:
    """The trainings cut into sessions: at each drop of submit_time along job_id, and where the
    next training starts more than `split_gap_min` (if any) after the run so far ended."""
    groups: list[list[Training]] = []
    end = 0.0
    gap = float("inf") if split_gap_min is None else split_gap_min
    for training in trainings:
        current = groups[-1] if groups else None
        if (current is None or training.submit_min < current[-1].submit_min
                or training.submit_min - end > gap):
            groups.append([training])
            end = training.submit_min + training.duration_min
        else:
            current.append(training)
            end = max(end, training.submit_min + training.duration_min)
    return groups


def _gap_cells(gap_s: float, gpus: int, model: SessionModel, rng: random.Random
               ) -> list[ModelledCell]:
    """The small cells in a gap of `gap_s` before a training, and that training's think time
    as a last cell with no run (the caller fills it in)."""
    count = min(model.cells_per_gap, int(gap_s // (model.small_cell_s + MIN_THINK_S)))
    think_total = gap_s - count * model.small_cell_s
    weights = [rng.random() + 1e-9 for _ in range(count + 1)]
    thinks = [think_total * w / sum(weights) for w in weights]
    return [ModelledCell(t, model.small_cell_s, gpus, False) for t in thinks[:-1]] + \
           [ModelledCell(thinks[-1], 0.0, gpus, True)]


def without_gpus(trainings: list[Training], share: float, seed: int) -> list[Training]:
    """The trainings with a share `share` of them on no GPU, drawn among the 1-GPU rows."""
    ones = sum(t.gpus == 1 for t in trainings)
    chance = min(1.0, share * len(trainings) / ones) if ones else 0.0
    rng = random.Random(seed)
    return [_replace(t, gpus=0) if t.gpus == 1 and rng.random() < chance else t
            for t in trainings]


def _cells(group: list[Training], model: SessionModel, rng: random.Random
           ) -> tuple[float, tuple[ModelledCell, ...]]:
    """A session's first execute time and its cells, from its trainings in order."""
    cells: list[ModelledCell] = []
    start = end = 0.0
    for k, training in enumerate(group):
        begin = training.submit_min * 60 + rng.uniform(0, 60)
        length = training.duration_min * 60 + rng.uniform(0, 60)
        if k == 0:
            start = begin
            cells.append(ModelledCell(model.first_think_s, length, training.gpus, True))
        else:
            gap = _gap_cells(max(0.0, begin - end), cells[-1].gpus, model, rng)
            last = gap.pop()
            cells += gap
            cells.append(ModelledCell(last.think_s, length, training.gpus, True))
        end = max(end, begin + length)
    return start, tuple(cells)


def _ordered(sessions: list[ModelledSession]) -> list[ModelledSession]:
    sessions.sort(key=lambda s: s.start_s)
    return [_replace(s, index=i) for i, s in enumerate(sessions)]


def build_sessions(trainings: list[Training], model: SessionModel) -> list[ModelledSession]:
    """The sessions of the trace under `model`, ordered by when they start."""
    rng = random.Random(model.seed)
    trainings = without_gpus(trainings, model.no_gpu_share, model.seed)
    sessions = []
    for group in runs(trainings, model.split_gap_min):
        start, cells = _cells(group, model, rng)
        sessions.append(ModelledSession(0, start, cells, model.before_first_h * 3600,
                                        model.after_last_h * 3600))
    return _ordered(sessions)


def workload_sessions(workload: list[tuple[float, float, list[Training]]],
                      model: SessionModel) -> list[ModelledSession]:
    """Sessions whose open and close times are given, as (open minute, close minute,
    trainings): a session-level workload (`workload.read_workload`); the model adds only the
    small cells and the seconds."""
    rng = random.Random(model.seed)
    sessions = []
    for opened, closed, group in workload:
        start, cells = _cells(group, model, rng)
        last_end = max(t.submit_min + t.duration_min for t in group)
        sessions.append(ModelledSession(0, start, cells, max(0.0, start - opened * 60),
                                        max(0.0, (closed - last_end) * 60)))
    return _ordered(sessions)
