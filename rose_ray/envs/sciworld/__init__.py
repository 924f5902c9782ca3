"""ScienceWorld as a world; `make_catalogue_data` and `make_corpus` regenerate the shipped data.
The game (py4j, scienceworld) is imported only when one is started."""

from importlib import resources

from rose_ray.envs.config import DEFAULT_HEAP
from rose_ray.envs.sciworld import gold
from rose_ray.envs.sciworld.catalogue import MAPPINGS, SciWorldCatalogue
from rose_ray.envs.sciworld.expert import EXPERT_TASKS
from rose_ray.envs.sciworld.protocol import PROTOCOL
from rose_ray.envs.worlds import World


def _game(call_timeout_s: float = 60.0, max_turns: int | None = None, heap: str | None = DEFAULT_HEAP):
    from rose_ray.envs.sciworld.game import SciWorldGame

    return SciWorldGame(heap=heap, call_timeout_s=call_timeout_s, max_turns=max_turns)


def _expert(heap: str | None = DEFAULT_HEAP, call_timeout_s: float = 60.0):
    from rose_ray.envs.sciworld.expert import SciWorldExpert

    return SciWorldExpert(heap=heap, call_timeout_s=call_timeout_s)


WORLD = World(name="sciworld", catalogue=SciWorldCatalogue, protocol=PROTOCOL, game=_game,
              has_gold=True, mappings=tuple(MAPPINGS), observed_gold=gold, expert=_expert,
              corpus=lambda: (resources.files("rose_ray.envs") / "data/sciworld_corpus.txt").read_text(),
              expert_tasks=EXPERT_TASKS)
