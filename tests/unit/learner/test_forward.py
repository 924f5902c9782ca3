"""The learner's forward pass (rose_ray/learner/forward.py) alone: `PackedForward` writes the
LM head's logits chunk by chunk and they equal the model's own. Its per-token logprobs and
gradients against the original dense path, on the tiny model and on Qwen3's vocabulary:
test_learner_paths.py."""

from __future__ import annotations

import numpy as np
import torch

from rose_ray.learner.forward import PackedForward
from tests.unit.learner.test_paths import RTOL, load


def test_chunked_logits_equal_the_models_logits(tiny_models):
    model = load(tiny_models["student"], "sdpa_varlen")
    ids = torch.from_numpy(np.random.default_rng(0).integers(5, 500, (2, 40)))
    t = {"input_ids": ids, "position_ids": torch.arange(40).expand(2, 40)}
    out = torch.empty(2, 40, model.config.vocab_size)
    forward = PackedForward(model, "sdpa_varlen", 7)
    with torch.no_grad():
        forward.logits_into(forward.hidden_states(model, t), out)
        expected = load(tiny_models["student"], "dense_mask")(input_ids=ids).logits
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=1e-5)
