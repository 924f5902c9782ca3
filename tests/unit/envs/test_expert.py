"""ScienceWorld's expert teacher (envs/sciworld/expert.py) on real games (real JVMs, no Ray):
it says when it has no plan, plans again when the game goes another way, reads the state a
handoff hands over, continues warm-up demonstrations, and its turns render and train as a model
teacher's do. Its walks and its reading of the student's focuses are checked on their own first.
The slow half (its finish rate from the states random moves and the tiny student's own openings
leave, through Ray; a short ROSE run with it) is tests/e2e/test_rose_run_with_the_expert.py."""

from __future__ import annotations

from rose_ray.envs.pool import EnvPool
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.expert import _after_focus, _moved_since_look, _walk

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


