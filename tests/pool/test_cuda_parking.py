"""CUDA parking sequencing against the fake driver: every transition and every failure path.

On success the worker ends CHECKPOINTED (suspend) or RUNNING (resume); on failure `ParkFailed`
is raised and the process is left where a cold fallback is safe (never LOCKED by us).
"""

from __future__ import annotations

import pytest
from fake_cuda import FakeDriver

from fabric.pool.cuda import ProcessState
from fabric.pool.parking import ParkFailed, resume, resume_tree, suspend, suspend_tree

PID = 4242


def steps(driver: FakeDriver) -> list[str]:
    return [step for step, _ in driver.calls if step != "state"]


def test_suspend_locks_then_checkpoints_and_resume_reverses_it() -> None:
    driver = FakeDriver()
    assert suspend(driver, PID) is True
    assert driver.states[PID] is ProcessState.CHECKPOINTED
    resume(driver, PID)
    assert driver.states[PID] is ProcessState.RUNNING
    assert steps(driver) == ["lock", "checkpoint", "restore", "unlock"]


def test_a_worker_without_cuda_state_is_left_alone() -> None:
    driver = FakeDriver()
    driver.without_cuda.add(PID)
    assert suspend(driver, PID) is False
    assert driver.calls == []


def test_suspend_and_resume_are_idempotent() -> None:
    driver = FakeDriver()
    resume(driver, PID)  # RUNNING already
    suspend(driver, PID)
    suspend(driver, PID)  # CHECKPOINTED already
    assert steps(driver) == ["lock", "checkpoint"]


def test_lock_timeout_leaves_the_worker_running() -> None:
    driver = FakeDriver()
    driver.fail["lock"] = ("CUDA_ERROR_TIMEOUT", None)
    with pytest.raises(ParkFailed, match="cannot lock"):
        suspend(driver, PID)
    assert driver.states[PID] is ProcessState.RUNNING
    assert steps(driver) == ["lock"]


def test_failed_checkpoint_unlocks_a_still_locked_worker() -> None:
    driver = FakeDriver()
    driver.fail["checkpoint"] = ("CUDA_ERROR_OUT_OF_MEMORY", None)
    with pytest.raises(ParkFailed, match="cannot checkpoint"):
        suspend(driver, PID)
    assert driver.states[PID] is ProcessState.RUNNING
    assert steps(driver) == ["lock", "checkpoint", "unlock"]


def test_checkpoint_that_leaves_failed_state_is_reported() -> None:
    driver = FakeDriver()
    driver.fail["checkpoint"] = ("CUDA_ERROR_UNKNOWN", ProcessState.FAILED)
    with pytest.raises(ParkFailed, match="cannot checkpoint"):
        suspend(driver, PID)
    assert driver.states[PID] is ProcessState.FAILED
    assert steps(driver) == ["lock", "checkpoint"]  # nothing to unlock in FAILED


def test_suspend_refuses_a_locked_or_failed_worker() -> None:
    for state in (ProcessState.LOCKED, ProcessState.FAILED):
        driver = FakeDriver()
        driver.states[PID] = state
        with pytest.raises(ParkFailed, match=state.name):
            suspend(driver, PID)
        assert steps(driver) == []


def test_failed_state_query_is_a_park_failure_on_resume() -> None:
    driver = FakeDriver()
    driver.states[PID] = ProcessState.CHECKPOINTED
    driver.fail["state"] = ("CUDA_ERROR_NOT_INITIALIZED", None)
    with pytest.raises(ParkFailed, match="cannot resume"):
        resume(driver, PID)


def test_failed_restore_is_a_park_failure() -> None:
    driver = FakeDriver()
    suspend(driver, PID)
    driver.fail["restore"] = ("CUDA_ERROR_OUT_OF_MEMORY", ProcessState.FAILED)
    with pytest.raises(ParkFailed, match="cannot resume"):
        resume(driver, PID)
    assert driver.states[PID] is ProcessState.FAILED


def test_failed_unlock_is_a_park_failure() -> None:
    driver = FakeDriver()
    suspend(driver, PID)
    driver.fail["unlock"] = ("CUDA_ERROR_UNKNOWN", None)
    with pytest.raises(ParkFailed, match="cannot resume"):
        resume(driver, PID)
    assert driver.states[PID] is ProcessState.LOCKED


def test_resume_of_a_locked_worker_only_unlocks() -> None:
    driver = FakeDriver()
    driver.states[PID] = ProcessState.LOCKED  # e.g. a restore that succeeded before a crash
    resume(driver, PID)
    assert steps(driver) == ["unlock"] and driver.states[PID] is ProcessState.RUNNING


def test_resume_of_a_failed_worker_is_a_park_failure() -> None:
    driver = FakeDriver()
    driver.states[PID] = ProcessState.FAILED
    with pytest.raises(ParkFailed, match="FAILED"):
        resume(driver, PID)
    assert steps(driver) == []


def test_checkpoint_reported_done_but_not_checkpointed_is_a_failure() -> None:
    driver = FakeDriver()

    def lying_checkpoint(pid: int) -> None:  # the call returns, the state says otherwise
        driver.calls.append(("checkpoint", pid))
        driver.states[pid] = ProcessState.FAILED

    driver.checkpoint = lying_checkpoint
    with pytest.raises(ParkFailed, match="FAILED after its checkpoint"):
        suspend(driver, PID)


# A worker with the processes its cell started (DDP ranks, DataLoader workers): parked together.
RANK, LOADER = 4343, 4444


def test_a_worker_and_the_processes_it_started_park_and_resume_together() -> None:
    driver = FakeDriver()
    driver.without_cuda.add(LOADER)  # a DataLoader worker that never touched CUDA
    assert suspend_tree(driver, [PID, RANK, LOADER]) is True
    assert driver.states[PID] is driver.states[RANK] is ProcessState.CHECKPOINTED
    assert LOADER not in driver.states
    resume_tree(driver, [PID, RANK, LOADER], {"gpu-a": "gpu-b"})
    assert driver.states[PID] is driver.states[RANK] is ProcessState.RUNNING
    assert [pid for pid, _ in driver.moves] == [PID, RANK]  # both moved to the new GPU


def test_a_tree_parks_all_or_none() -> None:
    driver = FakeDriver()
    driver.states[RANK] = ProcessState.FAILED  # a rank the driver cannot checkpoint
    with pytest.raises(ParkFailed, match=str(RANK)):
        suspend_tree(driver, [PID, RANK])
    assert driver.states[PID] is ProcessState.RUNNING  # put back: nothing is left half parked
