"""The slow half of tests/unit/envs/test_discoveryworld.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check. The eval of the tiny student on easy games is
tests/e2e/test_eval_with_a_judge.py's, with a served judge (one eval for both)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_a_short_online_rose_run_on_discoveryworld(tiny_models, ray_cluster, tmp_path):
    from rose_ray.config import default_config_path
    from rose_ray.train import train

    config = default_config_path().with_name("tiny_discoveryworld.yaml")
    run_dir = tmp_path / "run"
    summary = train(str(config), [
        f"tiny_dir={tiny_models['student'].parent}", f"run_dir={run_dir}", "steps=2",
        "rollout.batch_episodes=2", "rollout.max_turns=3", "rollout.student_sampling.max_new_tokens=8",
        "rollout.teacher_sampling.max_new_tokens=8", "eval.n=2", "eval.max_turns=2",
        "eval.max_new_tokens=8", "eval.teacher=false", "env.games_per_worker=2",
    ])
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert rows and all(r["item_id"].startswith("discoveryworld_") for r in rows)
    tasks = {"combinatorial-chemistry-easy", "archaeology-dating-easy", "plant-nutrients-easy", "reactor-lab-easy"}
    assert {r["task"] for r in rows} <= tasks
    first = rows[0]["conversations"]
    assert first[0]["content"].startswith("You are an agent in DiscoveryWorld")
    assert first[2]["content"].startswith("Task: ")
    # K=2 student turns, then the teacher: both own turns in the stitched episodes.
    owners = {m["owner"] for r in rows for m in r["conversations"] if m["role"] == "assistant" and m["owner"] != "prompt"}
    assert owners == {"student", "teacher"}
    # The report question is asked at each episode's end and recorded, but not trained on
    # (rollout.report=ask): it is not among the conversation's messages.
    from rose_ray.envs.discoveryworld.protocol import REPORT_QUESTION

    assert all(isinstance(r["report"], str) for r in rows)
    assert not any(REPORT_QUESTION in m["content"] for r in rows for m in r["conversations"])
