"""The expert teacher's finish rate from the states real moves leave (marked `slow`: real JVMs,
and Ray for the student's openings); the short ROSE run with the expert is
tests/e2e/test_rose_run_with_the_expert.py, whose docstring says what both check."""

from __future__ import annotations

import random

import pytest

from rose_ray.config import load_config
from rose_ray.envs.pool import EnvPool
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.protocol import location_of
from tests.conftest import launch_module
from tests.unit.envs.test_expert import play_expert
from tests.unit.provision.test_small_tier import SMALL

WON_SHARE = 0.95  # of the games still winnable at the handoff, the share the expert must win


def random_openings(pool: EnvPool, game, k: int, rng: random.Random) -> list[tuple[str, object]]:
    """k of the game's valid actions drawn at random, played in slot 0: real moves. Each draw
    first picks a kind: a move that changes the game (a door, a room, taking or moving a thing)
    most often, a focus one time in twenty (most lose the game), else any action; then an action
    of that kind. Valid actions are sorted first: ScienceWorld lists them in another order in
    each JVM."""
    kinds = ("open door", "go to", "pick up", "move ")
    played = []
    for _ in range(k):
        valid = sorted(pool.valid_actions(0))
        draw = rng.random()
        kind = ("focus on",) if draw < 0.05 else (rng.choice(kinds),) if draw < 0.8 else ("",)
        pick = [a for a in valid if a.startswith(kind)]
        action = rng.choice(pick or valid)
        result = pool.step(0, action)
        played.append((action, result))
        if result.done:
            break
    return played


@pytest.mark.slow
def test_the_expert_wins_the_games_real_moves_leave():
    """From the states K = 1..4 random valid actions leave on training games of the small tier's
    tasks and the find tasks, the expert wins >= 95% of those still winnable; its replies are in
    the protocol's form and name the room the game last said the agent is in."""
    cfg = load_config(SMALL)
    tasks = [*cfg.tasks, "find-living-thing", "find-plant", "find-animal"]
    games = SciWorldCatalogue(cfg.env.mapping).sample("train", 18, 3, tasks=tasks)
    rng = random.Random(0)
    pool = EnvPool(num_games=1, world="sciworld")
    winnable = won = changed = verified = 0
    try:
        for game in games:
            first = pool.reset(0, game)
            opening = random_openings(pool, game, rng.randint(1, 4), rng)
            if opening[-1][1].done:
                continue  # lost (or won) by the opening: nobody can win it now
            winnable += 1
            state = pool.state(0)
            changed += state["now"] != state["initial"]
            replies, result = play_expert(pool)
            won += bool(result is not None and result.success)
            verified += replies[0].verified
            if replies[0].text is not None:
                location = location_of(first.observation)
                for _, r in opening:
                    location = location_of(r.observation) or location
                thought = replies[0].text.split("\n")[0]
                assert thought.startswith(f"Thought: I am in the {location}.") and "\nAction: " in replies[0].text
    finally:
        pool.close()
    assert winnable >= 12 and changed >= 4, (winnable, changed)  # the openings changed rooms, hands, focus
    assert won / winnable >= WON_SHARE and verified / winnable >= WON_SHARE, (won, verified, winnable)


@pytest.mark.slow
def test_the_expert_wins_after_the_tiny_students_own_openings(tiny_models, ray_cluster):
    """The rollout's own path (Ray, the hf engine, an EnvPool actor whose slots hold the expert):
    the untrained tiny student plays K = 1..4 turns, greedy and at T=1.0, then the expert; of the
    games still on at the handoff it wins >= 95%, and every handoff records its state."""
    bench = launch_module("expert", folder="bench")
    cfg = load_config(SMALL, ["teacher.kind=expert", "teacher_warmup.enabled=false", "student_warmup.enabled=false",
                              "env.games_per_worker=4"])
    games = SciWorldCatalogue(cfg.env.mapping).sample("train", 3, 5, tasks=cfg.tasks)
    plays = [(k, t) for t in (0.0, 1.0) for k in (1, 2, 3, 4)]
    rows = bench.play(cfg, str(tiny_models["student"]), games, plays, extra_turns=16)
    assert len(rows) == len(games) * len(plays)
    s = bench.summary(rows)
    assert s["winnable"] >= 0.9 * len(rows) and s["won"] / s["winnable"] >= WON_SHARE, s
    assert s["planned_rate"] >= WON_SHARE and all(r["handoff_state"] is not None for r in rows
                                                  if not r["ended_before_handoff"])
    # The expert's replies are the teacher's, after exactly K of the student's.
    for r in rows:
        assert len(r["actions"]) >= r["k"]
