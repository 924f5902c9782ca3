"""Hub ids (`org/name`) resolve once to their snapshot in the local Hugging Face cache
(offline), for engines, the learner, tokenizers, vLLM's weight-name check, `plan` and `check`.

The cache is laid out here as the hub's client lays it out (`models--org--name/snapshots/<rev>/`
with `refs/main` naming `<rev>`), holding the tiny models: nothing can be downloaded here
(conftest.hub_cache). A hub-id student on vLLM training and taking the learner's weights:
tests/e2e/test_reliability.py's vLLM run (and launch/rehearse.sh, tests/e2e/test_rehearse.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


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

    seed = str(Path(__file__).resolve().parents[2] / "configs/rose_qwen3_1p7b_32b.yaml")
    assert main(["check", seed, "student_engine.model=org/tiny-student", "teacher_engine.model=org/tiny-teacher",
                 "--node", "CPU=64,GPU=8,accelerator_type:H100=1"]) == 0
    out = capsys.readouterr().out
    assert "student chat template" in out and out.rstrip().endswith("OK"), out
