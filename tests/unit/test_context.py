"""The context cut (rollout/context.py): which turns a prompt leaves out to fit a context."""

from __future__ import annotations

import pytest

from rose_ray.rollout.context import ContextExceeded, context_cut
from rose_ray.types import Turn


def _conversation(n_rounds: int, size: int = 10) -> list[Turn]:
    turns = [Turn("user", "instruction", "prompt", [1] * 30), Turn("assistant", "OK", "prompt", [])]
    for r in range(n_rounds):
        turns.append(Turn("user", f"obs{r}", "env", [2] * size))
        turns.append(Turn("assistant", f"act{r}", "student", [3] * size))
    turns.append(Turn("user", f"obs{n_rounds}", "env", [2] * size))
    return turns


def test_a_conversation_that_fits_is_not_cut():
    assert context_cut(_conversation(3), 1000, "drop_oldest") == []


def test_drop_oldest_leaves_out_the_oldest_pairs_after_the_first_observation():
    turns = _conversation(4)  # 30 + 9 turns of 10 = 120 tokens
    cut = context_cut(turns, 95, "drop_oldest")
    assert cut == [3, 4, 5, 6]  # two (action, observation) pairs: 120 -> 80
    kept = [t for n, t in enumerate(turns) if n not in cut]
    assert [t.text for t in kept] == ["instruction", "OK", "obs0", "act2", "obs3", "act3", "obs4"]
    assert sum(len(t.token_ids) for t in kept) <= 95
    assert [t.role for t in kept[2:]] == ["user", "assistant"] * 2 + ["user"]  # still alternating
    assert context_cut(turns, 95, "drop_oldest", keep_first_turns=0) == [2, 3, 4, 5]


def test_end_episode_and_impossible_budgets():
    turns = _conversation(4)
    with pytest.raises(ContextExceeded):
        context_cut(turns, 95, "end_episode")
    with pytest.raises(ContextExceeded):  # prompt + first + last observation alone are 50
        context_cut(turns, 45, "drop_oldest")
    with pytest.raises(ValueError, match="context_policy"):
        context_cut(turns, 95, "truncate")
