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
"$PY" -m pip install -q -e ".[dev]"
command -v pyenv >/dev/null && pyenv rehash || true
"$PY" -c "import rose_ray, torch; print(f'setup: rose_ray {rose_ray.__version__}, torch {torch.__version__}')"
