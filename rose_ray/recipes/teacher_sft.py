"""Teacher SFT, online: the teacher plays whole episodes and the student imitates the tokens of
`owners`. `algorithm: {name: teacher_sft, owners: [student, teacher]}`
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rose_ray.errors import ConfigError
from rose_ray.recipes import Recipe
from rose_ray.rollout.handoff import TeacherOnly, TurnPolicy
from rose_ray.tokens import TokenWeights
from rose_ray.types import OWNERS


def imitate(owners: list[str] | tuple[str, ...], key: str = "algorithm.owners") -> TokenWeights:
    """Cross entropy on these owners' tokens (also offline SFT's weights, recipes/sft.py); `key`
    names them in the ConfigError when they are not a non-empty subset of OWNERS."""
    if not owners or set(owners) - set(OWNERS):
        raise ConfigError(f"{key}: must be a non-empty subset of {OWNERS}, got {list(owners)}")
    return TokenWeights(ce={o: 1.0 for o in owners})


@dataclass
class TeacherSFT(Recipe):
    name: str = "teacher_sft"
    owners: list[str] = field(default_factory=lambda: ["student", "teacher"])  # whose tokens to imitate

    def __post_init__(self) -> None:
        imitate(self.owners)
        if "teacher" not in self.owners:
            raise ConfigError(f"algorithm.owners: {list(self.owners)} leaves out the teacher, who "
                              "plays every turn under teacher_sft, so no token would train")

    def turn_policy(self) -> TurnPolicy:
        return TeacherOnly()

    def token_weights(self) -> TokenWeights:
        return imitate(self.owners)
