"""Leases under oversubscription: a fair queue, waits reported, slot-seconds per session;
gangs of slots taken and given back together."""

from __future__ import annotations

import asyncio
import random

import pytest

from fabric.errors import SlotsUnavailable
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
                assert not in_use & set(lease.slots)  # exclusive
                in_use.update(lease.slots)
                await asyncio.sleep(random.random() / 1000)  # the cell runs
                in_use.difference_update(lease.slots)
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


def test_a_gang_takes_all_its_slots_at_once_or_waits_holding_none() -> None:
    async def scenario() -> None:
        leases = Leases(4)
        three = await leases.acquire("a", 3)
        assert three.slots == (0, 1, 2)
        pair = asyncio.ensure_future(leases.acquire("b", 2))
        single = asyncio.ensure_future(leases.acquire("c"))
        await asyncio.sleep(0.01)
        # b waits holding nothing; c, with no estimate of its run, may not jump ahead of it
        assert not pair.done() and not single.done()
        assert leases.status()["held"] == 3
        assert [(w["session"], w["slots"]) for w in leases.status()["queue"]] == [("b", 2),
                                                                                 ("c", 1)]
        leases.release(three)
        got = await pair, await single
        assert got[0].slots == (0, 3) and got[1].slots == (1,)  # least recently used first
        for lease in got:
            leases.release(lease)
        assert leases.status()["held"] == 0 and not leases.held

    asyncio.run(scenario())


@pytest.mark.parametrize(("slots", "sizes"), [(4, (1, 2, 4)), (2, (1, 2))])
def test_mixed_gangs_never_deadlock_and_every_request_is_served(slots: int,
                                                                 sizes: tuple[int, ...]) -> None:
    sessions, cells = 12, 6  # 72 requests, each session of one size

    async def scenario() -> dict[int, list[float]]:
        leases = Leases(slots, patience=0.05)
        in_use: set[int] = set()
        waits: dict[int, list[float]] = {size: [] for size in sizes}

        async def notebook(name: str, size: int) -> None:
            for _ in range(cells):
                await asyncio.sleep(random.random() / 500)  # think time
                lease = await leases.acquire(name, size)
                assert len(lease.slots) == size and not in_use & set(lease.slots)  # exclusive
                in_use.update(lease.slots)
                await asyncio.sleep(random.random() / 500)  # the cell runs
                in_use.difference_update(lease.slots)
                leases.release(lease)
                waits[size].append(lease.waited)

        await asyncio.wait_for(asyncio.gather(*(notebook(f"s{i}", sizes[i % len(sizes)])
                                                for i in range(sessions))), 60)
        assert leases.queued == 0 and not leases.held
        return waits

    waits = asyncio.run(scenario())
    assert sum(map(len, waits.values())) == sessions * cells  # every request served
    print(f"{slots} slots, waits in ms: " + "; ".join(
        f"{size}-slot mean {1000 * sum(w) / len(w):.1f} max {1000 * max(w):.1f}"
        for size, w in waits.items()))


def test_more_slots_than_the_host_has_is_refused_at_once() -> None:
    async def scenario() -> None:
        leases = Leases(2)
        for count in (3, 0):
            with pytest.raises(SlotsUnavailable, match="1 to 2 cpu slots") as caught:
                await leases.acquire("a", count)
            assert caught.value.fields == {"session": "a", "asked": count, "slots": 2}
        assert leases.queued == 0 and not leases.held

    asyncio.run(scenario())


def test_a_gang_counts_slot_seconds_and_grants_its_slots_threads() -> None:
    async def scenario() -> None:
        leases = Leases(4, threads=3)
        lease = await leases.acquire("a", 2)
        assert lease.threads == 6 and (await leases.acquire("b")).threads == 3
        entries = leases.status()["leases"]
        assert [e.get("with_slots") for e in entries[:2]] == [[0, 1], [0, 1]]
        await asyncio.sleep(0.01)
        leases.release(lease)
        assert leases.seconds["a"] == pytest.approx(2 * lease.held)

    asyncio.run(scenario())


def test_a_gang_of_gpus_is_one_cuda_visible_devices_in_slot_order() -> None:
    gpus = [Gpu(i, f"GPU-{i}", "fake", 1 << 30) for i in range(4)]

    async def scenario() -> list[str | None]:
        leases = Leases(devices=gpus)
        first = await leases.acquire("a", 2)
        again = await leases.acquire("b", 2, prefer="GPU-3,GPU-2")  # parked off these
        leases.release(first)
        leases.release(again)
        mixed = await leases.acquire("c", 3, prefer="GPU-3,GPU-1")
        return [first.device, again.device, mixed.device]

    assert asyncio.run(scenario()) == ["GPU-0,GPU-1", "GPU-2,GPU-3", "GPU-0,GPU-1,GPU-3"]


def test_a_cancelled_gang_at_the_head_lets_those_behind_it_in() -> None:
    async def scenario() -> None:
        leases = Leases(2)
        one = await leases.acquire("a")
        big = asyncio.ensure_future(leases.acquire("b", 2))
        small = asyncio.ensure_future(leases.acquire("c"))
        await asyncio.sleep(0.01)
        assert not small.done()
        big.cancel()
        assert (await small).slots == (1,)
        leases.release(one)
        assert leases.queued == 0 and list(leases.held) == [1]

    asyncio.run(scenario())
