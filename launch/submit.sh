#!/usr/bin/env bash
# Submit a training run as a Ray job. The repository is the job's working directory (Ray
# uploads it; the cluster's image provides the dependencies) and the entrypoint is
# `python -m rose_ray.cli train`, so the job runs this checkout's code.
#
#   RAY_ADDRESS=http://HEAD:8265 launch/submit.sh [OPTIONS] [CONFIG] [KEY=VALUE ...]
#
#   CONFIG            YAML inside the repository (default: configs/rose_qwen3_1p7b_32b.yaml)
#   KEY=VALUE         config overrides, as for `rose-ray train`
#   --no-wait         return once submitted (follow with `ray job logs -f JOB_ID`)
#   --job-id ID       the submission id (default: rose-ray-<config name>-<time>)
#   --env KEY=VALUE   an environment variable for the job (repeatable)
#   --address URL     the dashboard address (default: $RAY_ADDRESS)
#
# Passed through to the job when set here: ROSE_RAY_RUNS (where run_dir goes: use shared
# storage), HF_HOME, HF_HUB_OFFLINE, HF_ENDPOINT. Waits for the job and exits 1 if it fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
config=""
wait_flag=()
job_id=""
envs=()
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-wait) wait_flag=(--no-wait); shift ;;
    --job-id) job_id=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --address) export RAY_ADDRESS=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *=*) overrides+=("$1"); shift ;;
    *) if [ -n "$config" ]; then echo "submit.sh: a second config $1 (overrides are KEY=VALUE)" >&2; exit 2; fi
       config=$1; shift ;;
  esac
done
config=${config:-configs/rose_qwen3_1p7b_32b.yaml}
if [ -z "${RAY_ADDRESS:-}" ]; then
  echo "submit.sh: set RAY_ADDRESS (e.g. http://127.0.0.1:8265) or pass --address" >&2
  exit 2
fi
if [ ! -f "$config" ] && [ ! -f "$root/$config" ]; then
  echo "submit.sh: config $config does not exist" >&2
  exit 2
fi
# The job sees the uploaded copy of the repository: name the config relative to it.
abs=$(cd "$(dirname "${config}")" 2>/dev/null && pwd)/$(basename "$config") || abs=$root/$config
[ -f "$abs" ] || abs=$root/$config
case "$abs" in
  "$root"/*) config=${abs#"$root"/} ;;
  *) echo "submit.sh: $config is outside the repository; the job reads that path on the cluster" >&2
     config=$abs ;;
esac
# Validate here first: a bad key or value fails now (exit 2, key named), not after an upload.
check='import sys
from rose_ray.config import load_config
try:
    load_config(sys.argv[1], sys.argv[2:])
except ValueError as e:
    sys.exit(f"submit.sh: {e}")'
if ! "$PY" -c "$check" "$abs" ${overrides[@]+"${overrides[@]}"}; then
  exit 2
fi
name=$(basename "$config" .yaml)
job_id=${job_id:-rose-ray-$name-$(date +%Y%m%d-%H%M%S)}

runtime_env=$("$PY" - "$root" ${envs[@]+"${envs[@]}"} <<'PYEOF'
import json, os, sys
root, pairs = sys.argv[1], sys.argv[2:]
env = {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
for key in ("ROSE_RAY_RUNS", "HF_HOME", "HF_HUB_OFFLINE", "HF_ENDPOINT", "RAY_AUTH_MODE"):
    if os.environ.get(key):
        env[key] = os.environ[key]
for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
        sys.exit(f"submit.sh: --env wants KEY=VALUE, got {pair!r}")
    env[key] = value
print(json.dumps({
    "working_dir": root,
    # What never needs to travel (Ray caps the upload at a few hundred MB).
    "excludes": [".git", "runs/", "bench/results/", "**/__pycache__", "*.egg-info", ".venv/",
                 ".pytest_cache/", ".ruff_cache/", "*.safetensors", "*.pt", "*.bin"],
    "env_vars": env,
}))
PYEOF
)
entry=(python -m rose_ray.cli train --config "$config" ${overrides[@]+"${overrides[@]}"})
echo "submit.sh: job $job_id on $RAY_ADDRESS: ${entry[*]}"
exec ray job submit --address "$RAY_ADDRESS" --submission-id "$job_id" \
  --runtime-env-json "$runtime_env" ${wait_flag[@]+"${wait_flag[@]}"} -- "${entry[@]}"
