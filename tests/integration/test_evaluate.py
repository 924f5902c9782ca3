"""The half of tests/unit/test_evaluate.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations


def test_sciworld_results_are_summarised_without_discoveryworlds_paper_tables(tmp_path):
    """The paper tables are DiscoveryWorld's: summarising, writing and comparing other worlds'
    results never loads that world (a fresh interpreter: other tests here may have loaded it)."""
    import subprocess
    import sys

    code = f"""
import json, sys
from tests.unit.test_evaluate import record
from rose_ray.evaluate import compare, markdown, summarise
s = summarise([record("boil", 50), record("melt", 100)])
assert "paper" not in s, s
markdown(s, "t")
open({str(tmp_path / "a.json")!r}, "w").write(json.dumps({{"summary": s}}))
assert "| 2 |" in compare([{str(tmp_path / "a.json")!r}])
loaded = sorted(m for m in sys.modules if m.startswith("rose_ray.envs.discoveryworld"))
assert not loaded, loaded
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
