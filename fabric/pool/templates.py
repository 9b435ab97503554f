"""Templates: CRIU images of dormant workers, one per import family, restored many times.

A template is built once per family: `llfabric-init --pidns python -m fabric.worker.dormant`
imports the family, reports ready and closes its control socket; CRIU dumps the namespace
rooted at the init. Each restore brings back a copy in a new PID namespace as a child of the
server; woken, the copy connects to the endpoint named after its pid (see `wake`). CPU hosts
only: CUDA cannot initialize in such a namespace, whose /proc is the host's (`choose_source`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from ..tasks import Background, within
from ..worker import control, wake
from . import criu

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 300.0


class TemplateMap(TypedDict):
    """A template as `status` reports it."""

    modules: list[str]
    env: str
    state: str  # building, ready or failed
    error: str
    bytes: int
    built_in: float  # seconds
    restores: int
    failed_imports: dict[str, str]


@dataclass
class Template:
    modules: frozenset[str]
    images: Path
    site: str = ""  # the environment's site-packages it entered; "": the server's own
    state: str = "building"  # building, ready, failed
    error: str = ""
    built_in: float = 0.0
    restores: int = 0
    failed_imports: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.images.glob("*.img")) if self.images.exists() \
            else 0

    def status(self) -> TemplateMap:
        return {"modules": sorted(self.modules), "env": self.site, "state": self.state,
                "error": self.error,
                "bytes": self.size, "built_in": self.built_in, "restores": self.restores,
                "failed_imports": self.failed_imports}


class Templates:
    def __init__(self, root: Path, socket_dir: Path, store_root: Path) -> None:
        self.root = root
        self.socket_dir = socket_dir
        self.store_root = store_root
        # by (environment's site-packages or "", import family)
        self.by_family: dict[tuple[str, frozenset[str]], Template] = {}
        self._builds_running = Background("templates")
        # each family's latest build, its template once ended
        self._tasks: dict[tuple[str, frozenset[str]], asyncio.Task[Template]] = {}
        self._restores = itertools.count()
        self._builds = itertools.count()  # a family rebuilt after a retire gets a new folder

    def ready(self, modules: frozenset[str], site: str = "") -> Template | None:
        """The smallest ready template of environment `site` whose family covers `modules`."""
        found = [t for (s, f), t in self.by_family.items()
                 if s == site and f >= modules and t.state == "ready"]
        return min(found, key=lambda t: len(t.modules), default=None)

    def build_soon(self, modules: frozenset[str], site: str = "") -> None:
        """Start building the family's template unless it exists, is under way or failed."""
        key = (site, modules)
        if key not in self.by_family:
            name = hashlib.sha256("\0".join([site, *sorted(modules)]).encode()).hexdigest()[:16]
            template = Template(modules, self.root / f"{name}-{next(self._builds)}", site)
            self.by_family[key] = template
            self._tasks[key] = self._builds_running.start(self.build(template),
                                                          "a template build")

    async def wait(self, modules: frozenset[str], site: str = "") -> Template:
        """The family's template once its build has ended, ready or failed."""
        return await asyncio.shield(self._tasks[(site, modules)])

    def retire(self, site: str) -> list[frozenset[str]]:
        """Drop the templates of environment `site` (it changed): builds under way are
        cancelled, images removed. Their families."""
        families = []
        for key in [k for k in self.by_family if k[0] == site]:
            template = self.by_family.pop(key)
            task = self._tasks.pop(key)
            task.cancel()
            task.add_done_callback(lambda _, images=template.images: criu.remove(images))
            families.append(key[1])
        return families

    async def build(self, template: Template) -> Template:
        start = time.monotonic()
        try:
            await within(self._build(template), BUILD_TIMEOUT)
        except Exception as exc:  # recorded and shown by status; workers fork from zygotes
            template.state, template.error = "failed", f"{type(exc).__name__}: {exc}"
            log.warning("template for %s failed: %s", sorted(template.modules), template.error)
            criu.remove(template.images)
        else:
            template.state, template.built_in = "ready", time.monotonic() - start
        return template

    async def _build(self, template: Template) -> None:
        template.images.mkdir(parents=True, exist_ok=True)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        launcher = subprocess.Popen(
            [str(criu.init_binary()), "--pidns", sys.executable, "-m", "fabric.worker.dormant",
             str(theirs.fileno()), str(self.socket_dir), str(self.store_root),
             str(template.images / "process.log"), template.site, *sorted(template.modules)],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd="/", start_new_session=True)
        theirs.close()
        root = None
        try:
            with mine:
                loop = asyncio.get_running_loop()
                data = await loop.sock_recv(mine, control.PACKET)
                if not data:
                    raise criu.CheckpointError(
                        f"the template process exited before it was ready; see "
                        f"{template.images / 'process.log'}")
                ready = control.decode(data, [], (control.Ready,))
                template.failed_imports = ready.failed
                if await loop.sock_recv(mine, control.PACKET):  # then EOF: it is going to sleep
                    raise criu.CheckpointError("the template process sent more than ready")
            root = criu.worker_of(launcher.pid)
            dormant = criu.worker_of(root)
            await wake.until_asleep(dormant, BUILD_TIMEOUT)
            await asyncio.to_thread(criu.dump, root, template.images)
        except BaseException:
            if root is not None:  # killing a namespace's init ends everything in it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(root, signal.SIGKILL)
            launcher.kill()
            raise
        finally:
            await asyncio.to_thread(launcher.wait)

    async def restore(self, template: Template) -> int:
        """Restore a copy of `template`; return its init's pid (a child of this process)."""
        log_name = f"restore-{next(self._restores)}.log"
        try:
            pid = await asyncio.to_thread(criu.restore, template.images, log_name)
        except criu.CheckpointError:
            template.state, template.error = "failed", "restore failed"
            raise
        (template.images / log_name).unlink(missing_ok=True)
        template.restores += 1
        return pid

    async def stop(self) -> None:
        await self._builds_running.close()
        for template in self.by_family.values():
            criu.remove(template.images)

    def status(self) -> list[TemplateMap]:
        return [t.status() for t in self.by_family.values()]

