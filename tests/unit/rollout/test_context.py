"""An agent's context (rollout/context.py: `ContextSettings`): which turns a prompt leaves out
to fit it (`cut`), and which a finished conversation's learner row leaves out (`learner_cut`)."""

from __future__ import annotations

import pytest

from rose_ray.inference.engine import EngineConfig
from rose_ray.rollout.context import ContextExceeded, ContextSettings
from rose_ray.types import Turn


def _conversation(n_rounds: int, size: int = 10) -> list[Turn]:
    turns = [Turn("user", "instruction", "prompt", [1] * 30), Turn("assistant", "OK", "prompt", [])]
    for r in range(n_rounds):
        turns.append(Turn("user", f"obs{r}", "env", [2] * size))
        turns.append(Turn("assistant", f"act{r}", "student", [3] * size))
    turns.append(Turn("user", f"obs{n_rounds}", "env", [2] * size))
    return turns


def test_a_conversation_that_fits_is_not_cut():
    assert ContextSettings(1000).cut(_conversation(3)) == []


def test_drop_oldest_leaves_out_the_oldest_pairs_after_the_first_observation():
    turns = _conversation(4)  # 30 + 9 turns of 10 = 120 tokens
    cut = ContextSettings(95, "drop_oldest").cut(turns)
    assert cut == [3, 4, 5, 6]  # two (action, observation) pairs: 120 -> 80
    kept = [t for n, t in enumerate(turns) if n not in cut]
    assert [t.text for t in kept] == ["instruction", "OK", "obs0", "act2", "obs3", "act3", "obs4"]
    assert sum(len(t.token_ids) for t in kept) <= 95
    assert [t.role for t in kept[2:]] == ["user", "assistant"] * 2 + ["user"]  # still alternating
    assert ContextSettings(95, "drop_oldest", keep_first_turns=0).cut(turns) == [2, 3, 4, 5]
    # A prompt leaves room for the reply: the budget is the context less max_new_tokens.
    assert ContextSettings(95 + 16).cut(turns, max_new_tokens=16) == cut
    assert ContextSettings(120 + 16).cut(turns, max_new_tokens=16) == []
    assert ContextSettings(120 + 16).cut(turns, max_new_tokens=17) == [3, 4]


def test_end_episode_and_impossible_budgets():
    turns = _conversation(4)
    with pytest.raises(ContextExceeded):
        ContextSettings(95, "end_episode").cut(turns)
    with pytest.raises(ContextExceeded):  # prompt + first + last observation alone are 50
        ContextSettings(45, "drop_oldest").cut(turns)
    with pytest.raises(ValueError, match="context_policy"):
        ContextSettings(95, "truncate")


def test_an_agents_context_is_its_engines():
    engine = EngineConfig(model="m", context_tokens=4096, context_policy="end_episode", keep_first_turns=2)
    assert ContextSettings.of(engine) == ContextSettings(4096, "end_episode", 2)
    assert ContextSettings.of(EngineConfig(model="m")) == ContextSettings()
    assert ContextSettings(4096).budget(512) == 3584 and ContextSettings(256).budget(512) == 0


def test_the_learners_row_leaves_out_the_last_prompts_cut_and_what_follows_the_last_reply_only_to_fit():
    turns = _conversation(4) + [Turn("assistant", "act4", "student", [3] * 10), Turn("user", "obs5", "env", [2] * 10)]
    whole = sum(len(t.token_ids) for t in turns)  # 140
    assert ContextSettings(whole).learner_cut(turns, []) == []
    assert ContextSettings(whole).learner_cut(turns, [3, 4]) == [3, 4]
    assert ContextSettings(whole - 1).learner_cut(turns, []) == [12]  # the last observation goes
    assert ContextSettings(whole - 20).learner_cut(turns, [3, 4]) == [3, 4]  # the cut made room for it
    assert ContextSettings(whole - 20).learner_cut(turns, [3]) == [3, 12]
    # Replies are never left out to fit: what is still too long stays so (the learner's pack says so).
    assert ContextSettings(10).learner_cut(turns, [3, 4]) == [3, 4, 12]
