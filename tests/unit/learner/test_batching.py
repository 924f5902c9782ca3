"""The learner's micro-batches (rose_ray/learner/batching.py): rows share a micro-batch only
while they fit the token budget, every rank gets as many micro-batches, each one padding-free
with its segment boundaries, and position ids restart at each packed segment. That the packed
path gives the dense path's numbers: test_learner_paths.py."""

from __future__ import annotations

import numpy as np

from rose_ray.learner.batching import micro_batches, position_ids
from rose_ray.tokens import TokenWeights, make_batch, render
from rose_ray.types import Turn


def test_micro_batches_follow_a_token_budget():
    """Rows share a micro-batch only while they fit the budget; every rank gets as many
    micro-batches; a micro-batch is one padding-free row with its segment boundaries."""
    seqs = [render([Turn("user", "", "env", list(range(1, n + 1)))]) for n in (8, 7, 3, 2)]
    batch = make_batch(seqs, TokenWeights(ce={"env": 1.0}), max_tokens=8)
    rows = (np.asarray(batch.attention_mask) > 0).sum(axis=1).tolist()
    assert rows == [8, 7, 5]  # the last row: segments of 3 and 2, padded to 8
    (one_rank,) = micro_batches(batch, ranks=1, max_tokens=8)
    assert [p["input_ids"].shape[1] for p in one_rank] == [8, 7, 5]  # no two rows fit 8 together
    (wide,) = micro_batches(batch, ranks=1, max_tokens=16)
    assert [p["input_ids"].shape[1] for p in wide] == [15, 5]  # 8 + 7 share one
    for p in wide:
        seg = p["attention_mask"][0]
        assert (seg > 0).all() and seg[0] == 1 and (np.diff(seg) >= 0).all()  # renumbered, no padding
        starts = p["cu_seq_lens"][:-1]
        assert (p["position_ids"][0, starts] == 0).all() and p["cu_seq_lens"][-1] == seg.size
        assert len(starts) == seg.max()
    per_rank = micro_batches(batch, ranks=4, max_tokens=8)
    assert len({len(parts) for parts in per_rank}) == 1
    tokens = sorted(int((p["attention_mask"] > 0).sum()) for parts in per_rank for p in parts)
    assert sum(tokens) == 20 and tokens.count(0) == 4 * len(per_rank[0]) - len(rows)
    empty = next(p for parts in per_rank for p in parts if not (p["attention_mask"] > 0).any())
    assert "ce_weights" in empty and not any(v.any() for k, v in empty.items() if k.endswith("_weights"))


def test_position_ids_restart_per_segment():
    seg = np.array([[1, 1, 1, 2, 2, 0, 0]])
    assert position_ids(seg).tolist() == [[0, 1, 2, 0, 1, 0, 1]]
