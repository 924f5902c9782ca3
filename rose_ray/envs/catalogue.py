"""Game catalogues: what every world's catalogue does, and ScienceWorld's games (id mappings,
splits, id-list files and a held-out sampler).

Reads only the shipped `data/sciworld_catalogue.json` (made by `make_catalogue_data`), so
listing games never starts a JVM.

Mappings (by name):
- `agentgym` (default, 4,639 games): all tasks but 5-1, 5-2, 9-1..9-3, 10-1, 10-2, taken
  in topic order, each task's variations 0..n-1 in order; `sciworld_<n>` is the n-th game.
- `agentgym_traj` (4,339 games): also without 2-3; AgentGym's released training and test
  item lists use this one.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from rose_ray.types import GameId

EXCLUDED_AGENTGYM = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
MAPPINGS: dict[str, frozenset[str]] = {
    "agentgym": EXCLUDED_AGENTGYM,
    "agentgym_traj": EXCLUDED_AGENTGYM | {"2-3"},
}
SPLITS = ("train", "dev", "test", "all")
# Named id-list splits shipped with the package, with the mapping their ids follow.
NAMED_ID_LISTS: dict[str, tuple[str, str]] = {
    # AgentEval's 200-game ScienceWorld test list (public copy: zerosurplus/Agent-R,
    # mcts_utils/sciworld/sciworld_test.json); all in ScienceWorld's test variations under
    # `agentgym_traj`.
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
        raise ValueError(f"variation {variation} out of range for task {self.task}")


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


class GameCatalogue:
    """The games of one world under one mapping: by item id (`<prefix><n>` or n), by split
    (`train`, `dev`, `test`, `all`, a named id list, or an id-list file) and as a seeded,
    task-stratified sample. A world's catalogue fills `games` and says each game's split."""

    world = ""
    item_prefix = ""
    mapping = ""
    named_id_lists: dict[str, tuple[str, str]] = {}

    def __init__(self, games: list[GameId]) -> None:
        self.games = games

    def __len__(self) -> int:
        return len(self.games)

    def split_of(self, game: GameId) -> str:
        raise NotImplementedError

    def task_names(self) -> list[str]:
        return list(dict.fromkeys(g.task for g in self.games))

    def game(self, item: int | str | GameId) -> GameId:
        """A game by integer index, `<prefix><n>` or `<n>`."""
        if isinstance(item, GameId):
            return self.game(item.item_id)
        try:
            index = parse_item(item, self.item_prefix)
        except ValueError:
            from rose_ray.envs.worlds import world_of_item

            other = world_of_item(item)
            if other is not None and other != self.world:
                raise ValueError(f"item {item!r} is a {other} game, not {self.world}; "
                                 f"pass --world {other} (env.world={other} for train)") from None
            raise
        if not 0 <= index < len(self.games):
            raise KeyError(
                f"item {item!r} is outside the {self.mapping!r} mapping (0..{len(self.games) - 1})"
            )
        return self.games[index]

    def split(self, name: str | Path) -> list[GameId]:
        """`train`, `dev`, `test`, `all`, a named id list, or an id-list file."""
        if name == "all":
            return list(self.games)
        if name in ("train", "dev", "test"):
            return [g for g in self.games if self.split_of(g) == name]
        if name in self.named_id_lists:
            filename, mapping = self.named_id_lists[name]
            if mapping != self.mapping:
                raise ValueError(
                    f"split {name!r} lists item ids of the {mapping!r} mapping, "
                    f"not {self.mapping!r}; pass --mapping {mapping}"
                )
            return self.load_id_list(resources.files("rose_ray.envs").joinpath("data", filename))
        path = Path(name)
        if not path.exists():
            raise ValueError(
                f"unknown split {str(name)!r}: use one of {list(SPLITS) + list(self.named_id_lists)} "
                "or the path of a JSON id-list file"
            )
        return self.load_id_list(path)

    def load_id_list(self, path: str | Path) -> list[GameId]:
        """A JSON list of integer item indices or `<prefix><n>` strings."""
        try:
            items = json.loads(Path(path).read_text() if isinstance(path, str) else path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON list of item ids, got {type(items).__name__}")
        games = []
        for i, item in enumerate(items):
            try:
                games.append(self.game(item))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}: entry {i} ({item!r}): {e.args[0]}") from None
        return games

    def sample(self, split: str | Path, n: int, seed: int = 0) -> list[GameId]:
        """A seeded, task-stratified sample of `n` games of a split, in item order.

        Each task gets a share of `n` in proportion to its games in the split (largest
        remainders first, every task at least one while n allows), sampled without replacement.
        """
        pool = self.split(split)
        if n >= len(pool):
            return pool
        by_task: dict[str, list[GameId]] = {}
        for g in pool:
            by_task.setdefault(g.task, []).append(g)
        quotas = _stratified_quotas({t: len(gs) for t, gs in by_task.items()}, n)
        rng = random.Random(seed)
        chosen = [g for t, gs in by_task.items() for g in rng.sample(gs, quotas[t])]
        return sorted(chosen, key=lambda g: g.index)

    def task_counts(self) -> dict[str, dict[str, int]]:
        """Per task: games in all, train, dev and test."""
        counts: dict[str, dict[str, int]] = {}
        for g in self.games:
            c = counts.setdefault(g.task, {"all": 0, "train": 0, "dev": 0, "test": 0})
            c["all"] += 1
            c[self.split_of(g)] += 1
        return counts


class Catalogue(GameCatalogue):
    """ScienceWorld's games of one mapping; also addressable by (task, variation)."""

    world = "sciworld"
    item_prefix = ITEM_PREFIX
    named_id_lists = NAMED_ID_LISTS

    def __init__(self, mapping: str | None = None) -> None:
        mapping = mapping or "agentgym"
        if mapping not in MAPPINGS:
            raise ValueError(f"unknown catalogue mapping {mapping!r}; choose from {sorted(MAPPINGS)}")
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
            raise KeyError(f"task {name!r} is not in the {self.mapping!r} mapping") from None

    def find(self, task: str, variation: int) -> GameId:
        info = self.task(task)
        if not 0 <= variation < info.num_variations:
            raise KeyError(f"task {task!r} has variations 0..{info.num_variations - 1}, not {variation}")
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


