"""The trajectory buffer (rollout/buffer.py) alone, with asyncio and no actors: backpressure
admits at most max_lag + 1 batches, stale samples are dropped and counted (or kept when only the
teacher's tokens train), every admitted episode has one outcome, and its counters go through a
checkpoint."""

from __future__ import annotations

import asyncio

import pytest

from rose_ray.rollout.buffer import TrajectoryBuffer
from rose_ray.types import GameId, Trajectory


def traj(i: int, version: int | None) -> Trajectory:
    return Trajectory(GameId("boil", i, f"sciworld_{i}"), [], student_version=version, episode_id=f"e{i}")


def test_buffer_admits_only_up_to_max_lag_plus_one_batches():
    async def main():
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1)  # capacity 4
        for _ in range(4):
            await asyncio.wait_for(buf.admit(), 1)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.admit(), 0.2)  # in flight + buffered would pass 4
        await buf.add(traj(0, 0), learner_version=0)
        await buf.add(traj(1, 0), learner_version=0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.admit(), 0.2)  # buffered items still count
        batch = await asyncio.wait_for(buf.take_batch(0), 1)
        assert [t.episode_id for t in batch] == ["e0", "e1"]
        await asyncio.wait_for(buf.admit(), 1)  # room again
        assert buf.accounting_holds()

    asyncio.run(main())


def test_buffer_drops_and_counts_stale_samples():
    async def main():
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1)
        for _ in range(4):
            await buf.admit()
        assert not await buf.add(traj(0, 0), learner_version=2)  # lag 2 > 1: dropped
        assert await buf.add(traj(1, 1), learner_version=2)
        assert await buf.add(traj(2, None), learner_version=2)  # teacher-only: never stale
        await buf.fail()
        assert buf.counters.dropped_stale == 1 and buf.counters.failed == 1
        for _ in range(2):
            await buf.admit()
        # At version 3 the buffered version-1 sample is too old: dropped on the way out.
        waiter = asyncio.create_task(buf.take_batch(3))
        await asyncio.sleep(0.05)
        assert not waiter.done() and buf.counters.dropped_stale == 2  # only e2 is left
        await buf.add(traj(3, 3), learner_version=3)
        batch = await asyncio.wait_for(waiter, 1)
        assert [t.episode_id for t in batch] == ["e2", "e3"]
        assert all(lag <= 1 for lag in buf.lags)
        assert buf.accounting_holds()
        c = buf.counters
        assert c.admitted == c.trained + len(buf.items) + c.dropped_stale + c.failed + buf.in_flight

    asyncio.run(main())


def test_buffer_keeps_lagging_episodes_when_only_teacher_tokens_train():
    """ROSE without its OPD term trains the frozen teacher's tokens only: no lag makes them
    off-policy, so nothing is dropped (backpressure still bounds how far rollouts run ahead)."""
    async def main():
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1, drop_stale=False)
        for _ in range(4):
            await buf.admit()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.admit(), 0.2)
        assert await buf.add(traj(0, 0), learner_version=5)  # lag 5: kept
        assert await buf.add(traj(1, 4), learner_version=5)
        batch = await asyncio.wait_for(buf.take_batch(7), 1)
        assert [t.episode_id for t in batch] == ["e0", "e1"] and buf.counters.dropped_stale == 0
        assert buf.lags == [7, 3]  # lags are still recorded (async/policy_lag)
        assert buf.accounting_holds()

    asyncio.run(main())


def test_the_buffer_reports_stale_drops_and_checkpoints_counters_without_open_episodes():
    from rose_ray.rollout.buffer import TrajectoryBuffer
    from rose_ray.types import Trajectory

    def traj(i: int) -> Trajectory:
        return Trajectory(GameId("boil", i, f"sciworld_{i}"), [], student_version=0, episode_id=f"e{i}")

    dropped: list = []

    async def main() -> TrajectoryBuffer:
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1, on_drop=dropped.append)  # room for 4
        for _ in range(3):
            await buf.admit()
        assert await buf.add(traj(0), learner_version=0)  # fresh: buffered
        assert not await buf.add(traj(1), learner_version=2)  # two versions behind: stale
        return buf  # e0 buffered, one episode still in flight

    buf = asyncio.run(main())
    assert [t.episode_id for t in dropped] == ["e1"]
    saved = buf.state_dict()
    assert (saved["admitted"], saved["accepted"], saved["dropped_stale"]) == (1, 0, 1)
    resumed = TrajectoryBuffer(2, 1)
    resumed.load_state_dict(saved)
    assert resumed.accounting_holds()  # a resume starts balanced
