"""The server's interrupt, sent once the worker says a cell started, stops the cell with a
KeyboardInterrupt wherever it lands: before the cell's code (in IPython's own steps), in it, or
as it ends; it is never lost and never ends the worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fabric.pool import Pool
from fabric.worker.messages import Done, RunCell, Started
from fabric.worker.shell import make_shell

TRIES = 40
STEP = 50e-6  # seconds: each try interrupts this much later after `started` than the last
# Short sleeps: a signal Python takes just before a blocking call is handled once it returns
# (CPython's own race, as in any kernel); the cell stops at the next one.
ENDLESS = "import time\nwhile True:\n    time.sleep(0.1)"


def _spin(seconds: float) -> None:
    """Wait `seconds` on this thread, finer than the loop's timers."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_an_interrupt_sent_as_a_cell_starts_stops_it_and_the_worker_lives(
        tmp_path: Path) -> None:
    async def scenario() -> list[tuple[str, str | None]]:
        pool = Pool(tmp_path / "store", worker_source="zygote")
        await pool.start()
        try:
            worker = await pool.fork_worker(frozenset())
            ended = []
            for count in range(1, TRIES + 1):
                await worker.send(RunCell(ENDLESS, count))
                while not isinstance(await worker.recv(timeout=60), Started):
                    pass
                _spin(count * STEP)
                worker.interrupt()
                while not isinstance(done := await worker.recv(timeout=60), Done):
                    pass
                ended.append((done.status, done.ename))
            await worker.close()
            return ended
        finally:
            await pool.stop()

    assert asyncio.run(scenario()) == [("error", "KeyboardInterrupt")] * TRIES


def test_a_cell_that_lets_sigint_kill_the_process_leaves_the_worker_its_own_handling(
        tmp_path: Path) -> None:
    """After it, an interrupt between cells is dropped, and the next cell's stops that cell."""
    async def scenario() -> tuple[str, str | None]:
        pool = Pool(tmp_path / "store", worker_source="zygote")
        await pool.start()
        try:
            worker = await pool.fork_worker(frozenset())
            await worker.send(RunCell("import signal\nsignal.signal(signal.SIGINT, "
                                      "signal.SIG_DFL)", 1))
            while not isinstance(done := await worker.recv(timeout=60), Done):
                pass
            assert done.status == "ok"
            worker.interrupt()
            await worker.send(RunCell(ENDLESS, 2))
            while not isinstance(await worker.recv(timeout=60), Started):
                pass
            worker.interrupt()
            while not isinstance(done := await worker.recv(timeout=60), Done):
                pass
            await worker.close()
            return done.status, done.ename
        finally:
            await pool.stop()

    assert asyncio.run(scenario()) == ("error", "KeyboardInterrupt")


def test_an_interrupt_in_an_event_callback_stops_the_cell_and_an_error_there_does_not() -> None:
    """IPython would show an interrupt that lands in a callback it runs before a cell's code as
    the callback's error, and run the code on."""
    shell = make_shell()
    raised: list[BaseException] = []

    def callback() -> None:
        if raised:
            raise raised.pop()

    shell.events.register("pre_execute", callback)
    try:
        outcomes = []
        for error in (KeyboardInterrupt(), ValueError("the callback's own")):
            shell.user_ns.pop("ran", None)
            raised.append(error)
            result = shell.run_cell("ran = True")
            outcomes.append((type(result.error_in_exec).__name__, "ran" in shell.user_ns))
    finally:
        shell.events.unregister("pre_execute", callback)
    assert outcomes == [("KeyboardInterrupt", False), ("NoneType", True)]
