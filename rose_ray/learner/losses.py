"""The learner's one loss: two weighted terms over the tokens the batch says train.

The learner is algorithm-blind: which tokens train, in which term and how much, arrives with
the batch (`ce_weights`, `opd_weights`; a recipe decides them, rose_ray/recipes/). The
learner computes each target token's logprob under the current model and this module turns
it into a loss. Each term is a weighted mean over its own tokens:

    ce  = Σ w_ce·(−logp) / n_ce          over tokens with w_ce > 0
    opd = Σ w_opd·surrogate / n_opd      over tokens with w_opd > 0

where n counts the term's tokens with w > 0 in the whole global batch (all ranks, all
micro-batches; `denominators`). Every value `loss` returns is a micro-batch's share of a
global mean, so the learner sums them across micro-batches and ranks and gets exact means.

OPD surrogate (on-policy distillation): advantage A = −(logp_behaviour − logp_teacher), the
negative per-token reverse-KL estimate; PPO-clipped importance ratio r = π_now/π_behaviour
for tokens sampled by an older policy: surrogate = −min(r·A, clip(r, 1±ε)·A). Its gradient
raises the logprob of tokens the teacher likes more than the student.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rose_ray.types import Batch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """logp[b, t] = log π(input_ids[b, t+1] | prefix): shape [B, L-1], in float32."""
    b, length, v = logits.shape
    nll = F.cross_entropy(
        logits[:, :-1].reshape(-1, v).float(), input_ids[:, 1:].reshape(-1), reduction="none"
    )
    return -nll.view(b, length - 1)


def aligned(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A micro-batch's per-token fields shifted to the targets they weigh (columns 1..L-1),
    the shape of `token_logprobs`; what the model reads (ids, positions, boundaries) is left out."""
    return {k: v[:, 1:] for k, v in t.items() if k not in ("input_ids", "position_ids", "cu_seq_lens")}


def denominators(batch: Batch) -> dict[str, float]:
    """Token counts of each term over the whole (global) batch; checks the OPD inputs."""
    ce = np.asarray(batch.ce_weights)[:, 1:] > 0
    opd = np.asarray(batch.opd_weights)[:, 1:] > 0
    if opd.any() and np.isnan(np.asarray(batch.teacher_logprobs)[:, 1:][opd]).any():
        raise ValueError("teacher_logprobs are missing for some tokens of the OPD term "
                         "(score them with the teacher engine)")
    return {"ce": float(ce.sum()), "opd": float(opd.sum())}


def loss(logp: torch.Tensor, t: dict[str, torch.Tensor], den: dict[str, float],
         clip_eps: float) -> tuple[torch.Tensor, dict[str, float]]:
    """(this micro-batch's share of the loss, its share of each metric).

    `t` holds target-aligned fields ([B, L-1], i.e. the batch's columns 1..L-1).
    """
    total = logp.sum() * 0.0  # keeps a graph when this micro-batch has no trained token
    metrics: dict[str, float] = {}
    if den.get("ce", 0) > 0:
        w = t["ce_weights"]
        ce = torch.where(w > 0, -logp * w, 0.0).sum() / den["ce"]
        total = total + ce
        metrics["loss_ce"] = ce.item()
    if den.get("opd", 0) > 0:
        w = t["opd_weights"]
        term, extra = opd_surrogate(logp, w > 0, w, t["old_logprobs"], t["teacher_logprobs"], clip_eps)
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
