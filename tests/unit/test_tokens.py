"""Trajectories to tokens (rose_ray/tokens.py): ids exactly as the engine/template saw them,
owners, the recipes' token weights, the rollout's cut, packing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rose_ray.chat import ChatFormat
from rose_ray.config import load_config
from rose_ray.learner.batching import first_fit, micro_batches
from rose_ray.recipes.sft import row_cut
from rose_ray.rollout.context import ContextSettings
from rose_ray.rows import row_to_trajectory
from rose_ray.tokens import TokenWeights, loss_turns, make_batch, render
from rose_ray.types import OWNERS, GameId, Trajectory, Turn

EOS = 99


def weights_of(algorithm: str, *overrides: str) -> TokenWeights:
    """The token weights of a recipe, under the tiny default config with these overrides."""
    return load_config(None, [f"algorithm={algorithm}", *overrides]).algorithm.token_weights()


def term(batch, name: str) -> np.ndarray:
    """A loss term's per-token weights (zeros where the recipe names no such term)."""
    return batch.weights.get(name, np.zeros_like(batch.input_ids, dtype=np.float32))


def trained(batch) -> np.ndarray:
    return (term(batch, "ce")[0] > 0) | (term(batch, "opd")[0] > 0)


def hand_trajectory() -> Trajectory:
    """Token-mode trajectory: opening on turn 0, empty acknowledgement, student then teacher."""
    turns = [
        Turn("user", "instr", "prompt", [1, 2, 3]),
        Turn("assistant", "OK", "prompt", []),
        Turn("user", "obs1", "env", [4, 5]),
        Turn("assistant", "act1", "student", [6, 7, EOS], logprobs=[-0.1, -0.2], policy_version=3),
        Turn("user", "obs2", "env", [8]),
        Turn("assistant", "act2", "teacher", [9, 10, EOS]),
    ]
    return Trajectory(GameId("t", 0, "sciworld_0"), turns)


def test_tokens_in_tokens_out():
    traj = hand_trajectory()
    traj.turns[3].teacher_logprobs = [-1.0, -2.0]  # scored: the sampled ids; the appended eos is NaN
    seq = render(traj)
    assert seq.input_ids == [1, 2, 3, 4, 5, 6, 7, EOS, 8, 9, 10, EOS]
    names = [OWNERS[o] for o in seq.owners]
    assert names == ["prompt"] * 3 + ["env"] * 2 + ["student"] * 3 + ["env"] + ["teacher"] * 3
    # the appended eos of the student turn was not sampled: no old logprob, no version
    assert seq.old_logprobs[5:7] == [-0.1, -0.2] and math.isnan(seq.old_logprobs[7])
    assert seq.versions == [-1] * 5 + [3, 3, -1] + [-1] * 4
    assert seq.teacher_logprobs[5:7] == [-1.0, -2.0] and math.isnan(seq.teacher_logprobs[7])


@pytest.mark.parametrize("algo", ["rose", "opd", "teacher_sft"])
def test_the_end_of_turn_appended_to_a_cut_reply_carries_no_loss(algo):
    """A reply cut at max_new_tokens: its sampled ids train, the closing id it never produced does not."""
    traj = hand_trajectory()
    for t in traj.turns[3], traj.turns[5]:
        t.truncated = True
    traj.turns[3].teacher_logprobs = [-1.0, -2.0, -3.0]
    seq = render(traj)
    weights = weights_of(algo)
    flags = trained(make_batch([seq], weights, max_tokens=64))
    trained_turn = [5, 6, 7] if algo == "opd" else [9, 10, 11]
    assert [bool(flags[i]) for i in trained_turn] == [True, True, False]
    traj.turns[5].truncated = traj.turns[3].truncated = False  # finished replies: their eos trains
    flags = trained(make_batch([render(traj)], weights, max_tokens=64))
    assert all(flags[i] for i in trained_turn)


