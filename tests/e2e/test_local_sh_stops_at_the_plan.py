"""The slow half of tests/unit/test_launch_files.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.unit.test_launch_files import ROOT


@pytest.mark.slow
def test_local_sh_stops_at_the_plan_when_this_machine_cannot_hold_the_run(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(["bash", str(ROOT / "launch/local.sh"), "configs/tiny.yaml", "resources.teacher_gpus=1",
                          f"run_dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "teacher engine" in out.stderr and "'GPU'" in out.stderr
    assert not (tmp_path / "run").exists(), "training must not start"
