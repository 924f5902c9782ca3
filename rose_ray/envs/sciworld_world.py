"""ScienceWorld as a world: the `agentgym` catalogues, the AgentGym protocol, one JVM per game."""

from rose_ray.envs.catalogue import Catalogue
from rose_ray.envs.protocol import Protocol
from rose_ray.envs.sciworld import DEFAULT_HEAP, SciWorldGame
from rose_ray.envs.worlds import World


def _game(call_timeout_s: float = 60.0, max_turns: int | None = None, heap: str | None = DEFAULT_HEAP):
    return SciWorldGame(heap=heap, call_timeout_s=call_timeout_s, max_turns=max_turns)


WORLD = World(name="sciworld", catalogue=Catalogue, protocol=Protocol(), game=_game, has_gold=True)
