"""The slow half of tests/unit/envs/test_knowledge.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from rose_ray.judge import (
    JudgeConfig,
    JudgeUnavailable,
    VerdictCache,
    check_judge,
    judge_records,
)
from tests.unit.envs.test_knowledge import CATALOGUE, CHEMISTRY, NAME

ARCHAEOLOGY = CATALOGUE.find("archaeology-dating-easy", 0)
PLANTS = CATALOGUE.find("plant-nutrients-easy", 0)


# --------------------------------------------------------------------------- judges
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_judge(tiny_models):
    """`rose-ray serve` of the tiny teacher on 127.0.0.1 (a judge whose verdicts are noise)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rose_ray.cli", "serve", str(tiny_models["teacher"]), "--port", str(port),
         "--served-model-name", NAME, "--threads", "1", "--dtype", "float32", "--context-tokens", "4096"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                break
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "rose-ray serve did not come up"
            time.sleep(0.5)
    yield proc, url
    proc.terminate()
    proc.wait(timeout=30)


def _hand_made(questions: list[str]) -> list[dict]:
    return [{"item_id": "discoveryworld_10", "task_description": "Find the rust remover.",
             "critical_questions": questions, "thoughts": "Thought 1: mixing chemical A and C removes the rust.\n",
             "report": "Mixing chemical A and chemical C removes the rust."},
            {"item_id": "discoveryworld_20", "task_description": "Find the rust remover.",
             "critical_questions": questions[:1], "thoughts": "", "report": "   "}]  # nothing written: not asked


@pytest.mark.slow
def test_eval_of_the_tiny_student_on_easy_games_with_a_served_judge_end_to_end(
        tiny_models, ray_cluster, served_judge, tmp_path):
    """Also the checks of a plain DiscoveryWorld eval (benchmark instances of three themes, in
    order, per task, in the markdown), which were an eval of their own: the judge only adds
    to what the same eval writes."""
    from rose_ray.evaluate import EvalCommand, resume_header, run_eval

    proc, url = served_judge
    easy = [CHEMISTRY.item_id, ARCHAEOLOGY.item_id, PLANTS.item_id]  # benchmark instances, three themes
    ids = tmp_path / "easy.json"
    ids.write_text(json.dumps(easy))
    # Sampled, so the untrained student writes something; the judge reads its thoughts (the
    # default) and no report question is asked.
    cfg = EvalCommand(model=str(tiny_models["student"]), world="discoveryworld", split=str(ids), n=0,
                     max_turns=2, max_new_tokens=16, temperature=1.0, seed=1, concurrency=2, context_tokens=2048,
                     out=str(tmp_path / "dw"), judge=f"openai:{url}", judge_model=NAME, judge_max_new_tokens=24)
    result = run_eval(cfg)
    games = result["games"]
    assert [g["item_id"] for g in games] == easy
    assert all(0 < g["turns"] <= 2 for g in games)
    assert set(result["summary"]["per_task"]) == {CATALOGUE.game(i).task for i in easy}
    for g in games:
        assert "report" not in g and isinstance(g["thoughts"], str) and g["critical_questions"]
        assert g["judge"] == f"openai:{url}@{NAME}" and g["knowledge_from"] == "thoughts"
        assert [v["question"] for v in g["verdicts"]] == g["critical_questions"]
        assert all(v["verdict"] in (0, 1) and not v["error"] for v in g["verdicts"])
        assert g["knowledge"] == pytest.approx(sum(v["verdict"] for v in g["verdicts"]) / len(g["verdicts"]))
    thought = [g for g in games if g["thoughts"]]
    assert thought and all(g["thoughts"].startswith("Thought 1: ") for g in thought)
    asked = [json.loads(line) for line in (tmp_path / "dw.verdicts.jsonl").read_text().splitlines()]
    assert sorted(r["question"] for r in asked) == sorted(q for g in thought for q in g["critical_questions"])
    o = result["summary"]["overall"]
    assert o["judged_questions"] == sum(len(g["critical_questions"]) for g in games)
    assert o["knowledge"] == pytest.approx(sum(g["knowledge"] for g in games) / len(games))
    assert o["knowledge_from"] == "thoughts"
    md = (tmp_path / "dw.md").read_text()
    assert "Easy Knowl." in md and "| Combinatorial Chemistry |" in md and "| Archaeology Dating |" in md
    assert "judged on the agent's thoughts" in md and md.count("-easy |") == 3
    # --knowledge-from report asks the report question at each episode's end (its own resume header).
    assert resume_header(replace(cfg, knowledge_from="report"))["report"] and not resume_header(cfg)["report"]

    # The same judge on hand-made records, from their thoughts and from their reports: every
    # question with something written is asked once, its answer parsed or counted as unparsed,
    # and cached; a second pass asks nothing, even with the server gone.
    questions = ["Does it clearly state that chemical A is needed?", "Does it clearly state the mixture?"]
    cache_path = tmp_path / "hand.verdicts.jsonl"
    judge = JudgeConfig(world="discoveryworld", model=f"openai:{url}", served_model=NAME, max_new_tokens=24)
    judged = {}
    for source in ("thoughts", "report"):
        records = _hand_made(questions)
        counts = judge_records(records, judge, VerdictCache(cache_path), source)
        assert counts == {**counts, "questions": 3, "asked": 2, "cached": 0, "errors": 0, "cut": 0}
        assert records[1]["knowledge"] == 0.0 and records[1]["verdicts"][0]["parsed"]
        assert counts["unparsed"] == sum(not v["parsed"] for v in records[0]["verdicts"])
        assert records[0]["knowledge_from"] == source
        judged[source] = records[0]["verdicts"]
    assert len(cache_path.read_text().splitlines()) == 4  # thoughts and report are other knowledge
    proc.terminate()
    proc.wait(timeout=30)
    again = _hand_made(questions)
    counts = judge_records(again, judge, VerdictCache(cache_path), "thoughts")
    assert counts["asked"] == 0 and counts["cached"] == 2
    assert again[0]["verdicts"] == judged["thoughts"]
    with pytest.raises(ValueError, match="knowledge from: must be one of"):
        judge_records(again, judge, VerdictCache(cache_path), "actions")
    # A judge that is not there: a clear error before any game is played.
    with pytest.raises(JudgeUnavailable, match="cannot reach"):
        check_judge(judge)
    with pytest.raises(JudgeUnavailable, match="cannot reach"):
        run_eval(EvalCommand(model=str(tiny_models["student"]), world="discoveryworld", split=str(ids), n=0,
                            max_turns=2, out=str(tmp_path / "gone"), judge=f"openai:{url}"))
    assert not list(tmp_path.glob("gone*"))


