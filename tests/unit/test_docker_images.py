"""The shipped images install what the seed configs run: the GPU image the `vllm` extra that
launch/setup.sh installs on a GPU machine, with the torch vLLM pins, and its build ends by
asking `rose-ray check --backends` whether vLLM imports."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def arg(text: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S*)", text, re.M)
    assert match, f"no ARG {name}"
    return match.group(1)


def setup_extras() -> set[str]:
    """The extras launch/setup.sh installs besides dev: the vLLM builds it chooses between."""
    text = (ROOT / "launch/setup.sh").read_text()
    chosen = re.search(r"vllm_extra=\$\{ROSE_RAY_VLLM:-\$\((.*)\)\}", text)
    assert chosen, "setup.sh no longer chooses a vLLM extra as this test reads it"
    return set(re.findall(r"echo ([\w-]+)", chosen.group(1)))


def test_the_gpu_image_installs_the_extra_setup_installs_on_gpus():
    assert setup_extras() == {"vllm", "vllm-cpu"}
    text = (ROOT / "docker/gpu.Dockerfile").read_text()
    assert re.search(r'pip install "\.\[vllm\]"', text), "the GPU image must install the vllm extra"
    assert 'pip install --no-deps -e ".[vllm]"' in text
    assert "FLASH_ATTN_WHEEL" in text  # flash-attn where a matching wheel is given
    runs = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    last_run = max(i for i, line in enumerate(runs) if line.startswith("RUN"))
    assert any("rose-ray check --backends" in line for line in runs[last_run:]), "the build must end with the check"


def test_the_images_torch_is_the_one_vllm_pins():
    """vLLM 0.32 (CUDA and CPU builds alike) pins torch 2.13.0; the image and setup.sh install it."""
    pins = {}
    for dist in ("vllm", "vllm-cpu"):
        try:
            requires = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for r in requires:
            if m := re.match(r"torch==([\d.]+)", r):
                pins[dist] = m.group(1)
    wanted = next(iter(pins.values()), "2.13.0")  # the installed build's pin (0.32's, without one)
    assert arg((ROOT / "docker/gpu.Dockerfile").read_text(), "TORCH_VERSION") == wanted
    assert f"TORCH_VERSION:-{wanted}" in (ROOT / "launch/setup.sh").read_text()
