"""What a ROSE user reads per learner step (metrics.jsonl and TensorBoard): how many of the
student's and the teacher's replies the game accepted, what the step trained on (tokens per
owner; replies cut, repeated, invalid), the rate the schedule gave, and a dev-eval curve.
One short real run (tiny models, real ScienceWorld, real Ray and DeepSpeed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rose_ray.envs.protocol import parse_action
from rose_ray.metrics import read_scalars
from rose_ray.train import train

STEPS, LR = 3, 3e-3
STEP_KEYS = ["rollout/student_valid_rate", "rollout/teacher_valid_rate", "learner/trained_tokens_student",
             "learner/trained_tokens_teacher", "learner/trained_replies", "learner/trained_truncated_rate",
             "learner/trained_repeated_rate", "learner/trained_invalid_rate", "learner/lr"]
DEV_KEYS = ["eval/dev_score", "eval/dev_success", "eval/dev_pass", "eval/dev_invalid_action_rate",
            "eval/dev_cut_before_action_rate"]


@pytest.fixture(scope="module")
def run(tiny_models, ray_cluster, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("diagnostics") / "run"
    summary = train(None, [
        f"tiny_dir={tiny_models['student'].parent}", f"run_dir={run_dir}", f"steps={STEPS}",
        "teacher_warmup.enabled=false", f"checkpoint_every={STEPS}", "rollout.batch_episodes=2",
        "rollout.max_turns=4", "algorithm.handoff.k=2", "rollout.student_sampling.max_new_tokens=16",
        "rollout.teacher_sampling.max_new_tokens=16", "env.games_per_worker=2", f"learner.lr={LR}",
        "learner.schedule=cosine", "learner.warmup_steps=1", "eval.before=false", "eval.after=false",
        "eval.teacher=false", "eval.every=1", "eval.every_n=2", "eval.max_turns=2", "eval.max_new_tokens=8",
    ])
    return Path(run_dir), summary


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_each_step_logs_validity_and_what_it_trained_on(run):
    run_dir, _ = run
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3]
    # cosine after one warm-up step, over the run's 3 steps: full rate, full, half
    assert [m["learner/lr"] for m in steps] == pytest.approx([LR, LR, LR / 2])
    for m in steps:
        assert all(k in m for k in STEP_KEYS), [k for k in STEP_KEYS if k not in m]
        replies = [(r, c) for r in rows if r["step"] == m["step"] for c in r["conversations"]
                   if c["role"] == "assistant" and c["owner"] in ("student", "teacher")]
        for owner in ("student", "teacher"):  # the rates are the records' flags, counted
            mine = [c for _, c in replies if c["owner"] == owner]
            assert m[f"rollout/{owner}_valid_rate"] == pytest.approx(
                sum(not c.get("invalid") for c in mine) / len(mine))
        # rose with lambda 0: only the teacher's replies train, all its tokens counted there
        trained = [c for _, c in replies if c["loss"]]
        assert {c["owner"] for c in trained} == {"teacher"} and m["learner/trained_replies"] == len(trained)
        assert m["learner/trained_tokens_student"] == 0
        assert m["learner/trained_tokens_teacher"] == m["learner/trained_tokens"] > 0
        for flag in ("truncated", "repeated", "invalid"):
            assert m[f"learner/trained_{flag}_rate"] == pytest.approx(sum(bool(c.get(flag)) for c in trained) / len(trained))
    # With 16 new tokens and an untrained teacher, some replies are cut and most are not actions.
    assert any(c.get("truncated") for r in rows for c in r["conversations"])
    assert any(c.get("invalid") for r in rows for c in r["conversations"])
    # A repeat is a reply that sent the action of the reply before it.
    for r in rows:
        actions = [parse_action(c["content"]).action for c in r["conversations"]
                   if c["role"] == "assistant" and c["owner"] in ("student", "teacher")]
        flagged = [bool(c.get("repeated")) for c in r["conversations"]
                   if c["role"] == "assistant" and c["owner"] in ("student", "teacher")]
        assert not flagged or not flagged[0]
        assert flagged[1:] == [a is not None and a == b for a, b in zip(actions[1:], actions)]


@pytest.mark.slow
def test_a_dev_eval_curve_from_before_the_first_step_to_after_the_last(run):
    run_dir, summary = run
    dev = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "eval/dev_score" in m]
    assert dev[0]["step"] == 0 and dev[-1]["step"] == STEPS  # the steps between: when one was free
    for m in dev:
        assert all(k in m and 0.0 <= m[k] <= 1.0 for k in DEV_KEYS), m
    assert [e["step"] for e in summary["dev"]] == [m["step"] for m in dev]
    assert all(e["games"] == 2 for e in summary["dev"])
    assert summary["before"] is None and summary["after"] is None  # eval.before/after off: no test games
    scalars = read_scalars(run_dir / "tb")
    assert all(k in scalars for k in STEP_KEYS + DEV_KEYS)
