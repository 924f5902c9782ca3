"""One DiscoveryWorld game in its own worker process (the package keeps global state, and a hung
game must be killable), in a private temporary directory removed on close."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from rose_ray.envs.base import GameError, ProcessGame, StepResult, end_reason
from rose_ray.envs.discoveryworld.catalogue import DiscoveryWorldCatalogue
from rose_ray.errors import InputError
from rose_ray.types import GameId

WORKDIR_PREFIX = "rose_ray_dw_"  # each worker's private folder; the worker removes its own on exit
START_TIMEOUT_S = 120.0  # a worker imports the package (pygame) before it is ready


class NoGoldPath(InputError):
    """The world has no gold action paths for its scenarios."""


class DiscoveryWorldGame(ProcessGame):
    """A worker process holding one DiscoveryWorld game at a time. Score: the package's normalised
    score rescaled from the starting score (`relative`); success: the scenario's
    `completedSuccessfully`; turn limit: `max_turns`, else the paper's. `done` ends an episode at
    the agent's word (`agent_stop`). `info["scoring"]` holds the package's own score (`process`);
    the load's also the task and the critical questions."""

    goodbye = b'{"cmd": "close"}\n'

    def __init__(self, call_timeout_s: float = 60.0, max_turns: int | None = None,
                 heap: str | None = None) -> None:
        """`heap`: ignored (no JVM)."""
        if importlib.util.find_spec("discoveryworld") is None:
            raise InputError("world 'discoveryworld' needs the discoveryworld package: "
                             "pip install -e '.[discoveryworld]'")
        self.call_timeout_s = call_timeout_s
        self.max_turns = max_turns
        self.catalogue = DiscoveryWorldCatalogue()
        self.workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYGAME_HIDE_SUPPORT_PROMPT": "1",
               "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy"}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "rose_ray.envs.discoveryworld.worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                cwd=self.workdir, env=env,
            )
        except OSError as e:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise GameError(f"could not start a DiscoveryWorld worker: {e}") from e
        self._buffer = b""
        self._read("start", START_TIMEOUT_S)

    def _read(self, what: str, timeout_s: float) -> dict[str, Any]:
        """The worker's next reply line, within `timeout_s`; a hang, a death or a garbled
        reply kills the worker and raises GameError."""
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            ready = remaining > 0 and select.select([fd], [], [], remaining)[0]
            chunk = os.read(fd, 1 << 20) if ready else b""
            if not chunk:
                reason = "died" if ready else f"timed out after {timeout_s:g} s"
                self.kill()
                raise GameError(f"DiscoveryWorld {what} {reason} (worker pid {self._proc.pid})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as e:
            self.kill()
            raise GameError(f"DiscoveryWorld {what}: unreadable reply from the worker ({e})") from e
        if not reply.get("ok"):
            raise GameError(f"DiscoveryWorld {what} failed: {reply.get('error')}\n{reply.get('traceback', '')}")
        return reply

    def _call(self, what: str, request: dict[str, Any]) -> dict[str, Any]:
        if not self.alive():
            raise GameError(f"{what}: the DiscoveryWorld worker is not running")
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        except OSError as e:
            self.kill()
            raise GameError(f"DiscoveryWorld {what}: the worker is gone ({e})") from e
        return self._read(what, self.call_timeout_s)

    def _load(self, game: GameId, gold: bool) -> StepResult:
        """The first observation: the task, the named places, then the state."""
        if gold:
            raise NoGoldPath("discoveryworld has no gold action paths")
        scenario = self.catalogue.scenario(game)
        reply = self._call("load", {"cmd": "load", "scenario": scenario.name,
                                    "difficulty": scenario.difficulty, "seed": scenario.seed})
        self.limit = self.max_turns if self.max_turns is not None else self.catalogue.turn_limit(game)
        self.start_score = reply["score"]
        scoring = {**reply.get("scoring", {}), "process": reply["score"]}
        return StepResult(observation=reply["observation"], raw_score=round(100 * reply["score"]),
                          game=game, info={"scoring": scoring})

    def _step(self, action: str) -> StepResult:
        reply = self._call("step", {"cmd": "step", "action": str(action)})
        self.turn += 1
        end = end_reason(success=reply["success"], completed=reply["completed"],
                         agent_stop=reply.get("stopped"), turn_limit=self.turn >= self.limit)
        return StepResult(
            observation=reply["observation"], raw_score=round(100 * reply["score"]), done=bool(end),
            turn=self.turn, game=self.game, end_reason=end, score=self.relative(reply["score"]),
            success=bool(reply["success"]),
            # process: the package's own normalised score (the paper's process score)
            info={"invalid": reply["invalid"], "world_step_ms": reply.get("step_ms"),
                  "scoring": {"process": reply["score"]}},
        )

    def relative(self, score: float) -> float:
        """The package's normalised score rescaled to [0, 1] from the starting score."""
        if self.start_score >= 1.0:
            return 1.0 if score >= 1.0 else 0.0
        return min(1.0, max(0.0, (score - self.start_score) / (1.0 - self.start_score)))

    def gold_actions(self) -> list[str]:
        raise NoGoldPath("discoveryworld has no gold action paths")

    def valid_actions(self) -> list[str]:
        raise NotImplementedError("discoveryworld does not list valid actions; see the instruction's commands")

    def _release(self) -> None:
        self.closed = True
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
