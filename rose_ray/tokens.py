"""Trajectories to token batches, on the rollout side of the learner's wall. Which tokens train,
and how much, is decided here only: a recipe's `TokenWeights` give each owner a weight per loss
term, which `make_batch` writes per token into packed rows (`attention_mask`: segment numbers)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from rose_ray.chat import ChatFormat
from rose_ray.learner.batching import first_fit
from rose_ray.types import OWNERS, Batch, Trajectory, Turn

OWNER_INDEX = {o: i for i, o in enumerate(OWNERS)}
NAN = float("nan")


@dataclass(init=False)
class TokenWeights:
    """Per loss term (learner/losses.py: `ce`, `opd`), per owner, the weight of its tokens (absent:
    0, context only): `TokenWeights(ce={"teacher": 1.0}, opd={"student": 0.5})`."""

    terms: dict[str, dict[str, float]]

    def __init__(self, **terms: dict[str, float]) -> None:
        for term, per_owner in terms.items():
            if unknown := set(per_owner) - set(OWNERS):
                raise ValueError(f"token weights ({term}): unknown owners {sorted(unknown)}; expected {OWNERS}")
        self.terms = {term: dict(per_owner) for term, per_owner in terms.items()}

    def trains(self, owner: str) -> bool:
        return any(per_owner.get(owner, 0.0) > 0 for per_owner in self.terms.values())

@dataclass
class Sequence:
    """One rendered conversation; every list has one entry per token (NaN = unknown)."""

    input_ids: list[int]
    owners: list[int]  # indices into OWNERS
    old_logprobs: list[float]  # behaviour-policy logprob of each token
    teacher_logprobs: list[float]  # teacher logprob of each token (OPD)
    versions: list[int]  # policy version that sampled the token and gave its logprob, else -1
    dropped_turns: int = 0
    # False where a token carries no loss whatever its owner (a template's framing, the end-of-turn
    # id appended to a reply cut at max_new_tokens). Empty: all trainable.
    trainable: list[bool] = field(default_factory=list)
    # (index in the trajectory's turns, token count) of each turn kept, for `loss_turns`.
    turn_spans: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def with_ids(turns: list[Turn], fmt: ChatFormat | None) -> list[Turn]:
    """The turns with their ids filled in, so later steps need not render again: the stored ids
    when any turn has them, else their text rendered (under a template-history format, the
    template's whole rendering)."""
    if any(t.token_ids for t in turns):
        return [replace(t, token_ids=list(t.token_ids)) for t in turns]
    if fmt is None:
        raise ValueError("turns carry no token_ids: a ChatFormat is needed to render their text")
    if fmt.history == "template":
        return fmt.apply_template(turns, add_generation_prompt=False)
    ids: list[list[int]] = []
    if [(t.role, t.owner) for t in turns[:2]] == [("user", "prompt"), ("assistant", "prompt")]:
        # The rollout opening: instruction + acknowledgement on the first turn.
        ids += [fmt.opening_ids([("user", turns[0].text), ("assistant", turns[1].text)]), []]
    for t in turns[len(ids):]:
        if t.role == "assistant":
            ids.append(fmt.assistant_ids(t.text))
        elif ids:
            ids.append(fmt.user_ids(t.text))
        else:  # a first user turn that opens the conversation and asks for a reply
            ids.append(fmt.render_ids([{"role": "user", "content": t.text}], True))
    return [replace(t, token_ids=piece) for t, piece in zip(turns, ids)]


def render(traj: Trajectory | list[Turn], fmt: ChatFormat | None = None, cut: Iterable[int] = ()) -> Sequence:
    """One trajectory as token ids with per-token owners, logprobs (the teacher's too, NaN past
    the scored ones) and versions, less the turns in `cut` (and a Trajectory's `context_cut`)."""
    turns = traj.turns if isinstance(traj, Trajectory) else traj
    left_out = set(cut) | (set(traj.context_cut) if isinstance(traj, Trajectory) else set())
    if not any(t.token_ids for t in turns):  # text only (a dataset row): render it
        turns = with_ids(turns, fmt)
    seq = Sequence([], [], [], [], [], dropped_turns=len(left_out))
    for index, t in enumerate(turns):
        if index in left_out:
            continue
        n = len(t.token_ids)
        seq.input_ids += t.token_ids
        seq.owners += [OWNER_INDEX[t.owner]] * n
        old = _per_token(t.logprobs if t.role == "assistant" else None, n, f"turn {index}", "logprobs")
        seq.old_logprobs += old
        version = t.policy_version if t.owner == "student" and t.policy_version is not None else -1
        seq.versions += [version if not math.isnan(x) else -1 for x in old]
        seq.teacher_logprobs += _per_token(t.teacher_logprobs, n, f"turn {index}", "teacher logprobs")
        keep = [i >= t.frame for i in range(n)]  # a template's role header is context
        if t.close:  # what a template renders after the turn's end-of-turn id: context
            keep[n - t.close:] = [False] * t.close
        if n > t.close and t.truncated and t.role == "assistant":
            keep[n - t.close - 1] = False  # the end-of-turn id appended after the cut
        seq.trainable += keep
        seq.turn_spans.append((index, n))
    return seq


def _per_token(values: list[float] | None, n: int, where: str, what: str) -> list[float]:
    """`values` for the first of `n` tokens, NaN for the rest (an appended eos has none)."""
    values = list(values or [])
    if len(values) > n:
        raise ValueError(f"{where} has {len(values)} {what} for {n} token ids")
    return values + [NAN] * (n - len(values))


def loss_turns(seq: Sequence, n_turns: int, weights: TokenWeights) -> list[bool]:
    """Per turn of the rendered trajectory: whether `make_batch` gives any of its tokens a weight
    > 0 (a turn left out carries none)."""
    flags = [False] * n_turns
    at = 0
    for i, n in seq.turn_spans:
        flags[i] = any(_trains(seq, j, weights) for j in range(at, at + n))
        at += n
    return flags


def _trains(seq: Sequence, j: int, weights: TokenWeights) -> bool:
    """Whether `make_batch` gives token `j` a weight > 0 (a sequence's first predicts nothing)."""
    return j > 0 and weights.trains(OWNERS[seq.owners[j]]) and (not seq.trainable or seq.trainable[j])


def trained_tokens(seqs: list[Sequence], weights: TokenWeights) -> dict[str, int]:
    """Per owner, the tokens `make_batch` gives a weight > 0 in some loss term (the count the
    learner's per-token mean divides by, split by who wrote them)."""
    counts = Counter(OWNERS[s.owners[j]] for s in seqs for j in range(len(s)) if _trains(s, j, weights))
    return {owner: counts[owner] for owner in OWNERS}


def make_batch(seqs: list[Sequence], weights: TokenWeights, max_tokens: int, pad_id: int = 0) -> Batch:
    """Pack sequences into rows, with each token's weight in each loss term (0 at segment
    starts, which have no prediction inside their own sequence)."""
    if not seqs:
        raise ValueError("make_batch: no sequences")
    of_owner = {term: np.array([float(per_owner.get(o, 0.0)) for o in OWNERS], dtype=np.float32)
                for term, per_owner in weights.terms.items()}
    for i, s in enumerate(seqs):
        if len(s) > max_tokens:
            raise ValueError(f"sequence {i} has {len(s)} tokens > max_tokens={max_tokens} "
                             "(learner.max_tokens must hold the engine's whole context)")
    rows = first_fit([len(s) for s in seqs], max_tokens)  # first-fit decreasing
    shape = (len(rows), max(sum(len(seqs[i]) for i in row) for row in rows))
    b = {
        "input_ids": np.full(shape, pad_id, dtype=np.int64),
        "attention_mask": np.zeros(shape, dtype=np.int32),
        "old_logprobs": np.full(shape, np.nan, dtype=np.float32),
        "teacher_logprobs": np.full(shape, np.nan, dtype=np.float32),
        "versions": np.full(shape, -1, dtype=np.int64),
    }
    terms = {term: np.zeros(shape, dtype=np.float32) for term in of_owner}
    for r, row in enumerate(rows):
        at = 0
        for seg, i in enumerate(row, start=1):
            s, end = seqs[i], at + len(seqs[i])
            owners = np.asarray(s.owners, dtype=np.int64)
            trainable = np.asarray(s.trainable, dtype=np.float32) if s.trainable else 1.0
            for name in ("input_ids", "old_logprobs", "teacher_logprobs", "versions"):
                b[name][r, at:end] = getattr(s, name)
            b["attention_mask"][r, at:end] = seg
            for term, of in of_owner.items():
                terms[term][r, at:end] = of[owners] * trainable
                terms[term][r, at] = 0.0
            at = end
    meta = {"dropped_turns": int(sum(s.dropped_turns for s in seqs))}
    return Batch(**b, weights=terms, num_sequences=len(seqs), meta=meta)
