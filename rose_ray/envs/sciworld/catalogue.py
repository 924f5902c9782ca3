"""ScienceWorld's games: id mappings and splits, from the shipped
`envs/data/sciworld_catalogue.json` (`make_catalogue_data`), so listing games starts no JVM.

Mappings (by name):
- `agentgym` (default, 4,639 games): all tasks but 5-1, 5-2, 9-1..9-3, 10-1, 10-2, taken
  in topic order, each task's variations 0..n-1 in order; `sciworld_<n>` is the n-th game.
- `agentgym_traj` (4,339 games): also without 2-3; AgentGym's released training and test
  item lists use this one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from rose_ray.envs.catalogue import GameCatalogue
from rose_ray.errors import InputError, UnknownItem
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
    return tuple(
        TaskInfo(
            r["task_id"], r["task"], r["num_variations"],
            tuple(r["train"]), tuple(r["dev"]), tuple(r["test"]),
        )
        for r in json.loads(text)["tasks"]
    )


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
        self._first: dict[str, int] = {}
        for t in self.tasks:
            first = self._first[t.task] = len(games)
            games.extend(
                GameId(t.task, v, f"{ITEM_PREFIX}{first + v}") for v in range(t.num_variations)
            )
        super().__init__(games)
        self._task_by_name = {t.task: t for t in self.tasks}

    def task(self, name: str) -> TaskInfo:
        try:
            return self._task_by_name[name]
        except KeyError:
            raise UnknownItem(f"task {name!r} is not in the {self.mapping!r} mapping") from None

    def find(self, task: str, variation: int) -> GameId:
        info = self.task(task)
        if not 0 <= variation < info.num_variations:
            raise UnknownItem(f"task {task!r} has variations 0..{info.num_variations - 1}, not {variation}")
        return self.games[self._first[task] + variation]

    def split_of(self, game: GameId) -> str:
        return self.task(game.task).split_of(game.variation)

    def task_counts(self) -> dict[str, dict[str, int]]:
        return {
            t.task: {
                "task_id": t.task_id,  # type: ignore[dict-item]
                "all": t.num_variations,
                "train": t.train[1] - t.train[0],
                "dev": t.dev[1] - t.dev[0],
                "test": t.test[1] - t.test[0],
            }
            for t in self.tasks
        }
