"""The slow half of tests/unit/test_train.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check. The module's run is started through the Python
API from inside a running event loop, as a notebook starts one, with W&B logging offline; its
model is evaluated again with `eval --run` (the API's `rose_ray.evaluate(run=...)`, also from a
running loop), which must match the run's own eval to the digit."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rose_ray
from rose_ray.envs.protocol import parse_action
from rose_ray.metrics import read_scalars
from rose_ray.train import train
from tests.integration.test_metrics import wandb_history, wandb_records

K = 2

# The learning-rate schedule and a dev eval every step, which the diagnostics tests read.
STEPS, LR = 3, 3e-3
DIAGNOSTICS = [f"learner.lr={LR}", "learner.schedule=cosine", "learner.warmup_steps=1", "eval.every=1",
               "eval.every_n=2"]
STEP_KEYS = ["rollout/student_valid_rate", "rollout/teacher_valid_rate", "learner/trained_tokens_student",
             "learner/trained_tokens_teacher", "learner/trained_replies", "learner/trained_truncated_rate",
             "learner/trained_repeated_rate", "learner/trained_invalid_rate", "learner/lr"]
DEV_KEYS = ["eval/dev_score", "eval/dev_success", "eval/dev_pass", "eval/dev_invalid_action_rate",
            "eval/dev_cut_before_action_rate"]


LISTED_SCALARS = [
    "eval/score", "eval/success", "eval/pass",
    "rollout/score", "rollout/episodes_per_s", "rollout/tokens_per_s", "rollout/handoff_turn",
    "rollout/invalid_action_rate",
    "learner/loss", "learner/loss_teacher_ce", "learner/loss_opd", "learner/grad_norm", "learner/lr",
    "learner/tokens_per_s",
    "async/policy_lag", "async/buffer_size", "async/dropped_stale",
    "env/step_ms_p50", "env/step_ms_p95", "env/restarts",
    "weights/sync_ms", "weights/version",
]


def overrides(tiny_models, run_dir, steps: int) -> list[str]:
    """A short tiny run; run_dir None: the config's run_dir (a new version folder under it)."""
    return [
        f"tiny_dir={tiny_models['student'].parent}", *([f"run_dir={run_dir}"] if run_dir else []), f"steps={steps}",
        "teacher_warmup.enabled=false", "checkpoint_every=2", "rollout.batch_episodes=2",
        "rollout.max_turns=4", f"algorithm.handoff.k={K}", "rollout.student_sampling.max_new_tokens=16",
        "rollout.teacher_sampling.max_new_tokens=16", "eval.n=2", "eval.max_turns=2",
        "eval.max_new_tokens=8", "env.games_per_worker=2",
    ]


WANDB = ["logging.wandb.enabled=true", "logging.wandb.project=rose_ray_tests"]


@pytest.fixture(scope="module")
def offline_wandb(tmp_path_factory):
    """W&B offline for this module: its files in the run folder, its own folders in a temp dir."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as env:
        for key in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            env.setenv(key, str(home))
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        yield


async def in_a_notebook(function, *args, **kwargs):
    """`function(...)` called from a coroutine, as a notebook cell calls it: an event loop runs."""
    asyncio.get_running_loop()
    return function(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny_run(tiny_models, ray_cluster, offline_wandb, tmp_path_factory):
    """A run started as a user starts one, without run_dir=: into the config's run_dir, which
    follows ROSE_RAY_RUNS; through `rose_ray.train` inside a running event loop, W&B offline. One
    run read by every test below (the per-step diagnostics and the dev-eval curve included:
    DIAGNOSTICS)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ROSE_RAY_RUNS", str(tmp_path_factory.mktemp("train")))
        summary = asyncio.run(in_a_notebook(rose_ray.train, None, overrides(tiny_models, None, steps=3) + DIAGNOSTICS
                                            + WANDB))
    return Path(summary["run_dir"]), summary


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_trajectories_are_student_then_teacher(tiny_run):
    run_dir, summary = tiny_run
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(rows) == 3 * 2
    for r in rows:
        owners = [m["owner"] for m in r["conversations"] if m["role"] == "assistant" and m["owner"] != "prompt"]
        assert len(owners) == r["rounds"] >= 1
        assert owners[:K] == ["student"] * min(K, len(owners))
        assert owners[K:] == ["teacher"] * (len(owners) - K)
        assert r["handoff_turn"] == (K + 1 if len(owners) > K else None)
        # rose with lambda = 0: only teacher tokens carried loss; the student's are context.
        for m in r["conversations"]:
            assert m["loss"] is (m["role"] == "assistant" and m["owner"] == "teacher"), m
    # No trajectory trained twice.
    assert len({r["episode_id"] for r in rows}) == len(rows)


