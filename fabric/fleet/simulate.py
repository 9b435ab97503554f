"""The discrete-event loop: sessions' cells over a fleet, under one policy.

Sessions are closed loops: a cell is executed its think time after the previous one ended, so a
delay pushes the rest of the session later, as it would a user. A session opens its `before_s`
before its first cell and closes its `after_s` after its last ends; a pinned policy holds its
gang from open to close (or, with an idle timeout, until that much idle time passed). A
lingering worker (`Policy.linger_s`) keeps its GPUs after its cell, as the server's `linger`
does: its session's next cell of the same size starts on them; when the linger ends, when any
request waits for GPUs, or when a next cell of another size comes, it is parked and then its
GPUs go back; when its session closes they go back at once. Events are kept in a heap by time;
ties keep the order they were pushed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from .costs import Costs
from .fleet import Fleet, GangRequest
from .policies import SessionState, make
from .sessions import ModelledSession

OPEN, EXECUTE, END, BOOTED, RECLAIM, CLOSE, RELEASE, LINGERED = range(8)
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


def simulate(sessions: list[ModelledSession], policy_name: str, costs: Costs, *,
             fleet: Fleet | None = None, traced: frozenset[int] = frozenset(),
             progress: Callable[[float], None] | None = None) -> Outcome:
    """Run every session under the policy `policy_name`; `progress` is told the simulated
    time at each tick; the sessions in `traced` keep their leases' (start, end) times."""
    fleet = fleet or Fleet(gpus_per_host=int(costs.gpus_per_host), boot_s=costs.host_boot_s)
    policy = make(policy_name, costs, fleet)
    out = Outcome(policy_name)
    events: list[tuple[float, int, int, int]] = []
    seq = 0

    def push(time: float, kind: int, subject: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, seq, kind, subject))

    states = [SessionState(s) for s in sessions]
    parking: list[tuple[int, int]] = []  # (host, GPUs) of workers parked after lingering
    lingering: dict[int, float] = {}  # sessions whose worker keeps its GPUs now: until when
    for s in sessions:
        # a session open before the trace began is counted from its start
        push(max(0.0, s.start_s - (s.before_s if policy.padded else 0.0)), OPEN, s.index)
        push(s.start_s, EXECUTE, s.index)
    booted = len(fleet.hosts)

    def run_cell(state: SessionState, host: int, now: float, asked: float) -> None:
        cell = state.session.cells[state.next_cell]
        delay, path = policy.start(state, cell, host, now - asked)
        end = asked + delay + cell.run_s + policy.after_s(cell)
        out.delays.append(delay)
        out.waits.append(now - asked)
        out.paths[path] = out.paths.get(path, 0) + 1
        out.busy_gpu_s += cell.gpus * cell.run_s
        if not policy.pinned and state.session.index in traced:
            out.leases.setdefault(state.session.index, []).append((now, end))
        state.host = host
        push(end, END, state.session.index)

    def let_go(state: SessionState, time: float) -> None:
        """The lingering worker is parked, then its GPUs go back."""
        assert state.kept is not None, "only a lingering worker is let go"
        host, gpus = state.kept
        state.kept = None
        del lingering[state.session.index]
        parking.append((host, gpus))
        cell = state.session.cells[state.next_cell - 1]  # the cell it lingers after
        push(time + policy.costs_for(cell).park_s, RELEASE, len(parking) - 1)

    def placed(state: SessionState, asked: float) -> Callable[[int, float], None]:
        return lambda host, now: run_cell(state, host, now, asked)

    def took(state: SessionState) -> Callable[[int, float], None]:
        """A pinned session's gang placed: the cell waiting for it, if any, starts."""
        def hold(host: int, now: float) -> None:
            state.holding, state.held_since, state.asking = host, now, False
            if state.executed_at is not None:
                asked, state.executed_at = state.executed_at, None
                run_cell(state, host, now, asked)
        return hold

    def ask_gang(state: SessionState, time: float) -> None:
        state.asking = True
        fleet.ask(GangRequest(state.session.max_gpus, time, (), took(state)))

    def release_gang(state: SessionState, time: float) -> None:
        assert state.holding is not None, "only a held gang is released"
        fleet.release(state.holding, state.session.max_gpus)
        if state.session.index in traced:
            out.leases.setdefault(state.session.index, []).append((state.held_since, time))
        state.holding = None

    def on_session(state: SessionState, kind: int, subject: int, time: float) -> None:
        """What an event of a session does to it and to the fleet."""
        if kind == OPEN:
            policy.opened(state)
            if policy.pinned:
                ask_gang(state, time)
        elif kind == EXECUTE:
            cell = state.session.cells[state.next_cell]
            state.reclaim_at = None
            if state.kept is not None and state.kept[1] == cell.gpus:  # the lease passes on
                del lingering[subject]
                run_cell(state, state.kept[0], time, time)
            elif state.kept is not None:  # a worker parked off other GPUs than it asks for
                let_go(state, time)
                fleet.ask(GangRequest(policy.gang(state, cell), time, policy.prefer(state),
                                      placed(state, time)))
            elif not policy.pinned:
                fleet.ask(GangRequest(policy.gang(state, cell), time, policy.prefer(state),
                                      placed(state, time)))
            elif state.holding is not None:
                run_cell(state, state.holding, time, time)
            else:  # its gang is on the way, or was reclaimed
                state.executed_at = time
                if not state.asking:
                    ask_gang(state, time)
        elif kind == END:
            cell = state.session.cells[state.next_cell]
            state.rebuild_s = cell.run_s + (0.0 if cell.training else state.rebuild_s)
            state.next_cell += 1
            last = state.next_cell == len(state.session.cells)
            assert state.host is not None, "the cell that ended ran on a host"
            if not policy.pinned and policy.linger_s > 0:
                state.kept = (state.host, cell.gpus)
                lingering[subject] = time + policy.linger_s
                push(lingering[subject], LINGERED, subject)
            elif not policy.pinned:
                fleet.release(state.host, cell.gpus)
            timeout = policy.idle_timeout_s
            if last:
                after = state.session.after_s if policy.padded else 0.0
                push(time + min(after, timeout if timeout is not None else after), CLOSE, subject)
            else:
                push(time + state.session.cells[state.next_cell].think_s, EXECUTE, subject)
                if timeout is not None:
                    state.reclaim_at = time + timeout
                    push(state.reclaim_at, RECLAIM, subject)
        elif kind == LINGERED:  # its linger is over, unless a next cell took the GPUs since
            if lingering.get(subject) == time:
                let_go(state, time)
        elif kind == RECLAIM:
            if state.reclaim_at == time and state.holding is not None:
                release_gang(state, time)
                state.reclaimed = True
        elif kind == CLOSE:
            if state.holding is not None:
                release_gang(state, time)
            if state.kept is not None:  # its worker retired with it: nothing to park
                fleet.release(*state.kept)
                state.kept = None
                del lingering[subject]
            policy.closed(state)

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
        elif kind == RELEASE:
            fleet.release(*parking[subject])
        else:
            on_session(states[subject], kind, subject, time)
        if fleet.queue:  # a request waits: no lingering worker keeps it waiting
            for index in sorted(lingering):
                let_go(states[index], time)
        for host in fleet.hosts[booted:]:
            push(host.up_at, BOOTED, host.index)
        booted = len(fleet.hosts)
    fleet.sample()
    out.held_gpu_s = fleet.held_gpu_s
    out.provisioned_gpu_s = fleet.provisioned_gpu_s
    out.samples = fleet.samples
    out.peak_hosts = max((n for _, n, _ in fleet.samples), default=0)
    return out
