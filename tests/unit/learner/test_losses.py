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
from rose_ray.recipes import recipes
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
    return load_config(None, [f"algorithm={algorithm}", *overrides]).algorithm.token_weights()


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
    ("rose", ["algorithm.lam=0.5"], {"teacher", "student"}),
    ("teacher_sft", ["algorithm.owners=[teacher]"], {"teacher"}),
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
    (rose, m), _ = run_loss(recipe_weights("rose", "algorithm.lam=0.25"), logits, seq)
    (opd, mo), _ = run_loss(recipe_weights("opd"), logits, seq)
    torch.testing.assert_close(rose, teacher_ce + 0.25 * opd)
    assert m["loss_ce"] == pytest.approx(float(teacher_ce)) and "loss_opd" in mo


def test_recipes_by_name_and_opd_inputs():
    assert set(recipes()) == {"rose", "opd", "teacher_sft"}
    with pytest.raises(ConfigError, match="algorithm: must be one of .*got 'ppo'"):
        load_config(None, ["algorithm=ppo"])
    with pytest.raises(ConfigError, match="algorithm.lam: must be >= 0"):
        load_config(None, ["algorithm.lam=-1"])
    with pytest.raises(ConfigError, match="algorithm.owners: \\['student'\\] leaves out the teacher"):
        load_config(None, ["algorithm=teacher_sft", "algorithm.owners=[student]"])
    with pytest.raises(ConfigError, match="algorithm.handoff.policy: 'none' never hands off"):
        load_config(None, ["algorithm.handoff.policy=none"])
    seq = render([Turn("user", "", "prompt", [1]), Turn("assistant", "", "student", [6, 7])])
    with pytest.raises(ValueError, match="teacher_logprobs are missing"):
        denominators(make_batch([seq], recipe_weights("opd"), 8))


def test_a_third_loss_term_is_one_function_and_a_recipe():
    """Adding a loss term: one registered function (learner/losses.py) and a recipe whose token
    weights name it; batching, the denominators and the loss carry it unchanged."""
    from dataclasses import dataclass

    from rose_ray.learner.losses import TERMS, loss_term
    from rose_ray.recipes import Recipe
    from rose_ray.rollout.handoff import turn_policy

    @loss_term("unlikelihood")  # push down the student's own tokens: −log(1 − p)
    def unlikelihood(logp, mask, weights, t, clip_eps):
        p = logp.exp().clamp(max=1 - 1e-6)
        return torch.where(mask, -torch.log1p(-p) * weights, 0.0).sum(), {"unlikely_p": float(torch.where(mask, p.detach(), 0).sum())}

    @dataclass
    class RoseUnlikely(Recipe):
        name: str = "rose_unlikely"
        beta: float = 0.5

        def turn_policy(self):
            return turn_policy("fixed", k=1)

        def token_weights(self):
            return TokenWeights(ce={"teacher": 1.0}, unlikelihood={"student": self.beta})

    try:
        weights = load_config(None, ["algorithm={name: rose_unlikely, beta: 0.25}"]).algorithm.token_weights()
        seq = trajectory()
        logits = torch.randn(1, len(seq), V, generator=torch.Generator().manual_seed(2), requires_grad=True)
        (total, metrics), batch = run_loss(weights, logits, seq)
        logp = -F.cross_entropy(logits[0, :-1].detach(), torch.tensor(seq.input_ids[1:]), reduction="none")
        owners = [OWNERS[o] for o in seq.owners[1:]]
        student = torch.tensor([o == "student" for o in owners]) & torch.tensor(seq.trainable[1:] or [True] * len(owners))
        teacher = torch.tensor([o == "teacher" for o in owners]) & torch.tensor(seq.trainable[1:] or [True] * len(owners))
        assert denominators(batch) == {"ce": float(teacher.sum()), "unlikelihood": float(student.sum())}
        expected = -logp[teacher].mean() + 0.25 * (-torch.log1p(-logp[student].exp())).mean()
        torch.testing.assert_close(total.detach(), expected)
        assert metrics["loss_unlikelihood"] == pytest.approx(0.25 * float((-torch.log1p(-logp[student].exp())).mean()),
                                                            rel=1e-5)
        assert metrics["unlikely_p"] == pytest.approx(float(logp[student].exp().mean()), rel=1e-5)
        total.backward()
        touched = {OWNERS[seq.owners[t + 1]] for t in range(len(seq) - 1) if logits.grad[0, t].abs().sum() > 0}
        assert touched == {"student", "teacher"}
    finally:
        del TERMS["unlikelihood"], Recipe.KINDS["rose_unlikely"]
    with pytest.raises(ValueError, match="loss term 'unlikelihood': not registered"):
        denominators(batch)
