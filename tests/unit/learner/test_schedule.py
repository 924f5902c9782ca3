"""The learner's rate schedule (`learner.schedule`, `learner.warmup_steps`): checked as config,
followed step by step by a real learner group, and the same after a checkpoint is loaded."""

from __future__ import annotations

import pytest

from rose_ray.config import load_config
from rose_ray.errors import ConfigError


def test_a_run_decays_over_its_steps_and_bad_values_name_their_key():
    cfg = load_config(None, ["steps=20", "learner.schedule=cosine", "learner.warmup_steps=4"])
    assert (cfg.learner.schedule, cfg.learner.warmup_steps, cfg.learner.total_steps) == ("cosine", 4, 20)
    assert load_config(None, []).learner.schedule == "constant"  # the tiny default keeps its rate
    assert load_config(None, ["learner.schedule=linear", "learner.total_steps=10"]).learner.total_steps == 10
    for bad, key in ((["learner.schedule=cyclic"], "learner.schedule"),
                     (["learner.warmup_steps=-1"], "learner.warmup_steps"),
                     (["steps=4", "learner.schedule=linear", "learner.warmup_steps=4"], "learner.total_steps")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, bad)


