"""The slow half of tests/unit/test_qwen3.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json

import pytest

from rose_ray.cli import main
from tests.e2e.test_train import every_reply_of_its_owners_trained


@pytest.fixture(scope="module")
def q3_overrides(tiny_qwen3):
    return [f"student_engine.model={tiny_qwen3['student']}", f"teacher_engine.model={tiny_qwen3['teacher']}",
            "teacher_warmup.enabled=false", "rollout.batch_episodes=2", "rollout.max_turns=3",
            "algorithm.handoff.k=1", "rollout.student_sampling.max_new_tokens=6",
            "rollout.teacher_sampling.max_new_tokens=16", "eval.n=2", "eval.max_turns=2",
            "eval.max_new_tokens=8", "env.games_per_worker=2", "checkpoint_every=2"]


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_online_rose_and_opd_run_on_qwen3_like_models(q3_overrides, ray_cluster, tmp_path):
    from rose_ray.train import train

    rose = train(None, q3_overrides + [f"run_dir={tmp_path}/rose", "steps=2"])
    assert rose["steps"] == 2 and rose["before"] and rose["after"] and rose["teacher"]
    rows = read_rows(tmp_path / "rose" / "trajectories.jsonl")
    assert len(rows) == 4 and all(r["success"] in (0, 1) and isinstance(r["success"], int) for r in rows)
    student = [m for r in rows for m in r["conversations"] if m.get("owner") == "student"]
    assert student and all(m["role"] == "assistant" and m["truncated"] for m in student)  # 6 tokens: cut
    assert rose["replies"]["truncated"] >= len(student) and rose["replies"]["cut_before_action"] >= 1
    scalars = [json.loads(line) for line in (tmp_path / "rose" / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("rollout/truncated_rate", 0) > 0 for m in scalars)

    opd = train(None, q3_overrides + [f"run_dir={tmp_path}/opd", "steps=2", "algorithm=opd",
                                      "mode=sync", "eval.before=false",
                                      "eval.after=false", "eval.teacher=false"])
    assert opd["steps"] == 2
    steps = [m for m in read_rows(tmp_path / "opd" / "metrics.jsonl") if "learner/loss" in m]
    assert len(steps) == 2 and all(m["learner/loss_opd"] != 0.0 for m in steps)
    every_reply_of_its_owners_trained(tmp_path / "opd", {"student"})  # opd: the student's, all trained


@pytest.mark.slow
def test_eval_collect_continue_sft_on_qwen3_like_models_and_a_tampered_prefix_is_skipped(
        tiny_qwen3, ray_cluster, tmp_path, capsys):
    """Also the checks of a plain collect -> continue (student prefixes on the train split,
    stitched rows ready for SFT, a tampered prefix skipped): they were a collect and two
    continues of their own on the tiny models, the same commands on the same code path."""
    from rose_ray.chat import ChatFormat
    from rose_ray.models import load_tokenizer
    from rose_ray.rows import read_jsonl, row_to_trajectory, write_jsonl
    from rose_ray.tokens import OWNER_INDEX, render

    student, teacher = str(tiny_qwen3["student"]), str(tiny_qwen3["teacher"])
    common = ["--max-new-tokens", "12", "--concurrency", "2"]
    assert main(["eval", "--model", student, "--n", "2", "--max-turns", "2", "--out", str(tmp_path / "ev"), *common]) == 0
    result = json.loads((tmp_path / "ev.json").read_text())
    assert result["config"]["context_tokens"] == 16384 and result["summary"]["overall"]["games"] == 2
    assert "cut before action" in (tmp_path / "ev.md").read_text()

    # Their own opening (the card's rows carry AgentGym's instruction) travels with each row.
    opening = tmp_path / "opening.jsonl"
    write_jsonl(opening, [{"item_id": "sciworld_0", "conversations": [
        {"role": "user", "content": "CARD INSTRUCTION: act."}, {"role": "assistant", "content": "CARD OK."}]}])
    prefixes, stitched = tmp_path / "prefixes.jsonl", tmp_path / "stitched.jsonl"
    assert main(["collect", "--model", student, "--turns", "2", "--split", "train", "--n", "2", "--out", str(prefixes),
                 "--instruction-from", str(opening), *common]) == 0
    rows = read_jsonl(prefixes)
    assert len(rows) == 2
    assert [m["content"] for m in rows[0]["conversations"][:2]] == ["CARD INSTRUCTION: act.", "CARD OK."]
    assert all(set(m) >= {"role", "content", "owner"} for r in rows for m in r["conversations"])
    for r in rows:
        owners = [m["owner"] for m in r["conversations"]]
        assert owners[:3] == ["prompt", "prompt", "env"] and owners.count("student") == r["rounds"] <= 2
    # As the card's files hold them: no owners.
    bare = [{**r, "conversations": [{"role": m["role"], "content": m["content"]} for m in r["conversations"]]}
            for r in rows]
    write_jsonl(tmp_path / "bare.jsonl", bare)
    assert main(["continue", "--teacher", teacher, "--in", str(tmp_path / "bare.jsonl"), "--max-turns", "3",
                 "--out", str(stitched), *common]) == 0
    out = read_jsonl(stitched)
    assert len(out) == 2
    fmt = ChatFormat(load_tokenizer(teacher))
    for r in out:  # the teacher went on from the very conversation the student had
        prefix = next(p for p in rows if p["item_id"] == r["item_id"])
        kept = [(m["role"], m["content"], m["owner"]) for m in r["conversations"][: len(prefix["conversations"])]]
        assert kept == [(m["role"], m["content"], m["owner"]) for m in prefix["conversations"]]
        later = [m["owner"] for m in r["conversations"][len(prefix["conversations"]):] if m["role"] == "assistant"]
        assert later and later == ["teacher"] * (r["rounds"] - prefix["rounds"])
        assert r["rounds"] <= 3
        seq = render(row_to_trajectory(r), fmt)  # ready for SFT: teacher tokens to train on
        assert OWNER_INDEX["teacher"] in seq.owners and OWNER_INDEX["student"] in seq.owners
    # Tamper with one recorded observation: that row must be reported and skipped.
    tampered = [json.loads(json.dumps(r)) for r in rows]
    tampered[0]["conversations"][2]["content"] += " (edited)"
    write_jsonl(tmp_path / "tampered.jsonl", tampered)
    assert main(["continue", "--teacher", teacher, "--in", str(tmp_path / "tampered.jsonl"), "--max-turns", "3",
                 "--out", str(tmp_path / "ag.jsonl"), "--schema", "agentgym", *common]) == 0
    ag = read_jsonl(tmp_path / "ag.jsonl")
    assert {r["item_id"] for r in ag} == {r["item_id"] for r in rows[1:]}
    assert all("from" in m and "value" in m for r in ag for m in r["conversations"])
    assert main(["sft", "--data", str(stitched), "--model", student, "--out", str(tmp_path / "sft"),
                 "--max-tokens", "4096"]) == 0
    assert (tmp_path / "sft" / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["check-data", str(stitched), "--no-jvm"]) == 0
    assert "the card's schema (role/content): 2 rows" in capsys.readouterr().out
