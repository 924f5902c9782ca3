"""The learner's loss over a recipe's token weights: the gradient reaches only the trained
owners, OPD's direction and clipping, exact means, recipe names and OPD inputs checked."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rose_ray.config import ConfigError, load_config
from rose_ray.learner.batching import micro_batches
from rose_ray.learner.losses import aligned, denominators, loss, token_logprobs
from rose_ray.recipes import get_recipe, recipes
from rose_ray.recipes.teacher_sft import imitate
from rose_ray.tokens import TokenWeights, make_batch, render
from rose_ray.types import OWNERS, Turn

V = 16


def trajectory(teacher_student=-0.5):
    turns = [
        Turn("user", "", "prompt", [1, 2, 3]),
        Turn("user", "", "env", [4, 5]),
        Turn("assistant", "", "student", [6, 7, 15], logprobs=[-2.0, -2.5], policy_version=0),
        Turn("user", "", "env", [8]),
        Turn("assistant", "", "teacher", [9, 10, 15]),
    ]
    turns[2].teacher_logprobs = [teacher_student] * 3
    return render(turns)


def recipe_weights(algorithm: str, *overrides: str) -> TokenWeights:
    return get_recipe(algorithm).token_weights(load_config(None, [f"algorithm={algorithm}", *overrides]))


def run_loss(weights: TokenWeights, logits, seq, clip_eps=0.2):
    batch = make_batch([seq], weights, max_tokens=64)
    den = denominators(batch)
    ((part,),) = micro_batches(batch, 1, 64)
    t = {k: torch.from_numpy(v) for k, v in part.items()}
    logp = token_logprobs(logits, t["input_ids"])
    return loss(logp, aligned(t), den, clip_eps), batch


@pytest.mark.parametrize("algorithm, overrides, trained", [
    ("rose", [], {"teacher"}),
    ("opd", [], {"student"}),
    ("rose", ["learner.lam=0.5"], {"teacher", "student"}),
    ("teacher_sft", ["learner.sft_owners=[teacher]"], {"teacher"}),
])
def test_gradient_reaches_only_the_trained_owners(algorithm, overrides, trained):
    seq = trajectory()
    logits = torch.randn(1, len(seq), V, generator=torch.Generator().manual_seed(0), requires_grad=True)
    (total, _), batch = run_loss(recipe_weights(algorithm, *overrides), logits, seq)
    total.backward()
    # logits at position t predict token t+1: gradient there means token t+1 is trained
    touched = {OWNERS[seq.owners[t + 1]] for t in range(len(seq) - 1) if logits.grad[0, t].abs().sum() > 0}
    assert touched == trained


def test_opd_raises_the_probability_the_teacher_prefers():
    theta = torch.zeros(V, requires_grad=True)  # a context-free "model": the same logits everywhere
    turns = [Turn("user", "", "prompt", [1]),
             Turn("assistant", "", "student", [6, 7], logprobs=[-math.log(V)] * 2, policy_version=0)]
    turns[1].teacher_logprobs = [-0.1, -6.0]  # the teacher likes 6, dislikes 7
    seq = render(turns)
    algo = recipe_weights("opd")
    before = torch.softmax(theta.detach(), 0)
    for _ in range(3):
        (total, metrics), _ = run_loss(algo, theta.expand(1, len(seq), V), seq)
        theta.grad = None
        total.backward()
        with torch.no_grad():
            theta -= 0.5 * theta.grad
    after = torch.softmax(theta.detach(), 0)
    assert after[6] > before[6] and after[7] < before[7]
    assert metrics["opd_reverse_kl"] == pytest.approx(np.mean([-math.log(V) + 0.1, -math.log(V) + 6]))


def test_stale_samples_are_clipped():
    """A token the old policy found unlikely (ratio >> 1) with a positive advantage gets no
    gradient; with a negative advantage the unclipped (pessimistic) term still applies."""
    logits = torch.zeros(1, 3, V, requires_grad=True)  # current logprob = -log V
    for teacher, grad_expected in ((0.0, False), (-20.0, True)):
        turns = [Turn("user", "", "prompt", [1]),
                 Turn("assistant", "", "student", [6, 7], logprobs=[-9.0, -9.0], policy_version=0)]
        turns[1].teacher_logprobs = [teacher, teacher]
        seq = render(turns)
        logits.grad = None
        (total, metrics), _ = run_loss(recipe_weights("opd"), logits, seq, clip_eps=0.2)
        total.backward()
        assert (logits.grad.abs().sum() > 0) == grad_expected
        assert metrics["opd_clip_frac"] == 1.0 and metrics["opd_ratio"] > 1.2


def test_losses_are_exact_means():
    seq = trajectory()
    logits = torch.randn(1, len(seq), V, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([seq.input_ids])
    ce_all = F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
    owners = [OWNERS[o] for o in seq.owners[1:]]
    teacher_ce = ce_all[[o == "teacher" for o in owners]].mean()
    (sft, m), _ = run_loss(imitate(["teacher"]), logits, seq)
    torch.testing.assert_close(sft, teacher_ce)
    (rose, m), _ = run_loss(recipe_weights("rose", "learner.lam=0.25"), logits, seq)
    (opd, mo), _ = run_loss(recipe_weights("opd"), logits, seq)
    torch.testing.assert_close(rose, teacher_ce + 0.25 * opd)
    assert m["loss_ce"] == pytest.approx(float(teacher_ce)) and "loss_opd" in mo


def test_recipes_by_name_and_opd_inputs():
    assert set(recipes()) == {"rose", "opd", "teacher_sft"}
    with pytest.raises(ConfigError, match="algorithm: must be one of .*got 'ppo'"):
        load_config(None, ["algorithm=ppo"])
    with pytest.raises(ConfigError, match="learner.lam: must be >= 0"):
        load_config(None, ["learner.lam=-1"])
    with pytest.raises(ConfigError, match="learner.sft_owners: \\['student'\\] leaves out the teacher"):
        load_config(None, ["algorithm=teacher_sft", "learner.sft_owners=[student]"])
    with pytest.raises(ConfigError, match="rollout.handoff.policy: 'none' never hands off"):
        load_config(None, ["rollout.handoff.policy=none"])
    seq = render([Turn("user", "", "prompt", [1]), Turn("assistant", "", "student", [6, 7])])
    with pytest.raises(ValueError, match="teacher_logprobs are missing"):
        denominators(make_batch([seq], recipe_weights("opd"), 8))
