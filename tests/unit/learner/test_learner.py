"""The DeepSpeed learner group: ZeRO/rank equivalence, exact resume, HF export, weight
publication to a real engine actor. One 2-rank group is shared by the tests of this module."""

from __future__ import annotations

import pytest

from rose_ray.learner.learner import LearnerConfig
from rose_ray.tokens import TokenWeights

# rose with λ = 0.5: cross entropy on the teacher's tokens, OPD on the student's (both terms)
WEIGHTS = TokenWeights(ce={"teacher": 1.0}, opd={"student": 0.5})


def conversations(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        conv = [{"from": "human", "value": "You are an agent in a science world."},
                {"from": "gpt", "value": "OK", "loss": False},
                {"from": "human", "value": f"You are in room {i}. You see a door and a sink."}]
        for k in range(1 + i % 3):
            conv += [{"from": "gpt", "value": f"Thought: step {k}.\nAction: open door {k}",
                      "owner": "student" if k == 0 else "teacher"},
                     {"from": "human", "value": f"The door {k} is open."}]
        conv.append({"from": "gpt", "value": "Action: focus on sink", "owner": "teacher"})
        rows.append({"item_id": f"sciworld_{i}", "conversations": conv})
    return rows


def config(model, **kw) -> LearnerConfig:
    base = dict(model=str(model), lr=3e-3, threads=1, max_tokens=256, logprob_chunk=32,
                grad_clip=1.0, seed=0)
    return LearnerConfig(**{**base, **kw})


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="learner.zero_stage"):
        LearnerConfig(model="m", zero_stage=4)
    with pytest.raises(ValueError, match="learner.total_steps"):
        LearnerConfig(model="m", schedule="cosine", warmup_steps=10, total_steps=5)
    with pytest.raises(ValueError, match="learner.clip_eps"):
        LearnerConfig(model="m", clip_eps=1.5)


