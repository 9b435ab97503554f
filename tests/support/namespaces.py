"""Test hosts that differ as real hosts do, made of Linux namespaces (root only).

A `Network` is a bridge inside a network namespace of its own (the switch, where the test
process's side of the network lives, at `.1` of the subnet the test picked); each of its
`Host`s is a set of network, PID, mount and UTS namespaces (and optionally a time namespace
whose monotonic and boot clocks run ahead by an offset), joined to the bridge by a veth pair,
with an address of the subnet and a hostname of its own, and its own /proc. Nothing of the
machine's own network is touched: every interface and address lives in a namespace made here.

Each namespace set is held by a small init process (pid 1 of its PID namespace, reaping
orphans); killing it ends the PID namespace's processes, and with them every namespace, veth
and mount made here. `Network.close` kills them all and waits; were the test process to die
first, the kernel kills them for it (a parent-death signal: it follows the thread that made
them, so make a network from one that outlives it, such as the test's own).

A `Cut` drops every packet between two ends of a network, both ways, and `heal`s: each end's
neighbour entry for the other points at a hardware address nobody has, so what is sent goes out
on the bridge and is lost there, as in a real partition (connections stay open, and hang).

Without root or namespace support, `unavailable` says why, and cluster tests fall back to plain
processes of this machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SUBNET = "10.211.7"  # a /24 of the private range, inside the test's own namespaces only
NOWHERE = "02:00:00:00:de:ad"  # a locally administered hardware address no interface has
TOOLS = ("ip", "unshare", "nsenter", "setpriv")
# clone(2) flags, by the name of the namespace's file in /proc/PID/ns
FLAGS = {"net": 0x40000000, "uts": 0x04000000, "pid": 0x20000000}
SPACES = ("--net", "--pid", "--mount", "--uts")

# pid 1 of a namespace set: names its host, says it is ready, and reaps what is orphaned there
INIT = ("import os, signal, socket, sys\n"
        "socket.sethostname(sys.argv[1])\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})\n"
        "print('ready', flush=True)\n"
        "while signal.sigwait({signal.SIGCHLD}):\n"
        "    try:\n"
        "        while os.waitpid(-1, os.WNOHANG)[0]: pass\n"
        "    except ChildProcessError: pass\n")

_libc = ctypes.CDLL(None, use_errno=True)


@functools.cache
def unavailable() -> str | None:
    """Why test hosts cannot have namespaces of their own here; None where they can."""
    if os.geteuid() != 0:
        return "namespaced test hosts need root"
    if missing := [tool for tool in TOOLS if shutil.which(tool) is None]:
        return f"namespaced test hosts need {', '.join(missing)}"
    return _refused([*SPACES, "--fork", "--mount-proc", "true"])


@functools.cache
def no_time_offsets() -> str | None:
    """Why a test host's clocks cannot run ahead of this machine's; None where they can."""
    return unavailable() or _refused(["--time", "--monotonic", "1", "--fork", "true"])


def _refused(flags: list[str]) -> str | None:
    try:
        subprocess.run(["unshare", *flags], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        why = getattr(exc, "stderr", b"") or str(exc).encode()
        return f"unshare {' '.join(flags[:-1])} is refused here: {why.decode().strip()}"
    return None


class Namespaces:
    """Network, PID, mount and UTS namespaces (and a time namespace where `ahead` is given:
    its monotonic and boot clocks that many seconds ahead), held by their init process."""

    def __init__(self, name: str, ahead: int | None = None) -> None:
        self.name = name
        clocks = [] if ahead is None else [
            "--time", "--monotonic", str(ahead), "--boottime", str(ahead)]
        self._holder = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "unshare", *SPACES, *clocks, "--fork",
             "--kill-child=SIGKILL", "--mount-proc", sys.executable, "-c", INIT, name],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self._holder.stdout is not None
        if self._holder.stdout.readline() != b"ready\n":
            _, why = self._holder.communicate()
            raise OSError(f"namespaces for {name} were refused: {why.decode().strip()}")
        # pid 1 there: the only child of `unshare`, which `setpriv` became
        self.init = int(Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children")
                        .read_text().split()[0])
        self.timed = ahead is not None
        self.closed = False

    def path(self, kind: str) -> str:
        return f"/proc/{self.init}/ns/{kind}"

    def ip(self, *argv: str) -> str:
        """`ip ARGV` run in the network namespace; what it printed."""
        return subprocess.run(["nsenter", f"--net={self.path('net')}", "ip", *argv],
                              check=True, capture_output=True, text=True).stdout

    @contextlib.contextmanager
    def entered(self, kinds: tuple[str, ...] = ("net", "uts", "pid")) -> Iterator[None]:
        """The calling thread in these namespaces for the block: the sockets it makes are
        made there, and the processes it starts start there (a PID namespace takes the
        thread's children, never the thread itself)."""
        saved = {kind: os.open(f"/proc/thread-self/ns/{_own(kind)}", os.O_RDONLY)
                 for kind in kinds}
        try:
            for kind in kinds:
                with _opened(self.path(kind)) as fd:
                    _setns(fd, kind)
            yield
        finally:
            for kind, fd in saved.items():
                _setns(fd, kind)
                os.close(fd)

    def inside(self, argv: list[str], cwd: Path) -> list[str]:
        """`argv`, run by a process this thread starts `entered`, in the rest of the set (its
        mount namespace, with its own /proc, and its clocks), in `cwd`."""
        clocks = [f"--time={self.path('time')}"] if self.timed else []
        return ["nsenter", f"--mount={self.path('mnt')}", *clocks, f"--wd={cwd}", "--", *argv]

    def commands(self) -> dict[int, str]:
        """The command lines of this set's processes, by their pid in this process's PID
        namespace (its arguments joined by spaces); none once it is closed."""
        if self.closed:
            return {}
        lines = {}
        for outer, _ in self._processes():
            with contextlib.suppress(OSError):
                lines[outer] = Path(f"/proc/{outer}/cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace").strip()
        return lines

    def outer_pid(self, pid: int) -> int | None:
        """The pid, in this process's PID namespace, of process `pid` of this set's; None if
        it has none."""
        return next((outer for outer, status in self._processes()
                     if int(_field(status, "NSpid").split()[-1]) == pid), None)

    def _processes(self) -> Iterator[tuple[int, str]]:
        """The processes of this set's PID namespace: each one's pid here, and its status."""
        try:
            if self._holder.poll() is not None:  # its init is gone (the thread that made it
                return                           # ended, say), every process of it with it
            mine = os.stat(self.path("pid")).st_ino
        except FileNotFoundError:  # going now
            return
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and os.stat(entry / "ns" / "pid").st_ino == mine:
                    yield int(entry.name), (entry / "status").read_text()

    def close(self) -> None:
        """Kill the init, so every process of the PID namespace, and wait for them. The
        namespace ends once each of its processes is reaped, this process's children too: it
        reaps those itself (a `Popen` of one then finds it gone, and says it exited with 0).
        Closed again, it does nothing."""
        if self.closed:
            return
        children = [pid for pid, status in self._processes()
                    if int(_field(status, "PPid")) == os.getpid()]
        if self._holder.poll() is None:  # else its init is gone, and its pid maybe taken
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._holder.wait()
        self.closed = True
        for pipe in (self._holder.stdout, self._holder.stderr):
            if pipe is not None:
                pipe.close()


class Host(Namespaces):
    """A test host on a `Network`: its namespaces, its address there and its interface."""

    def __init__(self, name: str, address: str, ahead: int | None = None) -> None:
        super().__init__(name, ahead)
        self.address, self.device = address, "eth0"


class Network:
    """A bridge in a switch namespace, and the test hosts on it, until `close`."""

    def __init__(self, subnet: str = SUBNET) -> None:
        self.subnet = subnet
        self.hosts: list[Host] = []
        self.switch = Host("switch", f"{subnet}.1")
        self.switch.device = "br0"
        try:
            self.switch.ip("link", "add", "br0", "type", "bridge")
            self.switch.ip("addr", "add", f"{self.switch.address}/24", "dev", "br0")
            for device in ("lo", "br0"):
                self.switch.ip("link", "set", device, "up")
        except BaseException:
            self.close()
            raise

    def host(self, name: str, ahead: int | None = None) -> Host:
        """A new host on the bridge, named `name` (its hostname too); `ahead`: its time
        namespace's clock offset in seconds (None: the machine's clocks)."""
        number = len(self.hosts) + 2
        host = Host(name, f"{self.subnet}.{number}", ahead)
        self.hosts.append(host)
        end = f"port{number}"  # its veth's end on the bridge
        self.switch.ip("link", "add", end, "type", "veth", "peer", "name", host.device,
                       "netns", str(host.init))
        self.switch.ip("link", "set", end, "master", "br0", "up")
        host.ip("addr", "add", f"{host.address}/24", "dev", host.device)
        for device in ("lo", host.device):
            host.ip("link", "set", device, "up")
        return host

    def connect(self, address: tuple[str, int]) -> socket.socket:
        """A TCP connection to `address` from the switch's side of the network (where the
        test process reaches its hosts)."""
        with self.switch.entered(("net",)):
            return socket.create_connection(address)

    def cut(self, a: Host, b: Host) -> Cut:
        return Cut(a, b)

    def close(self) -> None:
        for namespaces in [*self.hosts, self.switch]:
            namespaces.close()


class Cut:
    """The link between ends `a` and `b` of a network (hosts, or the switch), to `cut` (every
    packet between them dropped, both ways) and `heal`."""

    def __init__(self, a: Host, b: Host) -> None:
        self.a, self.b = a, b

    def cut(self) -> None:
        for near, far in ((self.a, self.b), (self.b, self.a)):
            near.ip("neigh", "replace", far.address, "lladdr", NOWHERE, "dev", near.device,
                    "nud", "permanent")

    def heal(self) -> None:
        """Each end finds the other again (ARP), and what waited is sent again (TCP). An end
        whose entry went already (its link went down and up as its host restarted) is healed."""
        for near, far in ((self.a, self.b), (self.b, self.a)):
            near.ip("neigh", "flush", "to", far.address, "dev", near.device, "nud", "all")


def _field(status: str, name: str) -> str:
    """A field of a /proc/PID/status file."""
    return next(line for line in status.splitlines() if line.startswith(f"{name}:")).split(
        ":", 1)[1].strip()


def _own(kind: str) -> str:
    """The file of this thread's namespace that `setns` of `kind` changes."""
    return "pid_for_children" if kind == "pid" else kind


@contextlib.contextmanager
def _opened(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


def _setns(fd: int, kind: str) -> None:
    if _libc.setns(fd, FLAGS[kind]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns into a {kind} namespace: {os.strerror(errno)}")
