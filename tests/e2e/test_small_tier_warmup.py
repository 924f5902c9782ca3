"""The slow half of tests/unit/provision/test_small_tier.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rose_ray.cli import main
from tests.unit.provision.test_small_tier import SMALL


@pytest.mark.slow
def test_rose_ray_warmup_builds_a_partly_trained_student_and_caches_it(tiny_dir, capsys, ray_cluster):
    """`rose-ray warmup`: the base student SFT'd on the tier's shipped observed demonstrations (one
    epoch here: epochs do not choose the rows; its own cache folder and record), the teacher
    untouched when its warm-up is off; a second call is cached."""
    from rose_ray.provision.warmup import DEMONSTRATIONS, weights_digest

    args = ["warmup", "--config", SMALL, f"tiny_dir={tiny_dir}", "teacher_warmup.enabled=false",
            "student_warmup.epochs=1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "warming the student on 64 gold demonstrations (shipped)" in out  # the same rows on every machine
    student = Path(out.split("student: ")[-1].split(" (weights")[0])
    assert student.parent == tiny_dir and student.name.startswith("student_warm_")
    info = json.loads((student / "rose_ray_warmup.json").read_text())
    assert info["student"] == str(tiny_dir / "student") and info["observe"] is True and info["max_turns"] == 3
    rows = [json.loads(line) for line in (student / DEMONSTRATIONS).read_text().splitlines()]
    assert len(rows) == 64 and all(1 <= r["rounds"] <= 3 for r in rows)
    assert weights_digest(student) != weights_digest(tiny_dir / "student")  # it trained
    assert f"teacher: {tiny_dir / 'teacher'} " in out
    stamp = student.stat().st_mtime_ns
    # cached: nothing trains again; --eval plays both on the config's eval games of dev
    assert main(["warmup", "--eval", "dev", *args[1:], "eval.n=2", "eval.max_turns=1"]) == 0
    out = capsys.readouterr().out
    assert "warming" not in out and student.stat().st_mtime_ns == stamp
    assert "2 games of 'dev', 1 turns, greedy" in out
    assert [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| student") or
            line.startswith("| teacher")] == ["| student", "| teacher"]
    result = json.loads((student.with_name(student.name + "_eval_dev.json")).read_text())
    assert result["config"]["context_policy"] == "drop_oldest" and len(result["games"]) == 2
