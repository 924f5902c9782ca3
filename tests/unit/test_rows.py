"""JSONL datasets: schema validation with line numbers, atomic writes, rows to Turns."""

from __future__ import annotations

import json
import re

import pytest

from rose_ray.rows import (
    DataError,
    read_jsonl,
    row_to_trajectory,
    row_to_turns,
    validate_row,
    write_jsonl,
)

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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]  # no out, no temp file


# The dataset card's row, as its files hold it (role/content messages, success 0/1, no owners).
CARD_ROW = {
    "item_id": "sciworld_0", "task": "boil", "var": 0, "score": 0.0, "success": 0, "rounds": 2,
    "conversations": [
        {"role": "user", "content": "AgentGym's instruction."}, {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "Your task is to boil water."},
        {"role": "assistant", "content": "Thought: a.\nAction: look around"},
        {"role": "user", "content": "This room is called the kitchen."},
        {"role": "assistant", "content": "Thought: b.\nAction: go to hallway"},
    ],
}


def test_the_cards_rows_are_read_as_they_are(tmp_path):
    path = tmp_path / "card.jsonl"
    done = {**CARD_ROW, "item_id": "sciworld_1", "score": 1.0, "success": 1}
    path.write_text(json.dumps(CARD_ROW) + "\n" + json.dumps(done) + "\n")  # their bytes, not ours
    rows = read_jsonl(path)
    turns = row_to_turns(rows[0])
    assert [(t.role, t.owner) for t in turns] == [
        ("user", "prompt"), ("assistant", "prompt"), ("user", "env"),
        ("assistant", "teacher"), ("user", "env"), ("assistant", "teacher"),
    ]
    assert turns[3].text == "Thought: a.\nAction: look around"
    assert not row_to_trajectory(rows[0]).success and row_to_trajectory(rows[1]).success


@pytest.mark.parametrize(
    "bad, key",
    [
        ({**CARD_ROW, "success": 2}, "success"),
        ({**CARD_ROW, "score": 55}, "score"),
        ({**CARD_ROW, "conversations": [{"role": "system", "content": "x"}]}, "conversations[0].role"),
        ({**CARD_ROW, "conversations": [{"role": "user", "content": 3}]}, "conversations[0].content"),
        ({**CARD_ROW, "conversations": [CARD_ROW["conversations"][0], {"from": "gpt", "value": "OK"}]},
         "conversations[1]"),
        ({**CARD_ROW, "conversations": [{"speaker": "user"}]}, "conversations[0]"),
    ],
)
def test_card_rows_errors_name_line_and_key(tmp_path, bad, key):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(CARD_ROW) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=re.escape(f"d.jsonl:2: {key}:")):
        read_jsonl(path)


def test_trajectories_write_either_schema_and_read_back():
    from rose_ray.types import GameId, Trajectory, Turn

    turns = [Turn("user", "I", "prompt"), Turn("assistant", "A", "prompt"), Turn("user", "o1", "env"),
             Turn("assistant", "Thought: t", "student", truncated=True), Turn("user", "o2", "env"),
             Turn("assistant", "Action: wait", "teacher")]
    t = Trajectory(GameId("boil", 0, "sciworld_0"), turns, score=1.0, success=True, rounds=2)
    card, ag = t.to_record(), t.to_record("agentgym")
    assert card["success"] == 1 and type(card["success"]) is int and ag["success"] is True
    assert card["conversations"][3] == {"role": "assistant", "content": "Thought: t", "owner": "student",
                                        "truncated": True}
    assert "truncated" not in card["conversations"][5]
    assert ag["conversations"][3]["from"] == "gpt" and ag["conversations"][3]["loss"] is True
    for row in (card, ag):
        back = row_to_turns(validate_row(row))
        assert [(b.role, b.text, b.owner, b.truncated) for b in back] == \
               [(x.role, x.text, x.owner, x.truncated) for x in turns]
    with pytest.raises(ValueError, match="schema"):
        t.to_record("sharegpt")
    # A training step's record: each message says whether its tokens carried loss.
    flags = [False, False, False, False, False, True]  # rose with lambda = 0: teacher only
    card, ag = t.to_record(loss=flags), t.to_record("agentgym", loss=flags)
    assert [m["loss"] for m in card["conversations"]] == flags
    assert [m["loss"] for m in ag["conversations"]] == flags
    # Read back, an untrained reply is context: the run's own training is what SFT repeats.
    assert [b.owner for b in row_to_turns(validate_row(card))][3] == "prompt"
    with pytest.raises(ValueError, match="loss: 2 flags for 6 turns"):
        t.to_record(loss=[True, False])


