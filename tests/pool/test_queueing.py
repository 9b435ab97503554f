"""The mixed-size queue policy: first come, first served, a reservation for the oldest request,
backfill only where it cannot delay that reservation, and aging when estimates are wrong."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

import pytest

from fabric.pool.queueing import PATIENCE, Holding, LeaseRequest, admit, estimate

AGING = 10.0  # a short patience: its bound is tight enough that a greedy policy breaks it



def test_requests_that_fit_are_served_in_arrival_order() -> None:
    queue = [LeaseRequest(1, 0.0), LeaseRequest(2, 1.0), LeaseRequest(1, 2.0)]
    assert admit(4, queue, [], now=3.0) == [0, 1, 2]
    assert admit(3, queue, [], now=3.0) == [0, 1]


def test_a_large_request_at_the_head_holds_back_small_ones_with_no_estimate() -> None:
    queue = [LeaseRequest(4, 0.0), LeaseRequest(1, 1.0), LeaseRequest(1, 2.0)]
    held = [Holding(2, ends=50.0)]
    assert admit(2, queue, held, now=3.0) == []


def test_backfill_only_when_it_ends_before_the_reservation() -> None:
    queue = [LeaseRequest(4, 0.0), LeaseRequest(1, 1.0, estimate=5.0),
             LeaseRequest(1, 2.0, estimate=60.0)]
    held = [Holding(2, ends=20.0)]
    # the head's 4 slots are expected free at 20: a 5 s run fits before, a 60 s run does not
    assert admit(2, queue, held, now=3.0) == [1]


def test_backfill_on_slots_the_reservation_will_not_need() -> None:
    queue = [LeaseRequest(2, 0.0), LeaseRequest(1, 1.0, estimate=100.0),
             LeaseRequest(1, 2.0, estimate=100.0)]
    held = [Holding(3, ends=20.0)]  # at 20, 4 slots are free: the head needs 2, 2 are spare
    assert admit(1, queue, held, now=3.0) == [1]
    bigger = [LeaseRequest(3, 0.0), *queue[1:]]  # 2 free now, 5 at 20: 2 spare beyond its 3
    assert admit(2, bigger, held, now=3.0) == [1, 2]
    assert admit(2, bigger, [Holding(2, ends=20.0)], now=3.0) == [1]  # 4 then: 1 spare


def test_no_backfill_when_the_reservation_cannot_be_dated() -> None:
    queue = [LeaseRequest(4, 0.0), LeaseRequest(1, 1.0, estimate=0.1)]
    assert admit(2, queue, [Holding(2, ends=None)], now=3.0) == []


def test_an_overdue_run_is_taken_to_end_now() -> None:
    queue = [LeaseRequest(4, 0.0), LeaseRequest(1, 1.0, estimate=5.0)]
    assert admit(2, queue, [Holding(2, ends=2.0)], now=3.0) == []  # 5 s would delay it


def test_aging_stops_backfill_past_a_head_that_waited_long_enough() -> None:
    queue = [LeaseRequest(4, 0.0), LeaseRequest(1, 1.0, estimate=1.0)]
    held = [Holding(2, ends=100.0)]
    assert admit(2, queue, held, now=10.0, patience=30.0) == [1]
    assert admit(2, queue, held, now=30.0, patience=30.0) == []


def test_an_estimate_is_the_longest_recent_run() -> None:
    assert estimate([]) is None
    assert estimate([2.0, 7.0, 3.0]) == 7.0


@dataclass
class _Job:
    session: int
    size: int
    arrival: float
    run: float
    granted: float | None = None
    head: float | None = None  # when it became the oldest waiting request


@dataclass
class _Pool:
    """The policy in virtual time: arrivals, grants and completions as events."""

    slots: int
    patience: float
    running: list[tuple[float, _Job, float | None]] = field(default_factory=list)
    queue: list[_Job] = field(default_factory=list)
    recent: dict[int, list[float]] = field(default_factory=dict)

    def step(self, now: float) -> None:
        done = [r for r in self.running if r[0] <= now]
        for ends, job, _ in done:
            self.running.remove((ends, job, _))
            self.recent.setdefault(job.session, []).append(job.run)
        free = self.slots - sum(job.size for _, job, _ in self.running)
        requests = [LeaseRequest(j.size, j.arrival, estimate(self.recent.get(j.session, [])[-5:]))
                    for j in self.queue]
        held = [Holding(job.size, expected) for _, job, expected in self.running]
        for index in admit(free, requests, held, now, self.patience):
            job = self.queue[index]
            job.granted = now
            expected = requests[index].estimate
            self.running.append((now + job.run, job,
                                 None if expected is None else now + expected))
        self.queue = [j for j in self.queue if j.granted is None]
        if self.queue and self.queue[0].head is None:
            self.queue[0].head = now

    def run(self, jobs: list[_Job]) -> None:
        arrivals = sorted(jobs, key=lambda j: j.arrival)
        while arrivals or self.queue or self.running:
            now = min([r[0] for r in self.running] + [j.arrival for j in arrivals[:1]])
            while arrivals and arrivals[0].arrival <= now:
                self.queue.append(arrivals.pop(0))
            self.step(now)


def _mixed(slots: int, sizes: list[int], count: int, seed: int) -> list[_Job]:
    """`count` requests from 8 sessions, each with its own typical cell length (estimates come
    from a session's recent runs, and are sometimes wrong by 2x), arriving at 90% of what
    `slots` can serve."""
    rng = random.Random(seed)
    typical = {s: rng.choice([1.0, 5.0, 20.0]) for s in range(8)}
    runs = [0.5, 1.0, 1.0, 2.0]
    demand = statistics.mean(sizes) * statistics.mean(typical.values()) * statistics.mean(runs)
    jobs, now = [], 0.0
    for _ in range(count):
        session = rng.randrange(8)
        now += rng.expovariate(0.9 * slots / demand)
        jobs.append(_Job(session, rng.choice(sizes), now, typical[session] * rng.choice(runs)))
    return jobs


@pytest.mark.parametrize(("slots", "sizes"), [(4, [1, 2, 4]), (2, [1, 2])])
def test_a_mixed_queue_serves_every_request_and_starves_none(slots: int,
                                                              sizes: list[int]) -> None:
    for seed in range(5):
        jobs = _mixed(slots, sizes, 60, seed)
        _Pool(slots, AGING).run(jobs)
        assert all(j.granted is not None for j in jobs)  # every request served
        longest = max(j.run for j in jobs)
        for job in jobs:  # aging's bound: once oldest, never past patience + one run
            assert job.head is None or job.granted - job.head <= AGING + longest
        waits = {size: [j.granted - j.arrival for j in jobs if j.size == size]
                 for size in sizes}
        print(f"{slots} slots, seed {seed}: " + "; ".join(
            f"{size}-slot n={len(w)} mean {statistics.mean(w):.1f} max {max(w):.1f}"
            for size, w in waits.items()))


def test_backfill_uses_slots_plain_first_come_first_served_leaves_idle() -> None:
    jobs = _mixed(4, [1, 2, 4], 60, 0)
    plain = [_Job(j.session, j.size, j.arrival, j.run) for j in jobs]
    _Pool(4, PATIENCE).run(jobs)
    _Pool(4, 0.0).run(plain)  # patience 0: nothing ever jumps ahead
    mean = statistics.mean
    assert mean(j.granted - j.arrival for j in jobs) < mean(j.granted - j.arrival for j in plain)
