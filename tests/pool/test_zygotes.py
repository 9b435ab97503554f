"""The zygote tree: families forked from their nearest ancestor, bounded by count and memory;
its control channel, where what is not a message is an error at either end."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from fabric.errors import NoZygote, WorkerDied, ZygoteProtocolError
from fabric.pool import Pool
from fabric.pool import pool as pool_module
from fabric.pool.pool import BASE, Key, ZygoteHandle
from fabric.worker import control


def test_families_past_the_memory_bound_are_evicted_least_recently_used_first(
        tmp_path: Path) -> None:
    async def scenario() -> list[list[str]]:
        pool = Pool(tmp_path, max_zygotes=10, zygote_memory=1)  # any family is over the bound
        await pool.start()
        try:
            json_zygote = await pool.zygote_for(frozenset({"json"}))
            worker = await pool.fork_worker(frozenset({"json"}))  # keeps its zygote alive
            await pool.zygote_for(frozenset({"csv"}))
            await pool.zygote_for(frozenset({"decimal"}))  # csv: least recently used, idle
            kept = [z["modules"] for z in pool.status()["zygotes"]]
            assert all(z["memory"] > 0 for z in pool.status()["zygotes"])
            assert json_zygote.ctrl.fileno() >= 0  # spared: a live worker depends on it
            await worker.close()
            return kept
        finally:
            await pool.stop()

    kept = asyncio.run(scenario())
    assert sorted(kept) == [[], ["decimal"], ["json"]]


def test_a_dead_or_hung_base_zygote_is_replaced_and_workers_start_cold_meanwhile(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "START_TIMEOUT", 5.0)  # for the hung one

    async def replaced(pool: Pool, old: int) -> int:
        for _ in range(600):
            base = pool.zygotes.get(BASE)
            if base is not None and base.pid != old and base.ready.done():
                return base.pid
            await asyncio.sleep(0.1)
        raise AssertionError("no new base zygote")

    async def scenario() -> None:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            dead = pool.zygotes[BASE].pid
            os.kill(dead, signal.SIGKILL)
            worker = await pool.new_worker(frozenset())
            assert worker.source == "cold"
            await worker.close()
            hung = await replaced(pool, dead)
            assert not Path(f"/proc/{dead}").exists()  # reaped
            os.kill(hung, signal.SIGSTOP)  # alive, but it will never answer
            worker = await pool.new_worker(frozenset())
            assert worker.source == "cold"
            await worker.close()
            await replaced(pool, hung)
            worker = await pool.new_worker(frozenset())
            assert worker.source == "zygote"
            await worker.close()
        finally:
            await pool.stop()

    asyncio.run(scenario())


def test_a_zygote_refuses_what_is_not_its_message_and_serves_on() -> None:
    ctrl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = subprocess.Popen([sys.executable, "-m", "fabric.worker.zygote", str(theirs.fileno())],
                              pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
    theirs.close()
    ctrl.settimeout(120)
    bad = [
        (msgpack.packb({"op": "exit", "req": 1}), [], 1, "unknown op 'exit'"),
        (msgpack.packb({"op": "forked", "req": 2, "pid": 9}), [], 2, "unknown op 'forked'"),
        (msgpack.packb({"op": "fork_worker", "req": 3, "endpoint": "ipc:///w"}), [], 3,
         "fork_worker lacks its field 'store'"),
        (msgpack.packb({"op": "fork_zygote", "req": 4, "modules": "json", "site": ""}), [], 4,
         "fork_zygote.modules is 'json', not list[str]"),
        (msgpack.packb({"op": "fork_zygote", "req": 5, "modules": [], "lazy": True}), [], 5,
         "fork_zygote has unknown fields ['lazy']"),
        (msgpack.packb({"op": "fork_zygote", "req": 6, "modules": []}),
         [os.open(os.devnull, os.O_RDONLY)], 6, "fork_zygote came with 1 descriptors, not 0"),
        (msgpack.packb([1, 2]), [], None, "a control packet holding a list, not a map"),
        (b"\xc1", [], None, "a control packet that is not msgpack"),
    ]
    try:
        ready, _ = control.receive(ctrl, (control.Ready,))
        assert ready.pid == zygote.pid
        for packet, fds, req, why in bad:
            socket.send_fds(ctrl, [packet], fds)
            for fd in fds:
                os.close(fd)
            refused, fds = control.receive(ctrl, (control.ZygoteRefused,))
            assert (refused.req, fds) == (req, [])
            assert why in refused.error
        control.send(ctrl, control.ForkZygote(modules=["json"], req=7))
        forked, fds = control.receive(ctrl, (control.ZygoteForked,))
        with socket.socket(fileno=fds[0]) as child:
            child.settimeout(120)
            ready, _ = control.receive(child, (control.Ready,))
            assert (ready.pid, ready.imported) == (forked.pid, ["json"])
    finally:
        ctrl.close()  # the zygote exits on EOF
        assert zygote.wait(30) == 0


def test_a_request_the_zygote_refuses_fails_with_its_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            base = pool.zygotes[BASE]
            with pytest.raises(ZygoteProtocolError,
                               match=r"refused fork_zygote: fork_zygote.modules\[0\] is 1,"):
                await base.request(control.ForkZygote(modules=[1]))  # type: ignore[list-item]
            worker = await pool.new_worker(frozenset())
            assert worker.zygote is base  # it served on
            await worker.close()
        finally:
            await pool.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(("packet", "why"), [
    ({"op": "ready", "pid": 1, "imported": "json", "failed": {}}, "ready.imported is 'json'"),
    ({"op": "hello", "req": 0}, "unknown op 'hello'"),
])
def test_a_zygote_that_sends_what_is_not_a_message_fails_its_requests_and_is_killed(
        tmp_path: Path, packet: dict, why: str) -> None:
    async def scenario() -> None:
        pool = Pool(tmp_path)
        stand_in = subprocess.Popen(["sleep", "60"])  # the zygote process the server kills
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote = ZygoteHandle(pool, mine, stand_in.pid, frozenset({"json"}))
        try:
            request = asyncio.ensure_future(
                zygote.request(control.ForkWorker(endpoint="ipc:///w", store=str(tmp_path))))
            await asyncio.sleep(0)
            assert control.receive(theirs, control.TO_ZYGOTE) is not None  # it was sent
            theirs.send(msgpack.packb(packet))
            for waiting in (request, zygote.until_ready()):
                with pytest.raises(ZygoteProtocolError, match=why):
                    await waiting
            assert await asyncio.to_thread(stand_in.wait, 10) == -signal.SIGKILL
            theirs.close()
            for _ in range(100):  # its socket's close drops it, as any dead zygote
                if mine.fileno() < 0:
                    break
                await asyncio.sleep(0.05)
            assert mine.fileno() < 0
        finally:
            theirs.close()
            stand_in.kill()
            stand_in.wait()
            await pool.stop()

    asyncio.run(scenario())


def _retire(pool: Pool, family: Key) -> None:
    """What a finished rebuild does to the zygote it replaces (`Pool._build`, then `_evict`)."""
    pool.retired.add(pool.zygotes.pop(family))
    pool.stop_retired()


def test_a_zygote_retired_while_it_forks_a_worker_serves_that_fork(tmp_path: Path) -> None:
    """A family rebuilt (its preloads grew) while a worker is forked from the old zygote: the old
    one is kept until its worker lives; one stopped all the same fails the fork at once."""
    async def scenario() -> None:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            family = ("", frozenset({"json"}))
            old = await pool.zygote_for(family[1])
            forking = asyncio.ensure_future(pool.fork_worker(family[1]))
            while not old.busy():  # the fork request is sent, its answer not yet read
                await asyncio.sleep(0)
            _retire(pool, family)
            worker = await asyncio.wait_for(forking, 60)
            assert worker.zygote is old and old.ctrl.fileno() >= 0
            await worker.close()
            assert old.ctrl.fileno() < 0  # its worker gone, it goes too

            other = await pool.zygote_for(frozenset({"csv"}))
            forking = asyncio.ensure_future(pool.fork_worker(frozenset({"csv"})))
            while not other.busy():
                await asyncio.sleep(0)
            other.stop()
            with pytest.raises(NoZygote):
                await asyncio.wait_for(forking, 60)
        finally:
            await pool.stop()

    asyncio.run(scenario())


def test_a_zygote_retired_once_its_fork_is_answered_lives_until_its_worker_is_known(
        tmp_path: Path) -> None:
    """The zygote's answer is read before the fork's caller resumes to register the worker;
    a retirement in between must not stop the zygote (and with it the new worker)."""
    async def scenario() -> None:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            family = ("", frozenset({"json"}))
            old = await pool.zygote_for(family[1])
            asked = old.request

            async def answered_then_retired(message):
                answer = await asked(message)
                _retire(pool, family)  # as a rebuild ending now does
                return answer

            old.request = answered_then_retired
            worker = await asyncio.wait_for(pool.fork_worker(family[1]), 60)
            assert old.ctrl.fileno() >= 0 and not worker.died.done()
            await worker.close()
            assert old.ctrl.fileno() < 0  # its worker gone, it goes too
        finally:
            await pool.stop()

    asyncio.run(scenario())


def test_the_workers_of_a_stopped_zygote_are_known_dead(tmp_path: Path) -> None:
    """A zygote stopped with a worker (its children die with it) reports no exit: the pool
    marks them dead, so that nothing waits on them forever."""
    async def scenario() -> None:
        pool = Pool(tmp_path)
        await pool.start()
        try:
            zygote = await pool.zygote_for(frozenset({"json"}))
            worker = await pool.fork_worker(frozenset({"json"}))
            zygote.stop()
            with pytest.raises(WorkerDied):
                await asyncio.wait_for(worker.recv(), 60)
            await asyncio.wait_for(worker.close(), 60)
        finally:
            await pool.stop()

    asyncio.run(scenario())
