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
from .sessions import Cell, Session


@dataclass
class SessionState:
    session: Session
    next_cell: int = 0
    host: int | None = None  # where its previous cell ran (a warm or parked worker)
    holding: int | None = None  # pinned: the host whose GPUs it holds
    held_since: float = 0.0  # pinned: when it took them
    replicas: list[int] = field(default_factory=list)  # NotebookOS


class Policy:
    name = ""
    pinned = False

    def __init__(self, costs: Costs, fleet: Fleet) -> None:
        self.costs = costs
        self.fleet = fleet

    def gang(self, state: SessionState, cell: Cell) -> int:
        return cell.gpus

    def prefer(self, state: SessionState) -> tuple[int, ...]:
        return ()

    def opened(self, state: SessionState) -> None:
        """The session's first cell is about to ask for GPUs."""

    def closed(self, state: SessionState) -> None:
        """The session's last cell ended."""

    def start(self, state: SessionState, cell: Cell, host: int, wait_s: float) -> tuple[float, str]:
        raise NotImplementedError

    def after_s(self, cell: Cell) -> float:
        """Seconds the cell holds its GPUs after its run: its save, and parking its worker."""
        return self.costs.save_s(cell.training) + self.costs.park_s

    def _peer_gbps(self) -> float:
        return min(self.costs.load_gbps, self.costs.peer_gbps)


class Pinned(Policy):
    """Jupyter, Colab: the session holds its largest gang from its first cell to its last; cells
    start at once. Its kernel starts when the notebook opens, before the first cell, and is not
    counted against it."""

    name = "pinned"
    pinned = True

    def gang(self, state: SessionState, cell: Cell) -> int:
        return state.session.max_gpus

    def start(self, state: SessionState, cell: Cell, host: int, wait_s: float) -> tuple[float, str]:
        return wait_s, "pinned"

    def after_s(self, cell: Cell) -> float:
        return 0.0


class NotebookOS(Policy):
    """Three replicas of each kernel on distinct hosts hold its state in host memory; GPUs are
    bound only while a cell runs, on a replica's host that has them free (an election, then the
    device state copied in); otherwise a replica migrates to a host with free GPUs (a new kernel
    process loads the whole session from the store). Oversubscription: hosts are provisioned for
    the replicas' subscribed GPUs over the `subscription_limit` input, on top of the autoscaler's
    own spare. After a cell its device state is copied back off the GPU."""

    name = "notebookos"
    replicas = 3

    def __init__(self, costs: Costs, fleet: Fleet) -> None:
        super().__init__(costs, fleet)
        self.subscribed: dict[int, int] = {}  # host -> GPUs its replicas subscribe
        self.total = 0
        per_host = fleet.gpus_per_host * costs.subscription_limit
        fleet.min_hosts = lambda: int(-(-self.total // per_host))

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

    def start(self, state: SessionState, cell: Cell, host: int, wait_s: float) -> tuple[float, str]:
        copy_in = self.costs.gpu_gb / self.costs.h2d_gbps
        if host in state.replicas:
            return wait_s + self.costs.election_s + copy_in, "executor"
        if len(state.replicas) < self.replicas:  # a replica that found no host at open
            self.total -= state.session.max_gpus
        else:  # migrate: the replica on the fullest (or a released) host moves to this one
            out = max(state.replicas, key=lambda h: (not self.fleet.hosts[h].alive,
                                                     self.subscribed.get(h, 0)))
            self._subscribe(state, out, -1)
            state.replicas.remove(out)
        state.replicas.append(host)
        self._subscribe(state, host, 1)
        return wait_s + self.costs.cold_kernel_s(self._peer_gbps()) + copy_in, "migrated"


class Fresh(Policy):
    """LooseLeaf: every cell on a fresh worker from a template, its closure loaded from the store
    after the execute arrives, nothing prepared ahead."""

    name = "fresh"

    def start(self, state: SessionState, cell: Cell, host: int, wait_s: float) -> tuple[float, str]:
        prepare = self.costs.fresh_s(self._peer_gbps())
        return wait_s + prepare + self.costs.staged_s, "fresh"

    def after_s(self, cell: Cell) -> float:
        return self.costs.save_s(cell.training)  # the worker exits: nothing to park


class LLFabric(Policy):
    """The next cell's draft prepares a worker during think time on the host of the previous
    cell (template, closure loaded, tensors staged); a parked warm worker is resumed instead
    where that is quicker; a cell placed on another host loads its closure there."""

    name = "llfabric"
    keep_warm_s = 300.0  # the server's keep_warm default

    def prefer(self, state: SessionState) -> tuple[int, ...]:
        alive = state.host is not None and self.fleet.hosts[state.host].alive
        return (state.host,) if alive else ()

    def start(self, state: SessionState, cell: Cell, host: int, wait_s: float) -> tuple[float, str]:
        drafted_here = (state.host is None or not self.fleet.hosts[state.host].alive
                        or host == state.host)
        local = state.host == host
        prepare = self.costs.fresh_s(self.costs.load_gbps if local else self._peer_gbps())
        hidden = cell.think_s + wait_s if drafted_here else 0.0  # a draft runs on while it waits
        fresh = max(0.0, prepare - hidden) + self.costs.staged_s
        warm = local and cell.think_s <= self.keep_warm_s
        if warm and self.costs.resume_s < fresh:
            return wait_s + self.costs.resume_s, "warm"
        path = "draft" if prepare <= hidden else ("late draft" if drafted_here else "moved")
        return wait_s + fresh, path


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Pinned, NotebookOS, Fresh, LLFabric)}
NAMES = tuple(POLICIES)


def make(name: str, costs: Costs, fleet: Fleet) -> Policy:
    return POLICIES[name](costs, fleet)


def describe() -> dict[str, str]:
    """Each policy's description, one paragraph."""
    return {name: " ".join((p.__doc__ or "").split()) for name, p in POLICIES.items()}
