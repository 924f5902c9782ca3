#!/usr/bin/env bash
# Try the dependency floors (by hand, not in CI: it downloads from PyPI and takes minutes): a
# fresh virtual environment with every dependency in pyproject.toml at exactly its floor
# (`>=X` becomes `==X`; transitive dependencies resolve as pip likes), this package installed
# without dependencies, then tests that touch every dependency.
#
#   bash launch/floors.sh [VENV]              VENV defaults to /tmp/rose_ray_floors (recreated)
#   PYTHON=python3.10 bash launch/floors.sh   the interpreter (try the requires-python floor)
#   PINS="transformers==5.0.0 ray==2.40.0"    replace single pins (try a candidate floor)
#   TESTS="tests/unit/test_models.py"         the tests to run (default: every test not marked slow)
#
# torch at its floor comes from PyPI as a CUDA build (GBs, runs on CPU too); to try the other
# floors cheaply on this machine, PINS="torch==2.13.0" takes the local CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${1:-/tmp/rose_ray_floors}
# Default: tests/ less those marked `slow` (pyproject.toml's marker: whole training runs,
# warm-ups, servers and jobs); Ray, DeepSpeed, ScienceWorld and OmegaConf all still run.
if [[ -n "${TESTS:-}" ]]; then
  read -r -a tests <<< "$(echo "$TESTS" | tr '\n' ' ')"
else
  tests=(-m "not slow" tests/)
fi

# The pins: [project] dependencies and the dev extra's pytest, each at its floor, then PINS.
mapfile -t pins < <("$PY" - "${PINS:-}" <<'EOF'
import re, sys

text = open("pyproject.toml", encoding="utf-8").read()
deps = re.search(r"^dependencies = \[\n(.*?)^\]", text, re.S | re.M).group(1)
dev = re.search(r"^dev = \[(.*?)\]", text, re.M).group(1)
reqs = re.findall(r'"([^"]+)"', deps) + [r for r in re.findall(r'"([^"]+)"', dev) if r.startswith("pytest")]
key = lambda req: re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")
pins = {}
for req in reqs:
    m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)>=([0-9][^,;\s]*)", req)
    if not m:
        sys.exit(f"floors: {req!r} is not `name>=floor`; pin it with PINS")
    pins[key(req)] = f"{m.group(1)}=={m.group(2)}"
for pin in sys.argv[1].split():
    pins[key(pin)] = pin
print("\n".join(pins.values()))
EOF
)
echo "floors: ${pins[*]}"

pip_install() {  # quiet, less this machine's notes about local index folders it lacks
  "$VENV/bin/python" -m pip install -q "$@" 2> >(grep -v "is neither a file nor a directory" >&2)
}
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip_install --upgrade pip
pip_install "${pins[@]}"
pip_install --no-deps .
# A CUDA torch brings triton, whose kernels DeepSpeed builds at import (seen with 0.16); with no GPU
# driver that import fails ("0 active drivers"). Triton is of no use without a GPU.
if ! command -v nvidia-smi >/dev/null && "$VENV/bin/python" -m pip show -q triton 2>/dev/null; then
  echo "floors: no GPU here: removing triton (pulled in by the CUDA torch build)"
  "$VENV/bin/python" -m pip uninstall -q -y triton
fi
"$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|safetensors|ray|deepspeed|omegaconf|tensorboard|tqdm|scienceworld|numpy|huggingface.hub|aiohttp|pytest) '

export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu
# TensorBoard is only used by a training run: write and read back a scalar here.
"$VENV/bin/python" -c '
import sys, tempfile
from rose_ray.metrics import MetricsLogger, read_scalars
d = tempfile.mkdtemp()
m = MetricsLogger(d); m.log(3, {"learner/loss": 1.5}); m.close()
assert read_scalars(d + "/tb") == {"learner/loss": [(3, 1.5)]}, read_scalars(d + "/tb")
print("floors: tensorboard round trip ok")'
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}"
