"""DiscoveryWorld as a world (the discoveryworld package is needed only to play)."""

from rose_ray.envs.discoveryworld import knowledge, paper_tables
from rose_ray.envs.discoveryworld.catalogue import DiscoveryWorldCatalogue
from rose_ray.envs.discoveryworld.protocol import PROTOCOL
from rose_ray.envs.worlds import World
from rose_ray.errors import InputError


def _game(call_timeout_s: float = 60.0, max_turns: int | None = None, heap: str | None = None):
    """`heap`: ignored (no JVM)."""
    import importlib.util

    if importlib.util.find_spec("discoveryworld") is None:
        raise InputError("world 'discoveryworld' needs the discoveryworld package: pip install -e '.[discoveryworld]'")
    from rose_ray.envs.discoveryworld.game import DiscoveryWorldGame

    return DiscoveryWorldGame(call_timeout_s=call_timeout_s, max_turns=max_turns)


WORLD = World(name="discoveryworld", catalogue=DiscoveryWorldCatalogue, protocol=PROTOCOL,
              game=_game, has_gold=False, mappings=(DiscoveryWorldCatalogue.mapping,),
              paper_tables=paper_tables, knowledge=knowledge)