@pytest.mark.slow
def test_learner_steps_and_the_student_engine_version_advances(tiny_run):
    run_dir, summary = tiny_run
    assert summary["steps"] == 3 and summary["version"] == 3
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(math.isfinite(m["learner/loss"]) and m["learner/loss"] > 0 for m in steps)
    assert [m["weights/version"] for m in steps] == [1.0, 2.0, 3.0]
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    # With max_lag 1, step 3 (at version 2) trains only on episodes sampled after a publication.
    assert max(r["student_version"] for r in rows if r["step"] == 3) >= 1


@pytest.mark.slow
def test_tensorboard_has_the_listed_scalars(tiny_run):
    run_dir, _ = tiny_run
    scalars = read_scalars(run_dir / "tb")
    missing = [tag for tag in LISTED_SCALARS if tag not in scalars]
    assert not missing
    assert [s for s, _ in scalars["learner/loss"]] == [1, 2, 3]
    assert {s for s, _ in scalars["eval/score"]} == {0, 3}  # before and after


@pytest.mark.slow
def test_accounting_holds(tiny_run):
    _, summary = tiny_run
    b = summary["buffer"]
    assert summary["accounting_holds"]
    assert b["trained"] == 6
    assert b["admitted"] >= b["trained"] + b["dropped_stale"] + b["failed"]
    assert summary["runner"]["started"] >= summary["runner"]["finished"]


@pytest.mark.slow
def test_each_step_logs_validity_and_what_it_trained_on(tiny_run):
    run_dir, _ = tiny_run
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
        # What each handoff handed over (a model teacher's too), and the teacher's validity at
        # each turn of the game: from turn K+1, where it took over.
        states = [r["handoff_state"] for r in rows if r["step"] == m["step"] and "handoff_state" in r]
        assert states and m["rollout/handoff_state_changed_rate"] == pytest.approx(
            sum(s["changed"] for s in states) / len(states))
        turns = sorted(k for k in m if k.startswith("rollout/teacher_valid_by_turn/"))
        assert turns and turns[0] == f"rollout/teacher_valid_by_turn/t{K + 1:02d}"
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
def test_a_dev_eval_curve_from_before_the_first_step_to_after_the_last(tiny_run):
    run_dir, summary = tiny_run
    dev = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "eval/dev_score" in m]
    assert dev[0]["step"] == 0 and dev[-1]["step"] == STEPS  # the steps between: when one was free
    for m in dev:
        assert all(k in m and 0.0 <= m[k] <= 1.0 for k in DEV_KEYS), m
    assert [e["step"] for e in summary["dev"]] == [m["step"] for m in dev]
    assert all(e["games"] == 2 for e in summary["dev"])
    assert summary["before"]["games"] == summary["after"]["games"] == 2  # the test games: apart from dev
    scalars = read_scalars(run_dir / "tb")
    assert all(k in scalars for k in STEP_KEYS + DEV_KEYS)


