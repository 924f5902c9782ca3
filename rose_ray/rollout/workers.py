"""Many concurrent episodes over EnvPool actors: slots, retries, a seeded game sampler, and
the supervisor that keeps the engine actors serving.

Every episode holds one pool slot while it runs. An episode whose game process died (or
whose pool actor died, or whose engine died) is restarted from its first turn on the next
free slot and counted; it is never lost and never returned twice.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rose_ray.envs.config import EnvConfig  # noqa: F401
from rose_ray.rollout.episode import Agent, EnvSlot, EpisodeInterrupted, same_tokenizer
from rose_ray.rollout.supervisor import EngineSupervisor, awaitable
from rose_ray.types import GameId, Trajectory

EpisodeFn = Callable[[GameId, EnvSlot], Awaitable[Trajectory]]


def start_env_pools(config: EnvConfig, max_turns: int | None = None) -> list[Any]:
    """One EnvPool actor per worker, spread over nodes; Ray restarts a pool that dies."""
    from rose_ray.envs.pool import env_pool_actor

    return [
        env_pool_actor(
            num_games=config.games_per_worker,
            num_cpus=config.cpus_per_worker,
            resources=dict(config.resources),
            heap=config.heap or None,
            call_timeout_s=config.call_timeout_s,
            max_turns=max_turns,
            mapping=config.mapping,
            world=config.world,
        )
        for _ in range(config.workers)
    ]


def init_ray(address: str | None = None) -> None:
    """Join `address` (or RAY_ADDRESS, which `ray job submit` sets), else start a private local
    cluster; use `auto` to join a cluster started with `ray start` on this machine."""
    import os

    import ray

    if ray.is_initialized():
        return
    if address is None and not os.environ.get("RAY_ADDRESS"):
        address = "local"
    if address == "local":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster
    ray.init(address=address, include_dashboard=False, log_to_driver=False)


def start_agents(student: Any, teacher: Any | None, student_cpus: float = 1,
                 teacher_cpus: float = 1, student_gpus: float = 0,
                 teacher_gpus: float = 0, student_options: dict[str, Any] | None = None,
                 teacher_options: dict[str, Any] | None = None,
                 enable_thinking: bool = False) -> tuple[Agent, Agent | None]:
    """Engine actors for a student and an optional teacher (EngineConfigs), with chat formats.

    When both tokenizers give the same ids the agents share one ChatFormat, so an episode
    keeps one id list and the teacher can score student tokens (OPD). `enable_thinking` goes
    to both chat templates.
    """
    from rose_ray.chat import ChatFormat
    from rose_ray.inference.actor import engine_actor
    from rose_ray.models import load_tokenizer

    def spawner(config: Any, num_cpus: float, num_gpus: float, options: dict[str, Any] | None):
        def spawn(generation: int = 0) -> Any:
            opts = dict(options or {})
            if generation and "name" in opts:  # an actor's name must stay unique
                opts["name"] = f"{opts['name']} #{generation}"
            return engine_actor(config, num_cpus=num_cpus, num_gpus=num_gpus, **opts)
        return spawn

    student_tok = load_tokenizer(student.tokenizer or student.model)
    student_chat = ChatFormat(student_tok, enable_thinking)
    spawn = spawner(student, student_cpus, student_gpus, student_options)
    student_agent = Agent(spawn(), student_chat, student.model, student.context_tokens, spawn=spawn)
    if teacher is None:
        return student_agent, None
    if teacher == student:  # one engine serves both roles (e.g. `continue` without a student)
        return student_agent, student_agent
    teacher_tok = load_tokenizer(teacher.tokenizer or teacher.model)
    chat = student_chat if same_tokenizer(student_tok, teacher_tok) else ChatFormat(teacher_tok, enable_thinking)
    spawn = spawner(teacher, teacher_cpus, teacher_gpus, teacher_options)
    teacher_agent = Agent(spawn(), chat, teacher.model or teacher.base_url, teacher.context_tokens, spawn=spawn)
    return student_agent, teacher_agent


def stop_agents(*agents: Agent | None) -> None:
    """End the engine actors of these agents (an actor shared by two agents once)."""
    import ray

    for engine in {id(a.engine): a.engine for a in agents if a is not None}.values():
        ray.kill(engine)


def close_pools(pools: list[Any], timeout_s: float = 30.0) -> None:
    """Close every JVM of the pools (all at once, for at most `timeout_s`), then end the actors.
    A hung pool is killed without waiting longer: its JVMs die with it (die_on_exit)."""
    import ray

    refs = []
    for pool in pools:
        try:
            refs.append(pool.close.remote())
        except Exception:
            pass  # a dead pool has no JVMs left to close
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for pool in pools:
        ray.kill(pool)


async def ping_pools(pools: list[Any], timeout_s: float = 5.0) -> list[str]:
    """One line per env pool that does not answer a ping within `timeout_s` (the watchdog's report)."""
    async def ping(i: int, pool: Any) -> str | None:
        try:
            await asyncio.wait_for(awaitable(pool.num_games.remote()), timeout_s)
            return None
        except asyncio.TimeoutError:
            return f"env pool {i}: no answer to a ping within {timeout_s:g} s (hung?)"
        except Exception as e:  # noqa: BLE001 - dead or restarting: say so
            return f"env pool {i}: {type(e).__name__} (dead or restarting)"

    return [line for line in await asyncio.gather(*(ping(i, p) for i, p in enumerate(pools))) if line]


@dataclass
class RunnerCounters:
    started: int = 0  # episodes begun (a restart is not a new start)
    finished: int = 0
    restarts: int = 0  # attempts lost to a dead game, pool or engine and begun again
    failed: int = 0  # episodes given up after max_retries

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class TrackedSlot(EnvSlot):
    """An EnvSlot that remembers what its episode waits on, for the watchdog's report."""

    def __init__(self, pool: Any, slot: int, pool_index: int) -> None:
        super().__init__(pool, slot)
        self.pool_index = pool_index
        self.waiting: str | None = None  # "reset" or "step" while a call is out
        self.since = time.monotonic()

    async def _call(self, what: str, call: Awaitable[Any]) -> Any:
        self.waiting, self.since = what, time.monotonic()
        try:
            return await call
        finally:
            self.waiting, self.since = None, time.monotonic()

    async def reset(self, game: GameId):
        return await self._call("reset", super().reset(game))

    async def step(self, action: str):
        return await self._call("step", super().step(action))


class EpisodeRunner:
    """Hands free pool slots to episodes and restarts interrupted ones.

    With `engines` (an EngineSupervisor), an episode whose engine was lost waits for the
    replacement, then starts again from its first turn (counted in `restarts`).
    """

    def __init__(self, pools: list[Any], games_per_pool: int, max_retries: int = 5,
                 engines: EngineSupervisor | None = None) -> None:
        self.slots: asyncio.Queue[TrackedSlot] = asyncio.Queue()
        for slot in range(games_per_pool):  # interleave pools so load spreads
            for i, pool in enumerate(pools):
                self.slots.put_nowait(TrackedSlot(pool, slot, i))
        self.capacity = len(pools) * games_per_pool
        self.max_retries = max_retries
        self.engines = engines
        self.counters = RunnerCounters()
        self.in_flight = 0
        self.active: dict[int, tuple[GameId, TrackedSlot]] = {}  # episodes on a slot now

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
            raise EpisodeInterrupted(game, f"gave up after {self.max_retries + 1} attempts")
        except asyncio.CancelledError:  # the run stops: a resume plays this episode again
            self.counters.started -= 1
            self.counters.restarts -= restarts
            raise
        finally:
            self.in_flight -= 1

    def resumable_counters(self, buffered: int) -> RunnerCounters:
        """The counters as a checkpoint keeps them: without the episodes still open (in flight
        here, or `buffered` finished ones waiting for the learner), which a resumed run plays again."""
        c = RunnerCounters(**self.counters.as_dict())
        c.started -= self.in_flight + buffered
        c.finished -= buffered
        return c

    def waiting(self) -> list[str]:
        """What the episodes on a slot wait on, grouped (the watchdog's report)."""
        now, groups = time.monotonic(), {}
        for game, slot in self.active.values():
            what = f"env pool {slot.pool_index} ({slot.waiting})" if slot.waiting else "an engine (generating)"
            n, oldest, example = groups.get(what, (0, 0.0, game.item_id))
            groups[what] = (n + 1, max(oldest, now - slot.since), example)
        return [f"{n} episode(s) waiting on {what}, the longest for {oldest:.0f} s (e.g. {example})"
                for what, (n, oldest, example) in sorted(groups.items())]


class GameSampler:
    """Games of a split, shuffled with a seed, epoch after epoch; its state can be saved."""

    def __init__(self, games: list[GameId], seed: int = 0) -> None:
        if not games:
            raise ValueError("the game split is empty")
        self.games, self.seed = list(games), seed
        self.epoch, self.position = 0, 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[GameId]:
        order = list(self.games)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> GameId:
        if self.position >= len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._shuffle(self.epoch)
        game = self._order[self.position]
        self.position += 1
        return game

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._shuffle(self.epoch)
