"""Algorithms as recipes: what `algorithm: <name>` means, one small file each.

A recipe owns everything that differs between algorithms, and nothing else does:
- its handoff policy (who acts at each turn of an episode),
- whether the teacher scores the student's tokens (OPD needs the teacher's logprobs),
- which tokens train, in which loss term and how much (`TokenWeights`, rose_ray/tokens.py);
  the learner only multiplies,
- its config checks (a `ConfigError` naming the key).

    rose         the student plays K turns, the teacher the rest; CE on the teacher's tokens
                 (+ λ·OPD on the student's)                                    recipes/rose.py
    opd          the student plays every turn; OPD on its tokens               recipes/opd.py
    teacher_sft  the teacher plays every turn; CE on its tokens                recipes/teacher_sft.py

Beside them, the drivers that are not the online loop: offline SFT on a dataset
(`recipes/sft.py`, `rose-ray sft`) and the tiny teacher's warm-up (`recipes/warmup.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rose_ray.config import TrainConfig
    from rose_ray.rollout.episode import HandoffConfig
    from rose_ray.tokens import TokenWeights


class Recipe:
    """One algorithm. Subclasses set `name` and the methods below; `check_agents` is shared."""

    name = ""
    scoring_key = ""  # the key that makes the teacher score student tokens (named when it cannot)

    def check(self, cfg: TrainConfig) -> None:
        """Config checks beyond each section's own (ConfigError naming the key)."""

    def handoff(self, cfg: TrainConfig) -> HandoffConfig:
        raise NotImplementedError

    def teacher_scores_student(self, cfg: TrainConfig) -> bool:
        """Whether every student token gets the teacher's logprob (the OPD term needs it)."""
        return False

    def token_weights(self, cfg: TrainConfig) -> TokenWeights:
        raise NotImplementedError

    def check_agents(self, cfg: TrainConfig, shared_tokenizer: bool) -> None:
        """The teacher scores the student's tokens only when both share one tokenizer."""
        if self.teacher_scores_student(cfg) and not shared_tokenizer:
            raise ValueError(f"{self.scoring_key}: OPD needs the teacher to score the student's tokens, so both must "
                             f"share a tokenizer; {cfg.student_engine.model} and {cfg.teacher_engine.model} do not")


def recipes() -> dict[str, Recipe]:
    from rose_ray.recipes.opd import OPD
    from rose_ray.recipes.rose import ROSE
    from rose_ray.recipes.teacher_sft import TEACHER_SFT

    return {r.name: r for r in (ROSE, OPD, TEACHER_SFT)}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; a ValueError naming the `algorithm` key otherwise."""
    known = recipes()
    if name not in known:
        raise ValueError(f"algorithm: must be one of {tuple(known)}, got {name!r}")
    return known[name]
