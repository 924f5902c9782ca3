"""Runs sharing a cache (`tiny_dir`, ~/.cache/rose_ray by default): two started at once build
the tiny models and warm the teacher once, and both go on with the one result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The smallest warm-up the config allows: 2 gold games of 2 actions, played now; 1 SFT step.
WARMUP = ["teacher_warmup.enabled=true", "teacher_warmup.gold_games=2", "teacher_warmup.max_turns=2",
          "teacher_warmup.epochs=1", "teacher_warmup.batch_episodes=2", "teacher_warmup.threads=1",
          "student_warmup.enabled=false"]


@pytest.mark.slow
def test_two_runs_warming_one_teacher_at_once_build_it_once(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    runs = [subprocess.Popen([sys.executable, "-m", "rose_ray.cli", "warmup", f"tiny_dir={cache}", *WARMUP],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for _ in range(2)]
    outs = [r.communicate(timeout=600)[0] for r in runs]
    for r, out in zip(runs, outs):
        assert r.returncode == 0, out[-3000:]
    both = "".join(outs)
    assert both.count("warming the teacher on 2 gold demonstrations") == 1, both[-3000:]
    teachers = {line.split()[-1] for out in outs for line in out.splitlines() if line.strip().startswith("teacher:")}
    assert len(teachers) == 1, teachers  # the same weights digest: one teacher, used by both
    left = sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))
    assert left == ["rose_ray_tiny.json", "student", "teacher", next(n for n in left if n.startswith("teacher_warm_"))]
