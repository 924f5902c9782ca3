"""JSONL datasets: schema validation with line numbers, atomic writes, rows to Turns."""

from __future__ import annotations

import json
import re

import pytest

from rose_ray.data import DataError, read_jsonl, row_to_trajectory, row_to_turns, write_jsonl

ROW = {
    "item_id": "sciworld_7", "task": "boil", "var": 3, "score": 1.0, "success": True, "rounds": 2,
    "conversations": [
        {"from": "human", "loss": None, "value": "You are an agent."},
        {"from": "gpt", "loss": False, "value": "OK"},
        {"from": "human", "value": "You see a door."},
        {"from": "gpt", "loss": True, "value": "Thought: go.\nAction: open door"},
        {"from": "human", "value": "The door is open."},
        {"from": "gpt", "value": "Action: go to kitchen", "owner": "student"},
    ],
}


def test_roundtrip_and_owners(tmp_path):
    path = tmp_path / "d.jsonl"
    assert write_jsonl(path, [ROW, ROW]) == 2
    rows = read_jsonl(path)
    assert rows == [ROW, ROW]
    turns = row_to_turns(rows[0])
    assert [(t.role, t.owner) for t in turns] == [
        ("user", "prompt"), ("assistant", "prompt"), ("user", "env"),
        ("assistant", "teacher"), ("user", "env"), ("assistant", "student"),
    ]
    traj = row_to_trajectory(rows[0])
    assert (traj.game.item_id, traj.game.task, traj.game.variation) == ("sciworld_7", "boil", 3)
    assert traj.success and traj.rounds == 2


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"conversations": ROW["conversations"]}, "item_id"),
        ({**ROW, "var": "3"}, "var"),
        ({**ROW, "conversations": []}, "conversations"),
        ({**ROW, "conversations": [{"from": "bot", "value": "x"}]}, "conversations[0].from"),
        ({**ROW, "conversations": [{"from": "gpt", "value": "x", "owner": "judge"}]}, "conversations[0].owner"),
        ({**ROW, "conversations": [{"from": "gpt", "value": "x", "loss": "yes"}]}, "conversations[0].loss"),
    ],
)
def test_errors_name_line_and_key(tmp_path, bad, key):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=re.escape(f"d.jsonl:3: {key}:")):
        read_jsonl(path)


def test_bad_json_and_failed_write_leave_nothing(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"item_id": "a",\n')
    with pytest.raises(DataError, match=r"d\.jsonl:1: not valid JSON"):
        read_jsonl(path)
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataError, match="row 2: conversations"):
        write_jsonl(out, [ROW, {"item_id": "x"}])
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
