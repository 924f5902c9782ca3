"""Training algorithms as (per-token weights, loss): sft, opd, rose, chosen by name.

The learner is algorithm-blind: it computes each target token's logprob under the current
model and hands it, with the batch's target-aligned fields, to `Algorithm.loss`. A loss is two
optional terms, each a weighted mean over its own tokens:

    ce  = Σ w·(−logp) / n_ce        over tokens whose owner is in `ce_owners`
    opd = Σ w·surrogate / n_opd     over tokens whose owner is in `opd_owners`

where n counts the term's tokens with w > 0 in the whole global batch (all ranks, all
micro-batches; `denominators`). Every value a loss returns is a micro-batch's share of a
global mean, so the learner sums them across micro-batches and ranks and gets exact means.

OPD surrogate (on-policy distillation): advantage A = −(logp_behaviour − logp_teacher), the
negative per-token reverse-KL estimate; PPO-clipped importance ratio r = π_now/π_behaviour
for tokens sampled by an older policy: surrogate = −min(r·A, clip(r, 1±ε)·A). Its gradient
raises the logprob of tokens the teacher likes more than the student.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rose_ray.types import OWNERS, Batch

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {}


def register(name: str) -> Callable[[Callable[..., Algorithm]], Callable[..., Algorithm]]:
    def add(factory: Callable[..., Algorithm]) -> Callable[..., Algorithm]:
        ALGORITHMS[name] = factory
        return factory

    return add


def make_algorithm(name: str, **params: Any) -> Algorithm:
    """The algorithm registered under `name`, built with its parameters."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown {name!r}; expected one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name](**params)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """logp[b, t] = log π(input_ids[b, t+1] | prefix): shape [B, L-1], in float32."""
    b, length, v = logits.shape
    nll = F.cross_entropy(
        logits[:, :-1].reshape(-1, v).float(), input_ids[:, 1:].reshape(-1), reduction="none"
    )
    return -nll.view(b, length - 1)


def _owner_mask(owners: Any, names: tuple[str, ...]) -> Any:
    idx = [OWNERS.index(n) for n in names]
    if isinstance(owners, torch.Tensor):
        return torch.isin(owners.long(), torch.tensor(idx, device=owners.device))
    return np.isin(owners, idx)


@dataclass(frozen=True)
class Algorithm:
    name: str
    owner_weights: dict[str, float]
    ce_owners: tuple[str, ...] = ()
    opd_owners: tuple[str, ...] = ()
    clip_eps: float = 0.2

    def denominators(self, batch: Batch) -> dict[str, float]:
        """Token counts of each term over the whole (global) batch; checks OPD inputs."""
        w = np.asarray(batch.loss_weights)[:, 1:] > 0
        owners = np.asarray(batch.owners)[:, 1:]
        out = {}
        if self.ce_owners:
            out["ce"] = float((w & _owner_mask(owners, self.ce_owners)).sum())
        if self.opd_owners:
            m = w & _owner_mask(owners, self.opd_owners)
            out["opd"] = float(m.sum())
            if batch.teacher_logprobs is None or np.isnan(np.asarray(batch.teacher_logprobs)[:, 1:][m]).any():
                raise ValueError(
                    f"{self.name}: teacher_logprobs are missing for some trained "
                    f"{'/'.join(self.opd_owners)} tokens (score them with the teacher engine)"
                )
        return out

    def loss(
        self, logp: torch.Tensor, t: dict[str, torch.Tensor], den: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(this micro-batch's share of the loss, its share of each metric).

        `t` holds target-aligned fields ([B, L-1], i.e. the batch's columns 1..L-1).
        """
        total = logp.sum() * 0.0  # keeps a graph when this micro-batch has no trained token
        metrics: dict[str, float] = {}
        w = t["loss_weights"]
        if self.ce_owners and den.get("ce", 0) > 0:
            m = (w > 0) & _owner_mask(t["owners"], self.ce_owners)
            ce = torch.where(m, -logp * w, 0.0).sum() / den["ce"]
            total = total + ce
            metrics["loss_ce"] = ce.item()
        if self.opd_owners and den.get("opd", 0) > 0:
            m = (w > 0) & _owner_mask(t["owners"], self.opd_owners)
            term, extra = opd_surrogate(logp, m, w, t["old_logprobs"], t["teacher_logprobs"], self.clip_eps)
            total = total + term / den["opd"]
            metrics["loss_opd"] = term.item() / den["opd"]
            metrics.update({k: v / den["opd"] for k, v in extra.items()})
        return total, metrics


def opd_surrogate(
    logp: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    clip_eps: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ over masked tokens of w·(clipped policy-gradient surrogate); sums of its diagnostics."""
    now = logp.detach()
    behaviour = torch.where(torch.isnan(old_logprobs), now, old_logprobs)  # unknown: on-policy
    teacher = torch.where(mask, teacher_logprobs, 0.0)  # NaN outside the mask must not leak
    advantage = torch.where(mask, teacher - behaviour, 0.0)
    ratio = torch.exp(torch.where(mask, logp - behaviour, 0.0))
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    surrogate = -torch.minimum(ratio * advantage, clipped * advantage)
    term = torch.where(mask, surrogate * weights, 0.0).sum()
    r = ratio.detach()
    extra = {
        "opd_reverse_kl": float(torch.where(mask, behaviour - teacher, 0.0).sum()),
        "opd_ratio": float(torch.where(mask, r, 0.0).sum()),
        "opd_clip_frac": float((mask & ((r - 1.0).abs() > clip_eps)).sum()),
    }
    return term, extra


def _check_owners(key: str, owners: tuple[str, ...]) -> tuple[str, ...]:
    owners = tuple(owners)
    if not owners or any(o not in OWNERS for o in owners):
        raise ValueError(f"{key}: expected a non-empty subset of {OWNERS}, got {owners!r}")
    return owners


def _check_clip(clip_eps: float) -> float:
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps: must be in (0, 1), got {clip_eps!r}")
    return float(clip_eps)


@register("sft")
def sft(owners: tuple[str, ...] = ("student", "teacher")) -> Algorithm:
    """Cross entropy on the chosen owners' tokens."""
    owners = _check_owners("sft_owners", owners)
    return Algorithm("sft", {o: 1.0 for o in owners}, ce_owners=owners)


@register("opd")
def opd(clip_eps: float = 0.2) -> Algorithm:
    """On-policy distillation on student tokens."""
    return Algorithm("opd", {"student": 1.0}, opd_owners=("student",), clip_eps=_check_clip(clip_eps))


@register("rose")
def rose(lam: float = 0.0, clip_eps: float = 0.2) -> Algorithm:
    """Cross entropy on teacher tokens + λ·OPD on student tokens (λ = 0: student tokens are
    context only)."""
    if lam < 0:
        raise ValueError(f"lam: must be >= 0, got {lam!r}")
    weights = {"teacher": 1.0}
    if lam > 0:
        weights["student"] = float(lam)
    return Algorithm(
        "rose", weights, ce_owners=("teacher",), opd_owners=("student",) if lam > 0 else (),
        clip_eps=_check_clip(clip_eps),
    )
