"""Attention over packed rows (rose_ray/learner/attention.py): with the block-diagonal
`segment_mask` a sequence packed after another gets the logits it gets alone. The padding-free
varlen path against the dense one, and flash attention on a GPU: test_learner_paths.py."""

from __future__ import annotations

import numpy as np


def test_packed_segments_do_not_attend_to_each_other(tiny_models):
    """A sequence packed after another gets the logits it gets alone."""
    import torch

    from rose_ray.learner.attention import segment_mask
    from rose_ray.learner.batching import position_ids
    from rose_ray.models import load_model

    model = load_model(tiny_models["student"])
    a, b = [5, 6, 7, 8, 9], [10, 11, 12]
    segments = np.array([[1] * 5 + [2] * 3 + [0] * 2])
    ids = torch.tensor([a + b + [0, 0]])
    with torch.no_grad():
        packed = model(ids, position_ids=torch.from_numpy(position_ids(segments)),
                       attention_mask=segment_mask(torch.from_numpy(segments))).logits[0]
        alone_a = model(torch.tensor([a])).logits[0]
        alone_b = model(torch.tensor([b])).logits[0]
    assert torch.allclose(packed[:5], alone_a, atol=1e-5)
    assert torch.allclose(packed[5:8], alone_b, atol=1e-5)
    assert torch.isfinite(packed).all()  # padding rows stay finite
