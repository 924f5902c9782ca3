"""A global batch into per-rank micro-batches, and the position ids of packed rows.

A `Batch` arrives packed (rose_ray/tokens.py): `attention_mask` holds each token's 1-based
segment number (0 = padding); positions restart at every segment.
"""

from __future__ import annotations

import numpy as np

from rose_ray.types import Batch

FIELDS = ("input_ids", "attention_mask", "ce_weights", "opd_weights", "old_logprobs",
          "teacher_logprobs", "versions")


def position_ids(segments: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 at every segment (and at the padding run) of each row."""
    n, length = segments.shape
    idx = np.broadcast_to(np.arange(length), (n, length))
    change = np.ones((n, length), dtype=bool)
    change[:, 1:] = segments[:, 1:] != segments[:, :-1]
    starts = np.maximum.accumulate(np.where(change, idx, 0), axis=1)
    return (idx - starts).astype(np.int64)


def split_batch(batch: Batch, parts: int) -> list[dict[str, np.ndarray]]:
    """Rows dealt into `parts` micro-batches balanced by tokens (longest row to the lightest
    part), each trimmed to its longest row. A part with no row gets one zero-weight row, so
    every rank still runs a forward and backward (ZeRO-3 gathers need all ranks)."""
    mask = np.asarray(batch.attention_mask)
    lengths = (mask > 0).sum(axis=1)
    load = [0] * parts
    members: list[list[int]] = [[] for _ in range(parts)]
    for r in sorted(range(len(lengths)), key=lambda r: -int(lengths[r])):
        p = min(range(parts), key=lambda p: load[p])
        members[p].append(r)
        load[p] += int(lengths[r])
    arrays = {k: np.asarray(getattr(batch, k)) for k in FIELDS}
    out = []
    for rows in members:
        if not rows:
            part = {k: v[:1, :2].copy() for k, v in arrays.items()}
            part["ce_weights"][:] = 0.0
            part["opd_weights"][:] = 0.0
            part["attention_mask"][:] = 0  # padding: counts as no token
        else:
            width = int(max(lengths[r] for r in rows))
            part = {k: v[sorted(rows), :width] for k, v in arrays.items()}
        part["position_ids"] = position_ids(part["attention_mask"])
        out.append(part)
    return out
