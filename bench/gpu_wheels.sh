#!/usr/bin/env bash
# The small wheels bench/gpu_check.sh needs on a GPU machine that has a CUDA torch (with its
# triton) and transformers but no index, no DeepSpeed and no Ray (the lent H200: torch 2.11+cu130,
# Python 3.12), downloaded here into a folder that is carried with the call (not committed:
# bench/wheels/ is ignored by git). About 20 MB.
#
#   bash bench/gpu_wheels.sh [DIR] [PYTHON_VERSION]     # default bench/wheels, 3.12
#   bash bench/gpu_check.sh --wheels bench/wheels        # on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-bench/wheels}
py=${2:-3.12}
mkdir -p "$dir"
# Binary and pure-Python wheels for that Python, without their dependencies (the machine has
# torch, triton, numpy, PyYAML, tokenizers, safetensors, huggingface-hub, packaging, tqdm).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$dir" \
  "transformers==5.19.0" "omegaconf==2.4.0" hjson py-cpuinfo pydantic pydantic-core annotated-types typing-inspection \
  einops msgpack psutil dill "liger-kernel==0.8.5" "cut-cross-entropy==25.1.1" pytest pluggy iniconfig
# DeepSpeed is on PyPI as source only: built here without its compiled ops (a plain Python wheel;
# torch's fused AdamW and kernels take their place).
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w "$dir" "deepspeed==0.19.8"
du -sh "$dir"
ls "$dir"
