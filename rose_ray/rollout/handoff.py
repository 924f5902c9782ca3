"""Turn policies (`algorithm.handoff`): `takes_over`, asked before each turn the student would
play, says when the teacher takes over to the end of the episode:

    fixed         the teacher takes over after K student turns (the seed: K=5)
    curriculum    K grows with the learner step (k_start, +1 every grow_every steps, to k_max)
    on_failure    after the student's first invalid or repeated action
    decay         at each student turn with probability p, falling linearly from p0 to 0 over
                  decay_steps learner steps; each draw seeded by the episode's seed and the turn,
                  so a restarted or repeated episode decides the same
    none          never: the student plays the whole episode (eval, OPD)
    teacher_only  at once (K = 0)

A new policy is one dataclass here with a `policy` name and `takes_over` or `student_turns`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from rose_ray.errors import ConfigError, at_least
from rose_ray.tagged import Tagged, chosen

KEY = "algorithm.handoff"


@dataclass
class TurnState:
    """What a policy may look at before a turn."""

    learner_step: int = 0
    seed: str = ""  # the episode's handoff seed (decay's draws)
    student_failed: bool = False  # the student's last action was invalid or repeated its previous one


@dataclass
class TurnPolicy(Tagged):
    policy: str = ""
    TAG: ClassVar[str] = "policy"
    KINDS: ClassVar[dict[str, type[TurnPolicy]]] = {}
    needs_teacher: ClassVar[bool] = False  # an episode without a teacher cannot play it

    def takes_over(self, turn: int, state: TurnState) -> bool:
        """Whether the teacher acts from `turn` (1-based) to the end of the episode (by default:
        after `student_turns`; never where that is None)."""
        k = self.student_turns(state.learner_step)
        return k is not None and turn > k

    def student_turns(self, learner_step: int = 0) -> int | None:
        """Turns the student plays before the handoff, where fixed in advance; else None."""
        return None

    def takeover_p(self, learner_step: int) -> float | None:
        """The per-turn takeover probability, for policies that draw (recorded per episode)."""
        return None


@dataclass
class Fixed(TurnPolicy):
    policy: str = "fixed"
    k: int = 5  # student turns before the teacher takes over

    def __post_init__(self) -> None:
        at_least(self, f"{KEY}.", 0, "k")

    def student_turns(self, learner_step: int = 0) -> int:
        return self.k


@dataclass
class Curriculum(TurnPolicy):
    policy: str = "curriculum"
    k_start: int = 1  # student turns at learner step 0
    k_max: int = 10  # the most student turns
    grow_every: int = 10  # learner steps per +1 student turn

    def __post_init__(self) -> None:
        at_least(self, f"{KEY}.", 0, "k_start", "k_max")
        at_least(self, f"{KEY}.", 1, "grow_every")

    def student_turns(self, learner_step: int = 0) -> int:
        return min(self.k_max, self.k_start + learner_step // self.grow_every)


@dataclass
class OnFailure(TurnPolicy):
    policy: str = "on_failure"

    def takes_over(self, turn: int, state: TurnState) -> bool:
        return state.student_failed


@dataclass
class Decay(TurnPolicy):
    policy: str = "decay"
    p0: float = 0.5  # takeover probability per student turn at learner step 0
    decay_steps: int = 100  # learner steps over which p falls linearly to 0

    def __post_init__(self) -> None:
        at_least(self, f"{KEY}.", 1, "decay_steps")
        if not 0.0 <= self.p0 <= 1.0:  # NaN fails too
            raise ConfigError(f"{KEY}.p0: must be in [0, 1], got {self.p0!r}")

    def takeover_p(self, learner_step: int) -> float:
        return self.p0 * max(0.0, 1.0 - learner_step / self.decay_steps)

    def takes_over(self, turn: int, state: TurnState) -> bool:
        return decay_takes_over(state.seed, turn, self.takeover_p(state.learner_step))


@dataclass
class StudentOnly(TurnPolicy):
    policy: str = "none"


@dataclass
class TeacherOnly(TurnPolicy):
    policy: str = "teacher_only"
    needs_teacher: ClassVar[bool] = True

    def student_turns(self, learner_step: int = 0) -> int:
        return 0


def turn_policy(value: Any = "fixed", **keys: Any) -> TurnPolicy:
    """A turn policy from its config (a name, a mapping with `policy`, or a policy):
    `turn_policy("fixed", k=2)`, `turn_policy({"policy": "decay", "p0": 0.3})`."""
    if keys:
        value = {"policy": value, **keys}
    return chosen(TurnPolicy, value, KEY)


def decay_takes_over(seed: str, turn: int, p: float) -> bool:
    """Whether the teacher takes over at `turn` (decay): a draw seeded by the episode's seed and
    the turn (string seeds hash alike in every process), below p."""
    return random.Random(f"{seed}/turn{turn}").random() < p
