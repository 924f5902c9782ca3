"""DiscoveryWorld's games (docs/games.md): 35 (scenario, difficulty) pairs x seeds 0..9; a task
is a pair, named as a slug (`combinatorial-chemistry-easy`). Listing games never imports the package."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rose_ray.envs.catalogue import GameCatalogue
from rose_ray.errors import InputError, UnknownItem
from rose_ray.types import GameId

ITEM_PREFIX = "discoveryworld_"
SEEDS = tuple(range(10))
BENCHMARK_SEEDS = (0, 1, 2, 3, 4)  # the benchmark's instances: the test split
DEV_SEED = 9
THEMES = ("Combinatorial Chemistry", "Archaeology Dating", "Plant Nutrients", "Reactor Lab",
          "Lost in Translation", "Space Sick", "Proteomics", "It's (not) Rocket Science!")
SKILLS = ("Dialog Test", "Pick and Place Test", "Pick and Give Test", "Instrument Measurement Test",
          "Doors Test", "Doors with Keys Test", "Navigation in a House Test", "Search Test",
          "Discovery Feed Test", "Moving Agents Test")
UNIT_TEST_PREFIX = "Small Skills: "
DIFFICULTIES = ("Easy", "Normal", "Challenge")
# (scenario, difficulty) in the package's order; a test checks it against the package.
PAIRS: tuple[tuple[str, str], ...] = (
    (("Tutorial", "Normal"),)
    + tuple((t, d) for t in THEMES for d in DIFFICULTIES)
    + tuple((f"{UNIT_TEST_PREFIX}{s}", "Normal") for s in SKILLS)
)


def slug(scenario: str, difficulty: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{scenario} {difficulty}".lower()).strip("-")


@dataclass(frozen=True)
class Scenario:
    name: str
    difficulty: str
    seed: int

    @property
    def kind(self) -> str:
        """`theme` (a discovery theme), `unit test` (a Small Skill) or `tutorial`."""
        if self.name in THEMES:
            return "theme"
        return "unit test" if self.name.startswith(UNIT_TEST_PREFIX) else "tutorial"

    @property
    def short_name(self) -> str:
        """The name without the `Small Skills: ` prefix (the paper's table rows)."""
        return self.name.removeprefix(UNIT_TEST_PREFIX)


class DiscoveryWorldCatalogue(GameCatalogue):
    world = "discoveryworld"
    item_prefix = ITEM_PREFIX
    mapping = "discoveryworld"

    def __init__(self, mapping: str | None = None) -> None:
        if mapping not in (None, self.mapping):
            raise InputError(f"discoveryworld has one catalogue mapping ({self.mapping!r}), not {mapping!r}")
        self._pairs = {slug(s, d): (s, d) for s, d in PAIRS}
        super().__init__([
            GameId(slug(s, d), seed, f"{ITEM_PREFIX}{len(SEEDS) * p + seed}", world=self.world)
            for p, (s, d) in enumerate(PAIRS) for seed in SEEDS
        ])

    def split_of(self, game: GameId) -> str:
        """`test` for the benchmark's instances, `dev` for seed 9, else `train`."""
        if game.variation in BENCHMARK_SEEDS and self.scenario(game).kind != "tutorial":
            return "test"
        return "dev" if game.variation == DEV_SEED else "train"

    def scenario(self, game: GameId) -> Scenario:
        """The package's (scenario name, difficulty, seed) of a game."""
        try:
            name, difficulty = self._pairs[game.task]
        except KeyError:
            raise UnknownItem(f"task {game.task!r} is not a DiscoveryWorld scenario") from None
        return Scenario(name, difficulty, int(game.variation))

    def turn_limit(self, game: GameId) -> int:
        """The paper's step limit for a game: 100 for Easy tasks and the unit tests, else 1,000."""
        scenario = self.scenario(game)
        return 100 if scenario.difficulty == "Easy" or scenario.kind == "unit test" else 1000
