"""ScienceWorld as a world; `make_data` regenerates the shipped data.
The game (py4j, scienceworld) is imported only when one is started."""

from importlib import resources

from rose_ray.envs.sciworld import gold
from rose_ray.envs.sciworld.catalogue import MAPPINGS, SciWorldCatalogue
from rose_ray.envs.sciworld.expert import EXPERT_TASKS
from rose_ray.envs.sciworld.protocol import PROTOCOL
from rose_ray.envs.worlds import World

WORLD = World(name="sciworld", catalogue=SciWorldCatalogue, protocol=PROTOCOL,
              game_class="rose_ray.envs.sciworld.game:SciWorldGame", has_gold=True, mappings=tuple(MAPPINGS),
              observed_gold=gold, expert_class="rose_ray.envs.sciworld.expert:SciWorldExpert",
              corpus=lambda: (resources.files("rose_ray.envs") / "data/sciworld_corpus.txt").read_text(),
              expert_tasks=EXPERT_TASKS)
