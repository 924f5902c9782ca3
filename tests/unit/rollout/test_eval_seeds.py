"""Seeded sampling (`rose-ray eval --temperature T --seed S`): every turn of every game draws
with its own seed, derived from (seed, game, turn), not one seed for every request."""

from __future__ import annotations

from rose_ray.types import SamplingParams


def test_each_turn_of_each_game_gets_its_own_stable_seed():
    seeded = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    seeds = {(g, t): seeded.for_turn(g, t).seed for g in ("sciworld_1", "sciworld_2") for t in range(1, 6)}
    assert len(set(seeds.values())) == len(seeds)  # no two turns or games share a draw
    assert seeded.for_turn("sciworld_1", 2).seed == seeds["sciworld_1", 2]  # the same on a rerun
    assert seeded.for_turn("sciworld_1", 2).seed != SamplingParams(1.0, seed=4).for_turn("sciworld_1", 2).seed
    assert all(0 <= s < 2**63 for s in seeds.values())
    assert seeded.for_turn("sciworld_1", 2).temperature == 1.0 and seeded.seed == 3  # nothing else changes
    unseeded = SamplingParams(temperature=1.0)
    assert unseeded.for_turn("sciworld_1", 2) is unseeded  # unseeded stays unseeded


