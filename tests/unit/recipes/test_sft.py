"""Offline SFT through the CLI: the loss falls and the tiny model memorises actions."""

from __future__ import annotations

import json

from rose_ray.cli import main

INSTRUCTION = "You are an agent in a science world. Answer with Thought: and Action:."


EPISODES = [("You are in the kitchen. You see a stove.", "activate stove"),
            ("You are in the hallway. You see a door.", "open door to kitchen"),
            ("You are in the greenhouse. You see a pot.", "look at pot")]


def rows():
    return [{"item_id": f"sciworld_{i}", "task": "boil", "var": i, "conversations": [
        {"from": "human", "value": INSTRUCTION}, {"from": "gpt", "value": "OK", "loss": False},
        {"from": "human", "value": obs}, {"from": "gpt", "value": f"Thought: I act.\nAction: {act}"},
    ]} for i, (obs, act) in enumerate(EPISODES)]


def test_sft_bad_data_exits_2_naming_the_line(tmp_path, tiny_models, capsys):
    data = tmp_path / "bad.jsonl"
    good = json.dumps(rows()[0])
    data.write_text(good + "\n" + good.replace('"gpt"', '"robot"', 1) + "\n")
    code = main(["sft", "--data", str(data), "--model", str(tiny_models["student"]),
                 "--out", str(tmp_path / "o")])
    assert code == 2
    assert "bad.jsonl:2: conversations[1].from" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
