"""bench/table.py's fairness and outputs: every arm gets the same learner settings and the bench
seed, the SFT arm's teacher plays as the online arms' teacher does, and the figure is written."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from rose_ray.config import load_config

ROOT = Path(__file__).resolve().parents[2]


SMALL = str(ROOT / "configs" / "small.yaml")


def test_every_arm_gets_the_same_learner_settings_and_the_bench_seed(bench_table):
    table = bench_table
    common = ["learner.lr=3e-4", "learner.schedule=cosine", "learner.warmup_steps=2", "learner.weight_decay=0.1",
              "learner.grad_clip=0.5", "chat.history=template"]
    arms = ["sft", "rose_fixed", "rose_curriculum", "rose_decay"]  # opd refuses template history
    configs = {arm: load_config(SMALL, [*common, *table.arm_overrides(arm, 8, seed=2)]) for arm in arms}
    learners = {arm: asdict(cfg.learner) for arm, cfg in configs.items()}
    assert all(learner == learners["sft"] for learner in learners.values()), learners
    assert learners["sft"]["seed"] == 2 and configs["rose_fixed"].seed == 2
    assert (learners["sft"]["lr"], learners["sft"]["schedule"], learners["sft"]["total_steps"]) == (3e-4, "cosine", 8)
    # The SFT arm's learner gets every one of them (train_sft takes LearnerConfig fields) ...
    sft = table.learner_settings(configs["sft"])
    assert sft == {k: v for k, v in learners["rose_fixed"].items() if k != "model"}
    # ... and its teacher plays as the online arms' teacher: its engine's dtype, the run's history.
    cfg = load_config(SMALL, ["teacher_engine.dtype=bfloat16", "chat.history=template"])
    play = table.teacher_play(cfg, "teacher-folder", "student-folder")
    assert (play.student.dtype, play.history, play.student_sampling, play.teacher) == (
        "bfloat16", "template", cfg.rollout.teacher_sampling, None)
    assert play.student == replace(cfg.teacher_engine, model="teacher-folder")  # its engine, hf not `auto`
    assert list(play.engines()) == ["--model"] and play.student.backend.name == "hf"
    assert table.teacher_play(load_config(SMALL), "t", "s").history == "sampled"  # the small tier's
    # The expert as the teacher: it plays every turn in the student's tokenizer, from its engine.
    play = table.teacher_play(load_config(SMALL, ["teacher.kind=expert", "teacher_warmup.enabled=false"]), None, "s")
    assert (play.student.model, play.teacher, play.handoff.policy) == ("s", "expert", "teacher_only")
    assert list(play.engines()) == ["--model"]  # no teacher engine


def _run(score: float, seed: int) -> dict:
    games = [{"item_id": f"g{i}", "task": "t", "score": score * (i % 2), "success": 0.0, "pass": float(i % 2)}
             for i in range(4)]
    return {"games": games, "wall_s": 1.0, "trained_tokens": 100.0,
            "after": {"score": score / 2, "success": 0.0, "pass": 0.5, "invalid_action_rate": 0.25 + seed / 10,
                      "cut_before_action_rate": 0.1},
            "diagnostics": {"rollout/student_valid_rate": 0.5, "learner/trained_tokens_teacher": 40.0},
            "dev": [{"step": s, "score": score * s / 4} for s in (0, 2, 4)]}


def test_the_table_shows_play_rates_and_diagnostics_and_the_figure_is_a_png(bench_table, tmp_path):
    table = bench_table
    runs = {"student": [{k: v for k, v in _run(0.2, 0).items() if k not in ("diagnostics", "dev")}],
            "sft": [_run(0.3, s) for s in range(2)], "rose_fixed": [_run(0.1, s) for s in range(2)]}
    rows = table.table_rows(runs)
    sft = next(r for r in rows if r["arm"] == "sft")
    assert sft["invalid_action_rate"] == np.mean([0.25, 0.35]) and sft["cut_before_action_rate"] == 0.1
    assert sft["diagnostics"] == {"rollout/student_valid_rate": 0.5, "learner/trained_tokens_teacher": 40.0}
    text = table.markdown(rows, table.difference_rows(runs))
    assert "| invalid | cut |" in text and "| sft | 2 | 100 | 0.1500 [" in text and "| 0.30 | 0.10 |" in text
    diag = table.diagnostics_markdown(rows)
    assert "| sft | 0.50 | - | - | 40 |" in diag and "| student |" not in diag
    png = table.write_figure(rows, runs, tmp_path / "out" / "table.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # Without dev points (--dev-every 0, as the test tables run) no empty curves panel: 2 panels' width.
    plain = table.write_figure(rows, {arm: [{k: v for k, v in r.items() if k != "dev"} for r in rs]
                                      for arm, rs in runs.items()}, tmp_path / "out" / "plain.png")
    assert (png_width(png), png_width(plain)) == (1500, 1000)


def test_an_arm_set_reaches_that_arm_only(bench_table):
    import pytest

    own = bench_table.arm_sets(["sft:learner.lr=1e-3", "rose_fixed:learner.lr=3e-4", "sft:learner.warmup_steps=2"])
    assert own == {"sft": ["learner.lr=1e-3", "learner.warmup_steps=2"], "rose_fixed": ["learner.lr=3e-4"]}
    for bad in ("learner.lr=1", "teacher:learner.lr=1", "sft:learner.lr"):
        with pytest.raises(SystemExit, match="--arm-set"):
            bench_table.arm_sets([bad])


def test_stitched_play_is_summarised_against_the_teacher_alone():
    """bench/stitched.py's rows: the ratio and paired difference to teacher-only play, the shares
    of valid turns per owner, and the games the student's own turns ended."""
    import importlib.util
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))  # stitched.py imports table.py beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_stitched", bench / "stitched.py")
        stitched = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(stitched)
    finally:
        sys.path.remove(str(bench))

    def game(i, score, student_turns, student_valid, teacher_turns, teacher_valid):
        return {"item_id": f"g{i}", "score": score, "pass": float(score > 0), "student_turns": student_turns,
                "student_valid": student_valid, "teacher_turns": teacher_turns, "teacher_valid": teacher_valid}

    alone = [[game(i, s, 0, 0, 10, 5) for i, s in enumerate([0.4, 0.4, 0.0, 0.0])]]
    draws = [[game(0, 0.2, 2, 1, 8, 2), game(1, 0.2, 2, 0, 8, 2), game(2, 0.0, 2, 0, 0, 0), game(3, 0.0, 2, 1, 8, 4)]]
    row = stitched.summary("student K=2, then teacher", 1.0, draws, alone)
    assert row["score"][0] == 0.1 and row["ratio_to_teacher"] == 0.5
    assert row["score_minus_teacher"][0] == -0.1 and row["score_minus_teacher"][2] <= 0
    assert row["student_valid_rate"] == 2 / 8 and row["teacher_valid_rate"] == 8 / 24
    assert row["ended_before_handoff"] == 0.25
    text = stitched.markdown([stitched.summary("teacher only", None, alone, None), row])
    assert "| teacher only | - | 0.2000 [" in text and "| 0.50 | -0.1000 [" in text and text.endswith("| 0.25 | 0.33 | 0.25 |")


def png_width(path) -> int:
    """A PNG's width in pixels, from its header (IHDR, bytes 16-20)."""
    return int.from_bytes(path.read_bytes()[16:20], "big")
