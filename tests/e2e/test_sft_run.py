"""The slow half of tests/unit/recipes/test_sft.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json

import pytest
import torch

from rose_ray.chat import ChatFormat
from rose_ray.cli import main
from rose_ray.rows import write_jsonl
from tests.unit.recipes.test_sft import EPISODES, INSTRUCTION, rows


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
