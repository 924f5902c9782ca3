#!/usr/bin/env bash
# Submit a training run as a Ray job. The repository is the job's working directory (Ray
# uploads it; the cluster's image provides the dependencies) and the entrypoint is
# `python -m rose_ray.cli train`, so the job runs this checkout's code.
#
#   RAY_ADDRESS=http://HEAD:8265 launch/submit.sh [OPTIONS] [CONFIG] [KEY=VALUE ...]
#   RAY_ADDRESS=http://HEAD:8265 launch/submit.sh [OPTIONS] --resume RUN [KEY=VALUE ...]
#
#   CONFIG            YAML inside the repository (default: configs/rose_qwen3_1p7b_32b.yaml)
#   KEY=VALUE         config overrides, as for `rose-ray train`; an API key (*.api_key) only as
#                     '${oc.env:VAR}' (a literal one is refused: the job's record keeps the command)
#   --resume RUN      go on with a run from its last checkpoint (`train --resume`): an absolute
#                     run folder (or run_dir, meaning its latest) on storage the head node reads
#   --no-wait         return once submitted (follow with `ray job logs -f JOB_ID`)
#   --job-id ID       the submission id (default: rose-ray-<config name>-<time>)
#   --env KEY=VALUE   an environment variable for the job (repeatable); it is kept in the job's
#                     record, which whoever reaches the dashboard reads, so a secret's name
#                     (*_KEY, *_TOKEN, *SECRET*, *PASSWORD*) is refused: use --env-file
#   --env-file FILE   KEY=VALUE lines (absolute path, chmod 600, on storage the head node reads)
#                     that the job's driver loads before it starts: only the path is recorded.
#                     An API key reaches the engines through the config the driver resolves:
#                     teacher_engine.backend.api_key='${oc.env:ROSE_RAY_API_KEY}' (never saved in the run)
#   --address URL     the dashboard address (default: $RAY_ADDRESS)
#
# On a token-auth cluster (launch/slurm.sbatch, rayjob.yaml, cluster.yaml) set RAY_AUTH_MODE=token
# and RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN) to the cluster's token first; Ray's client sends it.
#
# Where runs go is settled here and printed: an absolute ROSE_RAY_RUNS (on storage the head node
# keeps); else, when the Ray head is this machine, ROSE_RAY_RUNS or ./runs made absolute from
# this directory; else it refuses (exit 2). Each run is a new version_N folder under the
# config's run_dir. Passed through to the job when set: ROSE_RAY_RUNS, ROSE_RAY_CACHE, HF_HOME,
# HF_HUB_OFFLINE, HF_ENDPOINT. Waits for the job and exits 1 if it fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
config=""
resume=""
wait_flag=()
job_id=""
env_file=""
envs=()
overrides=()
ENV_REF='^(\$\{oc\.env:[A-Za-z_][A-Za-z0-9_]*(,null)?\}|null|)$'  # an api_key that names a variable
while [ $# -gt 0 ]; do
  case "$1" in
    --no-wait) wait_flag=(--no-wait); shift ;;
    --job-id) job_id=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --address) export RAY_ADDRESS=$2; shift 2 ;;
    --env-file) env_file=$2; shift 2 ;;
    --resume) resume=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *=*) key=${1%%=*}
         if [[ "$key" == api_key || "$key" == *.api_key ]] && ! [[ "${1#*=}" =~ $ENV_REF ]]; then
           echo "submit.sh: $key=...: a key given here is printed and kept in the job's record (whoever reaches" \
             "the dashboard reads it): put ROSE_RAY_API_KEY=... in a file (chmod 600), pass --env-file FILE" \
             "and give $key='\${oc.env:ROSE_RAY_API_KEY}'" >&2
           exit 2
         fi
         overrides+=("$1"); shift ;;
    *) if [ -n "$config" ]; then echo "submit.sh: a second config $1 (overrides are KEY=VALUE)" >&2; exit 2; fi
       config=$1; shift ;;
  esac
