"""The context cut: which turns of a conversation an agent's prompt leaves out so that it fits
the agent's context (`prompt_budget`: what is left of it for the prompt). Decided in one place,
by the rollout (`Conversation.prompt_for`) and by offline SFT rows (`recipes/sft.row_cut`); the
engines get the ids that result and cut nothing.
"""

from __future__ import annotations

from rose_ray.inference.engine import CONTEXT_POLICIES
from rose_ray.types import Turn


class ContextExceeded(ValueError):
    """A conversation does not fit the context budget under the configured policy."""


def prompt_budget(context_tokens: int, max_new_tokens: int) -> int:
    """The prompt tokens an agent may send so that a full reply still fits its context."""
    return max(context_tokens - max_new_tokens, 0)


def droppable_from(turns: list[Turn], keep_first_turns: int = 1) -> int:
    """The first turn drop_oldest may drop: after the prompt turns and `keep_first_turns`."""
    head = 0
    while head < len(turns) and turns[head].owner == "prompt":
        head += 1
    return min(head + keep_first_turns, len(turns))


def context_cut(turns: list[Turn], max_tokens: int, policy: str, keep_first_turns: int = 1) -> list[int]:
    """The indices of the turns to leave out so that the rest's ids fit in `max_tokens`.

    Protected: the prompt turns (owner "prompt": instruction + acknowledgement), the first
    `keep_first_turns` turns after them, and the last turn (the observation being answered).
    drop_oldest leaves out the oldest unprotected turns two at a time (an action and the
    observation it caused), so user and assistant turns still alternate. Raises
    ContextExceeded when the policy is end_episode, or nothing more can be dropped.
    """
    if policy not in CONTEXT_POLICIES:
        raise ValueError(f"context_policy: must be one of {CONTEXT_POLICIES}, got {policy!r}")
    total = sum(len(t.token_ids) for t in turns)
    if total <= max_tokens:
        return []
    if policy == "end_episode":
        raise ContextExceeded(f"conversation has {total} tokens, budget {max_tokens}")
    start, end = droppable_from(turns, keep_first_turns), len(turns) - 1  # droppable: turns[start:end]
    dropped = 0
    while total > max_tokens and end - (start + dropped) >= 2:
        total -= len(turns[start + dropped].token_ids) + len(turns[start + dropped + 1].token_ids)
        dropped += 2
    if total > max_tokens:
        raise ContextExceeded(
            f"conversation has {total} tokens after dropping {dropped} turns, budget {max_tokens}"
        )
    return list(range(start, start + dropped))

