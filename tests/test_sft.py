"""Offline SFT through the CLI: the loss falls and the tiny model memorises actions."""

from __future__ import annotations

import json

import pytest
import torch

from rose_ray.chat import ChatFormat
from rose_ray.cli import main
from rose_ray.rows import write_jsonl

INSTRUCTION = "You are an agent in a science world. Answer with Thought: and Action:."
EPISODES = [("You are in the kitchen. You see a stove.", "activate stove"),
            ("You are in the hallway. You see a door.", "open door to kitchen"),
            ("You are in the greenhouse. You see a pot.", "look at pot")]


def rows():
    return [{"item_id": f"sciworld_{i}", "task": "boil", "var": i, "conversations": [
        {"from": "human", "value": INSTRUCTION}, {"from": "gpt", "value": "OK", "loss": False},
        {"from": "human", "value": obs}, {"from": "gpt", "value": f"Thought: I act.\nAction: {act}"},
    ]} for i, (obs, act) in enumerate(EPISODES)]


@pytest.mark.slow
def test_sft_memorises_actions(ray_cluster, tiny_models, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tmp_path / "train.jsonl"
    write_jsonl(data, rows())
    out = tmp_path / "sft"
    code = main(["sft", "--data", str(data), "--model", str(tiny_models["student"]), "--out", str(out),
                 "--epochs", "40", "--batch-size", "3", "--lr", "3e-3", "--schedule", "cosine",
                 "--warmup-steps", "2"])
    assert code == 0
    log = [json.loads(line) for line in (out / "sft_log.jsonl").read_text().splitlines()]
    assert len(log) == 40 and log[-1]["loss"] < 0.1 * log[0]["loss"]

    tok = AutoTokenizer.from_pretrained(out)
    fmt = ChatFormat(tok)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    for obs, act in EPISODES:  # the prompt a rollout would build, token by token
        prompt = fmt.opening_ids([("user", INSTRUCTION), ("assistant", "OK")]) + fmt.user_ids(obs)
        with torch.no_grad():
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=fmt.eos_id, pad_token_id=fmt.eos_id)
        reply = fmt.decode(ids[0, len(prompt):].tolist())
        assert reply.strip() == f"Thought: I act.\nAction: {act}"


def test_sft_bad_data_exits_2_naming_the_line(tmp_path, tiny_models, capsys):
    data = tmp_path / "bad.jsonl"
    good = json.dumps(rows()[0])
    data.write_text(good + "\n" + good.replace('"gpt"', '"robot"', 1) + "\n")
    code = main(["sft", "--data", str(data), "--model", str(tiny_models["student"]),
                 "--out", str(tmp_path / "o")])
    assert code == 2
    assert "bad.jsonl:2: conversations[1].from" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
