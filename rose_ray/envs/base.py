"""What every world's game returns from a step, and the interface a pool hosts."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any, Protocol

from rose_ray.types import GameId


class GameError(RuntimeError):
    """The game's process died, hung past its timeout, or failed to start."""


@dataclass
class StepResult:
    """One observation. `raw_score` is the world's own score (ScienceWorld: -100..100);
    `score` is it normalised to [0, 1] and `success` whether the task is done, as the world
    defines them.

    `interrupted` means the game's process died or hung during the call: the episode is lost
    and the caller should restart it from its first turn.
    """

    observation: str
    raw_score: int = 0
    done: bool = False
    turn: int = 0
    game: GameId | None = None
    end_reason: str = ""  # "", success, failed, completed, turn_limit, interrupted, ended (stepped after the end)
    interrupted: bool = False
    latency_ms: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0
    success: bool = False


@dataclass
class ExpertReply:
    """A world's expert teacher's next reply in an episode (envs/sciworld/expert.py): its text in
    the protocol's form, or None where it has no plan (the episode then ends). `planned`: it has
    a plan from this state; `verified`: that plan won when replayed in its scratch game;
    `status` says which (verified, partial, no_plan, ...); `replans`: plans made again this
    episode after the game answered otherwise than the replay; `plan_s`: this reply's time."""

    text: str | None
    action: str | None = None
    planned: bool = False
    verified: bool = False
    status: str = ""
    replans: int = 0
    plan_s: float = 0.0


class Game(Protocol):
    """One game of one world, on its own process (a JVM, a worker); a failed or timed-out
    call kills the process and raises GameError."""

    def load(self, game: GameId, gold: bool = False) -> StepResult: ...

    def step(self, action: str) -> StepResult: ...

    def gold_actions(self) -> list[str]: ...

    def state(self) -> dict[str, Any]: ...

    def alive(self) -> bool: ...

    def kill(self) -> None: ...

    @property
    def pid(self) -> int | None: ...

    def close(self) -> None: ...


class ProcessGame:
    """Closes its game's process at the end of a `with` block and when garbage-collected
    (subclasses define `close`). `state()`: a small fingerprint of the game's state, and
    `initial_state` the one at load (empty unless the world gives one: ScienceWorld does)."""

    initial_state: dict[str, Any] = {}

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # a half-built game, or interpreter shutdown
            pass


def kill_process(proc: subprocess.Popen) -> None:
    """SIGKILL a game's process if it still runs, and reap it (after a hang or a crash)."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
