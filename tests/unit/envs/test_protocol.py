"""The AgentGym protocol: instruction, parsing and score normalisation."""

from __future__ import annotations

import json

import pytest

from rose_ray.envs.protocol import Protocol, parse_action
from rose_ray.envs.sciworld.protocol import (
    ACTIONS,
    INSTRUCTION,
    PROTOCOL,
    first_observation,
    is_success,
    location_of,
    normalise_score,
)


def test_instruction_lists_the_24_actions_and_the_format():
    assert len(ACTIONS) == 24
    for form in ("focus on OBJ", "wait1", "connect OBJ to OBJ", "use OBJ [on OBJ]", "inventory"):
        assert form in INSTRUCTION
    assert "Thought:" in INSTRUCTION and "Action:" in INSTRUCTION


@pytest.mark.parametrize(
    "text, action, ok",
    [
        ("Thought: go.\nAction: go to kitchen", "go to kitchen", True),
        ("Action: open door\nAction: look around\n", "look around", True),  # last marker wins
        ("Thought: hm\nAction:\n\n   pick up cup  \nmore", "pick up cup", True),
        ("Action: look at cup\n", "look at cup", True),
        ("I will open the door", "", False),
        ("Thought: ...\nAction:   \n  ", "", False),
        ("", "", False),
    ],
)
def test_parse_action(text, action, ok):
    parsed = parse_action(text)
    assert (parsed.action, parsed.valid_format) == (action, ok)


def test_scores():
    assert normalise_score(-100) == 0.0
    assert normalise_score(37) == 0.37
    assert normalise_score(100) == 1.0
    assert is_success(100) and not is_success(99)


def test_first_observation_is_task_newline_look():
    assert first_observation("Your task is X. ", "\nThis room is Y.") == "Your task is X.\nThis room is Y."


def test_the_sciworld_protocol_tells_where_the_agent_is_and_keeps_it_with_a_dataset_opening(tmp_path):
    obs = "This room is called the kitchen. In it, you see:\nYou move to the hallway."
    assert location_of(obs) == PROTOCOL.location_of(obs) == "hallway"
    assert PROTOCOL.location_of("You see a cup.") is None
    assert PROTOCOL.is_invalid("No known action matches that input.") and not PROTOCOL.is_invalid("Done.")
    row = {"conversations": [{"from": "human", "value": "OLD INSTR"}, {"from": "gpt", "value": "OK."}]}
    assert PROTOCOL.with_opening_of(row).location_of(obs) == "hallway"  # still ScienceWorld's
    assert Protocol("I", "A").location_of(obs) is None  # a world that does not say


def test_instruction_from_dataset(tmp_path):
    row = {"conversations": [{"from": "human", "value": "OLD INSTR"}, {"from": "gpt", "value": "OK."}]}
    path = tmp_path / "d.jsonl"
    path.write_text("\n" + json.dumps(row) + "\n")
    p = PROTOCOL.from_dataset(path)
    assert p.opening() == [("user", "OLD INSTR"), ("assistant", "OK.")]
    path.write_text('{"conversations": []}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:1"):
        PROTOCOL.from_dataset(path)
    # Rows no JSON reader takes: named by their line, never a traceback.
    from rose_ray.errors import InputError

    for raw, says in ((b"\n\xff\xfe{}\n", "d.jsonl:2: not UTF-8 text"), (b"[" * 100_000 + b"\n", "nested too deeply"),
                      (b'{"conversations": ' + b"9" * 5000 + b"}\n", "unreadable JSON value"),
                      (b'[{"from": "human"}]\n', "expected a JSON object")):
        path.write_bytes(raw)
        with pytest.raises(InputError, match=says):
            PROTOCOL.from_dataset(path)