@pytest.mark.slow
def test_a_local_folder_judge(tiny_models, ray_cluster, tmp_path, capsys):
    from rose_ray.cli import main

    questions = ["Does it clearly state that chemical A is needed?"]
    records = _hand_made(questions)
    judge = check_judge(JudgeConfig(world="discoveryworld", model=str(tiny_models["teacher"]), max_new_tokens=24,
                                    concurrency=2, context_tokens=1 << 20))
    assert judge.context_tokens == 16384  # capped at the tiny model's positions
    counts = judge_records(records, judge, VerdictCache(tmp_path / "v.jsonl"))
    assert counts["questions"] == 2 and counts["asked"] == 1 and counts["errors"] == 0
    v = records[0]["verdicts"][0]
    assert v["verdict"] in (0, 1) and records[0]["knowledge"] == v["verdict"]
    assert counts["unparsed"] == int(not v["parsed"])
    row = json.loads((tmp_path / "v.jsonl").read_text())
    assert row["judge"] == judge.cache_name and row["question"] == questions[0]
    assert row["judge"].startswith(str(tiny_models["teacher"]))
    # Bad judges are clear errors (exit 2), never a traceback.
    with pytest.raises(JudgeUnavailable, match="no such model folder"):
        check_judge(JudgeConfig(world="discoveryworld", model=str(tmp_path / "nothing")))
    args = ["eval", "--model", str(tiny_models["student"]), "--out", str(tmp_path / "x")]
    assert main([*args, "--world", "discoveryworld", "--judge", str(tmp_path / "nothing")]) == 2
    assert "no such model folder" in capsys.readouterr().err
    assert main([*args, "--judge", str(tiny_models["teacher"])]) == 2  # ScienceWorld has no critical questions
    assert "sciworld has none" in capsys.readouterr().err
    assert main([*args, "--world", "discoveryworld", "--judge-model", "x"]) == 2
    with pytest.raises(SystemExit):  # argparse names the choices
        main([*args, "--world", "discoveryworld", "--knowledge-from", "actions"])
    assert "--knowledge-from: invalid choice: 'actions'" in capsys.readouterr().err
    assert not list(tmp_path.glob("x*"))
