"""The slow half of tests/unit/test_evaluate.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rose_ray.evaluate import EvalCommand, run_eval
from tests.unit.test_evaluate import record


@pytest.mark.slow
def test_eval_of_the_tiny_student_resumes_and_writes_json_and_markdown(tiny_models, ray_cluster, tmp_path):
    """One eval of 10 games, interrupted after 2 (a partial file as a kill leaves it): the
    finished games are kept, not replayed, and the JSON and markdown cover all 10. (Resuming
    and writing were two evals; the resumed one's checks hold on this one.)"""
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.evaluate import resume_header

    cfg = EvalCommand(model=str(tiny_models["student"]), split="test", n=10, max_turns=2,
                     max_new_tokens=8, concurrency=5, context_tokens=2048, out=str(tmp_path / "ev"))
    games = SciWorldCatalogue().sample("test", 10, 0)
    partial = tmp_path / "ev.partial.jsonl"
    done = [dict(record(g.task, 100, turns=1), item_id=g.item_id, resumed=True) for g in games[:2]]
    # The header names the mapping resolved: the default and `--mapping agentgym` are one eval.
    header = resume_header(cfg)
    assert header["mapping"] == "agentgym" and header["world"] == "sciworld"
    assert cfg.mapping is None and header == resume_header(replace(cfg, mapping="agentgym"))
    lines = [json.dumps({"eval_config": header})]
    lines += [json.dumps(r) for r in done] + ['{"item_id": "sciworld_']  # a line cut by the kill
    partial.write_text("\n".join(lines) + "\n")
    result = run_eval(cfg)
    by_id = {g["item_id"]: g for g in result["games"]}
    assert set(by_id) == {g.item_id for g in games}
    assert all(by_id[g.item_id].get("resumed") for g in games[:2])  # kept, not replayed
    assert not any(by_id[g.item_id].get("resumed") for g in games[2:])
    # The 2 kept successes count (the untrained student succeeds at none): 2 of the 10 games.
    assert result["summary"]["overall"]["success"] >= 2 / 10

    data = json.loads((tmp_path / "ev.json").read_text())
    assert data["summary"] == result["summary"]
    assert data["summary"]["overall"]["games"] == 10 and len(data["games"]) == 10
    per_task = data["summary"]["per_task"]
    assert len(per_task) >= 5 and sum(b["games"] for b in per_task.values()) == 10
    assert all(0 < g["turns"] <= 2 for g in data["games"])
    md = (tmp_path / "ev.md").read_text()
    assert "| task |" in md and all(f"| {t} |" in md for t in per_task)
    assert not (tmp_path / "ev.partial.jsonl").exists()

    # A partial file from other settings is refused, not silently mixed in (the result written
    # above moved away: an existing result is refused first).
    (tmp_path / "ev.json").rename(tmp_path / "ev_done.json")
    partial.write_text(json.dumps({"eval_config": {"model": "other"}}) + "\n")
    with pytest.raises(ValueError, match="other settings"):
        run_eval(cfg)


@pytest.mark.slow
def test_eval_ends_an_episode_at_the_context_by_default(tiny_models, ray_cluster, tmp_path):
    """AgentGym's rule is the default of `rose-ray eval` (and collect, continue): a prompt that
    no longer fits ends the episode, recorded as end reason `context`; `--context-policy
    drop_oldest` plays on by dropping old turns. (The game fills 900 tokens at turn 4: 6 turns
    are enough to see drop_oldest play past it.)"""
    from rose_ray.cli import main

    base = ["eval", "--model", str(tiny_models["student"]), "--n", "1", "--max-turns", "6",
            "--max-new-tokens", "32", "--context-tokens", "900", "--concurrency", "1"]
    assert main([*base, "--out", str(tmp_path / "end")]) == 0
    [ended] = json.loads((tmp_path / "end.json").read_text())["games"]
    assert ended["end_reason"] == "context" and 0 < ended["turns"] < 6  # at turn 4 (greedy)
    assert main([*base, "--context-policy", "drop_oldest", "--out", str(tmp_path / "drop")]) == 0
    [dropped] = json.loads((tmp_path / "drop.json").read_text())["games"]
    assert dropped["item_id"] == ended["item_id"] and dropped["turns"] > ended["turns"]
    assert dropped["end_reason"] != "context"
