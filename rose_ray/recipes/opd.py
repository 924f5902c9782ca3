"""On-policy distillation (OPD): the student plays whole episodes and is pushed toward the
tokens the teacher likes more than it does (learner/losses.py). `algorithm: {name: opd}`
"""
from __future__ import annotations

from dataclasses import dataclass

from rose_ray.recipes import Recipe
from rose_ray.rollout.handoff import StudentOnly, TurnPolicy
from rose_ray.tokens import TokenWeights


@dataclass
class OnPolicyDistillation(Recipe):
    name: str = "opd"

    def turn_policy(self) -> TurnPolicy:
        return StudentOnly()

    def teacher_scores_student(self) -> bool:
        return True

    def token_weights(self) -> TokenWeights:
        return TokenWeights(opd={"student": 1.0})
