"""What every world's game returns from a step, and the interface a pool hosts."""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from rose_ray.types import GameId


class GameError(RuntimeError):
    """The game's process died, hung past its timeout, or failed to start."""


@dataclass
class StepResult:
    """One observation. `raw_score` is the world's own score, `score` it normalised to [0, 1];
    `interrupted`: the game's process died or hung, and the episode must start again."""

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
    """A world's expert teacher's next reply: its text, or None where it has no plan.
    `verified`: the plan won when replayed in its scratch game; `status` says how it stands
    (verified, partial, no_plan, ...); `replans`: plans made again this episode."""

    text: str | None
    action: str | None = None
    planned: bool = False
    verified: bool = False
    status: str = ""
    replans: int = 0
    plan_s: float = 0.0


def end_reason(**reasons: bool) -> str:
    """The first of `reasons` that holds, in the order given ("" while the episode goes on)."""
    return next((reason for reason, holds in reasons.items() if holds), "")


class ProcessGame:
    """One game of one world on its own process (a JVM, a worker), as a pool hosts it: `load`,
    `step`, `gold_actions`, `valid_actions`, `state`, `alive`, `kill`, `pid`, `close`. A failed
    or timed-out call kills the process and raises GameError. `state()`: a small fingerprint of
    the game's state, `initial_state` the one at load (empty by default). A world's game starts
    `_proc` and plays `_load` and `_step`. Closed after a `with` block and when garbage-collected."""

    initial_state: dict[str, Any] = {}
    goodbye = b"\n"  # written to the process's stdin, it asks the process to exit
    _proc: subprocess.Popen
    closed = False
    game: GameId | None = None
    turn = 0
    done = True
    last: StepResult | None = None

    def _load(self, game: GameId, gold: bool) -> StepResult:
        raise NotImplementedError

    def _step(self, action: str) -> StepResult:
        """One turn of a running episode: `turn` counted once the world has answered, `done` set."""
        raise NotImplementedError

    def load(self, game: GameId, gold: bool = False) -> StepResult:
        """Load a game; returns its first observation."""
        t0 = time.perf_counter()
        self.last = self._load(game, gold)
        self.game, self.turn, self.done = game, 0, False
        self.last.latency_ms = (time.perf_counter() - t0) * 1e3
        return self.last

    def step(self, action: str) -> StepResult:
        """One agent turn. Bad input of any kind comes back as an observation."""
        if self.game is None:
            raise GameError("step before load")
        last = self.last
        if self.done:
            return StepResult("The episode has ended.", last.raw_score, True, self.turn, self.game, "ended",
                              score=last.score, success=last.success)
        t0 = time.perf_counter()
        self.last = self._step(action)
        self.done = self.last.done
        self.last.latency_ms = (time.perf_counter() - t0) * 1e3
        return self.last

    def state(self) -> dict[str, Any]:
        return {}

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def alive(self) -> bool:
        return not self.closed and self._proc.poll() is None

    def _release(self) -> None:
        """Free what the game holds besides its process (once that has ended)."""
        self.closed = True

    def kill(self) -> None:
        """End the process at once (after a hang or when it is already dead), and reap it."""
        self._proc.kill()  # SIGKILL, unless it has already been reaped
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        self._release()

    def close(self) -> None:
        """Ask the process to exit (`goodbye`); killed if it has not within 5 s."""
        if self.closed:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(Exception):  # gone or hung: killed below
                self._proc.stdin.write(self.goodbye)
                self._proc.stdin.flush()
                self._proc.wait(timeout=5)
        self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a half-built game, or interpreter shutdown
            self.close()
