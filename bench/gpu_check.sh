#!/usr/bin/env bash
# The prepared GPU check, for a machine with one GPU (bench/gpu_check.py; about 6 minutes on
# one H200, within 8): vLLM tokens/s at 16 and 64 concurrent multi-turn episodes, vLLM's
# allocated KV cache beside the memory plan's, one weight publication with its stages timed
# apart, the NCCL publication's path from GPU buffers into vLLM beside the object store's
# (greedy outputs equal to a fresh load after each), an NCCL weight group whose second member never
# joins (rank 0 must give up within its timeout and outlive the group's watchdog; ~35 s), and a real learner rank (DeepSpeed ZeRO-2, bf16 weights, fp32 master weights and
# AdamW moments) on the seed's 16,384-token rows: tokens/s, MFU, peak memory. A
# Qwen3-1.7B-shaped model with random weights (nothing is downloaded). Results go to $OUT
# (the device tool's folder) when set, else bench/results/.
#
#   bash bench/gpu_check.sh                  # the Python here already has what it needs
#   bash bench/gpu_check.sh --wheels DIR     # offline: install from a folder of wheels first
#
# The wheels it needs (an offline GPU machine has none of them): rose_ray's dependencies and
# its `vllm` extra for this Python and platform — vllm 0.32 with the torch it pins (2.13.0,
# CUDA), deepspeed, transformers, ray[default], scienceworld and theirs; flash-attn if a wheel
# for that torch/CUDA/Python is there (optional: the learner runs SDPA without it). Make the
# folder where an index is reachable, for the GPU machine's Python:
#   pip download -d DIR ".[vllm]"            # (+ a matching flash-attn wheel, if any)
# On a GPU machine that already has a CUDA torch and transformers but no index (an H200 lent on
# 2026-12-04: torch 2.11+cu130), vLLM's CUDA wheel was too large to carry; the hf and learner
# parts ran with these few wheels for Python 3.12 (`pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 ...`): hjson, omegaconf, pydantic,
# pydantic-core, annotated-types, typing-inspection, dill, py-cpuinfo, transformers 5.19, and
# DeepSpeed built here from its sdist with no ops (`DS_BUILD_OPS=0 pip wheel --no-deps
# --no-build-isolation deepspeed==0.19.8`); installed with `pip install --no-deps --target`, then
#   DS_ACCELERATOR=cuda python3 bench/gpu_check.py --part learner --tokens 16384   # and --part hf
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=""
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) wheels=${2:?--wheels needs a folder}; shift 2 ;;
    *) echo "gpu_check: unknown argument $1 (use --wheels DIR)" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
out=${OUT:-bench/results}
mkdir -p "$out"
nvidia-smi -L || { echo "gpu_check: no GPU here (nvidia-smi found none)" >&2; exit 2; }
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || { echo "gpu_check: --wheels $wheels is not a folder" >&2; exit 2; }
  python3 -m pip install -q --no-index --find-links "$wheels" -e ".[vllm]"
  if ls "$wheels"/flash_attn-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --find-links "$wheels" --no-deps flash-attn || \
      echo "gpu_check: no flash-attn wheel in $wheels fits this torch/Python; the learner runs SDPA"
  fi
fi
python3 -c "import deepspeed, torch; assert torch.cuda.is_available(), 'torch sees no GPU'" || \
  { echo "gpu_check: DeepSpeed or a CUDA torch is missing here (give --wheels DIR)" >&2; exit 2; }
# Without vLLM the engine and publish parts record an import error in the JSON; hf and learner run.
python3 -c "import vllm" 2>/dev/null || echo "gpu_check: no vLLM here: only the hf and learner parts can run"
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 480 python3 bench/gpu_check.py --out "$out/gpu_check.json" 2>&1 \
  | tee "$out/gpu_check.log"
# The NCCL publication between two processes (learner rank 0 here, an engine actor on another
# GPU): NCCL takes one rank per GPU, so on a one-GPU machine the test is skipped and says so.
if python3 -c "import pytest" 2>/dev/null; then
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} RAY_AUTH_MODE=disabled timeout 100 python3 -m pytest -q -rs \
    tests/e2e/test_publish.py -k nccl_publication 2>&1 | tail -5 | tee "$out/gpu_check_nccl_test.log" || true
else
  echo "gpu_check: pytest is not installed: the two-GPU NCCL publication test not run" | tee "$out/gpu_check_nccl_test.log"
fi
