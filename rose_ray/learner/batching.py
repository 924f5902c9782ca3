"""A global batch into per-rank micro-batches by a token budget, each one padding-free row.

`attention_mask` holds each token's 1-based segment number (0 = padding). Rows are dealt to
ranks balanced by tokens, then packed first-fit into micro-batches of at most `max_tokens`:
their tokens end to end, positions restarting at each segment, `cu_seq_lens` the boundaries.
Every rank gets as many micro-batches (ZeRO's collectives run once per forward and backward).
"""
from __future__ import annotations

import numpy as np

from rose_ray.types import Batch

FIELDS = ("input_ids", "attention_mask", "old_logprobs", "teacher_logprobs", "versions")
WEIGHTS = "_weights"  # each loss term's per-token weights: `<term>_weights` (learner/losses.py)


def position_ids(segments: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 at every segment (and at the padding run) of each row."""
    n, length = segments.shape
    idx = np.broadcast_to(np.arange(length), (n, length))
    change = np.ones((n, length), dtype=bool)
    change[:, 1:] = segments[:, 1:] != segments[:, :-1]
    starts = np.maximum.accumulate(np.where(change, idx, 0), axis=1)
    return (idx - starts).astype(np.int64)


def first_fit(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped so each group's lengths sum to at most `budget`, first-fit decreasing
    (a length over the budget gets a group of its own)."""
    groups: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for g, free in enumerate(room):
            if lengths[i] <= free:
                groups[g].append(i)
                room[g] -= lengths[i]
                break
        else:
            groups.append([i])
            room.append(budget - lengths[i])
    return groups


def _flat_row(arrays: dict[str, np.ndarray], rows: list[int]) -> dict[str, np.ndarray]:
    """The rows' tokens end to end, padding dropped, segments renumbered 1..S."""
    mask = arrays["attention_mask"]
    keep = [np.flatnonzero(mask[r] > 0) for r in rows]
    part = {k: np.concatenate([v[r, cols] for r, cols in zip(rows, keep)])[None] for k, v in arrays.items()}
    row_of = np.concatenate([np.full(len(cols), i) for i, cols in enumerate(keep)])
    seg = part["attention_mask"][0]
    starts = np.ones(len(seg), dtype=bool)
    starts[1:] = (seg[1:] != seg[:-1]) | (row_of[1:] != row_of[:-1])
    part["attention_mask"] = np.cumsum(starts).astype(np.int32)[None]
    return part


def _empty_part(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Two padding tokens with no weight: a rank with nothing to do still runs forward/backward."""
    part = {k: v[:1, :2].copy() for k, v in arrays.items()}
    for key in [k for k in part if k.endswith(WEIGHTS)] + ["attention_mask"]:
        part[key][:] = 0  # no weight, and padding (segment 0): counts as no token
    return part


def trained_targets(part: dict[str, np.ndarray]) -> np.ndarray:
    """Flat indices (into the micro-batch's [B·(L-1)] targets) of the targets some loss term
    weighs: the only ones the LM head needs to score (learner.head)."""
    weights = [w[:, 1:] > 0 for k, w in part.items() if k.endswith(WEIGHTS)]
    return np.flatnonzero(np.logical_or.reduce(weights)) if weights else np.zeros(0, dtype=np.int64)


def micro_batches(batch: Batch, ranks: int, max_tokens: int) -> list[list[dict[str, np.ndarray]]]:
    """Per rank, its micro-batches: dicts of [1, n] arrays (the batch's fields, `attention_mask`
    renumbered per micro-batch) plus `position_ids` and `cu_seq_lens` ([S+1] int32)."""
    arrays = {k: np.asarray(getattr(batch, k)) for k in FIELDS}
    arrays.update({term + WEIGHTS: np.asarray(w) for term, w in batch.weights.items()})
    lengths = (arrays["attention_mask"] > 0).sum(axis=1)
    longest = int(lengths.max()) if lengths.size else 0
    if longest > max_tokens:
        raise ValueError(f"a row holds {longest} tokens > learner.max_tokens={max_tokens}")
    load = [0] * ranks
    members: list[list[int]] = [[] for _ in range(ranks)]
    for r in sorted(range(len(lengths)), key=lambda r: -int(lengths[r])):
        if lengths[r] == 0:
            continue
        p = min(range(ranks), key=lambda p: load[p])
        members[p].append(r)
        load[p] += int(lengths[r])
    per_rank = [[_flat_row(arrays, sorted(rows[i] for i in group))
                 for group in first_fit([int(lengths[r]) for r in rows], max_tokens)]
                for rows in members]
    count = max(1, max(len(parts) for parts in per_rank))
    for parts in per_rank:
        parts += [_empty_part(arrays) for _ in range(count - len(parts))]
        for part in parts:
            seg = part["attention_mask"]
            part["position_ids"] = position_ids(seg)
            starts = np.flatnonzero(np.r_[True, seg[0, 1:] != seg[0, :-1]])
            part["cu_seq_lens"] = np.r_[starts, seg.shape[1]].astype(np.int32)
    return per_rank
