"""The policies compared, each a rule for what a cell waits for and how long it holds GPUs.

All run on the same fleet (`fabric.fleet.fleet`) and the same sessions; `start` returns a cell's
visible delay (from execute to its user code running, queue wait included) and its path, with
the GPUs held from placement until the cell's run and `after_s` have passed. Each policy's
docstring is its description in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .costs import Costs
from .fleet import Fleet
from .sessions import ModelledCell, ModelledSession


@dataclass
class SessionState:
    session: ModelledSession
    next_cell: int = 0
    host: int | None = None  # where its previous cell ran (a warm or parked worker)
    holding: int | None = None  # reservation: the host whose GPUs it holds
    held_since: float = 0.0  # reservation: when it took them
    asking: bool = False  # reservation: its gang is asked for and not yet placed
    executed_at: float | None = None  # reservation: a cell waits for the gang since then
    reclaim_at: float | None = None  # reservation: its idle GPUs are taken back then
    reclaimed: bool = False  # reservation: its kernel and state are gone
    kept: tuple[int, int] | None = None  # (host, GPUs) its lingering worker keeps for it
    rebuild_s: float = 0.0  # the run time of the cells that built its state
    replicas: list[int] = field(default_factory=list)  # NotebookOS


class Policy:
    name = ""
    pinned = False  # holds a gang for the session, not per cell
    padded = True  # a pinned session's open and close are the session model's
    idle_timeout_s: float | None = None  # a pinned session's idle GPUs are taken back after it
    linger_s = 0.0  # a worker keeps its GPUs this long after its cell, for the next one

    def __init__(self, costs: Costs, fleet: Fleet) -> None:
        self.costs = costs
        self.fleet = fleet
        self._cpu_costs = costs.with_inputs(cuda_init_s=0.0, cuda_restore_s=0.0, gpu_gb=0.0)

    def costs_for(self, cell: ModelledCell) -> Costs:
        """A cell on no GPU makes no CUDA context and moves no device memory."""
        return self.costs if cell.gpus else self._cpu_costs

    def gang(self, state: SessionState, cell: ModelledCell) -> int:
        return cell.gpus

    def prefer(self, state: SessionState) -> tuple[int, ...]:
        return ()

    def opened(self, state: SessionState) -> None:
        """The session's notebook opened."""

    def closed(self, state: SessionState) -> None:
        """The session's notebook closed."""

    def start(self, state: SessionState, cell: ModelledCell, host: int, wait_s: float
              ) -> tuple[float, str]:
        raise NotImplementedError

    def after_s(self, cell: ModelledCell) -> float:
        """Seconds the cell holds its GPUs after its run: its save, and parking its worker."""
        costs = self.costs_for(cell)
        return costs.save_s(cell.training) + costs.park_s

    def _peer_gbps(self) -> float:
        return min(self.costs.load_gbps, self.costs.peer_gbps)


class Reservation(Policy):
    """Jupyter, Colab, NotebookOS's reservation policy: the session holds its largest gang from
    the moment its notebook opens until it is closed ("for the duration of the lifetime of the
    associated user session", NotebookOS); cells start at once. Open and close come from the
    session model."""

    name = "reservation"
    pinned = True

    def start(self, state: SessionState, cell: ModelledCell, host: int, wait_s: float
              ) -> tuple[float, str]:
        if state.reclaimed:  # a new kernel, then the cells that built the state run again
            state.reclaimed = False
            return wait_s + self.costs_for(cell).restart_s + state.rebuild_s, "reclaimed"
        return wait_s, "pinned"

    def after_s(self, cell: ModelledCell) -> float:
        return 0.0


class ReservationSpan(Reservation):
    """A lower bound of reservation, not a platform: the session holds its largest gang only from
    its first cell to the end of its last, as though the notebook opened and closed exactly
    then."""

    name = "reservation-span"
    padded = False


