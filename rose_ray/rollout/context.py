"""An agent's context (`ContextSettings`) and the one decision made with it: which turns of a
conversation are left out so that the rest fits, for each prompt (`cut`) and for the learner's
row (`learner_cut`). Engines get the ids that result and cut nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rose_ray.inference.engine import CONTEXT_POLICIES
from rose_ray.types import CONTEXT_TOKENS, Turn

if TYPE_CHECKING:
    from rose_ray.inference.engine import EngineConfig


class ContextExceeded(ValueError):
    """A conversation does not fit the context budget under the configured policy."""


@dataclass(frozen=True)
class ContextSettings:
    """`tokens` (prompt + reply), what a conversation that no longer fits loses (`policy`), and
    the turns after the prompt turns it never loses (`keep_first_turns`: the first observation
    carries the task)."""

    tokens: int = CONTEXT_TOKENS
    policy: str = "drop_oldest"
    keep_first_turns: int = 1

    def __post_init__(self) -> None:
        if self.policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy: must be one of {CONTEXT_POLICIES}, got {self.policy!r}")

    @classmethod
    def of(cls, engine: EngineConfig) -> ContextSettings:
        return cls(engine.context_tokens, engine.context_policy, engine.keep_first_turns)

    def budget(self, max_new_tokens: int) -> int:
        """The prompt tokens an agent may send so that a full reply still fits its context."""
        return max(self.tokens - max_new_tokens, 0)

    def cut(self, turns: list[Turn], max_new_tokens: int = 0) -> list[int]:
        """The indices of the turns a prompt leaves out so that the rest and a reply of
        `max_new_tokens` fit. The prompt turns, the first `keep_first_turns` after them and the
        last turn are kept; drop_oldest leaves out the oldest others two at a time (an action and
        its observation, so roles still alternate). ContextExceeded under end_episode, or when
        nothing more can be dropped."""
        budget, total = self.budget(max_new_tokens), sum(len(t.token_ids) for t in turns)
        if total <= budget:
            return []
        if self.policy == "end_episode":
            raise ContextExceeded(f"conversation has {total} tokens, budget {budget}")
        head = next((n for n, t in enumerate(turns) if t.owner != "prompt"), len(turns))
        start, end = min(head + self.keep_first_turns, len(turns)), len(turns) - 1  # droppable: turns[start:end]
        dropped = 0
        while total > budget and end - (start + dropped) >= 2:
            total -= len(turns[start + dropped].token_ids) + len(turns[start + dropped + 1].token_ids)
            dropped += 2
        if total > budget:
            raise ContextExceeded(f"conversation has {total} tokens after dropping {dropped} turns, budget {budget}")
        return list(range(start, start + dropped))

    def learner_cut(self, turns: list[Turn], cut: list[int]) -> list[int]:
        """What the learner leaves out: `cut` (the last prompt's), and, only where the rest would
        not fit, the turns after the last reply (they predict nothing), last first."""
        left_out = set(cut)
        total = sum(len(t.token_ids) for n, t in enumerate(turns) if n not in left_out)
        last = max((n for n, t in enumerate(turns) if t.role == "assistant" and t.owner != "prompt"), default=-1)
        for n in range(len(turns) - 1, last, -1):
            if total <= self.tokens:
                break
            if n not in left_out:
                total -= len(turns[n].token_ids)
                left_out.add(n)
        return sorted(left_out)
