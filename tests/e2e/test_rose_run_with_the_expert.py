"""The slow half of tests/unit/envs/test_expert.py (marked `slow`): the expert teacher's finish rate
from the states real moves leave (random valid actions; the untrained tiny student's own greedy
and T=1.0 openings, through Ray, as a run plays them), and a short ROSE run with it that trains.
The warmed student's openings are bench/expert.py's (docs/results.md)."""

from __future__ import annotations

import json
import math

import pytest


@pytest.mark.slow
def test_a_short_rose_run_with_the_expert_trains(tiny_models, ray_cluster, tmp_path):
    """teacher.kind=expert on the tiny default (find tasks): no teacher engine starts, the
    learner trains on the expert's turns after the student's K, and each step logs the
    handoff's state, the expert's planned/verified shares and the teacher's validity by turn."""
    from rose_ray.train import train
    from tests.e2e.test_train import K, overrides, read_jsonl

    run_dir = tmp_path / "run"
    summary = train(None, overrides(tiny_models, run_dir, steps=2) + [
        "teacher.kind=expert", "rollout.max_turns=12", "eval.before=false", "eval.after=false"])
    assert summary["steps"] == 2 and "teacher engine" not in summary["restarts"]
    assert summary["teacher"]["games"] == 2  # the expert alone on the eval games (eval.teacher)
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert len(steps) == 2 and all(math.isfinite(m["learner/loss"]) for m in steps)
    assert all(m["learner/trained_tokens_teacher"] > 0 and m["learner/trained_tokens_student"] == 0 for m in steps)
    for m in steps:
        assert m["rollout/expert_planned_rate"] >= 0.75 and m["rollout/expert_verified_rate"] >= 0.75
        assert 0.0 <= m["rollout/handoff_state_changed_rate"] <= 1.0
        assert f"rollout/teacher_valid_by_turn/t{K + 1:02d}" in m
        assert not any(k.startswith("rollout/teacher_valid_by_turn/t0") and int(k[-2:]) <= K for k in m)
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    for r in rows:
        replies = [c for c in r["conversations"] if c["role"] == "assistant" and c["owner"] != "prompt"]
        assert [c["owner"] for c in replies[:K]] == ["student"] * K
        assert all(c["owner"] == "teacher" and c["loss"] for c in replies[K:])
        assert r["expert"]["planned"] and "handoff_state" in r
    assert any(r["success"] for r in rows)  # the expert finishes the tiny default's find tasks
    json.dumps(rows)  # the records are plain JSON
