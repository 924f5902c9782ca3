#!/usr/bin/env bash
# Train on this machine: Ray starts a private local cluster (every GPU and CPU here), the
# plan is checked first, then `rose-ray train` runs in the foreground (Ctrl-C stops cleanly).
#
#   launch/local.sh [CONFIG] [KEY=VALUE ...]
#
# CONFIG defaults to the seed's setup (configs/rose_qwen3_1p7b_32b.yaml: 7 GPUs of 80 GB); on a laptop
# use the tiny one:  launch/local.sh configs/tiny.yaml steps=20
# Each run goes to a new runs/<name>/version_N (under $ROSE_RAY_RUNS when set; runs/<name>/latest
# names the newest). TensorBoard: tensorboard --logdir runs/   (every run side by side)
set -euo pipefail
cd "$(dirname "$0")/.."
config=configs/rose_qwen3_1p7b_32b.yaml
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then
  config=$1
  shift
fi
unset RAY_ADDRESS  # a private local cluster, never someone else's
# Its ports listen on every interface: `rose-ray train` starts it with token auth and a fresh
# token kept in its own environment (docs/reliability.md, "The trust model"); leave RAY_AUTH_MODE unset.
export TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
# The plan fails early (exit 2) naming the role and the resource this machine lacks.
"$PY" -m rose_ray.cli plan --config "$config" "$@"
exec "$PY" -m rose_ray.cli train --config "$config" "$@"
