"""The slow half of tests/unit/test_trust.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_a_run_with_an_api_key_writes_no_key_to_disk_and_its_saved_config_reads_it_from_the_environment(
        tiny_models, ray_cluster, tmp_path, monkeypatch):
    from rose_ray.config import load_config
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.hf import HFEngine
    from rose_ray.inference.server import OpenAIServer
    from rose_ray.train import train

    key = "sk-rose-ray-test-4f1d9a"
    monkeypatch.delenv("ROSE_RAY_API_KEY", raising=False)
    teacher = HFEngine(EngineConfig(model=str(tiny_models["teacher"]), dtype="float32", threads=1,
                                    max_batch_size=4, max_wait_ms=20, context_tokens=2048))
    run_dir = tmp_path / "run"
    with OpenAIServer(teacher, "teacher", api_key=key).start_background() as server:
        common = [f"tiny_dir={tiny_models['student'].parent}", "teacher_warmup.enabled=false",
                  "tasks=[find-animal]", "rollout.batch_episodes=2", "rollout.max_turns=3", "algorithm.handoff.k=1",
                  "rollout.student_sampling.max_new_tokens=8", "rollout.teacher_sampling.max_new_tokens=8",
                  "env.games_per_worker=2", "eval.before=false", "eval.after=false", "eval.teacher=false",
                  "checkpoint_every=1", "teacher_engine.backend=openai", f"teacher_engine.backend.base_url={server.url}",
                  "teacher_engine.model=teacher", f"teacher_engine.tokenizer={tiny_models['teacher']}"]
        assert train(None, [*common, f"run_dir={run_dir}", "steps=1", f"teacher_engine.backend.api_key={key}"])["steps"] == 1
        written = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        assert run_dir / "config.yaml" in written and len(written) > 3
        assert [p for p, data in written.items() if key.encode() in data] == []
    # --resume reads the key from the environment (the saved config says where), in the driver:
    # the engines get it with their config even where Ray's workers started without it.
    monkeypatch.setenv("ROSE_RAY_API_KEY", key)
    resumed = load_config(run_dir / "config.yaml", [])
    assert resumed.teacher_engine.backend.api_key == key and not hasattr(resumed.student_engine.backend, "api_key")
