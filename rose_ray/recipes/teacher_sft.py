"""Teacher SFT, online: the teacher plays whole episodes and the student imitates them (the
seed table's SFT row, with episodes played as training goes instead of read from a file).

    handoff   teacher_only: the teacher acts from the first turn
    tokens    cross entropy on the tokens of learner.sft_owners (default student and teacher;
              in teacher-only episodes that is the teacher's)
"""

from __future__ import annotations

from rose_ray.recipes import Recipe
from rose_ray.tokens import TokenWeights


def imitate(owners: list[str] | tuple[str, ...]) -> TokenWeights:
    """Cross entropy on these owners' tokens (also offline SFT's weights, recipes/sft.py)."""
    return TokenWeights(ce={o: 1.0 for o in owners})


class TeacherSFT(Recipe):
    name = "teacher_sft"

    def check(self, cfg) -> None:
        from rose_ray.config import ConfigError

        if "teacher" not in cfg.learner.sft_owners:
            raise ConfigError(f"learner.sft_owners: {list(cfg.learner.sft_owners)} leaves out the teacher, who "
                              "plays every turn under teacher_sft, so no token would train")

    def handoff(self, cfg):
        from rose_ray.rollout.episode import HandoffConfig

        return HandoffConfig("teacher_only")

    def token_weights(self, cfg) -> TokenWeights:
        return imitate(cfg.learner.sft_owners)


TEACHER_SFT = TeacherSFT()
