"""Trajectories to token batches: the ids the engine saw, an owner and a loss weight per token.

A reply cut at max_new_tokens (`Turn.truncated`) ends with an end-of-turn id the model never
produced: that id gets no loss (`Sequence.trainable`), the sampled ids keep theirs.

Tokens in, tokens out: when a trajectory's turns carry token_ids (rollouts), those ids are
concatenated as they are (an empty list means the turn's ids live in an earlier turn, like the
acknowledgement inside the opening). Text-only turns (dataset rows) are rendered with
`ChatFormat` the way rollouts build them. Long trajectories are cut with the engine's own
`fit_context`, so the learner keeps the same turns the engine kept.

Packed rows: several sequences share a row; `attention_mask` holds the 1-based segment number of
each token (0 = padding), from which the learner derives position ids that restart at every
segment (the learner adds a block-diagonal mask: worker.segment_mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from rose_ray.chat import ChatFormat
from rose_ray.inference.engine import ContextExceeded, fit_context
from rose_ray.types import OWNERS, Batch, Trajectory, Turn

OWNER_INDEX = {o: i for i, o in enumerate(OWNERS)}
NAN = float("nan")


@dataclass
class Sequence:
    """One rendered conversation; every list has one entry per token (NaN = unknown)."""

    input_ids: list[int]
    owners: list[int]  # indices into OWNERS
    old_logprobs: list[float]  # behaviour-policy logprob of each token
    teacher_logprobs: list[float]  # teacher logprob of each token (OPD)
    versions: list[int]  # policy version that sampled the token and gave its logprob, else -1
    dropped_turns: int = 0
    # False where a token may carry no loss whatever its owner: the end-of-turn id appended
    # to a reply cut at max_new_tokens (the model never produced it). Empty: all trainable.
    trainable: list[bool] = field(default_factory=list)
    # (index in the trajectory's turns, token count) of each turn kept, in order: what
    # `loss_turns` maps tokens back to turns with (turns cut for context are absent).
    turn_spans: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def turn_ids(turns: list[Turn], fmt: ChatFormat | None) -> list[list[int]]:
    """The ids of each turn: the stored ids when any turn has them, else rendered text."""
    if any(t.token_ids for t in turns):
        return [list(t.token_ids) for t in turns]
    if fmt is None:
        raise ValueError("turns carry no token_ids: a ChatFormat is needed to render their text")
    ids: list[list[int]] = []
    start = 0
    if (
        len(turns) >= 2
        and (turns[0].role, turns[0].owner) == ("user", "prompt")
        and (turns[1].role, turns[1].owner) == ("assistant", "prompt")
    ):
        # The rollout opening: instruction + acknowledgement on the first turn.
        ids += [fmt.opening_ids([("user", turns[0].text), ("assistant", turns[1].text)]), []]
        start = 2
    for t in turns[start:]:
        if t.role == "assistant":
            ids.append(fmt.assistant_ids(t.text))
        elif ids:
            ids.append(fmt.user_ids(t.text))
        else:  # a first user turn that opens the conversation and asks for a reply
            ids.append(fmt.render_ids([{"role": "user", "content": t.text}], True))
    return ids


def _fit(turns: list[Turn], max_tokens: int, policy: str) -> tuple[list[Turn], int]:
    try:
        return fit_context(turns, max_tokens, policy)
    except ContextExceeded:
        # The engine ended the episode (or could drop nothing more): keep the longest prefix
        # of whole turns, which is what the engine had seen when it stopped.
        kept, total = [], 0
        for t in turns:
            if total + len(t.token_ids) > max_tokens:
                break
            kept.append(t)
            total += len(t.token_ids)
        if not any(t.role == "assistant" and t.owner != "prompt" for t in kept):
            raise ValueError(
                f"trajectory cannot be cut to max_tokens={max_tokens} and keep a trained turn"
            ) from None
        return kept, len(turns) - len(kept)


def render(
    traj: Trajectory | list[Turn],
    fmt: ChatFormat | None = None,
    max_tokens: int | None = None,
    context_policy: str = "drop_oldest",
    teacher_logprobs: list[list[float] | None] | None = None,
) -> Sequence:
    """One trajectory as token ids with per-token owners, logprobs and versions.

    `teacher_logprobs[i]`: the teacher's logprob of each id of turn i (None where not scored).
    """
    turns = traj.turns if isinstance(traj, Trajectory) else traj
    ids = turn_ids(turns, fmt)
    if teacher_logprobs is not None and len(teacher_logprobs) != len(turns):
        raise ValueError(f"teacher_logprobs: {len(teacher_logprobs)} entries for {len(turns)} turns")
    work = [replace(t, token_ids=i) for t, i in zip(turns, ids)]
    index = {id(t): n for n, t in enumerate(work)}
    dropped = 0
    if max_tokens is not None:
        work, dropped = _fit(work, max_tokens, context_policy)
    seq = Sequence([], [], [], [], [], dropped)
    for t in work:
        n = len(t.token_ids)
        seq.input_ids += t.token_ids
        seq.owners += [OWNER_INDEX[t.owner]] * n
        old = [NAN] * n
        if t.logprobs is not None and t.role == "assistant":
            if len(t.logprobs) > n:
                raise ValueError(f"turn has {len(t.logprobs)} logprobs for {n} token ids")
            old[: len(t.logprobs)] = t.logprobs  # an appended eos has none
        seq.old_logprobs += old
        version = t.policy_version if t.owner == "student" and t.policy_version is not None else -1
        seq.versions += [version if not math.isnan(x) else -1 for x in old]
        tl = teacher_logprobs[index[id(t)]] if teacher_logprobs is not None else None
        if tl is not None and len(tl) != n:
            raise ValueError(f"teacher_logprobs: {len(tl)} values for a turn of {n} token ids")
        seq.teacher_logprobs += list(tl) if tl is not None else [NAN] * n
        keep = [True] * n
        if n and t.truncated and t.role == "assistant":
            keep[-1] = False  # the end-of-turn id appended after the cut
        seq.trainable += keep
        seq.turn_spans.append((index[id(t)], n))
    return seq


def loss_turns(seq: Sequence, n_turns: int, owner_weights: dict[str, float]) -> list[bool]:
    """Per turn of the rendered trajectory: whether `make_batch` gives any of its tokens a
    loss weight > 0 under these owner weights. A turn cut for context, a reply whose only id
    is the end-of-turn appended after a cut, and the sequence's first token carry none."""
    flags = [False] * n_turns
    at = 0
    for i, n in seq.turn_spans:
        flags[i] = any(
            j > 0 and owner_weights.get(OWNERS[seq.owners[j]], 0.0) > 0
            and (not seq.trainable or seq.trainable[j])
            for j in range(at, at + n)
        )
        at += n
    return flags


