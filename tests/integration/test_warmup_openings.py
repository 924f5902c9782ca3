"""The teacher's demonstrations open with the live student's own turns (marked `slow`: Ray); the
warm-up runs are tests/e2e/test_warmup.py, whose docstring says what both check."""

from __future__ import annotations

import pytest

from rose_ray.config import load_config


@pytest.mark.slow
def test_teacher_demonstrations_open_with_the_students_own_sampled_turns(tiny_models, ray_cluster, monkeypatch):
    """Live: the (untrained, random) tiny student plays its first turns on the drawn games, and
    the teacher's demonstrations there open with exactly those replies, student-owned, then gold.
    The openings checked are the ones play_gold drew itself (read through a spy: one student
    engine and one round of openings, where calling student_openings first played them twice)."""
    from rose_ray.provision import warmup
    from rose_ray.provision.warmup import gold_games, opening_turns, play_gold

    cfg = load_config(None, ["teacher_warmup.student_openings=1.0", "teacher_warmup.opening_turns=2",
                             "teacher_warmup.gold_games=4", "rollout.student_sampling.max_new_tokens=12",
                             "teacher_warmup.max_turns=3"])
    games = gold_games(cfg)
    drawn, real = [], warmup.student_openings

    def spy(*args):
        drawn.append((args, real(*args)))
        return drawn[-1][1]

    monkeypatch.setattr(warmup, "student_openings", spy)
    rows = play_gold(cfg, "teacher", str(tiny_models["student"]))
    [((_, played_on, student), openings)] = drawn
    assert [g.item_id for g in played_on] == [g.item_id for g in games] and student == str(tiny_models["student"])
    assert set(openings) == {g.item_id for g in games}  # share 1.0: every game
    assert all(len(openings[g.item_id]) == opening_turns(g, 1.0, 2) for g in games)
    assert len({r for replies in openings.values() for r in replies}) > 1  # sampled text, not a fixed detour
    assert len(rows) == len(games)
    kept = 0
    for row in rows:
        owners = [m["owner"] for m in row["conversations"][3::2]]
        n = owners.count("student")
        assert owners == ["student"] * n + ["teacher"] * (len(owners) - n) and owners[-1] == "teacher"
        kept += n > 0
    assert kept  # the random student's replies change nothing in most games: kept before the gold path
