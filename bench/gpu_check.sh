#!/usr/bin/env bash
# The prepared GPU check of issue 23 (point 9), for a machine with one GPU: vLLM tokens/s at 16
# and 64 concurrent multi-turn episodes, one weight update, the learner's tokens/s, MFU and peak
# memory at the seed's 16,384-token rows, on a Qwen3-1.7B-shaped model with random weights
# (bench/gpu_check.py; about 5 minutes on one H200). Results go to $OUT (the device tool's
# folder) when set, else bench/results/.
#
#   bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
out=${OUT:-bench/results}
nvidia-smi -L || { echo "gpu_check: no GPU here (nvidia-smi found none)" >&2; exit 2; }
python3 -c "import vllm" 2>/dev/null || echo "gpu_check: vLLM does not import here: the engine part will say so"
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 bench/gpu_check.py --out "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.log"
