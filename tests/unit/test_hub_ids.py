"""Hub ids (`org/name`) resolve once to their snapshot in the local Hugging Face cache, for
engines, the learner, tokenizers, vLLM's weight-name check, `plan` and `check`; a command's
driver downloads a missing one first (`download_model`), unless HF_HUB_OFFLINE is set.

No model hub is reachable here: the cache is laid out as the hub's client lays it out
(`models--org--name/snapshots/<rev>/` with `refs/main` naming `<rev>`, conftest.hub_cache), and
downloads come from launch/hub_server.py on 127.0.0.1 through the real huggingface_hub client
(conftest.hub_endpoint). A hub-id student on vLLM downloaded, training and taking the learner's
weights: tests/e2e/test_run_survives_failures.py's vLLM run (and launch/rehearse.sh, tests/e2e/test_rehearse_the_seed_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_a_hub_id_the_hub_does_not_have_is_one_line_naming_it(hub_endpoint, capsys):
    from rose_ray.cli import main

    assert main(["eval", "--model", "org/not-there", "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert f"model 'org/not-there' could not be downloaded from {hub_endpoint.url}" in err, err
    assert "RepositoryNotFoundError" in err and "hf download org/not-there --cache-dir" in err


def test_offline_a_model_not_in_the_cache_names_the_command_that_downloads_it(hub_cache, tmp_path, capsys):
    from rose_ray.cli import main
    from rose_ray.models import download_model

    assert download_model("org/tiny-student", "train") == str(hub_cache["org/tiny-student"])  # cached: as it is
    assert main(["eval", "--model", "org/not-there", "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert "'org/not-there' is not in the Hugging Face cache" in err and "HF_HUB_OFFLINE is set" in err, err
    assert f"`hf download org/not-there --cache-dir {tmp_path / 'hf' / 'hub'}`" in err


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
