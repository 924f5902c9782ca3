"""EnvPool: N games of a world, each on its own process, driven from one Ray actor; calls on
different slots run in parallel threads. A game process that dies or hangs is replaced at once and
the call that found it returns `interrupted=True` (docs/reliability.md)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rose_ray.envs.base import ExpertReply, GameError, ProcessGame, StepResult
from rose_ray.envs.config import DEFAULT_HEAP
from rose_ray.envs.worlds import get_world
from rose_ray.types import GameId

START_ATTEMPTS = 3  # a game process's starts before the pool gives up (2 s, then 4 s between)


@dataclass
class _Slot:
    game: ProcessGame | None = None
    world: str = ""
    current: GameId | None = None
    restarts: int = 0
    steps: int = 0
    interrupted: int = 0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=1000))
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the episode's record: its first observation, then (action, observation) per step
    first: str = ""
    history: list[tuple[str, str]] = field(default_factory=list)
    loads: int = 0  # games loaded: tells one episode's record from the next
    expert: Any = None  # the world's expert teacher, started on first use


class EnvPool:
    """Hosts `num_games` games; every method takes a slot index in 0..num_games-1. `heap` caps
    the JVM of a world whose games run one (None: uncapped). A slot keeps its episode's record,
    from which the world's expert teacher plans (`expert_reply`)."""

    def __init__(
        self,
        num_games: int = 4,
        heap: str | None = DEFAULT_HEAP,
        call_timeout_s: float = 60.0,
        max_turns: int | None = None,
        mapping: str | None = None,
        world: str = "sciworld",
    ) -> None:
        if num_games < 1:
            raise ValueError(f"num_games must be >= 1, got {num_games}")
        self.heap, self.call_timeout_s, self.max_turns = heap, call_timeout_s, max_turns
        self.catalogue = get_world(world).catalogue(mapping)
        self.slots = [_Slot(world=world) for _ in range(num_games)]
        self._threads = ThreadPoolExecutor(max_workers=num_games, thread_name_prefix="envpool")
        list(self._threads.map(self._start, self.slots))  # game processes start in parallel

    def num_games(self) -> int:
        return len(self.slots)

    def _start(self, slot: _Slot) -> None:
        # Tried again: on a loaded machine a JVM's gateway can miss its start once, and a pool
        # whose constructor raises is dead for good.
        for attempt in range(START_ATTEMPTS):
            try:
                slot.game = get_world(slot.world).game(call_timeout_s=self.call_timeout_s,
                                                       max_turns=self.max_turns, heap=self.heap)
                return
            except GameError:
                if attempt == START_ATTEMPTS - 1:
                    raise
                time.sleep(2.0 * 2**attempt)

    def _replace(self, slot: _Slot, world: str | None = None) -> None:
        """A new game process: a restart, or a swap to another `world` (not counted as one)."""
        slot.game.kill()
        slot.restarts += world in (None, slot.world)
        slot.world, slot.current = world or slot.world, None
        self._start(slot)

    @contextmanager
    def _held(self, index: int, needs_game: str = "") -> Iterator[_Slot]:
        """The slot, locked; `needs_game`: the call that needs a game loaded first."""
        if not 0 <= index < len(self.slots):
            raise IndexError(f"slot {index} out of range 0..{len(self.slots) - 1}")
        s = self.slots[index]
        with s.lock:
            if needs_game and s.current is None:
                raise RuntimeError(f"slot {index}: {needs_game} before reset")
            yield s

    def reset(self, slot: int, game: GameId | str | int, gold: bool = False) -> StepResult:
        """Load `game` into a slot and return its first observation (a dead process is replaced
        first; a load that kills it is retried once on a new one)."""
        game = game if isinstance(game, GameId) else self.catalogue.game(game)
        with self._held(slot) as s:
            if game.world != s.world or not s.game.alive():
                self._replace(s, game.world)
            try:
                result = s.game.load(game, gold=gold)
            except GameError:
                self._replace(s)
                result = s.game.load(game, gold=gold)
            s.current, s.first, s.history = game, result.observation, []
            s.loads += 1
            return result

    def step(self, slot: int, action: str) -> StepResult:
        """One action in one slot; `interrupted=True` if the game process died or hung (now replaced)."""
        with self._held(slot, "step") as s:
            game = s.current
            try:
                result = s.game.step(action)
            except GameError as e:
                s.interrupted += 1
                self._replace(s)
                return StepResult(
                    observation="",
                    done=True,
                    game=game,
                    end_reason="interrupted",
                    interrupted=True,
                    info={"error": str(e)},
                )
            s.steps += 1
            s.history.append((action, result.observation))
            s.latencies_ms.append(result.latency_ms)
            return result

    def step_many(self, actions: dict[int, str]) -> dict[int, StepResult]:
        """Step several slots in parallel; results keyed by slot."""
        futures = {i: self._threads.submit(self.step, i, a) for i, a in actions.items()}
        return {i: f.result() for i, f in futures.items()}

    def gold_actions(self, slot: int) -> list[str]:
        with self._held(slot) as s:
            return s.game.gold_actions()

    def valid_actions(self, slot: int) -> list[str]:
        with self._held(slot) as s:
            return s.game.valid_actions()

    def expert_reply(self, slot: int) -> ExpertReply:
        """The world's expert teacher's next reply in the episode the slot plays."""
        with self._held(slot, "expert reply") as s:
            if s.expert is None:
                s.expert = get_world(s.world).expert(heap=self.heap, call_timeout_s=self.call_timeout_s)
            return s.expert.reply(s.current, s.first, list(s.history), s.loads)

    def state(self, slot: int) -> dict[str, Any]:
        """The game's state fingerprint at load and now (`initial`, `now`)."""
        with self._held(slot, "state") as s:
            return {"initial": dict(s.game.initial_state), "now": s.game.state()}

    def health(self) -> list[dict[str, Any]]:
        """Per slot: alive, process pid, current game, steps, restarts, interrupted, latency p50/p95."""
        out = []
        for i, s in enumerate(self.slots):
            lat = sorted(s.latencies_ms)
            out.append(
                {
                    "slot": i,
                    "world": s.world,
                    "alive": s.game.alive(),
                    "pid": s.game.pid,
                    "game": s.current.item_id if s.current else None,
                    "steps": s.steps,
                    "restarts": s.restarts,
                    "interrupted": s.interrupted,
                    "step_ms_p50": _percentile(lat, 0.50),
                    "step_ms_p95": _percentile(lat, 0.95),
                }
            )
        return out

    def close(self) -> None:
        for s in self.slots:
            s.game.close()
            if s.expert is not None:
                s.expert.close()
        self._threads.shutdown(wait=False)


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def env_pool_actor(num_games: int = 4, num_cpus: float = 1.0, resources: dict | None = None, **kwargs):
    """An EnvPool as a threaded Ray actor, restarted by Ray when its process dies (calls in
    flight then fail with RayActorError and the episode runner restarts those episodes)."""
    import ray

    cls = ray.remote(EnvPool)
    return cls.options(
        num_cpus=num_cpus, resources=resources or {}, max_concurrency=2 * num_games + 4,
        max_restarts=-1, scheduling_strategy="SPREAD",
    ).remote(num_games=num_games, **kwargs)

