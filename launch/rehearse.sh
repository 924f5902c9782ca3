#!/usr/bin/env bash
# Rehearse a seed config on one machine before booking a cluster: a two-node Ray cluster on
# this host (a head with one CPU, as a cluster's head has few; a second raylet with its own
# temp dir, HOME and working directory and 8 fake GPUs: Ray only counts them), the config's
# placement groups, engines (tensor parallel included), learner ranks and ZeRO stage as
# shipped, tiny Qwen3 stand-ins under hub-style names downloaded by the run from a local hub
# (launch/hub_server.py on 127.0.0.1, HF_ENDPOINT) into an empty Hugging Face cache, and the
# rest scaled to a small machine (configs/rehearse.overrides says what and why).
#
#   bash launch/rehearse.sh [CONFIG] [KEY=VALUE ...]     # default configs/rose_qwen3_1p7b_32b.yaml
#
# Prints where each actor went and the learner's step times; exits 0 once the run reached its
# last step (3) with the weights published. It starts and stops its own raylets and hub only
# (ports of its own; the raylets are ended by the processes under its temp dir, never by
# `ray stop`, which would end every cluster on the machine).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
config=configs/rose_qwen3_1p7b_32b.yaml
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then
  config=$1
  shift
fi
PY=${PYTHON:-python3}
# A short path: Ray's socket paths under its temp dir must stay within 107 characters.
work=$(mktemp -d "/tmp/rr_rehearse.XXXXXX")
unset RAY_ADDRESS
# Ray's token auth, with a token of this rehearsal's own kept in the environment (its raylets'
# ports listen on every interface; see docs/reliability.md, The trust model).
RAY_AUTH_TOKEN=$("${PYTHON:-python3}" -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN TOKENIZERS_PARALLELISM=false DS_ACCELERATOR=cpu
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
# Models (an empty cache the run downloads into), caches and runs on a path both raylets see
# (a cluster's shared storage).
export HF_HOME=$work/hf ROSE_RAY_CACHE=$work/cache ROSE_RAY_RUNS=$work/runs
unset HF_HUB_OFFLINE
hub_pid=

stop_raylets() {
  # Every process of this rehearsal's cluster names its temp dir (under $work) on its command line.
  local pids
  mapfile -t pids < <(pgrep -f "$work/(head|node)" || true)
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 20); do
    mapfile -t pids < <(pgrep -f "$work/(head|node)" || true)
    [ ${#pids[@]} -eq 0 ] && break
    sleep 0.5
  done
  [ ${#pids[@]} -gt 0 ] && kill -9 "${pids[@]}" 2>/dev/null || true
  [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null || true
  echo "rehearse: raylets and hub stopped ($work kept: runs/ holds the run)"
}
trap stop_raylets EXIT

# The stand-ins, served under hub-style names by a hub of the rehearsal's own.
mapfile -t repos < <("$PY" launch/rehearse.py models "$work")
"$PY" launch/hub_server.py --log "$work/hub.log" "${repos[@]}" >"$work/hub.out" 2>&1 &
hub_pid=$!
for _ in $(seq 150); do
  grep -q "serving on" "$work/hub.out" && break
  kill -0 "$hub_pid" 2>/dev/null || break
  sleep 0.2
done
HF_ENDPOINT=$(sed -n 's/^hub: serving on //p' "$work/hub.out")
[ -n "$HF_ENDPOINT" ] || { cat "$work/hub.out" >&2; exit 1; }
export HF_ENDPOINT
sed 's/^/rehearse: /' "$work/hub.out"

port=$((20000 + RANDOM % 20000))  # ports of its own: other clusters on this machine keep theirs
ports() {  # per raylet: distinct agent, metrics and worker ports
  local b=$1
  printf '%s\n' --dashboard-agent-listen-port=$((b + 1)) --dashboard-agent-grpc-port=$((b + 2)) \
    --metrics-export-port=$((b + 3)) --runtime-env-agent-port=$((b + 4)) \
    --node-manager-port=$((b + 5)) --object-manager-port=$((b + 6)) \
    --min-worker-port=$((b + 100)) --max-worker-port=$((b + 400))
}
mapfile -t head_ports < <(ports $((port + 10)))
mapfile -t node_ports < <(ports $((port + 500)))
ray start --head --port="$port" --num-cpus=1 --num-gpus=0 --temp-dir="$work/head" --include-dashboard=false \
  --ray-client-server-port=$((port + 7)) --disable-usage-stats "${head_ports[@]}" >"$work/head.log" 2>&1 \
  || { tail -20 "$work/head.log" >&2; exit 1; }
mkdir -p "$work/node/home" "$work/node/cwd"
# DeepSpeed builds its CPU ops once per machine into torch's extension cache (~25 s on 2
# cores); under the node's own HOME every rehearsal would build them again.
extensions=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}
# The GPU node: 8 fake GPUs and enough logical CPUs for the config's CPU counts per role.
(cd "$work/node/cwd" && HOME="$work/node/home" TORCH_EXTENSIONS_DIR="$extensions" ray start --address="127.0.0.1:$port" --num-cpus=32 --num-gpus=8 \
  --temp-dir="$work/node/tmp" --disable-usage-stats "${node_ports[@]}" >"$work/node.log" 2>&1) \
  || { tail -20 "$work/node.log" >&2; exit 1; }
echo "rehearse: cluster at 127.0.0.1:$port (head: 1 CPU; node: 32 CPUs, 8 fake GPUs), work dir $work"

mapfile -t changes < <(grep -v '^\s*\(#\|$\)' configs/rehearse.overrides)
RAY_ADDRESS="127.0.0.1:$port" "$PY" launch/rehearse.py train "$work" "$config" "${changes[@]}" "$@"