@pytest.mark.parametrize("algo, overrides, ce, opd", [
    ("rose", [], {"teacher"}, set()), ("rose", ["algorithm.lam=0.5"], {"teacher"}, {"student"}),
    ("opd", [], set(), {"student"}), ("teacher_sft", [], {"student", "teacher"}, set()),
])
def test_each_recipe_decides_which_tokens_train_in_which_term(algo, overrides, ce, opd):
    seq = render(hand_trajectory())
    batch = make_batch([seq], weights_of(algo, *overrides), max_tokens=64)
    owners = [OWNERS[o] for o in seq.owners]
    assert {o for o, w in zip(owners, term(batch, "ce")[0]) if w > 0} == ce
    assert {o for o, w in zip(owners, term(batch, "opd")[0]) if w > 0} == opd
    assert int((term(batch, "opd")[0] > 0).sum()) == sum(o in opd for o in owners[1:])
    if overrides:  # rose's λ is the weight of the student's tokens in the OPD term
        assert set(term(batch, "opd")[0][term(batch, "opd")[0] > 0].tolist()) == {0.5}


def test_text_rows_render_like_the_chat_template(tiny_models):
    from rose_ray.models import load_tokenizer

    tok = load_tokenizer(tiny_models["student"])
    fmt = ChatFormat(tok)
    row = {"item_id": "sciworld_1", "conversations": [
        {"from": "human", "value": "You are an agent."}, {"from": "gpt", "value": "OK", "loss": False},
        {"from": "human", "value": "You see a door."}, {"from": "gpt", "value": "Action: open door"},
        {"from": "human", "value": "Opened."}, {"from": "gpt", "value": "Action: go to hall"},
    ]}
    seq = render(row_to_trajectory(row), fmt)
    messages = [{"role": "user" if m["from"] == "human" else "assistant", "content": m["value"]}
                for m in row["conversations"]]
    full = fmt.render_ids(messages, add_generation_prompt=False)
    assert seq.input_ids == full[: len(seq.input_ids)]  # equal up to the final separator
    separator = fmt.user_prefix[: len(fmt.user_prefix) - len(fmt.user_prefix.lstrip())]  # "\n"
    assert len(full) - len(seq.input_ids) == len(fmt.encode(separator))
    trained = [i for i, o in zip(seq.input_ids, seq.owners) if OWNERS[o] == "teacher"]
    assert tok.decode(trained) == "Action: open door<|im_end|>Action: go to hall<|im_end|>"


def test_a_trajectory_is_cut_where_the_rollout_cut_it():
    traj = hand_trajectory()
    traj.turns += [Turn("user", "obs3", "env", [11, 12]), Turn("assistant", "act3", "teacher", [13, EOS]),
                   Turn("user", "final observation", "env", [14, 15])]
    full = render(traj)
    assert full.input_ids == [1, 2, 3, 4, 5, 6, 7, EOS, 8, 9, 10, EOS, 11, 12, 13, EOS, 14, 15]

    def row(context: int, cut: list[int] = ()):
        """The learner's row of this episode ended in a `context`-token student context, its last
        prompt cut at `cut` (the rollout's one recorded decision: `ContextSettings.learner_cut`)."""
        traj.context_cut = ContextSettings(context).learner_cut(traj.turns, list(cut))
        return render(traj)

    # The final observation predicts nothing: it goes only when the rest would not fit.
    assert row(18).input_ids == full.input_ids
    assert row(16).input_ids == full.input_ids[:16] and traj.context_cut == [8]
    cut = row(16, [3, 4])  # the engine's last prompt left out the oldest action + observation
    assert cut.dropped_turns == 2
    assert cut.input_ids == [1, 2, 3, 4, 5, 9, 10, EOS, 11, 12, 13, EOS, 14, 15]
    assert [i for i, _ in cut.turn_spans] == [0, 1, 2, 5, 6, 7, 8]
    # Replies are never dropped to fit: what is too long for a row stays too long (make_batch says so).
    with pytest.raises(ValueError, match="learner.max_tokens must hold the engine's whole context"):
        make_batch([row(8, [3, 4])], weights_of("rose"), max_tokens=8)


