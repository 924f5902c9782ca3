"""TrajectoryBuffer: bounded, staleness-aware hand-off from rollouts to the learner (docs/design.md):
at most (max_lag + 1) * batch_episodes episodes in flight or buffered; with `drop_stale`, one whose
oldest student token lags the learner by more than max_lag is dropped and counted. Always:
admitted = trained + buffered + dropped_stale + failed + in_flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass

from rose_ray.types import Trajectory


@dataclass
class BufferCounters:
    admitted: int = 0
    accepted: int = 0
    dropped_stale: int = 0
    failed: int = 0
    trained: int = 0

    as_dict = asdict  # the counters as a plain dict (checkpoints, metrics)


class TrajectoryBuffer:
    def __init__(self, batch_episodes: int, max_lag: int, on_drop: Callable[[Trajectory], None] | None = None,
                 drop_stale: bool = True) -> None:
        self.batch_episodes, self.max_lag, self.drop_stale = batch_episodes, max_lag, drop_stale
        self.capacity = (max_lag + 1) * batch_episodes
        self.items: list[Trajectory] = []
        self.in_flight = 0
        self.counters = BufferCounters()
        self.on_drop = on_drop  # told of every trajectory dropped as stale (the run's episode ledger)
        self.lags: list[int] = []  # lag of each trajectory handed to the learner
        self._changed = asyncio.Condition()

    def state_dict(self) -> dict[str, int]:
        """The counters without the open episodes (in flight or buffered), as a checkpoint keeps them."""
        c = self.counters.as_dict()
        c["admitted"] -= self.in_flight + len(self.items)
        c["accepted"] -= len(self.items)
        return c

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Back to a checkpoint's counters, empty (the run has cancelled every episode in flight)."""
        self.items, self.in_flight, self.lags = [], 0, []
        self.counters = BufferCounters(**state)
        self._changed = asyncio.Condition()

    def lag(self, t: Trajectory, learner_version: int) -> int:
        return 0 if t.student_version is None else learner_version - t.student_version

    def fresh(self, t: Trajectory, learner_version: int) -> bool:
        """False for one that lags by more than max_lag (with drop_stale): it is dropped and counted."""
        if not self.drop_stale or self.lag(t, learner_version) <= self.max_lag:
            return True
        self.counters.dropped_stale += 1
        if self.on_drop is not None:
            self.on_drop(t)
        return False

    async def admit(self) -> None:
        """Wait for room, then count one episode in flight."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight + len(self.items) < self.capacity)
            self.in_flight += 1
            self.counters.admitted += 1

    async def add(self, t: Trajectory, learner_version: int) -> bool:
        """A finished episode; False if it was dropped as stale."""
        async with self._changed:
            self.in_flight -= 1
            accepted = self.fresh(t, learner_version)
            if accepted:
                self.items.append(t)
                self.counters.accepted += 1
            self._changed.notify_all()
            return accepted

    async def fail(self) -> None:
        """An admitted episode that could not be played (its game kept dying)."""
        async with self._changed:
            self.in_flight -= 1
            self.counters.failed += 1
            self._changed.notify_all()

    async def take_batch(self, learner_version: int) -> list[Trajectory]:
        """Wait for `batch_episodes` fresh trajectories; stale ones are dropped on the way."""
        async with self._changed:
            while True:
                self.items = [t for t in self.items if self.fresh(t, learner_version)]
                if len(self.items) >= self.batch_episodes:
                    break
                await self._changed.wait()
            batch, self.items = self.items[: self.batch_episodes], self.items[self.batch_episodes :]
            self.counters.trained += len(batch)
            self.lags.extend(self.lag(t, learner_version) for t in batch)
            self._changed.notify_all()  # room for new episodes
            return batch

    def accounting_holds(self) -> bool:
        c = self.counters
        return c.admitted == c.trained + len(self.items) + c.dropped_stale + c.failed + self.in_flight
