"""The NVIDIA driver against the CUDA the installed torch (and vLLM) was built for: `rose-ray
check` refuses a GPU node whose driver cannot run the wheels, where a run would otherwise fall
back to the CPU without a word."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from rose_ray.errors import InputError

# The oldest Linux driver that runs each CUDA major (NVIDIA's CUDA Toolkit release notes).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


@dataclass(frozen=True)
class Driver:
    version: str  # "580.65.06"
    cuda: str  # the newest CUDA it runs, from nvidia-smi's header ("13.0"); "" when not shown
    gpus: tuple[str, ...]  # one name per GPU


def _major(version: str) -> int:
    return int(re.match(r"\d+", version).group(0))


def driver_problem(driver: Driver, torch_version: str, wheel_cuda: str | None) -> str | None:
    """Why this driver cannot run torch `torch_version` built for CUDA `wheel_cuda` (None: a CPU
    build), or None when it can."""
    if wheel_cuda is None:
        return (f"torch {torch_version} is a CPU build, on a node with {len(driver.gpus)} NVIDIA GPU(s): "
                "the learner and engines would run on the CPU; install the CUDA set (bash launch/setup.sh, "
                "or pip install -c launch/constraints-cuda13.txt -e '.[vllm]')")
    need = MIN_DRIVER.get(_major(wheel_cuda))
    too_old = _major(driver.cuda) < _major(wheel_cuda) if driver.cuda else \
        need is not None and _major(driver.version) < need
    if not too_old:
        return None
    runs = f" (it runs CUDA {driver.cuda} at most)" if driver.cuda else ""
    return (f"NVIDIA driver {driver.version}{runs} cannot run torch {torch_version}, built for CUDA {wheel_cuda}"
            + (f", which needs driver >= {need}" if need else "") + ": torch would find no GPU and the run "
            f"would train on the CPU. Upgrade the node's driver{f' to >= {need}' if need else ''}, or install "
            f"wheels built for CUDA {driver.cuda or 'the driver runs'} (not a set this project has tested)")


def gpu_report() -> list[str]:
    """The driver, the GPUs and the wheels' CUDA (from nvidia-smi); an InputError when torch
    cannot use the GPUs."""
    import torch

    wheels = f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'})"
    if (exe := shutil.which("nvidia-smi")) is None:
        return [f"GPU: no NVIDIA GPU here (no nvidia-smi); {wheels}"]
    try:
        header = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        query = subprocess.run([exe, "--query-gpu=driver_version,name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"GPU: no usable NVIDIA GPU here ({exe} failed: {e}); {wheels}"]
    if query.returncode != 0 or not query.stdout.strip():
        failed = (query.stderr or query.stdout or header.stdout).strip()[:300]
        return [f"GPU: no usable NVIDIA GPU here ({exe} failed: {failed}); {wheels}"]
    rows = [[cell.strip() for cell in line.split(",", 1)] for line in query.stdout.strip().splitlines()]
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", header.stdout)
    driver = Driver(version=rows[0][0], cuda=cuda.group(1) if cuda else "",
                    gpus=tuple(row[1] if len(row) > 1 else "?" for row in rows))
    problem = driver_problem(driver, torch.__version__, torch.version.cuda)
    if problem is not None:
        raise InputError(problem)
    names = ", ".join(sorted({f"{driver.gpus.count(n)} x {n}" for n in driver.gpus}))
    return [f"GPU: {names}; NVIDIA driver {driver.version} (CUDA {driver.cuda or '?'}); {wheels}: the driver runs it"]
