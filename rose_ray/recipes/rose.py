"""ROSE: the student acts for the first turns, the teacher takes over for the rest; cross
entropy on the teacher's tokens, and with lam > 0 also λ·OPD on the student's own.

    algorithm: {name: rose, handoff: {policy: fixed, k: 5}, lam: 0.0}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rose_ray.errors import ConfigError, at_least
from rose_ray.recipes import Recipe
from rose_ray.rollout.handoff import StudentOnly, TurnPolicy, turn_policy
from rose_ray.tagged import tagged
from rose_ray.tokens import TokenWeights


@dataclass
class Rose(Recipe):
    name: str = "rose"
    handoff: Any = tagged(TurnPolicy, "fixed")  # who acts at each turn: a turn policy chosen by `policy`
    lam: float = 0.0  # weight of the OPD term on the student's own tokens
    scoring_key: ClassVar[str] = "algorithm.lam"

    def __post_init__(self) -> None:
        self.handoff = turn_policy(self.handoff)
        at_least(self, "algorithm.", 0, "lam")
        if isinstance(self.handoff, StudentOnly) and self.lam == 0:
            raise ConfigError("algorithm.handoff.policy: 'none' never hands off to the teacher, so rose with "
                              "algorithm.lam=0 has no token to train (use algorithm opd for student-only episodes)")

    def turn_policy(self) -> TurnPolicy:
        return self.handoff

    def teacher_scores_student(self) -> bool:
        return self.lam > 0

    def token_weights(self) -> TokenWeights:
        return TokenWeights(ce={"teacher": 1.0}, opd={"student": float(self.lam)} if self.lam > 0 else {})
