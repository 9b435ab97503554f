"""The discrete-event loop: sessions' cells over a fleet, under one policy.

Sessions are closed loops: a cell is executed its think time after the previous one ended, so a
delay pushes the rest of the session later, as it would a user. Events are kept in a heap by
time; ties keep the order they were pushed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from .costs import Costs
from .fleet import Fleet, Request
from .policies import SessionState, make
from .sessions import Session

EXECUTE, END, BOOTED, TICK = range(4)
TICK_S = 300.0  # the autoscaler's scale-in check and the hosts-over-time sample


@dataclass
class Outcome:
    """What one policy did with the sessions: per cell, and the fleet's totals."""

    policy: str
    delays: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)
    busy_gpu_s: float = 0.0
    held_gpu_s: float = 0.0
    provisioned_gpu_s: float = 0.0
    peak_hosts: int = 0
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    leases: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # traced sessions


def simulate(sessions: list[Session], policy_name: str, costs: Costs, *,
             fleet: Fleet | None = None, traced: frozenset[int] = frozenset(),
             progress: Callable[[float], None] | None = None) -> Outcome:
    """Run every session under the policy `policy_name`; `progress` is told the simulated
    time at each tick; the sessions in `traced` keep their leases' (start, end) times."""
    fleet = fleet or Fleet(boot_s=costs.host_boot_s)
    policy = make(policy_name, costs, fleet)
    out = Outcome(policy_name)
    events: list[tuple[float, int, int, int]] = []
    seq = 0

    def push(time: float, kind: int, subject: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, seq, kind, subject))

    states = [SessionState(s) for s in sessions]
    for s in sessions:
        push(s.start_s, EXECUTE, s.index)
    booted = len(fleet.hosts)

    def placed(state: SessionState, asked: float) -> Callable[[int, float], None]:
        def run(host: int, now: float) -> None:
            cell = state.session.cells[state.next_cell]
            delay, path = policy.start(state, cell, host, now - asked)
            end = asked + delay + cell.run_s + policy.after_s(cell)
            out.delays.append(delay)
            out.waits.append(now - asked)
            out.paths[path] = out.paths.get(path, 0) + 1
            out.busy_gpu_s += cell.gpus * cell.run_s
            if policy.pinned and state.holding is None:
                state.holding, state.held_since = host, now
            elif not policy.pinned and state.session.index in traced:
                out.leases.setdefault(state.session.index, []).append((now, end))
            state.host = host
            push(end, END, state.session.index)
        return run

    horizon = max((s.start_s for s in sessions), default=0.0)
    next_tick = 0.0
    while events:
        time, _, kind, subject = heapq.heappop(events)
        while next_tick <= time:  # ticks are not events, so an idle fleet still ends
            fleet.advance(next_tick)
            fleet.scale_in()
            fleet.sample()
            if progress:
                progress(min(next_tick, horizon))
            next_tick += TICK_S
        fleet.advance(time)
        if kind == BOOTED:
            fleet.booted()
        elif kind == EXECUTE:
            state = states[subject]
            cell = state.session.cells[state.next_cell]
            if state.next_cell == 0:
                policy.opened(state)
            if state.holding is not None:
                placed(state, time)(state.holding, time)
            else:
                gpus = policy.gang(state, cell)
                fleet.ask(Request(gpus, time, policy.prefer(state), placed(state, time)))
        elif kind == END:
            state = states[subject]
            cell = state.session.cells[state.next_cell]
            state.next_cell += 1
            last = state.next_cell == len(state.session.cells)
            if not policy.pinned:
                fleet.release(state.host, cell.gpus)
            elif last:
                fleet.release(state.holding, state.session.max_gpus)
                if subject in traced:  # one lease, the whole session
                    out.leases[subject] = [(state.held_since, time)]
            if last:
                policy.closed(state)
            else:
                push(time + state.session.cells[state.next_cell].think_s, EXECUTE, subject)
        for host in fleet.hosts[booted:]:
            push(host.up_at, BOOTED, host.index)
        booted = len(fleet.hosts)
    fleet.sample()
    out.held_gpu_s = fleet.held_gpu_s
    out.provisioned_gpu_s = fleet.provisioned_gpu_s
    out.samples = fleet.samples
    out.peak_hosts = max((n for _, n, _ in fleet.samples), default=0)
    return out
