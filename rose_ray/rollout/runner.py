"""Many concurrent episodes over EnvPool actors: each holds one pool slot while it runs; one
whose game process, pool actor or engine died is restarted from its first turn on the next
free slot and counted, never lost and never returned twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from rose_ray.rollout.agent import EnvSlot
from rose_ray.rollout.episode import EpisodeInterrupted
from rose_ray.rollout.supervisor import EngineSupervisor
from rose_ray.types import GameId, Trajectory

EpisodeFn = Callable[[GameId, EnvSlot], Awaitable[Trajectory]]


@dataclass
class RunnerCounters:
    started: int = 0  # episodes begun (a restart is not a new start)
    finished: int = 0
    restarts: int = 0  # attempts lost to a dead game, pool or engine and begun again
    failed: int = 0  # episodes given up after max_retries

    as_dict = asdict  # the counters as a plain dict (checkpoints, metrics)


class EpisodeRunner:
    """Hands free pool slots to episodes and restarts interrupted ones (with `engines`, an
    episode whose engine was lost waits for the replacement first)."""

    def __init__(self, pools: list[Any], games_per_pool: int, max_retries: int = 5,
                 engines: EngineSupervisor | None = None) -> None:
        self.slots: asyncio.Queue[EnvSlot] = asyncio.Queue()
        for slot in range(games_per_pool):  # interleave pools so load spreads
            for i, pool in enumerate(pools):
                self.slots.put_nowait(EnvSlot(pool, slot, i))
        self.max_retries = max_retries
        self.engines = engines
        self.counters = RunnerCounters()
        self.in_flight = 0
        self.active: dict[int, tuple[GameId, EnvSlot]] = {}  # episodes on a slot now

    async def play(self, game: GameId, episode: EpisodeFn) -> Trajectory:
        """Run one episode to its end on some slot, restarting it if its game or engine dies."""
        import ray

        self.counters.started += 1
        self.in_flight += 1
        restarts = 0
        try:
            for attempt in range(self.max_retries + 1):
                slot = await self.slots.get()
                self.active[id(slot)] = (game, slot)
                try:
                    trajectory = await episode(game, slot)
                    trajectory.timing["attempts"] = attempt + 1
                    self.counters.finished += 1
                    return trajectory
                except Exception as e:
                    role = self.engines.role_of(e) if self.engines is not None else None
                    if role is None and not isinstance(e, (EpisodeInterrupted, ray.exceptions.RayActorError)):
                        raise
                    lost = e
                finally:
                    del self.active[id(slot)]
                    self.slots.put_nowait(slot)
                self.counters.restarts += 1
                restarts += 1
                if role is not None:
                    await self.engines.recover(role, lost)  # the replacement serves (or RoleFailed)
                else:
                    await asyncio.sleep(min(0.5 * 2**attempt, 5.0))  # a dead pool is restarting
            self.counters.failed += 1
            raise EpisodeInterrupted(
                f"episode on {game.item_id} interrupted: gave up after {self.max_retries + 1} attempts")
        except asyncio.CancelledError:  # the run stops: a resume plays this episode again
            self.counters.started -= 1
            self.counters.restarts -= restarts
            raise
        finally:
            self.in_flight -= 1

    def state_dict(self, buffered: int = 0) -> dict[str, int]:
        """The counters as a checkpoint keeps them: without the episodes still open (in flight
        here, or `buffered` finished ones waiting for the learner), which a resumed run plays again."""
        c = self.counters.as_dict()
        c["started"] -= self.in_flight + buffered
        c["finished"] -= buffered
        return c

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.counters = RunnerCounters(**state)

    def waiting(self) -> list[str]:
        """What the episodes on a slot wait on, grouped (the watchdog's report)."""
        now, groups = time.monotonic(), {}
        for game, slot in self.active.values():
            what = f"env pool {slot.pool_index} ({slot.waiting})" if slot.waiting else "an engine (generating)"
            n, oldest, example = groups.get(what, (0, 0.0, game.item_id))
            groups[what] = (n + 1, max(oldest, now - slot.since), example)
        return [f"{n} episode(s) waiting on {what}, the longest for {oldest:.0f} s (e.g. {example})"
                for what, (n, oldest, example) in sorted(groups.items())]