@pytest.mark.parametrize("line, says", [
    (b'{"item_id": "sciworld_1", "task": "caf\xe9"}', "not UTF-8 text (byte 0xe9 at column 39)"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    (b'{"item_id": "sciworld_1", "var": ' + b"9" * 5000 + b"}", "unreadable JSON value"),
], ids=["latin-1", "deep", "huge-int"])
def test_unreadable_lines_are_data_errors_naming_the_line(tmp_path, line, says):
    """Bytes that are not UTF-8, JSON nested past Python's recursion limit, and an integer
    longer than Python converts: a DataError naming file and line, not a traceback."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + line + b"\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:2: {says}")):
        read_jsonl(path)


def test_gzipped_rows_read_as_plain_ones_and_a_bad_one_is_named(tmp_path):
    import gzip

    plain = tmp_path / "d.jsonl"
    write_jsonl(plain, [ROW, ROW])
    packed = tmp_path / "d.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_jsonl(packed) == read_jsonl(plain) == [ROW, ROW]
    packed.write_bytes(gzip.compress(plain.read_bytes() + b'{"item_id": 1}\n'))
    with pytest.raises(DataError, match=r"d\.jsonl\.gz:3: "):  # a bad row by its line, as in a plain file
        read_jsonl(packed)
    packed.write_bytes(gzip.compress(plain.read_bytes())[:-12])  # cut short
    with pytest.raises(DataError, match=r"d\.jsonl\.gz: not a readable gzip file"):
        read_jsonl(packed)
    packed.write_bytes(plain.read_bytes())  # not gzip at all
    with pytest.raises(DataError, match=r"d\.jsonl\.gz: not a readable gzip file"):
        read_jsonl(packed)


def test_a_bad_line_mid_partial_rows_costs_only_its_game(tmp_path, capsys):
    """`collect`/`continue`/`gold`'s OUT.partial with a line that cannot be read in the middle:
    the other finished rows are kept, the line is named and its game played again (before: the
    file was refused, "--overwrite to start over, or delete the file")."""
    from rose_ray.errors import InputError
    from rose_ray.rows import PartialRows

    out, job = tmp_path / "rows.jsonl", {"command": "collect", "games": 4}
    lines = [json.dumps({"partial_of": job}), json.dumps({"game": 0, "row": ROW}), '{"game": 1, "ro',
             json.dumps({"game": 2, "row": {"item_id": "x"}}), json.dumps({"game": "3", "row": ROW}),
             json.dumps({"game": 3, "row": ROW})]
    (tmp_path / "rows.jsonl.partial").write_text("\n".join(lines) + "\n")
    with PartialRows(out, job) as rows:
        assert sorted(rows.done) == [0, 3]
        rows.add(1, ROW)
    err = capsys.readouterr().err
    for n, problem in ((3, "not valid JSON"), (4, "conversations"), (5, "game: expected an integer")):
        assert f"rows.jsonl.partial:{n}: {problem}" in err
    again = PartialRows(out, job)
    assert sorted(again.done) == [0, 1, 3]
    (tmp_path / "rows.jsonl.partial").write_text("{cut\n" + "\n".join(lines[1:]) + "\n")
    with pytest.raises(InputError, match="partial:1: not valid JSON.*header cannot be read"):
        PartialRows(out, job)
    assert sorted(PartialRows(out, job, overwrite=True).done) == []  # asked to start over
