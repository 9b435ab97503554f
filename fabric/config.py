"""One configuration object: defaults, then ``llfabric.toml``, then ``LLFABRIC_*``, then flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .output_limit import OUTPUT_LIMIT

if TYPE_CHECKING:
    from .snapshot.remote import Remote
    from .snapshot.retention import RetentionPolicy


def _data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def _config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def _runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    return Path(base) / "llfabric" if base else Path("/tmp") / f"llfabric-{os.getuid()}"


GPU_LINGER = 60  # seconds a GPU host's lease lingers by default: what `llfabric simulate` models


@dataclass(frozen=True)
class Config:
    # the store: every session's committed state and its history of versions
    store: Path = field(default_factory=lambda: _data_home() / "llfabric")
    # the server's socket (with bind empty) and lock; $XDG_RUNTIME_DIR/llfabric, else
    # /tmp/llfabric-UID
    runtime_dir: Path = field(default_factory=_runtime_dir)
    bind: str = ""  # empty: ipc:// socket in runtime_dir
    slots: int = 0  # CPU lease slots on hosts without GPUs; 0: one per core
    # intra-op threads (torch, OpenMP, BLAS) of a worker under a lease; 0: cores // slots
    threads: int = 0
    # slots (GPUs) a session's cells lease together unless it sets its own (`%llfabric gpus`,
    # `llfabric run --gpus`, the notebook's metadata)
    gpus: int = 1
    max_zygotes: int = 4  # import-family zygotes kept, least recently used evicted
    zygote_memory: int = 0  # bytes those zygotes may hold, LRU evicted past it; 0: 1/4 of RAM
    # where fresh workers come from: zygote forks, template restores (CRIU; CPU hosts only, as
    # CUDA cannot initialize in a template copy's PID namespace), or auto: zygote forks
    worker_source: str = "auto"
    # seconds a session's worker stays warm (parked off the GPU) after its cell, so the next
    # runs on it with no load; 0: every cell starts on a fresh worker loaded with its closure
    keep_warm: int = 300
    # seconds a kept worker stays on its lease (GPU or CPU slot) after its cell, so a next cell
    # meanwhile starts at once with no resume; given back at once when another session's cell
    # waits for slots. 0: parked and the lease given back as soon as the cell is saved; below
    # 0, the default: GPU_LINGER on a GPU host, 0 on CPU slots
    linger: int = -1
    cool_after: int = 600  # seconds a pinned worker idles before it is dumped to disk
    # percent of memory in use (the host's, or its cgroup's limit where the server runs in a
    # cgroup v2 that sets one) at which memory is short: kept workers leave one at a time, least
    # likely to run next and cheapest to rebuild first (warm ones retire, pinned ones are dumped
    # to disk, never dropped), until it is below memory_relief
    memory_pressure: int = 90
    # percent in use below which memory is short no more; 0: 10 points under memory_pressure
    memory_relief: int = 0
    # percent of time tasks stall waiting for memory (the kernel's PSI, over 10 s) at which
    # memory is short too, until below half of it; the kernel wakes the server as it starts. 0:
    # stalls are not read
    memory_stall: int = 10
    # bytes of memory (PSS: pages they share with zygotes or each other count once) all kept
    # workers together may hold; past it they leave as under memory_pressure until they hold
    # less. 0: no limit
    kept_memory: int = 0
    # bytes of memory (PSS) one user's workers, kept and running, may hold: past it their kept
    # workers leave first (as under memory_pressure), and a cell of theirs is refused while
    # their workers still hold as much. 0: no limit
    user_memory: int = 0
    max_frame: int = 16 * 1024 * 1024  # bytes of one message a client may send the server
    # CURVE keys: the server's pair, the admitted clients' public keys, this client's key
    key_dir: Path = field(default_factory=lambda: _config_home() / "llfabric")
    user_sessions: int = 0  # sessions one user may have open at once; 0: no limit
    user_cells: int = 0  # cells one user may run (hold or wait for a lease) at once; 0: no limit
    # bytes of memory one worker's processes may use (its cgroup's limit; past it the kernel
    # kills them and the cell is told it ran out of memory); 0: no limit
    worker_memory: int = 0
    user_pids: int = 0  # processes all of one user's workers may hold at once; 0: no limit
    # seconds a cell may run on after an interrupt before its worker is killed (its lease back)
    interrupt_grace: int = 5
    # seconds a worker may spend pickling one group (its objects' own code, `__reduce__`, runs
    # then) before the group is left unsaved, held by the worker as a value that cannot be; 0:
    # no limit
    save_limit: int = 60
    # 1: a save learns what a cell changed without reading it all again: which chunks of large
    # buffers it wrote, from the kernel (Linux 6.7+: userfaultfd write-protect, PAGEMAP_SCAN;
    # elsewhere they are hashed), and that plain data (builtin containers and atoms) did not
    # change, from a fingerprint, unpickled. 0: every group a cell may have changed is pickled
    # and hashed whole
    track_writes: int = 1
    # seconds between heartbeats to each client (ZMTP pings, answered by its libzmq); a client
    # silent for heartbeat_timeout seconds, or gone, has left its running cell. 0: off
    heartbeat: int = 2
    heartbeat_timeout: int = 10
    # seconds a cell whose client left runs on, its outputs kept for a client that follows it
    # (a kernel started again); then it is stopped, its lease back. 0: stopped at once
    detached_grace: int = 3600
    # bytes of a cell's outputs kept and sent to clients; what is past them is summarised
    output_limit: int = OUTPUT_LIMIT
    metrics_bind: str = ""  # HOST:PORT where Prometheus scrapes /metrics; empty: not served
    user_bytes: int = 0  # state bytes of one user's sessions (their heads) past which no cell runs
    # "single": every cell runs as the server's user (a laptop, CI); "separate": each user's
    # cells run as their OS user, their state in their own part of the store (`fabric.users`)
    users: str = "single"
    # the environment variables workers get of the server's (`fabric.pool.environ`): NAME (its
    # value), NAME=VALUE, * (all), separated by spaces or commas; empty: all with users =
    # "single", none with "separate"
    worker_env: str = ""
    # retention: each session keeps the state of its newest keep_versions versions, of one
    # version per clock hour for keep_hourly hours and one per day for keep_daily days, and of
    # every named one (`llfabric store tag`); a session may set its own (`store retain`)
    keep_versions: int = 20
    keep_hourly: int = 24
    keep_daily: int = 7
    # the server thins histories and collects garbage after cells commit, and every
    # gc_interval seconds besides (0: only after commits)
    gc_interval: int = 300
    disk_pressure: int = 90  # percent of the store's disk in use past which operators are told
    envs: str = ""  # the folder of users' environments (`llfabric env`); empty: the store's envs
    # an fsspec URL (a shared folder, s3://...) where every commit is kept too, and where a
    # host whose disk lacks a session's state finds it; empty: this host's disk alone
    remote: str = ""
    # when a commit counts as durable with a remote: "commit", once the remote holds its blobs,
    # manifest and head (a remote that fails, is full or does not answer fails the cell, which
    # is told so, and nothing of it is committed; hosts sharing a remote need this); "behind",
    # once this host's disk holds it: the remote is filled behind (`fabric.snapshot.behind`),
    # its backlog in status and metrics, retried until sent, a restart included
    remote_writes: str = "commit"
    remote_timeout: int = 60  # seconds one call to the remote may take before it has failed
    # a cluster's host: where it serves its blobs to its peers, and the file naming them and
    # the key they share (`fabric.cluster.peers`; its host agent sets both); empty: no peers
    peer_bind: str = ""
    peers: str = ""
    # a cluster without a remote tier: the hosts, the committing one included, each commit is
    # kept on before its cell is reported done (a remote tier holds every commit itself)
    copies: int = 2
    # the store's tiers, nearest first: reads are sourced in this order (`fabric.snapshot.layers`:
    # a kind of its own, or module:factory); those left unconfigured (no remote, no peers) are out
    tiers: str = "memory,disk,peer,remote"
    # many hosts: the Ray cluster to serve (an address, or auto); empty: this host alone
    ray: str = ""
    # sessions per slot a cluster's host takes before its cells queue cluster-wide; 0: 7
    oversubscribe: int = 0
    # seconds a cluster's host stays with no session and no cell before it is released (its
    # agent stopped, for the autoscaler to take its node back); 0: never
    idle_release: int = 0
    # where a cluster places cells: locality (`fabric.cluster.placement`), or random (a baseline)
    placement: str = "locality"

    def __post_init__(self) -> None:
        _check_memory(self)
        if self.track_writes not in (0, 1):
            raise ConfigError(f"track_writes is {self.track_writes}: 1 (on) or 0 (off)",
                              key="track_writes")

    @property
    def env_root(self) -> Path:
        return Path(self.envs).expanduser() if self.envs else self.store / "envs"

    @property
    def address(self) -> str:
        return self.bind or f"ipc://{self.runtime_dir / 'server.sock'}"

    @property
    def remote_tier(self) -> Remote | str:
        """The remote as the store takes it (`fabric.snapshot.remote.Remote`); "": none."""
        if not self.remote:
            return ""
        if self.remote_writes not in ("commit", "behind"):
            raise ConfigError(f"remote_writes is {self.remote_writes!r}: \"commit\" or "
                              "\"behind\"", key="remote_writes")
        if self.remote_timeout < 1:
            raise ConfigError("remote_timeout is at least 1 second", key="remote_timeout")
        from .snapshot.remote import Remote  # the store's code, loaded only by its users

        return Remote(self.remote, self.remote_timeout, self.remote_writes == "behind")

    @property
    def policy(self) -> RetentionPolicy:
        """The retention policy: keep_versions, keep_hourly, keep_daily."""
        # the store's code, loaded only by its users
        from .snapshot.retention import RetentionPolicy

        return RetentionPolicy(self.keep_versions, self.keep_hourly, self.keep_daily)

    def with_overrides(self, **values: Any) -> Config:
        """Apply the non-None values (CLI flags), converting types as declared."""
        return replace(self, **_convert({k: v for k, v in values.items() if v is not None}))


def _check_memory(config: Config) -> None:
    """Memory settings that could not work are refused, naming the setting."""
    percents = {"memory_pressure": (1, config.memory_pressure),
                "memory_relief": (0, config.memory_relief),
                "memory_stall": (0, config.memory_stall)}
    for key, (least, value) in percents.items():
        if not least <= value <= 100:
            raise ConfigError(f"{key} is {value}: a percent, {least} to 100", key=key)
    if config.memory_relief >= config.memory_pressure:
        raise ConfigError(f"memory_relief is {config.memory_relief}: memory pressure must end "
                          f"below where it begins (memory_pressure = {config.memory_pressure})",
                          key="memory_relief")
    for key in ("kept_memory", "user_memory"):
        if getattr(config, key) < 0:
            raise ConfigError(f"{key} is {getattr(config, key)}: bytes, or 0 for no limit",
                              key=key)


def _convert(values: dict[str, Any]) -> dict[str, Any]:
    types = {f.name: f.type for f in fields(Config)}
    out = {}
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"unknown configuration key {key!r}", key=key)
        kind = types[key]
        try:
            out[key] = Path(value).expanduser() if kind == "Path" else (
                int(value) if kind == "int" else str(value)
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"configuration {key}={value!r} is not a valid {kind}",
                              key=key) from exc
    return out


def load(path: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Defaults, overlaid with the config file (if any) and ``LLFABRIC_*`` variables."""
    env = os.environ if env is None else env
    path = path or (Path(env["LLFABRIC_CONFIG"]) if "LLFABRIC_CONFIG" in env else None)
    path = path or Path("llfabric.toml")
    config = Config()
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}", path=str(path)) from exc
        config = replace(config, **_convert(data.get("llfabric", data)))
    names = {f.name for f in fields(Config)}
    from_env = {
        key[len("LLFABRIC_"):].lower(): value
        for key, value in env.items()
        if key.startswith("LLFABRIC_") and key[len("LLFABRIC_"):].lower() in names
    }
    return replace(config, **_convert(from_env))
