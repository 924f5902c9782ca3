"""Worlds by name: everything else reaches a world through `get_world(name)`, its `World`.
Adding one: a package `rose_ray/envs/<name>/` whose `__init__` defines `WORLD`, and its name in
`WORLDS` (imported on first use, so its dependencies are needed only when it is used).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rose_ray.envs import DEFAULT_WORLD
from rose_ray.envs.protocol import Protocol
from rose_ray.errors import InputError

# What plays a demonstration after its opening: the gold path, or the expert from that state.
CONTINUATIONS: tuple[str, ...] = ("gold", "expert")

WORLDS: dict[str, str] = {
    "sciworld": "rose_ray.envs.sciworld",
    "discoveryworld": "rose_ray.envs.discoveryworld",
}


def _made(path: str, **kwargs: Any) -> Any:
    """An instance of the class at "module:Class", imported now: its world's package is needed only here."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)(**kwargs)


@dataclass(frozen=True)
class World:
    name: str
    catalogue: Callable[[str | None], Any]  # mapping (None = the world's default) -> GameCatalogue
    protocol: Protocol
    game_class: str  # "module:Class" of its ProcessGame (call_timeout_s, max_turns, heap: a JVM's cap)
    has_gold: bool  # whether games have gold action paths (`rose-ray gold`, teacher warm-up)
    mappings: tuple[str, ...]  # the catalogue's item-id mappings, the default first
    # Optional modules and factories (None: the world has none):
    paper_tables: Any = None  # results as its paper's tables (discoveryworld/paper_tables.py)
    observed_gold: Any = None  # gold paths a model can copy from what it sees (sciworld/gold.py)
    knowledge: Any = None  # a judge's knowledge scorer (discoveryworld/knowledge.py)
    corpus: Callable[[], str] | None = None  # text to train a tiny tokenizer on (provision/tiny.py)
    # "module:Class" of an expert teacher (heap, call_timeout_s) answering `reply(...)` and `close()`
    expert_class: str | None = None
    expert_tasks: tuple[str, ...] = ()  # the tasks the expert plays

    @property
    def judged(self) -> bool:
        return self.knowledge is not None

    def game(self, **kwargs: Any) -> Any:
        """A new game process (a ProcessGame)."""
        return _made(self.game_class, **kwargs)

    def expert(self, **kwargs: Any) -> Any:
        if self.expert_class is None:
            raise InputError(f"{self.name} has no expert teacher")
        return _made(self.expert_class, **kwargs)


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


def paper_tables() -> Any:
    """DiscoveryWorld's results as its paper's tables (`World.paper_tables`)."""
    return get_world("discoveryworld").paper_tables


def knowledge_scorer(name: str | None) -> Any:
    """A world's knowledge scorer (`World.knowledge`); a clear error for a world without one."""
    scorer = get_world(name).knowledge
    if scorer is None:
        raise InputError(f"world {name or DEFAULT_WORLD!r} has no critical questions for a knowledge judge")
    return scorer


def world_of_item(item: object) -> str | None:
    """The world an item id names by its prefix (`discoveryworld_5` -> discoveryworld)."""
    name = item.rsplit("_", 1)[0] if isinstance(item, str) and "_" in item else None
    return name if name in WORLDS else None


def world_protocol(name: str | None, instruction_from: str | None = None) -> Protocol:
    """A world's protocol, with the opening of the dataset `instruction_from` when set."""
    protocol = get_world(name).protocol
    return protocol.from_dataset(instruction_from) if instruction_from else protocol
