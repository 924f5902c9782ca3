"""The learner's loss: registered terms (`@loss_term`), each weighted per token, summed.

Which tokens train, in which term and how much, arrives with the batch (`<term>_weights`,
decided by a recipe). Each term is a weighted mean over its own tokens in the whole global batch
(`denominators`), so each micro-batch's values are shares that the learner sums exactly:

    ce  = Σ w_ce·(−logp) / n_ce          over tokens with w_ce > 0
    opd = Σ w_opd·surrogate / n_opd      over tokens with w_opd > 0

OPD (on-policy distillation): advantage A = logp_teacher − logp_behaviour (negative reverse
KL), PPO-clipped ratio r = π_now/π_behaviour: surrogate = −min(r·A, clip(r, 1±ε)·A).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from rose_ray.learner.batching import WEIGHTS  # a term's weights in a micro-batch: `<term>_weights`
from rose_ray.types import Batch


@dataclass(frozen=True)
class LossTerm:
    """`value(logp, mask, weights, fields, clip_eps)`: Σ over masked tokens of w·(per-token loss),
    and sums of its diagnostics; `needs`: batch fields that must be known on its tokens (the remedy)."""

    name: str
    value: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    needs: dict[str, str] = field(default_factory=dict)


TERMS: dict[str, LossTerm] = {}


def loss_term(name: str, needs: dict[str, str] | None = None) -> Callable:
    """Register a function as the loss term `name` (what TokenWeights and recipes call it)."""
    def register(fn: Callable) -> Callable:
        TERMS[name] = LossTerm(name, fn, needs or {})
        return fn
    return register


@loss_term("ce")
def cross_entropy(logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, t: dict[str, torch.Tensor],
                  clip_eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Imitation: −logp of each trained token."""
    return torch.where(mask, -logp * weights, 0.0).sum(), {}


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """logp[b, t] = log π(input_ids[b, t+1] | prefix): shape [B, L-1], in float32."""
    b, length, v = logits.shape
    nll = F.cross_entropy(
        logits[:, :-1].reshape(-1, v).float(), input_ids[:, 1:].reshape(-1), reduction="none"
    )
    return -nll.view(b, length - 1)


def aligned(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A micro-batch's per-token fields shifted to the targets they weigh (columns 1..L-1)."""
    return {k: v[:, 1:] for k, v in t.items() if k not in ("input_ids", "position_ids", "cu_seq_lens")}


def denominators(batch: Batch) -> dict[str, float]:
    """Token counts of each term over the whole (global) batch; checks each term's inputs."""
    den = {}
    for name, weights in batch.weights.items():
        if name not in TERMS:
            raise ValueError(f"loss term {name!r}: not registered (learner/losses.py has {tuple(TERMS)})")
        mask = np.asarray(weights)[:, 1:] > 0
        for key, remedy in TERMS[name].needs.items():
            if mask.any() and np.isnan(np.asarray(getattr(batch, key))[:, 1:][mask]).any():
                raise ValueError(f"{key} are missing for some tokens of the {name.upper()} term ({remedy})")
        den[name] = float(mask.sum())
    return den


def loss(logp: torch.Tensor, t: dict[str, torch.Tensor], den: dict[str, float],
         clip_eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """(this micro-batch's share of the loss, its share of each metric) from target-aligned `t`."""
    total = logp.sum() * 0.0  # keeps a graph when this micro-batch has no trained token
    metrics: dict[str, torch.Tensor | float] = {}
    for name, n in den.items():
        if n <= 0:
            continue
        w = t[name + WEIGHTS]
        term, extra = TERMS[name].value(logp, w > 0, w, t, clip_eps)
        total = total + term / n
        metrics[f"loss_{name}"] = term.detach() / n
        metrics.update({k: v / n for k, v in extra.items()})
    return total, metrics


@loss_term("opd", needs={"teacher_logprobs": "score them with the teacher engine"})
def on_policy_distillation(logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                           t: dict[str, torch.Tensor], clip_eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Σ over masked tokens of w·(clipped policy-gradient surrogate); sums of its diagnostics."""
    old = t["old_logprobs"]
    behaviour = torch.where(torch.isnan(old), logp.detach(), old)  # unknown: on-policy
    teacher = torch.where(mask, t["teacher_logprobs"], 0.0)  # NaN outside the mask must not leak
    advantage = torch.where(mask, teacher - behaviour, 0.0)
    ratio = torch.exp(torch.where(mask, logp - behaviour, 0.0))
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    surrogate = -torch.minimum(ratio * advantage, clipped * advantage)
    term = torch.where(mask, surrogate * weights, 0.0).sum()
    r = ratio.detach()
    return term, {
        "opd_reverse_kl": torch.where(mask, behaviour - teacher, 0.0).sum(),
        "opd_ratio": torch.where(mask, r, 0.0).sum(),
        "opd_clip_frac": (mask & ((r - 1.0).abs() > clip_eps)).sum().float(),
    }
