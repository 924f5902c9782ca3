"""The half of tests/unit/test_collect.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import pytest

from rose_ray.cli import main
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.game import SciWorldGame
from rose_ray.provision.gold import gold_rows
from rose_ray.rows import write_jsonl

CAT = SciWorldCatalogue("agentgym")


@pytest.fixture(scope="module")
def gold():
    # Two early games and one past id 1096, where the two mappings differ.
    games = [CAT.find("find-living-thing", 3), CAT.find("lifespan-longest-lived", 2), CAT.find("boil", 2)]
    rows, problems = gold_rows(games, workers=2, progress=False)
    assert not problems
    return rows


def test_gold_dataset_replays_to_100(gold):
    assert all(r["success"] and r["score"] == 1.0 for r in gold)
    with SciWorldGame() as game:
        for row in gold:
            first = game.load(CAT.game(row["item_id"]))
            assert first.observation == row["conversations"][2]["content"]
            actions = [parse_action(m["content"]) for m in row["conversations"][3:] if m["role"] == "assistant"]
            assert all(a.valid_format for a in actions)
            for a in actions:
                result = game.step(a.action)
            assert result.raw_score == 100, row["item_id"]


def test_check_data_tells_the_mapping(gold, tmp_path, capsys):
    late = [r for r in gold if int(r["item_id"].split("_")[1]) >= 1096]
    assert late
    path = tmp_path / "agentgym.jsonl"
    write_jsonl(path, gold)
    assert main(["check-data", str(path), "--sample", "3"]) == 0
    assert "follow the 'agentgym' mapping" in capsys.readouterr().out
    # The same rows written under the other mapping (ids from 1096 on shift down by 300).
    traj = SciWorldCatalogue("agentgym_traj")
    moved = [dict(r, item_id=traj.find(r["task"], r["var"]).item_id) for r in late]
    other = tmp_path / "traj.jsonl"
    write_jsonl(other, moved)
    assert main(["check-data", str(other), "--sample", "3", "--mapping", "agentgym"]) == 1
    out = capsys.readouterr()
    assert "follow the 'agentgym_traj' mapping" in out.out and "expected the 'agentgym'" in out.err
