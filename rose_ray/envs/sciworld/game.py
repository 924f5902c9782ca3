"""One ScienceWorld game on its own JVM, with a timeout on every call and a lean step: the stock
step's one `server.step`, then only score and completion (docs/games.md, the lean step)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JError
from scienceworld.constants import BASEPATH, JAR_PATH

from rose_ray.envs.base import GameError, ProcessGame, StepResult, end_reason
from rose_ray.envs.config import DEFAULT_HEAP
from rose_ray.envs.sciworld.gold import focused_name
from rose_ray.envs.sciworld.protocol import (
    first_observation,
    is_success,
    location_of,
    normalise_score,
)
from rose_ray.types import GameId

# py4j logs a page of traceback for every broken connection (partly through the root logger);
# our callers get a GameError instead.
logging.getLogger("py4j").setLevel(logging.CRITICAL)


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return "py4j" not in record.pathname


logging.getLogger().addFilter(_not_from_py4j)  # once: addFilter skips a filter it holds


class SciWorldGame(ProcessGame):
    """A ScienceWorld JVM holding one game at a time (score: max(raw, 0)/100, success: 100).
    Turns are counted here (the game's counter skips free actions); an episode ends at
    `max_turns`, on completion, or on a negative score (a failed game)."""

    def __init__(
        self,
        heap: str | None = DEFAULT_HEAP,
        call_timeout_s: float = 60.0,
        max_turns: int | None = None,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self.max_turns = max_turns
        opts = [f"-Xmx{heap}"] if heap else []
        opts.append("-XX:+UseSerialGC")  # one GC thread: many JVMs share few cores
        try:
            # py4j's own GatewayServer (its jar comes first on the classpath) listens on 127.0.0.1;
            # its auth token keeps other users of this machine from driving the JVM.
            port, token, self._proc = launch_gateway(
                classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH, javaopts=opts, return_proc=True,
                enable_auth=True,
            )
            self._gateway = JavaGateway(
                gateway_parameters=GatewayParameters(
                    auto_field=True, port=port, read_timeout=call_timeout_s, auth_token=token
                ),
                java_process=self._proc,
            )
            self.server = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        except Exception as e:  # java missing, port trouble: say which
            raise GameError(f"could not start a ScienceWorld JVM (java opts {opts}): {e}") from e
        self.focused: list[str] = []  # what the agent focused on this game, in order

    def _call(self, what: str, method: str, *args):
        """`self.server.<method>(*args)`; any py4j failure kills the JVM and raises GameError."""
        if self.closed:
            raise GameError(f"{what}: the game is closed")
        t0 = time.monotonic()
        try:
            return getattr(self.server, method)(*args)
        except Py4JError as e:
            # py4j wraps the socket timeout in several layers; elapsed time says it plainly.
            timed_out = time.monotonic() - t0 >= self.call_timeout_s * 0.95
            reason = f"timed out after {self.call_timeout_s:g} s" if timed_out else "failed"
            self.kill()
            raise GameError(f"ScienceWorld {what} {reason} (JVM pid {self.pid}): {e}") from e

    def _load(self, game: GameId, gold: bool) -> StepResult:
        """The first observation: task description, newline, look around."""
        self._call("load", "load", game.task, int(game.variation), "", bool(gold))
        description = self._call("task description", "getTaskDescription")
        look = self._call("look around", "step", "look around")
        self.focused = []
        self.initial_state = self.state()
        return StepResult(observation=first_observation(description, look), game=game)

    def _step(self, action: str) -> StepResult:
        # The JVM's parser handles any string; newlines would be read as several commands.
        action = " ".join(str(action).split())
        observation = self._call("step", "step", action)
        if (name := focused_name(observation)) is not None:
            self.focused.append(name)
        score = int(round(100 * self._call("score", "getScore")))
        completed = bool(self._call("completed", "getCompleted"))
        self.turn += 1
        end = end_reason(failed=score < 0, success=score >= 100, completed=completed,
                         turn_limit=self.max_turns is not None and self.turn >= self.max_turns)
        return StepResult(
            observation=observation,
            raw_score=score,
            done=bool(end),
            turn=self.turn,
            game=self.game,
            end_reason=end,
            score=normalise_score(score),
            success=is_success(score),
        )

    def gold_actions(self) -> list[str]:
        """The gold action path; the game must have been loaded with `gold=True`."""
        return [str(a) for a in self._call("gold path", "getGoldActionSequence")]

    def look(self) -> str:
        """What `look around` says now, without playing it (ScienceWorld's free look: no tick)."""
        return str(self._call("free look", "freeActionLook"))

    def state(self) -> dict[str, Any]:
        """A small fingerprint of the game's state: the room the agent is in, what it carries,
        what it focused on (free calls: the game does not tick)."""
        inventory = str(self._call("free inventory", "freeActionInventory"))
        return {"room": location_of(self.look()), "inventory": " ".join(inventory.split()),
                "focus": list(self.focused)}

    def valid_actions(self) -> list[str]:
        """Every valid action-object combination now (slow: ~20-50 ms)."""
        return [str(a) for a in self._call("valid actions", "getValidActionObjectCombinations")]

    def _release(self) -> None:
        with contextlib.suppress(Exception):
            self._gateway.close(keep_callback_server=False, close_callback_server_connections=False)
        self.closed = True

    def close(self) -> None:
        """Shut the JVM down cleanly (py4j's JVM exits when its stdin gets a newline)."""
        if not self.closed:
            with contextlib.suppress(Exception):
                self._gateway.shutdown()
        super().close()
