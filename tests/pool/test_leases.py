"""Leases under oversubscription: a fair queue, waits reported, lease-seconds per session."""

from __future__ import annotations

import asyncio
import random

from fabric.pool import Leases
from fabric.pool.gpus import Gpu


def test_fifty_sessions_on_two_slots_all_finish_in_arrival_order() -> None:
    sessions, cells = 50, 3

    async def scenario() -> tuple[list[tuple[str, int]], list[tuple[str, int]], Leases]:
        leases = Leases(2)
        asked, granted = [], []
        in_use = set()

        async def notebook(name: str) -> None:
            for cell in range(cells):
                await asyncio.sleep(random.random() / 1000)  # think time
                asked.append((name, cell))
                lease = await leases.acquire(name)
                granted.append((name, cell))
                assert lease.slot not in in_use  # exclusive
                in_use.add(lease.slot)
                await asyncio.sleep(random.random() / 1000)  # the cell runs
                in_use.discard(lease.slot)
                leases.release(lease)

        await asyncio.wait_for(asyncio.gather(*(notebook(f"s{i}") for i in range(sessions))), 60)
        return asked, granted, leases

    asked, granted, leases = asyncio.run(scenario())
    assert len(granted) == sessions * cells  # every cell ran: nobody starved
    assert granted == asked  # first come, first served
    assert leases.queued == 0 and not leases.held
    assert set(leases.seconds) == {f"s{i}" for i in range(sessions)}
    assert all(seconds > 0 for seconds in leases.seconds.values())


def test_waiting_time_is_reported_and_a_cancelled_waiter_gives_its_turn_on() -> None:
    async def scenario() -> None:
        leases = Leases(1)
        first = await leases.acquire("a")
        waiting = asyncio.ensure_future(leases.acquire("b"))
        third = asyncio.ensure_future(leases.acquire("c"))
        await asyncio.sleep(0.05)
        status = leases.status()
        assert [w["session"] for w in status["queue"]] == ["b", "c"]
        assert status["leases"][0]["session"] == "a"
        waiting.cancel()
        await asyncio.sleep(0)
        leases.release(first)
        lease = await third
        assert lease.session == "c" and lease.waited >= 0.05
        leases.release(lease)
        assert leases.status()["held"] == 0

    asyncio.run(scenario())


def test_gpu_slots_come_from_the_devices_and_name_them() -> None:
    async def scenario() -> None:
        devices = [Gpu(0, "GPU-aaaa", "fake", 1 << 30), Gpu(1, "GPU-bbbb", "fake", 1 << 30)]
        leases = Leases(devices=devices)
        assert (leases.kind, leases.slots) == ("gpu", 2)
        one, two = await leases.acquire("x"), await leases.acquire("y")
        assert {one.device, two.device} == {"GPU-aaaa", "GPU-bbbb"}
        leases.release(one)
        leases.release(two)

    asyncio.run(scenario())


def test_cpu_slots_without_gpus() -> None:
    leases = Leases(3)
    assert (leases.kind, leases.slots, leases.devices) == ("cpu", 3, [])


def test_a_cell_gets_the_gpu_its_worker_was_parked_from_when_it_is_free() -> None:
    gpus = [Gpu(i, f"GPU-{i}", "fake", 1 << 30) for i in range(3)]

    async def scenario() -> list[str | None]:
        leases = Leases(devices=gpus)
        held = [await leases.acquire("a"), await leases.acquire("b")]
        preferred = await leases.acquire("c", prefer="GPU-1")  # busy: the free one instead
        leases.release(held[1])
        again = await leases.acquire("d", prefer="GPU-1")  # free now, though not first in line
        leases.release(held[0])
        unknown = await leases.acquire("e", prefer="GPU-9")
        return [preferred.device, again.device, unknown.device]

    assert asyncio.run(scenario()) == ["GPU-2", "GPU-1", "GPU-0"]
