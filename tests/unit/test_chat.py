"""The chat format (rose_ray/chat.py): the token pieces an episode builds its prompts from (the
opening, each user turn, each reply's sampled ids closed by the end-of-turn id) add up to the
chat template's own rendering, turn by turn, for the plain tiny template and for Qwen3's
stand-in, whose template rewrites earlier turns. `chat.history=template`, its RenderCache and
the ids of `ChatFormat.encode` against the tokenizer's are checked with the Qwen3 stand-in in
test_qwen3.py."""

from __future__ import annotations

import pytest

from rose_ray.chat import ChatFormat
from rose_ray.envs.sciworld.protocol import PROTOCOL
from rose_ray.models import load_tokenizer
from tests.unit.test_qwen3 import ACK, INSTR, OBS, REPLY, msgs, render


def test_turn_by_turn_ids_equal_the_whole_template(tiny_models):
    fmt = ChatFormat(load_tokenizer(tiny_models["student"]))
    opening = PROTOCOL.opening()
    turns = [("user", "Your task is to boil water.\nThis room is called the hallway."),
             ("assistant", "Thought: go.\nAction: open door to kitchen"),
             ("user", "The door is now open.")]
    ids = fmt.opening_ids(opening) + fmt.user_ids(turns[0][1]) + fmt.assistant_ids(turns[1][1]) + fmt.user_ids(turns[2][1])
    whole = fmt.render_ids([{"role": r, "content": t} for r, t in opening + turns], add_generation_prompt=True)
    assert ids == whole
    sampled = fmt.encode("Action: look around")
    assert fmt.finish_sampled(sampled)[-1] == fmt.eos_id
    assert fmt.finish_sampled(sampled + [fmt.eos_id]) == sampled + [fmt.eos_id]


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_pieces_hold_for_a_template_that_rewrites_history(tiny_qwen3, thinking):
    tok = load_tokenizer(tiny_qwen3["student"])
    chat = ChatFormat(tok, enable_thinking=thinking)  # raised "rewrites earlier turns" before
    assert chat.rewrites_history
    opening = [("user", INSTR), ("assistant", ACK)]
    # The first prompt is exactly the template's.
    first = chat.opening_ids(opening) + chat.user_ids(OBS[0])
    conv = msgs(*opening, ("user", OBS[0]))
    assert first == chat.render_ids(conv, True)
    assert tok.decode(first) == render(tok, conv, True, enable_thinking=thinking)
    assert "<think>" not in tok.decode(chat.opening_ids(opening))  # the ack as history renders it
    # Each later prompt ends with the template's own rendering of its last user turn.
    sampled = tok(REPLY, add_special_tokens=False)["input_ids"]
    stream = first + chat.finish_sampled(sampled) + chat.user_ids(OBS[1])
    whole = render(tok, conv + msgs(("assistant", REPLY), ("user", OBS[1])), True, enable_thinking=thinking)
    tail = whole[whole.rindex("<|im_end|>\n<|im_start|>user") + len("<|im_end|>"):]
    assert tok.decode(stream).endswith(tail)
    # ... and holds the reply's ids exactly as sampled, right after the first prompt.
    assert stream[len(first):len(first) + len(sampled) + 1] == sampled + [chat.eos_id]
    assert tok.decode(chat.user_ids("x")).endswith(
        "<|im_start|>assistant\n" if thinking else "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_the_plain_template_is_not_a_rewriter(tiny_models):
    assert not ChatFormat(load_tokenizer(tiny_models["student"])).rewrites_history