def parse_item(item: int | str, prefix: str = ITEM_PREFIX) -> int:
    """`sciworld_12`, `12` or 12 -> 12; anything else is a ValueError naming the value."""
    if isinstance(item, bool):
        raise ValueError(f"not an item id: {item!r}")
    if isinstance(item, int):
        return item
    if isinstance(item, str):
        text = item[len(prefix) :] if item.startswith(prefix) else item
        if text.isdigit():
            return int(text)
    raise ValueError(f"not an item id: {item!r} (expected an integer or '{prefix}<n>')")


def _stratified_quotas(sizes: dict[str, int], n: int) -> dict[str, int]:
    total = sum(sizes.values())
    exact = {t: n * s / total for t, s in sizes.items()}
    quotas = {t: min(sizes[t], int(e)) for t, e in exact.items()}
    if n >= len(sizes):  # every task represented when there is room
        for t in quotas:
            quotas[t] = max(quotas[t], 1)
    # Hand out what is left by largest remainder, then trim any excess from the largest.
    order = sorted(sizes, key=lambda t: (exact[t] - int(exact[t]), sizes[t]), reverse=True)
    while sum(quotas.values()) < n:
        for t in order:
            if sum(quotas.values()) >= n:
                break
            if quotas[t] < sizes[t]:
                quotas[t] += 1
    while sum(quotas.values()) > n:
        t = max(quotas, key=lambda k: (quotas[k], k))
        quotas[t] -= 1
    return quotas
