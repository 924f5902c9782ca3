"""`rose-ray check`: every shipped config passes; each kind of problem exits 2 naming its key.

The seed configs name Qwen/Qwen3-1.7B and Qwen/Qwen3-32B, which cannot be downloaded here: the
Qwen3-like tiny tokenizer stands in for both (`--tokenizer-for`), and the GPU cluster is
described with `--node` (no GPU exists here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_ray.cli import main

ROOT = Path(__file__).resolve().parents[2]
GPU_NODE = ["--node", "CPU=64,GPU=8,accelerator_type:H100=1"]  # 80 GB GPUs for the memory plan


def stand_ins(tiny_qwen3) -> list[str]:
    return ["--tokenizer-for", f"Qwen/Qwen3-1.7B={tiny_qwen3['student']}",
            "--tokenizer-for", f"Qwen/Qwen3-32B={tiny_qwen3['teacher']}"]


def test_thinking_on_leaves_the_prompt_open(tiny_qwen3, capsys):
    seed = str(ROOT / "configs/rose_qwen3_1p7b_32b.yaml")
    assert main(["check", seed, "chat.enable_thinking=true", *stand_ins(tiny_qwen3), *GPU_NODE]) == 0
    out = capsys.readouterr().out
    assert "thinking on" in out and "</think>" not in out


@pytest.mark.parametrize("extra, message", [
    ([], "student_engine.model: 'Qwen/Qwen3-1.7B' is not on this machine; pass --tokenizer-for"),
    (["eval.split=train"], "eval.split: 2162 of its games are also training games"),
    (["env.mapping=agentgym"], "eval.split: split 'agenteval_test' lists item ids of the 'agentgym_traj' mapping"),
    (["student_engine.context_tokens=600", "learner.max_tokens=600"], "student_engine.context_tokens: the instruction"),
    (["resources.teacher_gpus=9", "teacher_engine.backend.tensor_parallel_size=9"], "the cluster cannot hold the teacher engine"),
    (["resources.teacher_gpus=2"], "resources.teacher_gpus: 2, but teacher_engine.backend.tensor_parallel_size is 4"),
    (["learner.max_tokens=8192"], "learner.max_tokens: 8192 is less than student_engine.context_tokens 16384"),
])
def test_problems_exit_2_naming_the_key(tiny_qwen3, extra, message, capsys):
    seed = str(ROOT / "configs/rose_qwen3_1p7b_32b.yaml")
    args = [] if not extra else stand_ins(tiny_qwen3)
    assert main(["check", seed, *extra, *args, *GPU_NODE]) == 2
    assert message in capsys.readouterr().err


def test_overrides_may_follow_flags(tiny_qwen3, capsys):
    """KEY=VALUE after a flag is an override, as before it; anything else left over is an error."""
    seed = str(ROOT / "configs/rose_qwen3_1p7b_32b.yaml")
    assert main(["check", seed, *stand_ins(tiny_qwen3), *GPU_NODE, "learner.max_tokens=8192"]) == 2
    assert "learner.max_tokens: 8192 is less than" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["check", seed, *GPU_NODE, "learner.max_tokens=8192", "--no-such-flag"])
    assert exit_.value.code == 2 and "unrecognized arguments: learner.max_tokens=8192 --no-such-flag" in \
        capsys.readouterr().err


def test_opd_needs_one_tokenizer(tiny_qwen3, tiny_models, capsys):
    seed = str(ROOT / "configs/opd_qwen3_1p7b_32b.yaml")
    args = ["--tokenizer-for", f"Qwen/Qwen3-1.7B={tiny_qwen3['student']}",
            "--tokenizer-for", f"Qwen/Qwen3-32B={tiny_models['teacher']}"]  # the plain tiny tokenizer
    assert main(["check", seed, *args, *GPU_NODE]) == 2
    assert "algorithm: OPD needs the teacher to score the student's tokens" in capsys.readouterr().err
    assert main(["check", seed, "--tokenizer-for", "Qwen/Qwen3-1.7B", *GPU_NODE]) == 2
    assert "--tokenizer-for: expected MODEL=DIR" in capsys.readouterr().err


def test_without_nvidia_smi_check_says_there_is_no_gpu(capsys):
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    assert main(["check", "--backends"]) == 0
    assert "check: GPU: no NVIDIA GPU here (no nvidia-smi)" in capsys.readouterr().out


def test_the_driver_number_decides_when_nvidia_smi_shows_no_cuda_version():
    from rose_ray.nvidia import Driver, driver_problem

    old = Driver("535.183.01", "", ("NVIDIA A100-SXM4-80GB",))
    assert "needs driver >= 580" in driver_problem(old, "2.13.0", "13.0")
    assert driver_problem(old, "2.6.0", "12.4") is None