@pytest.mark.slow
def test_wandb_offline_files_hold_the_runs_scalars_and_config(tiny_run):
    """Every scalar the run logged (metrics.jsonl, TensorBoard), at its step, in W&B's offline
    files; the W&B run named after the run folder, with the run's config."""
    run_dir, _ = tiny_run
    logged = [{k: v for k, v in m.items() if k != "time"}
              for m in read_jsonl(run_dir / "metrics.jsonl")]
    history = wandb_history(run_dir)[:len(logged)]  # a resume (below) logs on in the same W&B run
    assert history == logged and any("learner/loss" in m for m in history)
    assert {k for m in history for k in m} - {"step"} == set(read_scalars(run_dir / "tb"))
    [run] = [r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run"][:1]
    assert (run.display_name, run.project) == (f"tiny/{run_dir.name}", "rose_ray_tests")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["steps"] == STEPS and config["algorithm"]["handoff"]["k"] == K


@pytest.mark.slow
def test_eval_run_plays_the_runs_model_as_its_own_eval_did(tiny_run):
    """`rose-ray eval --run RUN` (here the API's `rose_ray.evaluate(run=...)`, from a running event
    loop; RUN_DIR/latest names the run) plays the run's model/ on the run's eval games with its
    eval settings and engine: the run's own "after" eval, to the digit. It writes into the run's
    folder, and refuses to write there again."""
    from rose_ray.cli import main

    run_dir, _ = tiny_run
    after = json.loads((run_dir / "summary.json").read_text())["after"]  # the run's (a resume rewrites both)
    result = asyncio.run(in_a_notebook(rose_ray.evaluate, run=str(run_dir.parent / "latest")))
    overall = result["summary"]["overall"]
    assert overall == {k: after[k] for k in overall}
    assert result["config"]["model"] == str(run_dir / "model") and result["config"]["n"] == after["games"] == 2
    assert json.loads((run_dir / "eval_test.json").read_text())["summary"]["overall"] == overall
    assert main(["eval", "--run", str(run_dir.parent)]) == 2  # the result is there: --overwrite to replace it


def model_step(run_dir) -> int:
    return json.loads((run_dir / "model" / "rose_ray_model.json").read_text())["step"]


@pytest.mark.slow
def test_checkpoint_and_resume_continue_from_the_step(tiny_run, tiny_models):
    run_dir, summary = tiny_run
    runs = run_dir.parent  # the config's run_dir: $ROSE_RAY_RUNS/tiny
    assert runs.name == "tiny" and run_dir.name == "version_0" and (runs / "latest").read_text() == "version_0\n"
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_3"
    assert summary["model"] == str(run_dir / "model") and model_step(run_dir) == 3
    summary = train(None, ["steps=5"], resume=str(runs))  # the config's run_dir: its latest run
    assert summary["run_dir"] == str(run_dir) and summary["steps"] == 5 and summary["version"] == 5
    assert model_step(run_dir) == 5  # a resumed run rewrites model/ when it ends
    steps = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert steps == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="already holds a run"):
        train(None, overrides(tiny_models, run_dir, steps=3))


def _jvm_pids(mark: str) -> set[int]:
    """The ScienceWorld JVMs whose environment carries `mark` (the run's: its driver, Ray's
    workers and their JVMs inherit it), not those of whatever else runs on the machine."""
    out = subprocess.run(["pgrep", "-f", "scienceworld.jar"], capture_output=True, text=True).stdout
    pids = set()
    for pid in map(int, out.split()):
        try:
            if f"ROSE_RAY_TEST_MARK={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.add(pid)
        except OSError:  # gone meanwhile
            pass
    return pids


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_no_jvm_left(tiny_models, tmp_path):
    run_dir = tmp_path / "run"
    mark = os.urandom(8).hex()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1", ROSE_RAY_TEST_MARK=mark)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rose_ray.cli", "train", "ray_address=local", "eval.before=false",
         "eval.teacher=false", *overrides(tiny_models, run_dir, steps=100)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.time() + 400
        metrics = run_dir / "metrics.jsonl"
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and any("learner/loss" in line for line in metrics.read_text().splitlines()):
                break
            time.sleep(1)
        assert proc.poll() is None, proc.stdout.read()
        during = _jvm_pids(mark)
        assert during  # the run's JVMs are up
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopping after the current step" in out
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert int(latest.split("_")[1]) >= 1
    assert model_step(run_dir) == int(latest.split("_")[1])  # model/ after the final checkpoint
    assert f"model in {run_dir / 'model'}" in out
    time.sleep(1)
    assert not _jvm_pids(mark)


def every_reply_of_its_owners_trained(run_dir: Path, owners: set[str]) -> None:
    """The run's replies were all by `owners` and every one of them trained (opd: the
    student's; teacher_sft: the teacher's), nothing else."""
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert {m["owner"] for r in rows for m in r["conversations"]
            if m["role"] == "assistant" and m["owner"] != "prompt"} == owners
    assert all(m["loss"] is (m["role"] == "assistant" and m["owner"] in owners)
               for r in rows for m in r["conversations"])


@pytest.mark.slow
def test_teacher_sft_runs(tiny_models, ray_cluster, tmp_path):
    """teacher_sft on the default (hf) engines; tests/e2e/test_runs_on_qwen3_like_models.py runs opd (on hf engines),
    tests/e2e/test_run_survives_failures.py rose with its OPD term on vLLM engines."""
    run_dir = tmp_path / "run"
    summary = train(None, overrides(tiny_models, run_dir, steps=1) + [
        "algorithm=teacher_sft", "eval.before=false",
        "eval.after=false", "eval.teacher=false", "mode=sync"])
    assert summary["steps"] == 1
    every_reply_of_its_owners_trained(run_dir, {"teacher"})
    step = next(m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m)
    assert step["learner/loss_teacher_ce"] != 0.0
