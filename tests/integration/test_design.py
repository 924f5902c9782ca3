"""The half of tests/unit/test_design.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["rose_ray.envs.worlds", "rose_ray.envs.pool", "rose_ray.envs.catalogue"])
def test_an_env_worker_loads_without_torch(module):
    """At run time too: importing an env worker's modules and building a world's catalogue
    and game class pulls in no torch."""
    code = (f"import sys, {module}; from rose_ray.envs.worlds import get_world; "
            "w = get_world('sciworld'); w.catalogue(None); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("module", ["rose_ray.config", "rose_ray.cli"])
def test_the_config_and_the_cli_load_without_torch(module):
    """Reading a config (and starting the CLI, `--help`, a bad-key error) imports no torch: the
    learner's losses are imported where a step is taken."""
    code = (f"import sys, {module}; from rose_ray.config import load_config; load_config(None); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
