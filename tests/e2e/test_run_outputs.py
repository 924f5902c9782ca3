"""What a run leaves behind, on a second short tiny run that takes the non-default paths: the
learner on 2 ranks under ZeRO-3, rose with λ > 0, and the `decay` handoff policy.

- `<run_dir>/model/`: a Hugging Face folder of the last step that `rose-ray eval` plays;
- `rose-ray export RUN --step N`: the same weights from a kept checkpoint (RUN may be the
  config's run_dir: its latest version); bad input exits 2;
- trajectories.jsonl: decay's p and seed per trajectory, loss flags under λ > 0.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rose_ray.checkpoint import kept_steps
from rose_ray.cli import main
from rose_ray.export import MODEL_INFO
from rose_ray.rollout.handoff import decay_takes_over
from rose_ray.runs import new_version
from rose_ray.train import train
from tests.e2e.test_train import overrides, read_jsonl

P0 = 0.6


@pytest.fixture(scope="module")
def run(tiny_models, ray_cluster, tmp_path_factory):
    """The second run of the tiny config under ROSE_RAY_RUNS (an earlier one started there and
    stopped before its first checkpoint): it gets the next version folder."""
    runs = tmp_path_factory.mktemp("outputs")
    earlier = new_version(runs / "tiny")
    (earlier / "config.yaml").write_text("name: tiny\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ROSE_RAY_RUNS", str(runs))
        summary = train(None, overrides(tiny_models, None, steps=2) + [
            "mode=sync", "checkpoint_every=1", "learner.ranks=2", "learner.zero_stage=3", "algorithm.lam=0.5",
            "algorithm.handoff.policy=decay", f"algorithm.handoff.p0={P0}", "algorithm.handoff.decay_steps=1",
            "eval.before=false", "eval.after=false", "eval.teacher=false"])
    run_dir = runs / "tiny" / "version_1"
    assert summary["run_dir"] == str(run_dir) and (runs / "tiny" / "latest").read_text() == "version_1\n"
    return run_dir, summary


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.slow
def test_every_run_ends_with_a_hugging_face_folder(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, summary = run
    model = run_dir / "model"
    assert summary["model"] == str(model)
    assert json.loads((run_dir / "summary.json").read_text())["model"] == str(model)
    info = json.loads((model / MODEL_INFO).read_text())
    assert (info["step"], info["policy_version"], info["algorithm"]) == (2, 2, "rose")
    assert not (run_dir / "model.tmp").exists()
    tok = AutoTokenizer.from_pretrained(model)
    assert tok.chat_template and (model / "generation_config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(model)
    assert loaded.config.num_hidden_layers == 2  # the tiny student, gathered from 2 ZeRO-3 ranks


@pytest.mark.slow
def test_eval_plays_the_run_model_through_the_cli(run, tmp_path):
    run_dir, _ = run
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(run_dir / "model"), "--n", "2", "--max-turns", "2",
                 "--max-new-tokens", "8", "--concurrency", "2", "--context-tokens", "2048",
                 "--out", str(out)]) == 0
    result = json.loads(out.with_name("ev.json").read_text())
    assert result["summary"]["overall"]["games"] == 2 and result["config"]["model"] == str(run_dir / "model")


@pytest.mark.slow
def test_export_of_a_kept_step_gives_the_learners_weights(run, tmp_path, capsys):
    run_dir, _ = run
    assert kept_steps(run_dir) == [1, 2]
    last, first = tmp_path / "last", tmp_path / "first"
    # The config's run_dir stands for its latest run; the default step is the latest kept.
    assert main(["export", str(run_dir.parent), "--out", str(last)]) == 0
    assert f"step 2 (policy version 2) of {run_dir} ->" in capsys.readouterr().out
    assert main(["export", str(run_dir), "--step", "1", "--out", str(first)]) == 0
    final, at_last, at_first = weights(run_dir / "model"), weights(last), weights(first)
    assert final.keys() == at_last.keys() == at_first.keys()
    for name in final:  # the export of step 2 is exactly what the learner held at step 2
        assert torch.equal(final[name], at_last[name]), name
    assert any(not torch.equal(final[n], at_first[n]) for n in final)  # step 1 is another model
    assert json.loads((first / MODEL_INFO).read_text())["step"] == 1
    assert json.loads((last / MODEL_INFO).read_text())["policy_version"] == 2


@pytest.mark.slow
def test_export_refuses_bad_input_naming_it(run, tmp_path, capsys):
    run_dir, _ = run
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "nope: not a run directory" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--step", "7", "--out", str(out)]) == 2
    assert "no checkpoint of step 7; kept steps: 1, 2" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "full")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert not out.exists() and (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # nothing half-written


@pytest.mark.slow
def test_decay_records_its_probability_and_reproducible_draws(run):
    run_dir, _ = run
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    # decay_steps=1: episodes of learner step 0 (trained at step 1) play under p0, then p = 0.
    assert {(r["step"], r["handoff_p"]) for r in rows} == {(1, P0), (2, 0.0)}
    for r in rows:
        owners = [m["owner"] for m in r["conversations"] if m["role"] == "assistant" and m["owner"] != "prompt"]
        # Replaying the recorded seed gives the recorded handoff: the first turn whose draw is below p.
        drawn = next((t for t in range(1, r["rounds"] + 1) if decay_takes_over(r["handoff_seed"], t, r["handoff_p"])),
                     None)
        assert r["handoff_turn"] == drawn
        k = (r["handoff_turn"] or r["rounds"] + 1) - 1
        assert owners == ["student"] * k + ["teacher"] * (len(owners) - k)
    assert any(r["handoff_turn"] for r in rows) and any(r["handoff_turn"] is None for r in rows)
    step1 = next(m for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("step") == 1 and "learner/loss" in m)
    assert step1["rollout/handoff_p"] == P0


@pytest.mark.slow
def test_with_lambda_both_students_and_teachers_turns_carry_loss(run):
    run_dir, _ = run
    for r in read_jsonl(run_dir / "trajectories.jsonl"):
        for m in r["conversations"]:
            assert m["loss"] is (m["role"] == "assistant" and m["owner"] in ("student", "teacher")), m
