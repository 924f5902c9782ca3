"""The slow half of tests/unit/test_collect.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json

import pytest

from rose_ray.cli import main
from rose_ray.rows import read_jsonl, row_to_trajectory, write_jsonl


@pytest.mark.slow
def test_collect_then_continue_gives_sft_ready_data(tiny_models, ray_cluster, tmp_path):
    from rose_ray.chat import ChatFormat
    from rose_ray.models import load_tokenizer
    from rose_ray.tokens import OWNER_INDEX, render

    prefixes, stitched = tmp_path / "prefixes.jsonl", tmp_path / "stitched.jsonl"
    common = ["--max-new-tokens", "16", "--concurrency", "3", "--context-tokens", "2048"]
    assert main(["collect", "--model", str(tiny_models["student"]), "--turns", "2", "--split", "train",
                 "--n", "3", "--out", str(prefixes), *common]) == 0
    rows = read_jsonl(prefixes)
    assert len(rows) == 3
    for r in rows:
        owners = [m["owner"] for m in r["conversations"]]
        assert owners[:3] == ["prompt", "prompt", "env"] and owners.count("student") == r["rounds"] <= 2

    # Tamper with one recorded observation: that row must be reported and skipped.
    tampered = [json.loads(json.dumps(r)) for r in rows]
    tampered[0]["conversations"][2]["content"] += " (edited)"
    write_jsonl(tmp_path / "tampered.jsonl", tampered)
    assert main(["continue", "--teacher", str(tiny_models["teacher"]), "--in", str(tmp_path / "tampered.jsonl"),
                 "--max-turns", "4", "--out", str(stitched), *common]) == 0
    out = read_jsonl(stitched)
    assert {r["item_id"] for r in out} == {r["item_id"] for r in rows[1:]}

    tok = load_tokenizer(tiny_models["teacher"])
    fmt = ChatFormat(tok)
    for r in out:
        prefix = next(p for p in rows if p["item_id"] == r["item_id"])
        n = len(prefix["conversations"])
        assert r["conversations"][:n] == prefix["conversations"]  # the prefix is kept as recorded
        later = [m["owner"] for m in r["conversations"][n:] if m["role"] == "assistant"]
        assert later and set(later) == {"teacher"}
        assert r["rounds"] <= 4
        seq = render(row_to_trajectory(r), fmt)  # ready for SFT: teacher tokens to train on
        assert OWNER_INDEX["teacher"] in seq.owners and OWNER_INDEX["student"] in seq.owners
