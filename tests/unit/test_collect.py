"""Gold demonstrations, student prefixes -> teacher continuations, and check-data. The slow
half (collect, continue and sft through the CLI) is tests/e2e/test_runs_on_qwen3_like_models.py's, on Qwen3-like models."""

from __future__ import annotations

import json

from rose_ray.cli import main


def test_malformed_lines_are_reported_by_number(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    good = {"item_id": "sciworld_0", "conversations": [{"from": "human", "value": "x"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n{not json}\n")
    assert main(["check-data", str(path), "--no-jvm"]) == 2
    assert "bad.jsonl:3" in capsys.readouterr().err
    path.write_text(json.dumps(good) + "\n" + json.dumps({"item_id": "sciworld_1", "conversations": [{"from": "robot", "value": "x"}]}) + "\n")
    assert main(["check-data", str(path), "--no-jvm"]) == 2
    assert "bad.jsonl:2: conversations[0].from" in capsys.readouterr().err
