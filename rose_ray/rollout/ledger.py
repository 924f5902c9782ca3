"""The game order (`GameSampler`) and every sampled game's one outcome in
`<run_dir>/episodes.jsonl` (docs/reliability.md); each drawn game is episode `e<n>`, n counting
over the whole run. Going back to a checkpoint replays its open episodes first, with their numbers.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rose_ray.errors import InputError
from rose_ray.files import crash_point, drop_cut_line, json_records, writing_file
from rose_ray.types import GameId


class GameSampler:
    """Games of a split, shuffled with a seed, epoch after epoch; its state can be saved."""

    def __init__(self, games: list[GameId], seed: int = 0) -> None:
        if not games:
            raise InputError("the game split is empty")
        self.games, self.seed = list(games), seed
        self.epoch, self.position = 0, 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[GameId]:
        order = list(self.games)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> GameId:
        if self.position >= len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._shuffle(self.epoch)
        game = self._order[self.position]
        self.position += 1
        return game

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._shuffle(self.epoch)


@dataclass
class Draw:
    """One sampled game: its number, and the sampler's cursor just after drawing it."""

    n: int
    game: GameId
    epoch: int
    position: int

    @property
    def episode_id(self) -> str:
        return f"e{self.n}"


class EpisodeLedger:
    def __init__(self, path: str | Path, sampler: Any, fresh: bool = True) -> None:
        """`sampler`: a GameSampler; `fresh`: start the file empty (a new run)."""
        self.path, self.sampler = Path(path), sampler
        self.next_n = 0
        self.open: dict[str, Draw] = {}  # drawn, no outcome yet
        self.replay: deque[Draw] = deque()  # open at the checkpoint gone back to: played first
        self.outcomes: Counter[str] = Counter()
        self._file = self.path.open("w" if fresh else "a")

    def draw(self) -> Draw:
        """The next episode: one to play again, else a new game from the sampler."""
        if self.replay:
            d = self.replay.popleft()
        else:
            game = self.sampler.next()
            at = self.sampler.state_dict()
            d = Draw(self.next_n, game, at["epoch"], at["position"])
            self.next_n += 1
        self.open[d.episode_id] = d
        return d

    def record(self, episode_id: str, outcome: str, **fields: Any) -> None:
        """An episode's one outcome (trained, dropped_stale, failed or in_flight); `fields` (e.g.
        `step`) go into its record."""
        d = self.open.pop(episode_id)
        self.outcomes[outcome] += 1
        self._file.write(json.dumps({"episode": episode_id, "n": d.n, "item_id": d.game.item_id,
                                     "outcome": outcome, **fields}) + "\n")
        self._file.flush()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (take it in the event loop); the file is synced to that length."""
        self._file.flush()
        os.fsync(self._file.fileno())
        pending = sorted([*self.open.values(), *self.replay], key=lambda d: d.n)
        return {"next_n": self.next_n, "sampler": self.sampler.state_dict(), "offset": self.path.stat().st_size,
                "open": [asdict(d) for d in pending], "outcomes": dict(self.outcomes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back to a checkpoint: the file cut to its length, its open episodes to play first. A
        shorter file (a machine's crash) keeps what it has, less a cut last line, and says so."""
        self._file.close()
        size = self.path.stat().st_size
        if size >= state["offset"]:
            with self.path.open("r+") as f:
                f.truncate(state["offset"])
        else:
            drop_cut_line(self.path)
            print(f"train: {self.path} holds {size} bytes, fewer than the {state['offset']} its checkpoint "
                  "recorded: outcome records written before the checkpoint were lost (a crash of the machine?); "
                  "those episodes have no outcome line", file=sys.stderr, flush=True)
        self._file = self.path.open("a")
        self.next_n = state["next_n"]
        self.sampler.load_state_dict(state["sampler"])
        self.open = {}
        self.replay = deque(Draw(d["n"], GameId(**d["game"]), d["epoch"], d["position"])
                            for d in state["open"])
        self.outcomes = Counter(state["outcomes"])

    def stop(self) -> None:
        """The run ends: every open episode (queued to play again too) was in flight."""
        self.open.update((d.episode_id, d) for d in self.replay)
        self.replay.clear()
        for episode_id in sorted(self.open, key=lambda e: self.open[e].n):
            self.record(episode_id, "in_flight")

    def close(self) -> None:
        self._file.close()


def keep_steps(path: str | Path, last_step: int) -> None:
    """Cut a per-step JSONL log back to records of steps <= last_step, atomically
    (files.writing_file). A line cut short goes too; one that is not a JSON object with an
    integer step (or none) is named (file:line) and left out."""
    path = Path(path)
    if not path.exists():
        return

    def bad(n: int, problem: str) -> None:
        print(f"train: {problem}; left out", file=sys.stderr, flush=True)

    with writing_file(path, "wb") as out:
        for n, raw, record in json_records(path, bad):
            step = record.get("step", 0)
            if not isinstance(step, int) or isinstance(step, bool):
                bad(n, f"{path}:{n}: its step is {step!r}, not an integer")
            elif step <= last_step:
                out.write(raw)
                crash_point("rewrite")  # the tests' kill in the middle of a resume's rewrite
