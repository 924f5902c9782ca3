"""The slow half of tests/unit/test_rehearse.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_rehearse import ROOT


@pytest.mark.slow
def test_the_seed_config_rehearsed_reaches_step_3(tmp_path):
    pytest.importorskip("vllm", reason="the rehearsal runs both engines on vLLM (launch/setup.sh installs it)")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(["bash", str(ROOT / "launch/rehearse.sh")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=1500)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "seen by all 2 nodes" in log
    where = [line for line in log.splitlines() if line.startswith("rehearse:   ")]
    assert any("teacher engine" in w and "GPU node" in w for w in where), where
    assert any("student engine" in w and "GPU node" in w for w in where), where
    assert sum("LearnerWorker" in w and "GPU node" in w for w in where) == 2, where  # learner.ranks: 2
    assert any("EnvPool" in w for w in where), where
    assert re.search(r"rehearse: step 3: .* weights v3 published", log), log[-4000:]
    assert "3 steps, policy version 3" in log
    # Both stand-ins downloaded by the driver from the rehearsal's hub into its empty cache, each
    # file once, before any actor started; the cache checked shared like the run's folders.
    assert re.search(r"train: HF_HOME \(the Hugging Face cache\) \S+: seen by all 2 nodes", log), log[-4000:]
    for role in ("student", "teacher"):
        assert re.search(rf"train: rose-ray-rehearsal/tiny-qwen3-{role}: downloading from http://127\.0\.0\.1:\d+", log)
    sent = re.search(r"rehearse: the hub sent (\d+) files \((\d+) distinct\)", log)
    assert sent and sent.group(1) == sent.group(2) and int(sent.group(1)) >= 12, log[-4000:]
    work = re.search(r"work dir (\S+)", log).group(1)
    metrics = next(Path(work, "runs").glob("*/version_*/metrics.jsonl")).read_text().splitlines()
    # the seed's dev curve (eval.every), scaled by configs/rehearse.overrides: before step 1 and after the last
    assert [r["step"] for r in map(json.loads, metrics) if "eval/dev_score" in r] == [0, 3], metrics
    left = subprocess.run(["pgrep", "-f", work], capture_output=True, text=True).stdout.split()
    assert not left, f"Ray processes of the rehearsal left running: {left}"
    shutil.rmtree(work)
