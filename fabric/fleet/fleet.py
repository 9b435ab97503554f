"""A fleet of identical GPU hosts: gang leases on one host, an autoscaler, and the accounting.

Every policy runs on this same fleet, so they differ only in how long they hold GPUs and what a
cell waits for. The autoscaler keeps `spare_gpus` free GPUs ready (booting a host takes
`boot_s`), boots hosts for requests that wait, and releases a host that has been idle for
`idle_release_s` when the spare stays covered without it. GPU-hours provisioned are the GPUs of
every host from its boot to its release; held are GPUs leased to sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass
class FleetHost:
    index: int
    free: int
    up_at: float  # when it can take leases
    idle_since: float | None  # when its last lease ended; None while any is held
    alive: bool = True
    taken_at: float = 0.0  # when a lease last took some of its GPUs


@dataclass
class GangRequest:
    """A gang of `gpus` GPUs on one host; `prefer` are hosts to try first, in order."""

    gpus: int
    asked_at: float
    prefer: tuple[int, ...]
    on_place: Callable[[int, float], None]  # (host, time)


@dataclass
class Fleet:
    gpus_per_host: int = 8
    spare_gpus: int = 8
    boot_s: float = 120.0
    idle_release_s: float = 600.0
    min_hosts: Callable[[], int] = lambda: 0  # a policy's own floor (NotebookOS: subscriptions)
    max_hosts: int | None = None  # a fixed machine (a live replay's): never more hosts
    hosts: list[FleetHost] = field(default_factory=list)  # every host ever booted, by index
    up: list[FleetHost] = field(default_factory=list)  # those not released: what each event scans
    queue: list[GangRequest] = field(default_factory=list)
    now: float = 0.0
    provisioned_gpu_s: float = 0.0
    held_gpu_s: float = 0.0
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, hosts, held GPUs)
    _live_gpus: int = 0
    _held: int = 0

    def advance(self, now: float) -> None:
        """Account GPU time up to `now` (events come in time order)."""
        span = now - self.now
        self.provisioned_gpu_s += span * self._live_gpus
        self.held_gpu_s += span * self._held
        self.now = now

    @property
    def held_gpus(self) -> int:
        return self._held

    def live(self) -> Iterable[FleetHost]:
        return iter(self.up)

    def _boot(self) -> FleetHost:
        host = FleetHost(len(self.hosts), self.gpus_per_host, self.now + self.boot_s, self.now)
        self.hosts.append(host)
        self.up.append(host)
        self._live_gpus += self.gpus_per_host
        return host

    def fits(self, host: int, gpus: int) -> bool:
        h = self.hosts[host]
        return h.alive and h.up_at <= self.now and h.free >= gpus

    def _choose(self, request: GangRequest) -> FleetHost | None:
        for index in request.prefer:
            if self.fits(index, request.gpus):
                return self.hosts[index]
        # best fit: the fullest host that fits keeps whole hosts free for 8-GPU gangs
        ready = [h for h in self.live() if h.up_at <= self.now and h.free >= request.gpus]
        return min(ready, key=lambda h: (h.free, h.index)) if ready else None

    def ask(self, request: GangRequest) -> None:
        self.queue.append(request)
        self.place_waiting()

    def release(self, host: int, gpus: int) -> None:
        h = self.hosts[host]
        h.free += gpus
        self._held -= gpus
        if h.free == self.gpus_per_host:
            h.idle_since = self.now
        self.place_waiting()

    def place_waiting(self) -> None:
        """Place every waiting request that fits, oldest first (a smaller one may pass a larger
        one that fits nowhere yet), then boot hosts for what still waits and for the spare."""
        waiting = []
        for request in self.queue:
            host = self._choose(request)
            if host is None:
                waiting.append(request)
                continue
            host.free -= request.gpus
            host.idle_since = None
            host.taken_at = self.now
            self._held += request.gpus
            request.on_place(host.index, self.now)
        self.queue = waiting
        self._scale_out()

    def _scale_out(self) -> None:
        booting = [h for h in self.live() if h.up_at > self.now]
        unmet = sum(r.gpus for r in self.queue) - sum(h.free for h in booting)
        free_ready = sum(h.free for h in self.live() if h.up_at <= self.now)
        spare_short = self.spare_gpus - free_ready - sum(h.free for h in booting)
        need = max(unmet, spare_short, 0)
        hosts = len(self.up)
        boots = max(-(-need // self.gpus_per_host), self.min_hosts() - hosts, 0)
        if self.max_hosts is not None:
            boots = min(boots, self.max_hosts - hosts)
        for _ in range(boots):
            self._boot()

    def booted(self) -> None:
        """A booting host came up: place what waits."""
        self.place_waiting()

    def scale_in(self) -> None:
        """Release idle hosts the spare does not need."""
        free = sum(h.free for h in self.live())
        floor = self.min_hosts()
        count = len(self.up)
        for h in sorted(self.up, key=lambda h: -h.index):
            if (h.idle_since is not None and h.up_at <= self.now
                    and self.now - h.idle_since >= self.idle_release_s
                    and free - self.gpus_per_host >= self.spare_gpus and count > floor
                    and not self.queue):
                h.alive = False
                self.up.remove(h)
                free -= self.gpus_per_host
                count -= 1
                self._live_gpus -= self.gpus_per_host

    def sample(self) -> None:
        self.samples.append((self.now, len(self.up), self._held))