done
if [ -n "$resume" ]; then
  if [ -n "$config" ]; then
    echo "submit.sh: --resume $resume goes on with the run's own config; give changes as KEY=VALUE, not $config" >&2
    exit 2
  fi
  case "$resume" in
    /*) ;;
    *) echo "submit.sh: --resume $resume: give an absolute path (the job's driver reads it on the head node)" >&2; exit 2 ;;
  esac
fi
config=${config:-configs/rose_qwen3_1p7b_32b.yaml}
if [ -z "${RAY_ADDRESS:-}" ]; then
  echo "submit.sh: set RAY_ADDRESS (e.g. http://127.0.0.1:8265) or pass --address" >&2
  exit 2
fi
if [ -n "$resume" ]; then
  abs=--resume=$resume
elif [ ! -f "$config" ] && [ ! -f "$root/$config" ]; then
  echo "submit.sh: config $config does not exist" >&2
  exit 2
else
  # The job sees the uploaded copy of the repository: name the config relative to it.
  abs=$(cd "$(dirname "${config}")" 2>/dev/null && pwd)/$(basename "$config") || abs=$root/$config
  [ -f "$abs" ] || abs=$root/$config
  case "$abs" in
    "$root"/*) config=${abs#"$root"/} ;;
    *) echo "submit.sh: $config is outside the repository; the job reads that path on the cluster" >&2
       config=$abs ;;
  esac
fi
if [ -n "$env_file" ]; then
  case "$env_file" in
    /*) ;;
    *) echo "submit.sh: --env-file $env_file: give an absolute path (the head node reads it)" >&2; exit 2 ;;
  esac
  # Checked here when this machine sees the file (the head often shares the storage).
  if [ -e "$env_file" ] && [ -n "$(find "$env_file" -maxdepth 0 -perm /077)" ]; then
    echo "submit.sh: --env-file $env_file is readable by other users: chmod 600 $env_file" >&2
    exit 2
  fi
fi

# Validate here first: a bad key or value fails now (exit 2, key named), not after an upload.
# Then settle where runs go: the job's working directory is a temporary copy of this one, so a
# relative run_dir would vanish with the job. An absolute ROSE_RAY_RUNS (or run_dir=) is used as
# it is; else, only when the Ray head is this machine, ROSE_RAY_RUNS or ./runs made absolute here.
resolved=$(  # with the env file's variables when this machine reads it, as the job's driver will
# shellcheck source=/dev/null
if [ -n "$env_file" ] && [ -r "$env_file" ]; then set -a; . "$env_file"; set +a; fi
"$PY" - "$abs" ${overrides[@]+"${overrides[@]}"} <<'PYEOF'
import os, sys
from rose_ray.config import load_config


def head_is_here(address: str) -> bool:
    """Whether the cluster's head node has one of this machine's addresses."""
    import psutil
    from ray.util.state import list_nodes

    import time

    heads, deadline = [], time.monotonic() + 30
    while not heads:  # a head that has just started may not list itself yet (seen on a loaded machine)
        try:
            heads = list_nodes(address=address, filters=[("is_head_node", "=", True)], timeout=30)
        except Exception as e:  # noqa: BLE001 - any failure: we cannot tell, so we do not guess
            sys.exit(f"submit.sh: cannot ask the Ray cluster at {address} where its head runs "
                     f"({type(e).__name__}); set ROSE_RAY_RUNS to where runs go")
        if not heads and time.monotonic() > deadline:
            sys.exit(f"submit.sh: the Ray cluster at {address} lists no head node; set ROSE_RAY_RUNS "
                     "to where runs go")
        if not heads:
            time.sleep(1)
    mine = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return heads[0].node_ip in mine


try:
    if sys.argv[1].startswith("--resume="):  # a run going on: its own config, its own folder
        from rose_ray.runs import resolve_run

        run = sys.argv[1].removeprefix("--resume=")
        if os.path.exists(run):
            run = resolve_run(run)
            load_config(run / "config.yaml", sys.argv[2:])
        else:
            print(f"submit.sh: {run} is not on this machine: the job goes on with it if the head node has it",
                  file=sys.stderr)
        print(f"\n{run}")
        sys.exit(0)
    cfg = load_config(sys.argv[1], sys.argv[2:])
    runs = os.environ.get("ROSE_RAY_RUNS", "")
    if not os.path.isabs(cfg.run_dir) and not os.path.isabs(runs):
        if not head_is_here(os.environ["RAY_ADDRESS"]):
            sys.exit(f"submit.sh: the Ray head at {os.environ['RAY_ADDRESS']} is another machine, so runs "
                     f"cannot go to {os.path.abspath(runs or 'runs')} here: set ROSE_RAY_RUNS to a folder the "
                     "head node writes and keeps (shared storage), e.g. ROSE_RAY_RUNS=/shared/runs")
        runs = os.path.abspath(runs or "runs")
        os.environ["ROSE_RAY_RUNS"] = runs
        cfg = load_config(sys.argv[1], sys.argv[2:])
    if not os.path.isabs(cfg.run_dir):
        sys.exit(f"submit.sh: run_dir {cfg.run_dir} is relative and does not follow ROSE_RAY_RUNS: the job "
                 "would write it inside its temporary working directory; give an absolute run_dir=")
except ValueError as e:
    sys.exit(f"submit.sh: {e}")
print(f"{runs}\n{cfg.run_dir}")
PYEOF
) || exit 2
{ read -r runs; read -r run_dir; } <<<"$resolved"  # lines: either may be empty
if [ -n "$runs" ]; then export ROSE_RAY_RUNS=$runs; fi
name=$(basename "$config" .yaml)
if [ -n "$resume" ]; then
  echo "submit.sh: the run goes on in $run_dir"
  name=$(basename "$run_dir")
  entry=(python -m rose_ray.cli train --resume "$run_dir" ${overrides[@]+"${overrides[@]}"})
else
  case " ${overrides[*]-} " in
    *" run_dir="*) echo "submit.sh: the run goes to $run_dir" ;;
    *) echo "submit.sh: the run goes to a new version_N folder in $run_dir (its name in $run_dir/latest)" ;;
  esac
  entry=(python -m rose_ray.cli train --config "$config" ${overrides[@]+"${overrides[@]}"})
fi
job_id=${job_id:-rose-ray-$name-$(date +%Y%m%d-%H%M%S)}

runtime_env=$("$PY" - "$root" ${envs[@]+"${envs[@]}"} <<'PYEOF'
import json, os, sys
root, pairs = sys.argv[1], sys.argv[2:]
env = {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
# Never RAY_AUTH_*: the job runs with its cluster's auth setting, and a token is a secret.
for key in ("ROSE_RAY_RUNS", "ROSE_RAY_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
    if os.environ.get(key):
        env[key] = os.environ[key]
SECRET_WORDS = {"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}
for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
        sys.exit(f"submit.sh: --env wants KEY=VALUE, got {pair!r}")
    if SECRET_WORDS & set(key.upper().split("_")) or "SECRET" in key.upper() or "PASSWORD" in key.upper():
        sys.exit(f"submit.sh: --env {key}=...: the job's record would keep this secret, readable to whoever "
                 f"reaches the dashboard; put {key}=... in a file (chmod 600) and pass --env-file FILE")
    env[key] = value
print(json.dumps({
    "working_dir": root,
    # What never needs to travel (Ray caps the upload at a few hundred MB).
    "excludes": [".git", "runs/", "bench/results/", "**/__pycache__", "*.egg-info", ".venv/",
                 ".pytest_cache/", ".ruff_cache/", "*.safetensors", "*.pt", "*.bin"],
    "env_vars": env,
}))
PYEOF
) || exit 2
if [ -n "$env_file" ]; then  # the driver exports the file's variables, then runs the command
  entry=(bash -c "set -a && . \"\$0\" && set +a && exec \"\$@\"" "$env_file" "${entry[@]}")
fi
echo "submit.sh: job $job_id on $RAY_ADDRESS: ${entry[*]}"
exec ray job submit --address "$RAY_ADDRESS" --submission-id "$job_id" \
  --runtime-env-json "$runtime_env" ${wait_flag[@]+"${wait_flag[@]}"} -- "${entry[@]}"
