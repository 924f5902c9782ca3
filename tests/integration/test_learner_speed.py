"""The half of tests/unit/learner/test_speed.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import numpy as np

from rose_ray.learner import speed
from tests.unit.learner import test_speed as speed_tests
from tests.unit.learner.test_paths import assert_same_grads
from tests.unit.learner.test_speed import assert_same_logprobs, load, rose_part, run

# the unit half's fixture, shared: the models each kernel is checked on
models = speed_tests.models


# --------------------------------------------------------------------------- fused kernels
def test_regionally_compiled_kernels_equal_eager(models):
    """`fused_kernels: compile` (torch.compile of every RMSNorm and MLP, dynamic shapes): the
    same logprobs and gradients, and a micro-batch of another length needs no new graph."""
    from torch._dynamo.utils import counters

    path, tok = models["tiny_qwen3"]
    part, den = rose_part(tok)
    ref, new = load(path), load(path)
    speed.apply_fused_kernels(new, "compile")
    graphs = counters["stats"]["unique_graphs"]
    lp_ref, trained = run(ref, part, den)
    lp_new, _ = run(new, part, den)
    assert counters["stats"]["unique_graphs"] > graphs  # compiled indeed
    assert_same_logprobs(lp_new[trained], lp_ref[trained])
    assert_same_grads(ref, new)
    other, den2 = rose_part(tok, seed=1)
    shorter = {k: v[:, :-7] if v.ndim == 2 else v for k, v in other.items()}
    shorter["cu_seq_lens"] = np.minimum(other["cu_seq_lens"], shorter["input_ids"].shape[1]).astype(np.int32)
    graphs = counters["stats"]["unique_graphs"]
    run(new, shorter, den2)
    assert counters["stats"]["unique_graphs"] == graphs
