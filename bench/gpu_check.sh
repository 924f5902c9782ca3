#!/usr/bin/env bash
# The prepared GPU check, for a machine with one GPU (within 8 minutes on one H200: each step has a
# time limit, 80 + 290 + 60 + 50 s at most, beside the wheels' install):
#  1. the learner's GPU kernels against their reference paths (tests/unit/learner/test_speed.py's
#     and test_learner_paths.py's CUDA tests: torch's varlen FlashAttention, cut-cross-entropy,
#     Liger, fused AdamW on CUDA, flash-attn where installed), ~1 minute;
#  2. the learner at the seed's step shape (bench/gpu_learner.py: 3 packed rows of 16,384 tokens
#     in 4 segments per optimizer step, ZeRO-2, bf16 with fp32 master weights), with the settings
#     shipped before issue 53 and then its speed settings added one at a time: seconds per step,
#     tokens/s, peak memory, MFU under two conventions; each rung in a process of its own, no rung
#     started after 215 s (those are listed as skipped), ~5 minutes;
#  3. the transformers engine (`--part hf`): greedy ids beside transformers' generate, tokens/s,
#     a weight update from GPU tensors, ~1 minute;
#  4. a weight group whose second member never joins (`--part stall`): learner rank 0 gives the
#     collective up within its timeout and outlives the group's own watchdog, ~35 s;
#  and, where vLLM is installed, its engine and publication parts too (bench/gpu_check.py --part all,
#  up to 5 more minutes).
# A Qwen3-1.7B-shaped model with random weights (nothing is downloaded). Results go to $OUT (the
# device tool's folder) when set, else bench/results/.
#
#   bash bench/gpu_check.sh                      # the Python here already has what it needs
#   bash bench/gpu_check.sh --wheels DIR         # offline: the wheels in DIR first (bench/gpu_wheels.sh)
#   bash bench/gpu_check.sh --dry-run            # the same steps on CPU at a tiny shape (no GPU needed)
#
# The lent H200 (torch 2.11+cu130 with its triton, transformers 5.17, no DeepSpeed, Ray or vLLM, no
# index, at most 64 MiB carried a call) runs it from the ~20 MB of wheels `bash bench/gpu_wheels.sh`
# downloads into bench/wheels/ (git ignores it): transformers 5.19, DeepSpeed 0.19.8 built without
# ops, its small dependencies, omegaconf, liger-kernel, cut-cross-entropy, pytest; installed into a
# folder of their own with `pip install --no-deps --target` (the machine's torch stays as it is).
# vLLM's CUDA wheel (~300 MB and dozens of dependencies) does not fit a call.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="" dry=""
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) wheels=${2:?--wheels needs a folder}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "gpu_check: unknown argument $1 (use --wheels DIR or --dry-run)" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled
out=${OUT:-bench/results}
mkdir -p "$out"
site=""
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || { echo "gpu_check: --wheels $wheels is not a folder" >&2; exit 2; }
  site=${TMPDIR:-/tmp}/rose_ray_gpu_site
  python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" "$wheels"/*.whl
fi
export PYTHONPATH=$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}
if [ -n "$dry" ]; then
  export DS_ACCELERATOR=cpu
  quick=(--quick) device=cpu hf_limit=900
else
  nvidia-smi -L || { echo "gpu_check: no GPU here (nvidia-smi found none; --dry-run runs on CPU)" >&2; exit 2; }
  export DS_ACCELERATOR=cuda
  quick=() device=cuda hf_limit=60
fi
python3 -c "import deepspeed, torch, omegaconf" || \
  { echo "gpu_check: DeepSpeed, torch or omegaconf is missing here (give --wheels DIR)" >&2; exit 2; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$out/gpu_check_env.log"
for pkg in triton liger_kernel cut_cross_entropy flash_attn vllm pytest; do
  python3 -c "import $pkg" 2>/dev/null && echo "$pkg: yes" || echo "$pkg: no"
done | tee -a "$out/gpu_check_env.log"

# 1. equality of the GPU kernels (skipped, saying so, without CUDA or a kernel's package)
if python3 -c "import pytest" 2>/dev/null; then
  DS_ACCELERATOR=$DS_ACCELERATOR timeout 80 python3 -m pytest -q -rs -o addopts="" -p no:cacheprovider \
    tests/unit/learner/test_speed.py tests/unit/learner/test_paths.py -k "gpu or flash" 2>&1 \
    | tail -15 | tee "$out/gpu_check_equality.log" || true
else
  echo "gpu_check: pytest is not installed: the GPU equality tests did not run" | tee "$out/gpu_check_equality.log"
fi
# 2. the learner's ladder
timeout 290 python3 bench/gpu_check.py --part learner --device "$device" "${quick[@]}" --budget-s 215 \
  --out "$out/gpu_check_learner.json" 2>&1 | tee "$out/gpu_check_learner.log" || true
# 3. the transformers engine on the GPU (and vLLM's parts where vLLM is here)
if [ -z "$dry" ] && python3 -c "import vllm" 2>/dev/null; then
  timeout 300 python3 bench/gpu_check.py --device "$device" "${quick[@]}" --budget-s 0 --out "$out/gpu_check.json" 2>&1 \
    | tee "$out/gpu_check.log" || true
else
  echo "gpu_check: no vLLM here (or a dry run): the engine and publication parts do not run" | tee "$out/gpu_check.log"
  rc=0
  timeout "$hf_limit" python3 bench/gpu_check.py --part hf --device "$device" "${quick[@]}" > "$out/gpu_check_hf.log" 2>&1 \
    || rc=$?
  tail -3 "$out/gpu_check_hf.log" | tee -a "$out/gpu_check.log"
  [ "$rc" = 0 ] || echo "gpu_check: the hf part stopped with exit status $rc (124: past its ${hf_limit} s)" \
    | tee -a "$out/gpu_check.log"
fi
# 4. a weight group whose second member never joins (NCCL on the GPU, gloo in a dry run): rank 0
# must give up within publish's timeout and still compute past the group's own watchdog (~35 s)
timeout 50 python3 bench/gpu_check.py --part stall --device "$device" 2>&1 | tail -2 | tee "$out/gpu_check_stall.log" || true
