"""One DiscoveryWorld game process (`DiscoveryWorldGame` runs it): JSON lines in on stdin, out
on its own pipe; the package's prints go to /dev/null. Each load builds a fresh `DiscoveryWorldAPI`
(a second load on one leaves the agent in the old world). Fast paths: the observation is
`ui.renderJSON()` alone (the stock one renders the screen twice and writes PNGs) and
`World.saveWorldHistory` (a pickle per tick) is off.
The package also draws from the global `random` and unseeded `random.Random()`s, so the global
RNG is seeded with the game's seed and every unseeded instance from it.
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import sys
import threading
import time
import traceback
from typing import Any

from rose_ray.envs.discoveryworld.game import WORKDIR_PREFIX
from rose_ray.envs.discoveryworld.protocol import (
    INVALID_PREFIX,
    STOP_ACTION,
    first_observation,
    parse_command,
    render_observation,
)

_seed_random = random.Random.seed


def _seed_from_global(self: random.Random, a: Any = None, version: int = 2) -> None:
    if a is None and self is not random._inst:  # an unseeded Random(): seed it from the global RNG
        a = random.getrandbits(64)
    _seed_random(self, a, version)


class Session:
    """The game this process holds."""

    def __init__(self) -> None:
        from discoveryworld.DiscoveryWorldAPI import DiscoveryWorldAPI  # noqa: F401 (imports pygame)

        self.api: Any = None
        self.ui: Any = None
        self.places: list[str] = []
        self.last_ui: dict[str, Any] = {}

    def load(self, scenario: str, difficulty: str, seed: int) -> dict[str, Any]:
        from discoveryworld.DiscoveryWorldAPI import DiscoveryWorldAPI
        from discoveryworld.ScenarioMaker import ScenarioMaker, getInternalScenarioName
        from discoveryworld.UserInterface import UserInterface
        from discoveryworld.World import World

        internal = getInternalScenarioName(scenario, difficulty)
        if internal is None:
            raise ValueError(f"DiscoveryWorld has no scenario {scenario!r} at difficulty {difficulty!r}")
        # The last episode's world is garbage in reference cycles: free it before building the next.
        self.api = self.ui = None
        gc.collect()
        random.seed(seed)
        self.api = api = DiscoveryWorldAPI(threadID=os.getpid())
        world = World(assetPath=None, filenameSpriteIndex="spriteIndex.json", dataPath=None,
                      filenameObjectData="objects.tsv", filenameMaterialData="materials.tsv",
                      filenameDiscoveryFeed="discoveryFeed.json")
        world.saveWorldHistory = lambda: None
        ok, error = ScenarioMaker(world=world, seed=seed).setupScenario(internal, 1)
        if not ok:
            raise ValueError(f"DiscoveryWorld could not set up {scenario!r} ({difficulty}): {error}")
        api.world = world
        api.numUserAgents = 1
        self.ui = UserInterface(api.window, world.spriteLibrary)
        self.ui.setAgent(world.getUserAgents()[0])
        api.ui = [self.ui]
        world.tick()
        self.places = sorted(world.getTeleportLocations())
        self.last_ui = self.ui.renderJSON()
        card = self.api.getTaskScorecard()[0]  # one card (the package serialises every task's progress)
        # What the knowledge score needs, never shown to the agent.
        scoring = {"task_description": str(card.get("taskDescription") or "").strip(),
                   "critical_questions": [str(q) for q in card.get("criticalQuestions") or []]}
        return {"observation": first_observation(self.last_ui, self.places), **self._scorecard(card),
                "scoring": scoring}

    def _scorecard(self, card: dict[str, Any] | None = None) -> dict[str, Any]:
        card = card or self.api.getTaskScorecard()[0]
        return {"score": float(card["scoreNormalized"]), "completed": bool(card["completed"]),
                "success": bool(card["completedSuccessfully"])}

    def _turn(self, observation: str, invalid: bool = True, **extra: Any) -> dict[str, Any]:
        """A turn's reply; an invalid one changed nothing in the world: the message is the observation."""
        return {"observation": observation, "invalid": invalid, **extra, **self._scorecard()}

    def step(self, text: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        # Names resolve against what the agent last saw (a second renderJSON would pop messages).
        try:
            command = parse_command(text, self.last_ui, self.places)
        except Exception as e:  # a parser bug must not cost the episode: the agent sees it
            return self._turn(f"{INVALID_PREFIX}: could not read '{text[:80]}' ({type(e).__name__}: {e})")
        if isinstance(command, str):
            return self._turn(command)
        if command == STOP_ACTION:  # the agent ends its episode; the world does not move
            return self._turn("Result: you ended the episode.", invalid=False, stopped=True)
        try:
            self.api.performAgentAction(0, command)
        except Exception as e:  # a package bug on a parsed action: the agent sees it, the game goes on
            self.api.agentsThatHaveActedThisStep = set()
            return self._turn(f"{INVALID_PREFIX}: the world could not carry out '{text[:80]}' "
                              f"({type(e).__name__}: {e})")
        # A failure from here on is the world's: an error reply, and the episode restarts.
        self.api.tick()
        self.last_ui = self.ui.renderJSON()
        return self._turn(render_observation(self.last_ui), invalid=False,
                          step_ms=(time.perf_counter() - t0) * 1e3)


def _exit_with_parent(parent: int) -> None:
    """End this process when its parent is gone, even if the game is stuck in a tick."""
    while os.getppid() == parent:
        time.sleep(2.0)
    _remove_workdir()
    os._exit(1)


def _remove_workdir() -> None:
    cwd = os.getcwd()
    if os.path.basename(cwd).startswith(WORKDIR_PREFIX):  # only the private folder we were given
        shutil.rmtree(cwd, ignore_errors=True)


def main() -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # prints from C code too
    random.Random.seed = _seed_from_global  # type: ignore[method-assign]
    session = Session()
    reply.write(json.dumps({"ok": True, "ready": True}) + "\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request["cmd"] == "load":
                out = session.load(request["scenario"], request["difficulty"], int(request["seed"]))
            elif request["cmd"] == "step":
                out = session.step(request["action"])
            elif request["cmd"] == "close":
                break
            else:
                raise ValueError(f"unknown command {request['cmd']!r}")
            reply.write(json.dumps({"ok": True, **out}) + "\n")
        except Exception as e:
            reply.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()[-3000:]}) + "\n")
    _remove_workdir()


if __name__ == "__main__":
    main()
