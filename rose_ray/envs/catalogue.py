"""What every world's game catalogue does (`GameCatalogue`, which a world's own subclasses: it
lists its games and says each one's split); `parse_item` reads an item id.
"""

from __future__ import annotations

import itertools
import json
import random
from importlib import resources
from pathlib import Path

from rose_ray.errors import InputError, UnknownItem
from rose_ray.types import GameId

SPLITS = ("train", "dev", "test", "all")


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
        self._by_task = {(g.task, g.variation): g for g in games}

    def __len__(self) -> int:
        return len(self.games)

    def split_of(self, game: GameId) -> str:
        raise NotImplementedError

    def find(self, task: str, variation: int) -> GameId:
        """A game by task and variation (a seed, in DiscoveryWorld)."""
        try:
            return self._by_task[task, variation]
        except KeyError:
            raise UnknownItem(f"no {self.world} game of task {task!r} with variation {variation!r} "
                              f"in the {self.mapping!r} mapping") from None

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
                raise InputError(f"item {item!r} is a {other} game, not {self.world}; "
                                 f"pass --world {other} (env.world={other} for train)") from None
            raise
        if not 0 <= index < len(self.games):
            raise UnknownItem(
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
                raise InputError(
                    f"split {name!r} lists item ids of the {mapping!r} mapping, "
                    f"not {self.mapping!r}; pass --mapping {mapping}"
                )
            return self.load_id_list(resources.files("rose_ray.envs").joinpath("data", filename))
        path = Path(name)
        if not path.exists():
            raise InputError(
                f"unknown split {str(name)!r}: use one of {list(SPLITS) + list(self.named_id_lists)} "
                "or the path of a JSON id-list file"
            )
        return self.load_id_list(path)

    def load_id_list(self, path: str | Path) -> list[GameId]:
        """A JSON list of integer item indices, `<prefix><n>` strings, or rows that carry an
        `item_id` (a dataset file as AgentGym publishes it)."""
        try:
            items = json.loads(Path(path).read_text() if isinstance(path, str) else path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(items, list):
            raise InputError(f"{path}: expected a JSON list of item ids, got {type(items).__name__}")
        games = []
        for i, item in enumerate(items):
            if isinstance(item, dict):
                if "item_id" not in item:
                    raise InputError(f"{path}: entry {i} is an object without an 'item_id'")
                item = item["item_id"]
            try:
                games.append(self.game(item))
            except (KeyError, ValueError) as e:
                raise InputError(f"{path}: entry {i} ({item!r}): {e.args[0]}") from None
        return games

    def sample(self, split: str | Path, n: int | None, seed: int = 0,
               tasks: list[str] | None = None) -> list[GameId]:
        """A seeded sample of `n` games of a split (only `tasks`' games, if given), in item order;
        `n=None` or at least the split's size: all of them, in the split's order. The one sampler
        every command draws with. Balanced over tasks: each task's games are shuffled with the
        seed, and tasks in name order give one game each in turn until `n` are chosen.
        """
        pool = self.split(split)
        if tasks:
            known = set(self.task_names())
            unknown = [t for t in tasks if t not in known]
            if unknown:
                raise InputError(f"tasks: unknown task(s) {unknown} in {self.world} (mapping {self.mapping!r}); "
                                 f"`rose-ray games --world {self.world}` lists them")
            pool = [g for g in pool if g.task in tasks]
        if n is None or n >= len(pool):
            return pool
        by_task = itertools.groupby(sorted(pool, key=lambda g: g.task), key=lambda g: g.task)  # a stable sort
        rng = random.Random(seed)
        shuffled = [rng.sample(gs, len(gs))[::-1] for gs in (list(group) for _, group in by_task)]
        rounds = itertools.zip_longest(*shuffled)  # each task's next game, in task order
        chosen = [g for games in rounds for g in games if g is not None][:n]
        return sorted(chosen, key=lambda g: g.index)

    def task_counts(self) -> dict[str, dict[str, int]]:
        """Per task: games in all, train, dev and test."""
        counts: dict[str, dict[str, int]] = {}
        for g in self.games:
            c = counts.setdefault(g.task, {"all": 0, "train": 0, "dev": 0, "test": 0})
            c["all"] += 1
            c[self.split_of(g)] += 1
        return counts


def parse_item(item: int | str, prefix: str = "") -> int:
    """`<prefix>12`, `12` or 12 -> 12; anything else is an InputError naming the value."""
    if isinstance(item, bool):
        raise InputError(f"not an item id: {item!r}")
    if isinstance(item, int):
        return item
    if isinstance(item, str):
        text = item[len(prefix) :] if item.startswith(prefix) else item
        if text.isdigit():
            return int(text)
    expected = f"an integer or '{prefix}<n>'" if prefix else "an integer"
    raise InputError(f"not an item id: {item!r} (expected {expected})")