def test_offline_rows_are_cut_as_an_engine_would():
    """No engine played a dataset row: `sft` cuts it with drop_oldest, else keeps a prefix."""
    turns = hand_trajectory().turns + [
        Turn("user", "obs3", "env", [11, 12]), Turn("assistant", "act3", "teacher", [13, EOS])]
    full = sum(len(t.token_ids) for t in turns)
    assert row_cut(turns, full) == []
    assert row_cut(turns, full - 2) == [3, 4]  # the oldest action + observation
    assert row_cut(turns, 8) == [3, 4, 5, 6]  # every droppable pair
    # Dropping cannot make it fit (a long last reply): the longest prefix of whole turns.
    turns[-1].token_ids = list(range(20, 30))
    assert row_cut(turns, 9) == [5, 6, 7]
    with pytest.raises(ValueError, match="max_tokens=4"):
        row_cut(turns, 4)  # not even the first reply fits


@pytest.mark.parametrize("algo, overrides, trained_owners", [
    ("rose", [], {"teacher"}), ("rose", ["algorithm.lam=0.5"], {"student", "teacher"}), ("opd", [], {"student"}),
    ("teacher_sft", ["algorithm.owners=[env,teacher]"], {"env", "teacher"}),
])
def test_loss_turns_say_which_turns_make_batch_trains(algo, overrides, trained_owners):
    """The per-turn flags of trajectories.jsonl agree with make_batch's weights, token by token."""
    turns = hand_trajectory().turns + [
        Turn("user", "obs3", "env", [11, 12]), Turn("assistant", "act3", "teacher", [13, EOS]),
        Turn("user", "obs4", "env", [14]),
        Turn("assistant", "cut", "student", [EOS], truncated=True),  # only the appended end-of-turn
    ]
    for t in turns:
        if t.owner == "student":
            t.teacher_logprobs = [-1.0] * len(t.token_ids)
    weights = weights_of(algo, *overrides)
    full = render(turns)
    cut = render(turns, cut=[3, 4])  # as an engine that dropped the oldest action + observation
    for seq, gone in ((full, set()), (cut, {3, 4})):
        flags = loss_turns(seq, len(turns), weights)
        batch = make_batch([seq], weights, max_tokens=64)
        at = 0
        for i, n in seq.turn_spans:
            assert flags[i] == bool(trained(batch)[at : at + n].any()), (i, turns[i])
            at += n
        assert {i for i in gone if flags[i]} == set()
        expected = {i for i, t in enumerate(turns) if t.owner in trained_owners and t.token_ids
                    and i not in gone and not (t.truncated and len(t.token_ids) == 1)}
        assert {i for i, f in enumerate(flags) if f} == expected


def test_packing_masks_attention_between_sequences(tiny_models):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["student"], dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    seqs = [render([Turn("user", "", "env", rng.integers(5, 500, n).tolist())]) for n in (9, 6, 5, 12)]
    rows = first_fit([len(s) for s in seqs], 16)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3] and len(rows) == 3
    assert all(sum(len(seqs[i]) for i in r) <= 16 for r in rows)
    batch = make_batch(seqs, TokenWeights(ce={"env": 1.0}), max_tokens=16)
    assert batch.input_ids.shape[1] <= 16 and batch.num_sequences == 4
    ((part,),) = micro_batches(batch, 1, 64)  # every row in one padding-free micro-batch
    # (no cache: transformers then derives the block-diagonal mask from the position ids)
    with torch.no_grad():
        packed = model(input_ids=torch.from_numpy(part["input_ids"]),
                       position_ids=torch.from_numpy(part["position_ids"]), use_cache=False).logits[0]
        for s in seqs:  # find each sequence in the packed row and compare its logits
            ids = torch.tensor([s.input_ids])
            alone = model(input_ids=ids).logits[0]
            c = next(c for c in part["cu_seq_lens"][:-1] if part["input_ids"][0, c:c + len(s)].tolist() == s.input_ids)
            torch.testing.assert_close(packed[c:c + len(s)], alone, atol=1e-4, rtol=1e-4)
