"""Algorithms as recipes: `algorithm: {name: <recipe>, ...}`, one small file each. A recipe owns
what differs between algorithms: its settings and their checks, its turn policy
(rollout/handoff.py), whether the teacher scores the student's tokens, and which tokens train
in which loss term (`TokenWeights`, rose_ray/tokens.py); the learner only multiplies.

    rose         the student plays K turns, the teacher the rest; CE on the teacher's tokens
                 (+ λ·OPD on the student's)                                    recipes/rose.py
    opd          the student plays every turn; OPD on its tokens               recipes/opd.py
    teacher_sft  the teacher plays every turn; CE on its tokens                recipes/teacher_sft.py

Offline SFT on a dataset is recipes/sft.py (`rose-ray sft`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rose_ray.errors import ConfigError
from rose_ray.tagged import Tagged, chosen

if TYPE_CHECKING:
    from rose_ray.rollout.handoff import TurnPolicy
    from rose_ray.tokens import TokenWeights


@dataclass
class Recipe(Tagged):
    """One algorithm and its settings. A subclass sets `name` and the methods below. `cfg` is
    the whole TrainConfig (recipes import no config: the config imports them)."""

    name: str = ""
    KINDS: ClassVar[dict[str, type[Recipe]]] = {}
    scoring_key: ClassVar[str] = "algorithm"  # the key that makes the teacher score student tokens

    @classmethod
    def kinds(cls) -> dict[str, type[Recipe]]:
        return recipes()  # (each file registers its recipe when imported)

    def check(self, cfg: Any) -> None:
        """Checks against the rest of the config (ConfigError naming the key)."""
        if not self.teacher_scores_student():
            return
        student, teacher = cfg.student_engine.context_tokens, cfg.teacher_engine.context_tokens
        if teacher < student:
            raise ConfigError(f"teacher_engine.context_tokens: {teacher} is less than student_engine.context_tokens "
                              f"{student}; the teacher scores each episode's student tokens in one pass over what "
                              "the learner trains on, up to the student's context")
        if cfg.chat.history == "template":
            raise ConfigError(f"chat.history: 'template' re-renders earlier turns from their text, but the OPD "
                              f"term ({self.scoring_key}={self.scoring_value()}) needs the ids that were sampled; "
                              "use chat.history=sampled")

    def scoring_value(self) -> Any:
        """The value of `scoring_key` (`opd` for `algorithm`, 0.5 for `algorithm.lam`)."""
        setting = self.scoring_key.split(".")[1:]  # `algorithm` itself, or one of its keys
        return getattr(self, setting[0]) if setting else self.name

    def turn_policy(self) -> TurnPolicy:
        raise NotImplementedError

    def teacher_scores_student(self) -> bool:
        """Whether every student token gets the teacher's logprob (the OPD term needs it)."""
        return False

    def token_weights(self) -> TokenWeights:
        raise NotImplementedError

    def check_agents(self, cfg: Any, shared_tokenizer: bool) -> None:
        """The teacher scores the student's tokens only when both share one tokenizer."""
        if self.teacher_scores_student() and not shared_tokenizer:
            raise ConfigError(f"{self.scoring_key}: OPD needs the teacher to score the student's tokens, so both must "
                              f"share a tokenizer; {cfg.student_engine.model} and {cfg.teacher_engine.model} do not")

    def describe(self) -> str:
        """One line for logs, as the config writes it: `rose handoff={policy: fixed, k: 5} lam=0.0`."""
        import yaml

        settings = [f"{k}={yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip().removesuffix('...').strip()}"
                    for k, v in asdict(self).items() if k != "name"]
        return " ".join([self.name, *settings])


def recipes() -> dict[str, type[Recipe]]:
    import rose_ray.recipes.opd  # noqa: F401  (each file registers its recipe)
    import rose_ray.recipes.rose  # noqa: F401
    import rose_ray.recipes.teacher_sft  # noqa: F401

    return dict(sorted(Recipe.KINDS.items()))  # by name, whatever imported them first


def get_recipe(value: Any) -> Recipe:
    """The `algorithm` section as its recipe: a name (`opd`, its defaults), a mapping with
    `name`, or a recipe. A ConfigError naming the key otherwise."""
    return chosen(Recipe, value, "algorithm")
