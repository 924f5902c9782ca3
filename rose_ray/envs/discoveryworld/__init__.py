"""DiscoveryWorld as a world (the discoveryworld package is needed only to play)."""

from rose_ray.envs.discoveryworld import knowledge, paper_tables
from rose_ray.envs.discoveryworld.catalogue import DiscoveryWorldCatalogue
from rose_ray.envs.discoveryworld.protocol import PROTOCOL
from rose_ray.envs.worlds import World

WORLD = World(name="discoveryworld", catalogue=DiscoveryWorldCatalogue, protocol=PROTOCOL,
              game_class="rose_ray.envs.discoveryworld.game:DiscoveryWorldGame", has_gold=False,
              mappings=(DiscoveryWorldCatalogue.mapping,),
              paper_tables=paper_tables, knowledge=knowledge)
