"""The half of tests/unit/learner/test_schedule.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import math

import pytest

from rose_ray.learner.learner import LearnerConfig, LearnerGroup
from rose_ray.rows import row_to_trajectory
from rose_ray.tokens import TokenWeights, make_batch, render


def expected_lr(step: int, lr: float, warmup: int, total: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine to 0 at `total` (step counted from 0)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min((step - warmup) / (total - warmup), 1.0)))


def test_the_learner_follows_the_schedule_and_resumes_on_it(ray_cluster, tiny_models, tmp_path):
    from rose_ray.chat import ChatFormat
    from rose_ray.models import load_tokenizer

    fmt = ChatFormat(load_tokenizer(tiny_models["student"]))
    row = {"item_id": "sciworld_0", "conversations": [
        {"from": "human", "value": "You are an agent."}, {"from": "gpt", "value": "OK", "loss": False},
        {"from": "human", "value": "You are in the kitchen."},
        {"from": "gpt", "value": "Thought: look.\nAction: look around", "owner": "teacher"}]}
    batch = make_batch([render(row_to_trajectory(row), fmt)], TokenWeights(ce={"teacher": 1.0}), 256)
    lr, warmup, total = 1e-3, 2, 6
    group = LearnerGroup(LearnerConfig(model=str(tiny_models["student"]), lr=lr, schedule="cosine",
                                       warmup_steps=warmup, total_steps=total, max_tokens=256, threads=1))
    try:
        straight = []
        for step in range(total):
            straight.append(group.train_step(batch)["lr"])
            if step == 2:
                group.save_checkpoint(tmp_path)
        assert straight == pytest.approx([expected_lr(s, lr, warmup, total) for s in range(total)], rel=1e-6)
        assert straight[1] == pytest.approx(lr) and straight[0] < straight[1] > straight[4]
        group.setup()  # fresh from the model folder: the schedule starts over ...
        assert group.train_step(batch)["lr"] == pytest.approx(straight[0])
        group.setup()
        group.load_checkpoint(tmp_path)  # ... and a checkpoint puts it back where it was saved
        resumed = [group.train_step(batch)["lr"] for _ in range(3, total)]
        assert resumed == pytest.approx(straight[3:], rel=1e-9)
    finally:
        group.shutdown()
