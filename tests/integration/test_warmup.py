"""The half of tests/unit/provision/test_warmup.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from rose_ray.config import load_config
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.game import SciWorldGame
from rose_ray.provision.warmup import shipped_gold, warmup_cache


def test_the_shipped_demonstrations_still_match_the_games():
    """A ScienceWorld release that changed these games would make the shipped data a lie."""
    cfg = load_config(None)
    rows = shipped_gold(warmup_cache(cfg, "")[0])
    catalogue = SciWorldCatalogue(cfg.env.mapping)
    with SciWorldGame() as game:
        for row in rows[:: len(rows) // 3][:3]:
            first = game.load(catalogue.game(row["item_id"]))
            conv = row["conversations"]
            assert first.observation == conv[2]["content"]
            for action, observation in zip(conv[3::2], conv[4::2]):
                step = game.step(parse_action(action["content"]).action)
                assert step.observation == observation["content"]
