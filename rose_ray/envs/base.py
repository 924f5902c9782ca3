"""What every world's game returns from a step, and the interface a pool hosts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
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


class ProcessGame:
    """One game of one world on its own process (a JVM, a worker), as a pool hosts it: `load`,
    `step`, `gold_actions`, `valid_actions`, `state`, `alive`, `kill`, `pid`, `close`. A failed
    or timed-out call kills the process and raises GameError. `state()`: a small fingerprint of
    the game's state, `initial_state` the one at load (empty by default). Closed after a `with`
    block and when garbage-collected."""

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
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def end_process(proc: subprocess.Popen, goodbye: bytes) -> None:
    """Ask a game's process to exit (`goodbye` on its stdin); killed if it has not within 5 s."""
    if proc.poll() is None:
        try:
            proc.stdin.write(goodbye)
            proc.stdin.flush()
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - gone or hung: killed below
            pass
    kill_process(proc)
