"""Worlds by name. A world is its catalogue, its protocol and its game class; everything
above `envs/` (pools, episodes, eval, datasets, training), and `envs/pool.py`, reaches a
world only through here: `get_world(name)` returns its `World`.

Adding a world: a package `rose_ray/envs/<name>/` whose `__init__` defines `WORLD` (as
`envs/sciworld/` and `envs/discoveryworld/` do: `catalogue.py`, `protocol.py`, `game.py`),
and its name in `WORLDS`. Packages are imported on first use, so a world's dependencies are
needed only when that world is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rose_ray.envs import DEFAULT_WORLD
from rose_ray.envs.base import Game
from rose_ray.envs.protocol import Protocol
from rose_ray.errors import InputError

# What plays a demonstration after its opening (provision.gold.gold_rows, teacher_warmup.continuation):
# the world's gold path, or its expert teacher from the state the opening left.
CONTINUATIONS: tuple[str, ...] = ("gold", "expert")

WORLDS: dict[str, str] = {
    "sciworld": "rose_ray.envs.sciworld",
    "discoveryworld": "rose_ray.envs.discoveryworld",
}


@dataclass(frozen=True)
class World:
    name: str
    catalogue: Callable[[str | None], Any]  # mapping (None = the world's default) -> GameCatalogue
    protocol: Protocol
    # keyword args: call_timeout_s, max_turns, and heap (the JVM's -Xmx cap, None: uncapped)
    # for a world whose games run a JVM (`jvm`)
    game: Callable[..., Game]
    has_gold: bool  # whether games have gold action paths (`rose-ray gold`, teacher warm-up)
    mappings: tuple[str, ...]  # the catalogue's item-id mappings, the default first
    jvm: bool = False  # its games run on a JVM and `game` takes `heap`
    # a module scoring results as the world's paper does (DiscoveryWorld's Tables 4 and 5:
    # `cell`, `paper_summary`, `paper_markdown`, `compare_paper`), or None
    paper_tables: Any = None
    # a module making gold paths a model can copy from what it sees (`look_before_focus`,
    # `visible_names`: ScienceWorld's `gold.py`), or None: gold paths are used as they are
    observed_gold: Any = None
    # its knowledge scorer, when its games carry critical questions that a judge model answers
    # (`judge_messages`, `read_verdict`, `episode_thoughts`, `PROMPT_HASH`: DiscoveryWorld's
    # knowledge.py; rose_ray/judge.py asks the judge, `eval --judge`), or None
    knowledge: Any = None
    # text of the world to train a tiny tokenizer on (provision.tiny.build_tokenizer), or None
    corpus: Callable[[], str] | None = None
    # its expert teacher, when it has one: a factory taking `heap` and `call_timeout_s` whose
    # object answers `reply(game, first, history, episode) -> ExpertReply` and `close()`
    # (ScienceWorld's envs/sciworld/expert.py), and the tasks it plays; None: no expert
    expert: Callable[..., Any] | None = None
    expert_tasks: tuple[str, ...] = ()


    @property
    def judged(self) -> bool:
        return self.knowledge is not None


def get_world(name: str | None) -> World:
    """The world called `name` (None = DEFAULT_WORLD); a clear error for an unknown or missing one."""
    name = name or DEFAULT_WORLD
    if name not in WORLDS:
        raise InputError(f"unknown world {name!r}; choose from {sorted(WORLDS)}")
    try:
        module = importlib.import_module(WORLDS[name])
    except ImportError as e:
        raise InputError(f"world {name!r} needs a package that is not installed ({e.name}): "
                         f"pip install -e '.[{name}]'") from e
    return module.WORLD


def paper_tables(name: str = "discoveryworld") -> Any:
    """The paper scoring of a world (`World.paper_tables`); a ValueError for a world without."""
    tables = get_world(name).paper_tables
    if tables is None:
        raise InputError(f"world {name!r} has no paper tables")
    return tables


def knowledge_scorer(name: str | None) -> Any:
    """A world's knowledge scorer (`World.knowledge`); a clear error for a world without one."""
    scorer = get_world(name).knowledge
    if scorer is None:
        raise InputError(f"world {name or DEFAULT_WORLD!r} has no critical questions for a knowledge judge")
    return scorer


def world_of_item(item: object) -> str | None:
    """The world an item id names by its prefix (`discoveryworld_5` -> discoveryworld)."""
    if isinstance(item, str) and "_" in item:
        name = item.rsplit("_", 1)[0]
        return name if name in WORLDS else None
    return None


def world_protocol(name: str | None, instruction_from: str | None = None) -> Protocol:
    """A world's protocol, with the instruction and acknowledgement of a dataset's first row
    when `instruction_from` names one (exact compatibility with existing data)."""
    protocol = get_world(name).protocol
    return protocol.from_dataset(instruction_from) if instruction_from else protocol
