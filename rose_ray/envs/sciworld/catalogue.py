"""ScienceWorld's games: id mappings and splits (docs/games.md), from the shipped
`envs/data/sciworld_catalogue.json` (`make_data`), so listing games starts no JVM."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from rose_ray.envs.catalogue import GameCatalogue
from rose_ray.errors import InputError
from rose_ray.types import GameId

EXCLUDED_AGENTGYM = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
MAPPINGS: dict[str, frozenset[str]] = {
    "agentgym": EXCLUDED_AGENTGYM,
    "agentgym_traj": EXCLUDED_AGENTGYM | {"2-3"},
}
# Named id-list splits shipped with the package, with the mapping their ids follow.
NAMED_ID_LISTS: dict[str, tuple[str, str]] = {
    # AgentEval's 200-game test list (public copy: zerosurplus/Agent-R), all test variations
    "agenteval_test": ("agenteval_sciworld_test_ids.json", "agentgym_traj"),
}
ITEM_PREFIX = "sciworld_"


@dataclass(frozen=True)
class TaskInfo:
    task_id: str  # "1-1"
    task: str  # "boil"
    num_variations: int
    train: tuple[int, int]  # half-open variation ranges
    dev: tuple[int, int]
    test: tuple[int, int]

    def split_of(self, variation: int) -> str:
        for name in ("train", "dev", "test"):
            start, end = getattr(self, name)
            if start <= variation < end:
                return name
        raise InputError(f"variation {variation} out of range for task {self.task}")


@cache
def all_tasks() -> tuple[TaskInfo, ...]:
    """Every ScienceWorld task in topic order (30 tasks, 7,207 games)."""
    text = resources.files("rose_ray.envs").joinpath("data/sciworld_catalogue.json").read_text()
    rows = json.loads(text)["tasks"]  # each with TaskInfo's fields, the splits as lists
    return tuple(TaskInfo(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}) for r in rows)


class SciWorldCatalogue(GameCatalogue):
    """ScienceWorld's games of one mapping; also addressable by (task, variation)."""

    world = "sciworld"
    item_prefix = ITEM_PREFIX
    named_id_lists = NAMED_ID_LISTS

    def __init__(self, mapping: str | None = None) -> None:
        mapping = mapping or "agentgym"
        if mapping not in MAPPINGS:
            raise InputError(f"unknown catalogue mapping {mapping!r}; choose from {sorted(MAPPINGS)}")
        self.mapping = mapping
        self.tasks = tuple(t for t in all_tasks() if t.task_id not in MAPPINGS[mapping])
        games: list[GameId] = []
        for t in self.tasks:  # item ids count on across tasks (the list is built before it is added)
            games += [GameId(t.task, v, f"{ITEM_PREFIX}{len(games) + v}") for v in range(t.num_variations)]
        super().__init__(games)
        self._task_by_name = {t.task: t for t in self.tasks}

    def split_of(self, game: GameId) -> str:
        return self._task_by_name[game.task].split_of(game.variation)

    def task_counts(self) -> dict[str, dict[str, int | str]]:  # type: ignore[override]
        counts = super().task_counts()
        return {t: {"task_id": self._task_by_name[t].task_id, **c} for t, c in counts.items()}
