"""Algorithms as recipes: `algorithm: {name: <recipe>, ...}` is one typed section, one small file each.

A recipe owns everything that differs between algorithms, and nothing else does:
- its settings (the `algorithm` section: a dataclass whose keys OmegaConf checks),
- its turn policy (who acts at each turn of an episode, rollout/handoff.py),
- whether the teacher scores the student's tokens (OPD needs the teacher's logprobs),
- which tokens train, in which loss term and how much (`TokenWeights`, rose_ray/tokens.py);
  the learner only multiplies,
- its config checks (a `ConfigError` naming the key).

    rose         the student plays K turns, the teacher the rest; CE on the teacher's tokens
                 (+ λ·OPD on the student's)                                    recipes/rose.py
    opd          the student plays every turn; OPD on its tokens               recipes/opd.py
    teacher_sft  the teacher plays every turn; CE on its tokens                recipes/teacher_sft.py

Beside them, the drivers that are not the online loop: offline SFT on a dataset
(`recipes/sft.py`, `rose-ray sft`) and the tiny models' warm-ups (`recipes/warmup.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rose_ray.errors import ConfigError, chosen_section

if TYPE_CHECKING:
    from rose_ray.rollout.handoff import TurnPolicy
    from rose_ray.tokens import TokenWeights


@dataclass
class Recipe:
    """One algorithm and its settings. A subclass sets `name` and the methods below. `cfg` is
    the whole TrainConfig (recipes import no config: the config imports them)."""

    name: str = ""
    KINDS: ClassVar[dict[str, type[Recipe]]] = {}
    scoring_key: ClassVar[str] = "algorithm"  # the key that makes the teacher score student tokens

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Recipe.KINDS[cls.name] = cls

    def check(self, cfg: Any) -> None:
        """Checks against the rest of the config (ConfigError naming the key)."""

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
        from dataclasses import asdict

        import yaml

        settings = [f"{k}={yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip().removesuffix('...').strip()}"
                    for k, v in asdict(self).items() if k != "name"]
        return " ".join([self.name, *settings])


def recipes() -> dict[str, type[Recipe]]:
    import rose_ray.recipes.opd  # noqa: F401  (each file registers its recipe)
    import rose_ray.recipes.rose  # noqa: F401
    import rose_ray.recipes.teacher_sft  # noqa: F401

    return dict(sorted(Recipe.KINDS.items()))  # by name: the order modules were imported in varies


def get_recipe(value: Any) -> Recipe:
    """The `algorithm` section as its recipe: a name (`opd`, its defaults), a mapping with
    `name`, or a recipe. A ConfigError naming the key otherwise."""
    return chosen_section(recipes(), "name", value, "algorithm")
