"""ROSE: the student acts for the first turns, the teacher takes over for the rest, in the
same game and conversation; the student learns to imitate the teacher's turns from the states
its own turns led to.

    handoff   rollout.handoff (fixed K, curriculum, on_failure or decay)
    tokens    cross entropy on the teacher's tokens; with learner.lam > 0 also λ·OPD on the
              student's own tokens (then the teacher scores them); otherwise the student's
              turns are context only
"""

from __future__ import annotations

from rose_ray.recipes import Recipe
from rose_ray.tokens import TokenWeights


class Rose(Recipe):
    name = "rose"
    scoring_key = "learner.lam"

    def check(self, cfg) -> None:
        from rose_ray.config import ConfigError

        if cfg.rollout.handoff.policy == "none" and cfg.learner.lam == 0:
            raise ConfigError("rollout.handoff.policy: 'none' never hands off to the teacher, so rose with "
                              "learner.lam=0 has no token to train (use algorithm opd for student-only episodes)")

    def handoff(self, cfg):
        return cfg.rollout.handoff

    def teacher_scores_student(self, cfg) -> bool:
        return cfg.learner.lam > 0

    def token_weights(self, cfg) -> TokenWeights:
        return TokenWeights(ce={"teacher": 1.0}, opd={"student": float(cfg.learner.lam)} if cfg.learner.lam > 0 else {})


ROSE = Rose()
