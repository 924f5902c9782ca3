"""ScienceWorld's expert teacher (envs/sciworld/expert.py) on real games (real JVMs, no Ray):
it says when it has no plan, plans again when the game goes another way, reads the state a
handoff hands over, continues warm-up demonstrations, and its turns render and train as a model
teacher's do. Its walks and its reading of the student's focuses are checked on their own first.
The slow half (its finish rate from the states random moves and the tiny student's own openings
leave, through Ray; a short ROSE run with it) is tests/e2e/test_rose_run_with_the_expert.py."""

from __future__ import annotations

import pytest

from rose_ray.config import load_config
from rose_ray.envs.pool import EnvPool
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.expert import _after_focus, _moved_since_look, _walk
from tests.unit.provision.test_small_tier import SMALL

# The house every ScienceWorld game shares (the expert reads it from a walk through the doors).
HOUSE = {"outside": ["foundry", "greenhouse", "kitchen"], "foundry": ["outside"], "greenhouse": ["hallway", "outside"],
         "hallway": ["art studio", "bedroom", "greenhouse", "kitchen", "living room", "workshop"],
         "art studio": ["hallway"], "bedroom": ["hallway"], "kitchen": ["bathroom", "hallway", "outside"],
         "bathroom": ["kitchen"], "living room": ["hallway"], "workshop": ["hallway"]}


def test_walks_take_the_shortest_way_and_the_gold_paths_where_ways_tie():
    assert _walk(HOUSE, "art studio", "outside", prefer=[]) in (["hallway", "greenhouse", "outside"],
                                                                ["hallway", "kitchen", "outside"])
    assert _walk(HOUSE, "art studio", "outside", prefer=["art studio", "hallway", "kitchen"]) == \
        ["hallway", "kitchen", "outside"]
    assert _walk(HOUSE, "bathroom", "bathroom", prefer=[]) == []
    assert _walk(HOUSE, "bathroom", "attic", prefer=[]) is None and _walk(HOUSE, None, "kitchen", prefer=[]) is None


def test_the_students_focus_stands_in_for_the_gold_paths():
    steps = [("focus on chair", "kitchen"), ("move chair to orange box", "kitchen")]
    assert _after_focus(steps, []) == steps
    # The student focused on the chair already: not again.
    assert _after_focus(steps, [("chair", "kitchen")], "fetch") == [("move chair to orange box", "kitchen")]
    # It focused on another thing elsewhere: that thing goes to the box (fetched), or the box to it.
    assert _after_focus(steps, [("axe", "outside")]) == [("move axe to orange box", "kitchen")]
    assert _after_focus(steps, [("axe", "outside")], "fetch") == [("pick up axe", "outside"),
                                                                  ("move axe to orange box", "kitchen")]
    assert _after_focus(steps, [("axe", "outside")], "bring") == [("pick up orange box", "kitchen"),
                                                                  ("move axe to orange box", "outside")]
    moved = [("go to hallway", "You move to the hallway."), ("look", "This room is called the hallway. In it")]
    assert _moved_since_look(moved[:1]) and not _moved_since_look(moved) and not _moved_since_look([])


def play_expert(pool: EnvPool, max_turns: int = 30):
    """The expert's replies in slot 0 until the game ends or it has no plan: (replies, last result)."""
    replies, result = [], None
    for _ in range(max_turns):
        reply = pool.expert_reply(0)
        replies.append(reply)
        if reply.text is None:
            break
        result = pool.step(0, parse_action(reply.text).action)
        if result.done:
            break
    return replies, result


def test_warm_up_demonstrations_continue_with_the_expert_after_the_students_opening():
    """teacher_warmup.continuation=expert: after the base student's real turns (here: replies
    that move, and junk), the expert plays from the state they left, and wins; the opening's
    replies stay the student's (context), the expert's are the teacher's, as its replies read."""
    from rose_ray.provision.gold import gold_rows

    cfg = load_config(SMALL)
    games = SciWorldCatalogue(cfg.env.mapping).sample("train", 4, 0, tasks=cfg.tasks)
    openings = {games[0].item_id: ["Thought: go.\nAction: open door to hallway", "Thought: go.\nAction: go to hallway"],
                games[1].item_id: ["Thought: I am in the"]}
    rows, problems = gold_rows(games, workers=2, progress=False, openings=openings, continuation="expert")
    assert len(rows) == 4 and all(r["success"] for r in rows), problems
    for game, row in zip(games, rows):
        replies = row["conversations"][3::2]
        n = len(openings.get(game.item_id, []))
        assert [m["owner"] for m in replies[:n]] == ["student"] * n and all(m["owner"] == "teacher" for m in replies[n:])
        assert all(m["content"].startswith("Thought: I am in the ") for m in replies[n:])
    with pytest.raises(Exception, match="continuation"):
        gold_rows(games[:1], progress=False, continuation="oracle")
