"""Hub ids (`org/name`) resolve once to their snapshot in the local Hugging Face cache
(offline), for engines, the learner, tokenizers, vLLM's weight-name check, `plan` and `check`.

The cache is laid out here as the hub's client lays it out (`models--org--name/snapshots/<rev>/`
with `refs/main` naming `<rev>`), holding the tiny models: nothing can be downloaded here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REVISION = "0123456789abcdef0123456789abcdef01234567"


def put_in_hub_cache(hub: Path, repo_id: str, folder: Path) -> Path:
    """Copy `folder` into the HF cache `hub` as repo `repo_id`'s main revision; its snapshot folder."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def hub_cache(tiny_models, tmp_path, monkeypatch):
    """HF_HOME with org/tiny-student and org/tiny-teacher in its hub cache; {id: snapshot}."""
    import huggingface_hub.constants

    hub = tmp_path / "hf" / "hub"
    snapshots = {f"org/tiny-{role}": put_in_hub_cache(hub, f"org/tiny-{role}", tiny_models[role])
                 for role in ("student", "teacher")}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The hub client read HF_HOME when it was imported (as it would at a user's start).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    return snapshots


def test_a_hub_id_resolves_to_its_cached_snapshot(hub_cache, tiny_models):
    from rose_ray.models import ModelNotAvailable, local_model

    assert local_model("org/tiny-student") == str(hub_cache["org/tiny-student"])
    assert local_model(tiny_models["teacher"]) == str(tiny_models["teacher"])  # a folder stays
    with pytest.raises(ModelNotAvailable, match="'org/not-there' is not available"):
        local_model("org/not-there")


def test_plan_reads_a_hub_models_config(hub_cache, capsys):
    from rose_ray.cli import main

    assert main(["plan", "--node", "CPU=64,GPU=8", "student_engine.model=org/tiny-student",
                 "teacher_engine.model=org/tiny-teacher"]) == 0
    out = capsys.readouterr().out
    assert f"sizes from {hub_cache['org/tiny-student'] / 'config.json'}" in out, out


def test_check_reads_hub_models_from_the_cache(hub_cache, capsys):
    """The seed config with hub-id models in the cache: no --tokenizer-for stand-ins needed."""
    from rose_ray.cli import main

    seed = str(Path(__file__).resolve().parent.parent / "configs/rose_qwen3_1p7b_32b.yaml")
    assert main(["check", seed, "student_engine.model=org/tiny-student", "teacher_engine.model=org/tiny-teacher",
                 "--node", "CPU=64,GPU=8,accelerator_type:H100=1"]) == 0
    out = capsys.readouterr().out
    assert "student chat template" in out and out.rstrip().endswith("OK"), out


@pytest.mark.slow
def test_two_rose_steps_with_hub_id_models_on_vllm_publish_and_train_on_the_sampled_ids(
        hub_cache, tiny_models, ray_cluster, tmp_path):
    """The seed configs name `Qwen/Qwen3-1.7B`: a hub-id student on vLLM trains and takes the
    learner's weights (vLLM's weight-name check reads the snapshot's safetensors). One run for
    two things: its rose (λ 0.5, both engines on vLLM, sync) also trains on exactly the ids
    vLLM sampled (tests/test_train.py's check, shared with its opd run)."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    from test_train import VLLM_ENGINES, sampled_ids_trained

    from rose_ray.train import train

    run_dir = tmp_path / "run"
    summary = train(None, [
        f"run_dir={run_dir}", "steps=2", "teacher_warmup.enabled=false",
        "student_engine.model=org/tiny-student", "teacher_engine.model=org/tiny-teacher", *VLLM_ENGINES,
        "algorithm.lam=0.5",  # + OPD on the student's tokens, whose ratio is checked
        "rollout.batch_episodes=2", "rollout.max_turns=4", "algorithm.handoff.k=2",
        "rollout.student_sampling.max_new_tokens=16", "rollout.teacher_sampling.max_new_tokens=16",
        "env.games_per_worker=2", "checkpoint_every=100"])
    assert summary["steps"] == 2 and summary["version"] == 2
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["weights/version"] for m in metrics if "weights/version" in m][-1] == 2
    rows = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert {r["student_version"] for r in rows if r["step"] == 2} == {1}  # sampled after the publication
    sampled_ids_trained(run_dir, summary)
    owners = {m["owner"] for r in rows for m in r["conversations"] if m["role"] == "assistant" and m["owner"] != "prompt"}
    assert owners == {"student", "teacher"}