class Reclaim30(Reservation):
    """Reservation with idle reclamation after 30 minutes (Adobe's setting, one of NotebookOS's
    idle-reclamation variants): GPUs stay held until 30 idle minutes pass; the next cell then
    waits for a new kernel and re-runs the cells that built its state (the last training and
    the cells after it)."""

    name = "reclaim-30m"
    idle_timeout_s = 30 * 60.0


class Reclaim90(Reclaim30):
    """As reclaim-30m, after 90 idle minutes (Colab's shorter setting, per NotebookOS)."""

    name = "reclaim-90m"
    idle_timeout_s = 90 * 60.0


class Reclaim180(Reclaim30):
    """As reclaim-30m, after 180 idle minutes (Colab's longer setting, per NotebookOS)."""

    name = "reclaim-180m"
    idle_timeout_s = 180 * 60.0


class NotebookOS(Policy):
    """NotebookOS as its authors configure it: `replicas` replicas of each kernel on distinct
    hosts hold its state in host memory from the notebook's open to its close; GPUs are bound
    only while a cell runs, on a replica's host that has them free (an election, then the device
    state copied in); otherwise a replica migrates to a host with free GPUs (a new kernel process
    loads the whole session from the store). The fleet keeps enough hosts for the replicas'
    subscribed GPUs at `subscribed_ratio` per physical GPU, and for the GPUs bound to running
    cells times `scaling_factor`, plus `buffer_hosts` idle hosts. After a cell its device state
    is copied back off the GPU."""

    name = "notebookos"

    def __init__(self, costs: Costs, fleet: Fleet) -> None:
        super().__init__(costs, fleet)
        self.replicas = int(costs.replicas)
        self.subscribed: dict[int, int] = {}  # host -> GPUs its replicas subscribe
        self.total = 0
        per_host = fleet.gpus_per_host
        fleet.spare_gpus = 0  # its buffer hosts stand in for the fleet's spare

        def need() -> int:
            by_subscription = -(-self.total // (per_host * costs.subscribed_ratio))
            by_commitment = -(-fleet.held_gpus * costs.scaling_factor // per_host)
            return int(max(by_subscription, by_commitment) + costs.buffer_hosts)

        fleet.min_hosts = need

    def _subscribe(self, state: SessionState, host: int, sign: int) -> None:
        gpus = sign * state.session.max_gpus
        self.subscribed[host] = self.subscribed.get(host, 0) + gpus
        self.total += gpus

    def opened(self, state: SessionState) -> None:
        hosts = sorted(self.fleet.live(), key=lambda h: (self.subscribed.get(h.index, 0), h.index))
        for h in hosts[:self.replicas]:
            state.replicas.append(h.index)
            self._subscribe(state, h.index, 1)
        # hosts that cannot take the replicas yet (too few): the subscriptions still count
        self.total += (self.replicas - len(state.replicas)) * state.session.max_gpus

    def closed(self, state: SessionState) -> None:
        for host in state.replicas:
            self._subscribe(state, host, -1)
        self.total -= (self.replicas - len(state.replicas)) * state.session.max_gpus

    def prefer(self, state: SessionState) -> tuple[int, ...]:
        return tuple(h for h in state.replicas if self.fleet.hosts[h].alive)

    def start(self, state: SessionState, cell: ModelledCell, host: int, wait_s: float
              ) -> tuple[float, str]:
        costs = self.costs_for(cell)
        copy_in = costs.gpu_gb / costs.h2d_gbps
        if host in state.replicas:
            return wait_s + costs.election_s + copy_in, "executor"
        if len(state.replicas) < self.replicas:  # a replica that found no host at open
            self.total -= state.session.max_gpus
        else:  # migrate: the replica on the fullest (or a released) host moves to this one
            out = max(state.replicas, key=lambda h: (not self.fleet.hosts[h].alive,
                                                     self.subscribed.get(h, 0)))
            self._subscribe(state, out, -1)
            state.replicas.remove(out)
        state.replicas.append(host)
        self._subscribe(state, host, 1)
        return wait_s + costs.cold_kernel_s(self._peer_gbps()) + copy_in, "migrated"

    def after_s(self, cell: ModelledCell) -> float:
        costs = self.costs_for(cell)
        return costs.save_s(cell.training) + costs.gpu_gb / costs.h2d_gbps


class Fresh(Policy):
    """LooseLeaf: every cell on a fresh worker from a template, its closure loaded from the store
    after the execute arrives, nothing prepared ahead."""

    name = "fresh"

    def start(self, state: SessionState, cell: ModelledCell, host: int, wait_s: float
              ) -> tuple[float, str]:
        costs = self.costs_for(cell)
        return wait_s + costs.fresh_s(self._peer_gbps()) + costs.staged_s, "fresh"

    def after_s(self, cell: ModelledCell) -> float:
        return self.costs.save_s(cell.training)  # the worker exits: nothing to park


class LLFabric(Policy):
    """After a cell its worker keeps its GPUs for `linger_s`: a next cell of the same size
    executed meanwhile starts on it at once; otherwise (the time is up, any request waits for
    GPUs, or the next cell needs another number of them) the worker is parked and its GPUs go
    back. The next cell's draft prepares a worker during think time on the host of
    the previous cell (template, closure loaded, tensors staged); a parked warm worker is
    resumed instead where that is quicker. When the scheduler gives the GPUs of a draft's host
    to another lease, the draft is made again on a host with room, where the cell then starts
    (modelled: hidden from the moment that host's GPUs were last taken); a cell placed on
    another host without one loads its closure there."""

    name = "llfabric"
    keep_warm_s = 300.0  # the server's keep_warm default

    def __init__(self, costs: Costs, fleet: Fleet) -> None:
        super().__init__(costs, fleet)
        self.linger_s = costs.linger_s

    def prefer(self, state: SessionState) -> tuple[int, ...]:
        if state.host is not None and self.fleet.hosts[state.host].alive:
            return (state.host,)
        return ()

    def start(self, state: SessionState, cell: ModelledCell, host: int, wait_s: float
              ) -> tuple[float, str]:
        costs = self.costs_for(cell)
        if state.kept is not None:
            state.kept = None
            return wait_s + costs.warm_ready_s, "lingered"
        previous = None if state.host is None else self.fleet.hosts[state.host]
        drafted_here = previous is None or not previous.alive or host == state.host
        local = state.host == host
        prepare = costs.fresh_s(costs.load_gbps if local else self._peer_gbps())
        hidden = cell.think_s + wait_s  # a draft runs on while it waits
        if previous is not None and not drafted_here:
            # drafted again elsewhere once its host's GPUs were given away
            hidden = min(hidden, self.fleet.now - previous.taken_at)
        fresh = max(0.0, prepare - hidden) + costs.staged_s
        warm = local and cell.think_s <= self.keep_warm_s
        if warm and costs.resume_s < fresh:
            return wait_s + costs.resume_s, "warm"
        if prepare <= hidden:
            return wait_s + fresh, "draft" if drafted_here else "redrafted"
        return wait_s + fresh, "late draft" if drafted_here else "moved"

    def after_s(self, cell: ModelledCell) -> float:
        if self.linger_s > 0:  # parked after it lingers (`simulate`)
            return self.costs.save_s(cell.training)
        return super().after_s(cell)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (
    Reservation, ReservationSpan, Reclaim30, Reclaim90, Reclaim180, NotebookOS, Fresh, LLFabric)}
NAMES = tuple(POLICIES)


def make(name: str, costs: Costs, fleet: Fleet) -> Policy:
    return POLICIES[name](costs, fleet)


def describe() -> dict[str, str]:
    """Each policy's description, one paragraph."""
    return {name: " ".join((p.__doc__ or "").split()) for name, p in POLICIES.items()}
