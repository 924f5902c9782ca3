# GPU node image: student/teacher engines and learner ranks (and env workers if they land here).
#   docker build -f docker/gpu.Dockerfile -t rose-ray/gpu:latest .
# CUDA 13.0 base (what torch 2.13.0's PyPI wheel and vLLM 0.32's are built for: the NVIDIA
# container runtime refuses to start it on a driver older than 580) + Python + headless JRE
# (ScienceWorld) + a C++ compiler (DeepSpeed builds its ops on first use) + rose_ray with its
# `vllm` extra, every version from launch/constraints-cuda13.txt (the tested CUDA 13 set);
# flash-attn where a wheel for this torch/CUDA/Python is given (FLASH_ATTN_WHEEL: a URL or a path
# in the build context; without one the learner runs its SDPA path). It runs as the unprivileged
# user `rose` (uid 1000; mount shared storage writable by it). The build ends with
# `rose-ray check --backends`: an image whose vLLM does not import fails to build.
ARG CUDA_VERSION=13.0.3
ARG UBUNTU_VERSION=22.04
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu${UBUNTU_VERSION}

ARG PYTHON_VERSION=3.11
ARG FLASH_ATTN_WHEEL=

# TOKENIZERS_PARALLELISM is a switch, not a secret.
# hadolint ignore=DL3064
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/shared/hf

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev" \
        default-jre-headless build-essential ca-certificates curl git openssh-client rsync tini \
    && rm -rf /var/lib/apt/lists/*

# One virtual environment on PATH: `python`, `ray` and `rose-ray` all come from it.
RUN "python${PYTHON_VERSION}" -m venv /opt/venv \
    && useradd --create-home --uid 1000 --shell /bin/bash rose
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv

WORKDIR /opt/rose_ray
# Dependencies first (a layer that survives code edits), then the code.
COPY pyproject.toml README.md ./
COPY launch/constraints-cuda13.txt launch/
COPY rose_ray/__init__.py rose_ray/__init__.py
# Every version is pinned by the constraints file (pip's own floor aside).
# hadolint ignore=DL3013
RUN pip install --upgrade "pip>=24" \
    && pip install -c launch/constraints-cuda13.txt ".[vllm]" && pip uninstall -y rose_ray \
    && if [ -n "${FLASH_ATTN_WHEEL}" ]; then pip install --no-deps "${FLASH_ATTN_WHEEL}"; fi
COPY . .
RUN pip install --no-deps -e ".[vllm]" \
    && java -version \
    && python -c "import rose_ray, torch, ray, scienceworld; print('rose_ray', rose_ray.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'ray', ray.__version__)" \
    && rose-ray check --backends

USER 1000:1000
WORKDIR /home/rose
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bash"]
