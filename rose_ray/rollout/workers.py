"""Many concurrent episodes over EnvPool actors: slots, retries, a seeded game sampler.

Every episode holds one pool slot while it runs. An episode whose game process died (or
whose pool actor died) is restarted from its first turn on the next free slot and counted;
it is never lost and never returned twice.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rose_ray.rollout.episode import Agent, EnvSlot, EpisodeInterrupted, same_tokenizer
from rose_ray.types import GameId, Trajectory

EpisodeFn = Callable[[GameId, EnvSlot], Awaitable[Trajectory]]


@dataclass
class EnvConfig:
    workers: int = 1  # EnvPool actors
    games_per_worker: int = 4  # game processes (JVMs, workers) per actor
    heap: str = "256m"
    call_timeout_s: float = 60.0
    cpus_per_worker: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)  # e.g. {"env_node": 0.01}
    world: str = "sciworld"  # sciworld or discoveryworld
    mapping: str | None = None  # the world's catalogue mapping (None: its default)
    # A JSONL dataset whose first row's first two messages become the instruction and its
    # acknowledgement (exact compatibility with existing data); None: the world's own wording.
    instruction_from: str | None = None

    def __post_init__(self) -> None:
        for key in ("workers", "games_per_worker"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"env.{key}: must be >= 1, got {getattr(self, key)!r}")
        if self.call_timeout_s <= 0:
            raise ValueError(f"env.call_timeout_s: must be > 0, got {self.call_timeout_s!r}")
        from rose_ray.envs.worlds import WORLDS, get_world

        if self.world not in WORLDS:
            raise ValueError(f"env.world: must be one of {sorted(WORLDS)}, got {self.world!r}")
        try:
            get_world(self.world).catalogue(self.mapping)
        except ValueError as e:
            raise ValueError(f"env.mapping: {e}") from None
        if self.instruction_from:
            self.protocol()  # an unreadable file fails at load, naming the key

    def protocol(self):
        """The world's protocol, with the instruction of `instruction_from` when set."""
        from rose_ray.envs.worlds import world_protocol

        try:
            return world_protocol(self.world, self.instruction_from)
        except ValueError as e:
            raise ValueError(f"env.instruction_from: {e}") from None


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

    student_tok = load_tokenizer(student.tokenizer or student.model)
    student_chat = ChatFormat(student_tok, enable_thinking)
    student_agent = Agent(engine_actor(student, num_cpus=student_cpus, num_gpus=student_gpus,
                                       **(student_options or {})),
                          student_chat, student.model, student.context_tokens)
    if teacher is None:
        return student_agent, None
    if teacher == student:  # one engine serves both roles (e.g. `continue` without a student)
        return student_agent, student_agent
    teacher_tok = load_tokenizer(teacher.tokenizer or teacher.model)
    chat = student_chat if same_tokenizer(student_tok, teacher_tok) else ChatFormat(teacher_tok, enable_thinking)
    teacher_agent = Agent(engine_actor(teacher, num_cpus=teacher_cpus, num_gpus=teacher_gpus,
                                       **(teacher_options or {})),
                          chat, teacher.model or teacher.base_url, teacher.context_tokens)
    return student_agent, teacher_agent


def stop_agents(*agents: Agent | None) -> None:
    """End the engine actors of these agents (an actor shared by two agents once)."""
    import ray

    for engine in {id(a.engine): a.engine for a in agents if a is not None}.values():
        ray.kill(engine)


def close_pools(pools: list[Any]) -> None:
    """Close every JVM of the pools, then end the actors."""
    import ray

    for pool in pools:
        try:
            ray.get(pool.close.remote(), timeout=60)
        except Exception:
            pass  # a dead pool has no JVMs left to close
        ray.kill(pool)


@dataclass
class RunnerCounters:
    started: int = 0  # episodes begun (a restart is not a new start)
    finished: int = 0
    restarts: int = 0  # attempts lost to a dead game or pool and begun again
    failed: int = 0  # episodes given up after max_retries

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class EpisodeRunner:
    """Hands free pool slots to episodes and restarts interrupted ones."""

    def __init__(self, pools: list[Any], games_per_pool: int, max_retries: int = 5) -> None:
        self.slots: asyncio.Queue[EnvSlot] = asyncio.Queue()
        for slot in range(games_per_pool):  # interleave pools so load spreads
            for pool in pools:
                self.slots.put_nowait(EnvSlot(pool, slot))
        self.capacity = len(pools) * games_per_pool
        self.max_retries = max_retries
        self.counters = RunnerCounters()
        self.in_flight = 0

    async def play(self, game: GameId, episode: EpisodeFn) -> Trajectory:
        """Run one episode to its end on some slot, restarting it if its game dies."""
        import ray

        self.counters.started += 1
        self.in_flight += 1
        try:
            for attempt in range(self.max_retries + 1):
                slot = await self.slots.get()
                try:
                    trajectory = await episode(game, slot)
                    trajectory.timing["attempts"] = attempt + 1
                    self.counters.finished += 1
                    return trajectory
                except (EpisodeInterrupted, ray.exceptions.RayActorError,
                        ray.exceptions.ActorUnavailableError):
                    self.counters.restarts += 1
                    await asyncio.sleep(min(0.5 * 2**attempt, 5.0))  # a dead pool is restarting
                finally:
                    self.slots.put_nowait(slot)
            self.counters.failed += 1
            raise EpisodeInterrupted(game, f"gave up after {self.max_retries + 1} attempts")
        finally:
            self.in_flight -= 1


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
