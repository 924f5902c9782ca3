"""The half of tests/unit/provision/test_small_tier.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from rose_ray.config import load_config
from tests.unit.provision.test_small_tier import SMALL


def test_observed_gold_paths_see_what_they_choose():
    """Real games: ScienceWorld's lifespan gold paths focus on an animal never looked at, under
    an internal name; the observed paths look first, use the name the game shows, and still win."""
    from rose_ray.envs.protocol import parse_action
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.provision.gold import gold_rows

    cfg = load_config(SMALL)
    games = SciWorldCatalogue(cfg.env.mapping).sample("train", 6, 0, tasks=cfg.tasks)
    plain, _ = gold_rows(games, workers=2, progress=False)
    observed, problems = gold_rows(games, workers=2, progress=False, observe=True)
    assert problems == [] and len(observed) == len(games) and all(r["success"] for r in observed)

    def path(row):
        conv = row["conversations"]
        return [(parse_action(a["content"]).action, o["content"]) for a, o in zip(conv[3::2], conv[4::2])]

    unseen = 0
    for before, after in zip(plain, observed):
        view = before["conversations"][2]["content"]  # the last room the agent saw described
        for action, observation in path(after):
            if action.startswith("focus on"):
                assert action[len("focus on "):] in view, (after["item_id"], action, view[:200])
            if action.startswith("go to"):
                view = ""  # a new place, not seen until it looks
            if "you see:" in observation:
                view = observation
        first_focus = [a for a, _ in path(before) if a.startswith("focus on")][0]
        unseen += first_focus[len("focus on "):] not in "".join(o for _, o in path(before))
    assert unseen > 0  # the plain gold paths of these games name things the game never showed

    # Detours: student-owned replies first, then gold turns that win the game just as well
    # without them (replayed from a fresh load). ScienceWorld's gold path for one game differs
    # between loads (another door, another non-living thing), so rows of two calls are not compared.
    from rose_ray.envs.pool import EnvPool

    detoured, problems = gold_rows(games, workers=2, progress=False, observe=True, detours=1.0)
    assert problems == [] and all(r["success"] for r in detoured)
    pool = EnvPool(num_games=1, world="sciworld")
    try:
        for game, row in zip(games, detoured):
            owners = [m["owner"] for m in row["conversations"][3::2]]
            n = owners.count("student")
            assert n in (1, 2) and owners == ["student"] * n + ["teacher"] * (len(owners) - n)
            pool.reset(0, game)
            for reply in row["conversations"][3 + 2 * n::2]:
                result = pool.step(0, parse_action(reply["content"]).action)
            assert result.success and result.score == row["score"], (game.item_id, result)
    finally:
        pool.close()


def test_student_openings_are_kept_where_the_gold_path_still_wins():
    """Real games: a demonstration opens with a student's own replies (junk that changes nothing,
    actions that change little) and its gold path after them; an opening after which the gold
    path loses (a wrong focus ends a lifespan game) is dropped and the game demonstrated without it."""
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.provision.gold import gold_rows

    cfg = load_config(SMALL)
    games = SciWorldCatalogue(cfg.env.mapping).sample("train", 4, 0, tasks=cfg.tasks)
    lifespan = [g for g in games if g.task.startswith("lifespan")]
    junk = ["Thought: I am in the on the task, I am in studio. To make progresss"]
    looked = ["Thought: x\nAction: look around", "Thought: y\nAction: inventory"]
    openings = {games[0].item_id: junk, lifespan[0].item_id: looked, lifespan[1].item_id: ["Action: focus on agent"]}
    rows, problems = gold_rows(games, workers=2, progress=False, observe=True, openings=openings)
    assert all(r["success"] for r in rows) and len(rows) == len(games)
    by_id = {r["item_id"]: r["conversations"] for r in rows}

    def student_replies(conv):
        return [m["content"] for m in conv[3::2] if m["owner"] == "student"]

    assert student_replies(by_id[games[0].item_id]) == junk
    assert student_replies(by_id[lifespan[0].item_id]) == looked
    assert student_replies(by_id[lifespan[1].item_id]) == []  # dropped: the wrong focus lost the game
    assert problems == [f"{lifespan[1].item_id}: the gold path did not score as well after the student's "
                        "opening; demonstrated without it"]
    assert all(student_replies(by_id[g.item_id]) == [] for g in games if g.item_id not in openings)
