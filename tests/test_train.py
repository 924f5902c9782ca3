"""End to end on a real local Ray cluster: a short tiny online-ROSE run, resume, Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rose_ray.metrics import read_scalars
from rose_ray.train import train

K = 2
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


@pytest.fixture(scope="module")
def tiny_run(tiny_models, ray_cluster, tmp_path_factory):
    """A run started as a user starts one, without run_dir=: into the config's run_dir, which
    follows ROSE_RAY_RUNS."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ROSE_RAY_RUNS", str(tmp_path_factory.mktemp("train")))
        summary = train(None, overrides(tiny_models, None, steps=3))
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


def _jvm_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "scienceworld.jar"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_no_jvm_left(tiny_models, tmp_path):
    run_dir = tmp_path / "run"
    before = _jvm_pids()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
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
        during = _jvm_pids() - before
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
    assert not (_jvm_pids() & during)


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
    """teacher_sft on the default (hf) engines; opd's run is the vLLM one below (and
    tests/test_qwen3.py runs opd on hf engines)."""
    run_dir = tmp_path / "run"
    summary = train(None, overrides(tiny_models, run_dir, steps=1) + [
        "algorithm=teacher_sft", "eval.before=false",
        "eval.after=false", "eval.teacher=false", "mode=sync"])
    assert summary["steps"] == 1
    every_reply_of_its_owners_trained(run_dir, {"teacher"})
    step = next(m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m)
    assert step["learner/loss_teacher_ce"] != 0.0


def test_bad_config_is_rejected_with_the_key_named(tmp_path, capsys):
    from rose_ray.cli import main

    assert main(["train", f"run_dir={tmp_path}/r", "rollout.nonsense=1"]) == 2
    assert main(["train", f"run_dir={tmp_path}/r", "rollout.max_lag=-1"]) == 2
    capsys.readouterr()
    # The keys this redesign removed are named, with what took their place.
    assert main(["train", f"run_dir={tmp_path}/r", "learner.algorithm=opd"]) == 2
    assert "key 'learner.algorithm': removed; set `algorithm` only" in capsys.readouterr().err
    assert main(["train", f"run_dir={tmp_path}/r", "rollout.handoff.k=3"]) == 2
    assert "key 'rollout.handoff': removed; moved to algorithm.handoff" in capsys.readouterr().err
    assert main(["train", f"run_dir={tmp_path}/r", "learner.context_policy=end_episode"]) == 2
    assert "key 'learner.context_policy': removed; the learner cuts a trajectory where the engine cut it" in (
        capsys.readouterr().err)
    assert main(["train", f"run_dir={tmp_path}/r", "learner.grad_accum=2"]) == 2
    assert "key 'learner.grad_accum': removed; micro-batches follow a token budget" in capsys.readouterr().err
    assert main(["train", f"run_dir={tmp_path}/r", "learner.attn_implementation=flex"]) == 2
    assert "learner.attn_implementation: must be one of" in capsys.readouterr().err
    for bad, key in (("algorithm.handoff.p0=1.5", "algorithm.handoff.p0"),
                     ("algorithm.handoff.decay_steps=0", "algorithm.handoff.decay_steps")):
        assert main(["train", f"run_dir={tmp_path}/r", "algorithm.handoff.policy=decay", bad]) == 2
        assert f"{key}: must be" in capsys.readouterr().err
    # OPD's teacher reads each episode in one pass: it needs at least the student's context.
    assert main(["train", f"run_dir={tmp_path}/r", "algorithm=opd", "teacher_engine.context_tokens=1024"]) == 2
    assert "teacher_engine.context_tokens: 1024 is less than student_engine.context_tokens 2048" in capsys.readouterr().err
    assert not (tmp_path / "r" / "checkpoints").exists()


def sampled_ids_trained(run_dir: Path, summary: dict) -> None:
    """Two sync steps on vLLM engines trained on exactly the sampled ids: the learner's logprob
    of each sampled id equals the engine's (importance ratio 1, none clipped), which it would
    not be if the learner trained on other ids or the engine served other weights after a
    publication. (Also read by tests/test_hub_ids.py's rose run.)"""
    assert summary["steps"] == 2 and summary["version"] == 2
    steps = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["learner/opd_ratio"] == pytest.approx(1.0, abs=1e-3), m
        assert m["learner/opd_clip_frac"] == 0.0
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert {r["student_version"] for r in rows if r["step"] == 2} == {1}  # sampled after the publication


VLLM_ENGINES = ["mode=sync", "eval.before=false", "eval.after=false", "eval.teacher=false",
                "student_engine.backend=vllm", "teacher_engine.backend=vllm",
                "student_engine.kv_cache_mb=64", "teacher_engine.kv_cache_mb=64"]


@pytest.mark.slow
def test_opd_two_steps_on_vllm_engines_train_on_exactly_the_sampled_ids(tiny_models, ray_cluster, tmp_path):
    """Both engines on vLLM, sync, opd: every reply is the student's and trained, with the OPD
    term; the learner's ratios say it trained on what vLLM sampled. rose (with λ > 0) on vLLM
    engines: tests/test_hub_ids.py, whose run has hub-id models."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    run_dir = tmp_path / "run"
    summary = train(None, overrides(tiny_models, run_dir, steps=2) + ["algorithm=opd", *VLLM_ENGINES])
    sampled_ids_trained(run_dir, summary)
    every_reply_of_its_owners_trained(run_dir, {"student"})
    assert all(m["learner/loss_opd"] != 0.0 for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m)
