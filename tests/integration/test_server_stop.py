"""A server that stops ends what it serves first: its task group owns every request's task,
cancels them and waits for them to end before the host shuts down."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from helpers import serving

from fabric import server as server_module
from fabric import stacks
from fabric.client import Client
from fabric.config import Config
from fabric.messages import Execute
from fabric.server import Server


def _servers_tasks() -> list[asyncio.Task]:
    """The tasks the server runs (its requests', its loops', not `serve` itself); the pool
    ends its own."""
    return [t for t in asyncio.all_tasks() if not t.done()
            and t.get_coro().cr_code.co_filename == server_module.__file__
            and t.get_coro().__qualname__ != Server.serve.__qualname__]


def test_a_stop_ends_the_cell_in_flight_before_the_host_shuts_down(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="llf-") as sockdir:
        config = Config(store=tmp_path / "store", runtime_dir=Path(sockdir),
                        bind=f"ipc://{sockdir}/s.sock", keep_warm=0)

        async def main() -> tuple[list[asyncio.Task], list[asyncio.Task]]:
            server = Server(config)
            at_shutdown: list[asyncio.Task] = []
            shut = server.host.shut

            async def shut_down() -> None:  # what still runs as the host shuts down
                at_shutdown.extend(_servers_tasks())
                await shut()

            server.host.shut = shut_down
            ready = asyncio.Event()
            serving = asyncio.ensure_future(server.serve(ready))
            await ready.wait()
            with Client(config.address, timeout=60) as client:
                def start() -> None:
                    client.open("long", str(tmp_path))
                    client.send(Execute("long", "import time\ntime.sleep(600)"))

                await asyncio.to_thread(start)
                while not server.host.runs.running:  # the cell's request is being served
                    await asyncio.sleep(0.05)
                server.stop()
                await asyncio.wait_for(serving, 120)  # not the cell's ten minutes
            return at_shutdown, _servers_tasks()

        at_shutdown, after = asyncio.run(main())
        assert at_shutdown == [] and after == []


def test_sigusr1_writes_every_threads_and_tasks_stack_to_the_log_and_the_server_serves_on(
        tmp_path: Path) -> None:
    # What an operator (and a test whose server would not stop) reads to see where it hangs.
    with serving(tmp_path / "store") as server:
        server.dump_stacks(timeout=60)
        log = server.log.read_text()
        assert "Current thread" in log and "server.py" in log  # the threads', where they stand
        assert stacks.DUMPED in log and "task " in log  # then the tasks', from the loop
        with server.client() as client:
            assert client.ping(timeout=30)
