"""On-policy distillation (OPD): the student plays whole episodes; the teacher scores every
student token, and the student is pushed toward the tokens the teacher likes more than it
does (reverse KL as a clipped policy-gradient surrogate, rose_ray/learner/losses.py).

    handoff   none: the student acts at every turn
    tokens    OPD on the student's tokens (the teacher must share the student's tokenizer)
"""

from __future__ import annotations

from rose_ray.recipes import Recipe
from rose_ray.tokens import TokenWeights


class OnPolicyDistillation(Recipe):
    name = "opd"
    scoring_key = "algorithm"

    def handoff(self, cfg):
        from rose_ray.rollout.episode import HandoffConfig

        return HandoffConfig("none")

    def teacher_scores_student(self, cfg) -> bool:
        return True

    def token_weights(self, cfg) -> TokenWeights:
        return TokenWeights(opd={"student": 1.0})


OPD = OnPolicyDistillation()