def pack(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Sequence indices per row, first-fit decreasing, each row at most max_tokens."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > max_tokens:
            raise ValueError(f"sequence {i} has {lengths[i]} tokens > max_tokens={max_tokens}")
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(max_tokens - lengths[i])
    return rows


def make_batch(
    seqs: list[Sequence], owner_weights: dict[str, float], max_tokens: int, pad_id: int = 0
) -> Batch:
    """Pack sequences into rows; loss weight per token from its owner (0 at segment starts,
    which have no prediction inside their own sequence)."""
    if not seqs:
        raise ValueError("make_batch: no sequences")
    unknown = set(owner_weights) - set(OWNERS)
    if unknown:
        raise ValueError(f"owner_weights: unknown owners {sorted(unknown)}; expected {OWNERS}")
    weight_of = np.array([float(owner_weights.get(o, 0.0)) for o in OWNERS], dtype=np.float32)
    rows = pack([len(s) for s in seqs], max_tokens)
    shape = (len(rows), max(sum(len(seqs[i]) for i in row) for row in rows))
    b = {
        "input_ids": np.full(shape, pad_id, dtype=np.int64),
        "attention_mask": np.zeros(shape, dtype=np.int32),
        "loss_weights": np.zeros(shape, dtype=np.float32),
        "owners": np.full(shape, -1, dtype=np.int8),
        "old_logprobs": np.full(shape, np.nan, dtype=np.float32),
        "teacher_logprobs": np.full(shape, np.nan, dtype=np.float32),
        "versions": np.full(shape, -1, dtype=np.int64),
    }
    for r, row in enumerate(rows):
        at = 0
        for seg, i in enumerate(row, start=1):
            s, end = seqs[i], at + len(seqs[i])
            owners = np.asarray(s.owners, dtype=np.int8)
            b["input_ids"][r, at:end] = s.input_ids
            b["attention_mask"][r, at:end] = seg
            b["owners"][r, at:end] = owners
            b["loss_weights"][r, at:end] = weight_of[owners]
            if s.trainable:
                b["loss_weights"][r, at:end] *= np.asarray(s.trainable, dtype=np.float32)
            b["loss_weights"][r, at] = 0.0
            b["old_logprobs"][r, at:end] = s.old_logprobs
            b["teacher_logprobs"][r, at:end] = s.teacher_logprobs
            b["versions"][r, at:end] = s.versions
            at = end
    meta = {
        "tokens": int(sum(len(s) for s in seqs)),
        "dropped_turns": int(sum(s.dropped_turns for s in seqs)),
        "max_tokens": max_tokens,
    }
    return Batch(**b, num_sequences=len(seqs), meta=meta)


def position_ids(segments: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 at every segment (and at the padding run) of each row."""
    n, length = segments.shape
    idx = np.broadcast_to(np.arange(length), (n, length))
    change = np.ones((n, length), dtype=bool)
    change[:, 1:] = segments[:, 1:] != segments[:, :-1]
    starts = np.maximum.accumulate(np.where(change, idx, 0), axis=1)
    return (idx - starts).astype(np.int64)


FIELDS = ("input_ids", "attention_mask", "loss_weights", "owners", "old_logprobs",
          "teacher_logprobs", "versions")


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
            part["loss_weights"][:] = 0.0
            part["attention_mask"][:] = 0  # padding: counts as no token
        else:
            width = int(max(lengths[r] for r in rows))
            part = {k: v[sorted(rows), :width] for k, v in arrays.items()}
        part["position_ids"] = position_ids(part["attention_mask"])
        out.append(part)
    return out
