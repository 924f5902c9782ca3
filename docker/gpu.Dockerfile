# GPU node image: student/teacher engines and learner ranks (and env workers if they land here).
#   docker build -f docker/gpu.Dockerfile -t rose-ray/gpu:latest .
# CUDA base + Python + headless JRE (ScienceWorld) + rose_ray with its `vllm` extra (vLLM's CUDA
# build and the torch it pins: vllm 0.32 requires torch==2.13.0, whose PyPI wheel is a CUDA one)
# + ray[default]; flash-attn where a wheel for this torch/CUDA/Python is given (FLASH_ATTN_WHEEL:
# a URL or a path in the build context; without one the learner runs its SDPA path). The build
# ends with `rose-ray check --backends`: an image whose vLLM does not import fails to build.
ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=22.04
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu${UBUNTU_VERSION}

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
ARG RAY_VERSION=2.60.0
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
RUN "python${PYTHON_VERSION}" -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv

RUN pip install --upgrade "pip>=24" \
    && pip install "torch==${TORCH_VERSION}" \
    && pip install "ray[default]==${RAY_VERSION}"

WORKDIR /opt/rose_ray
# Dependencies first (a layer that survives code edits), then the code.
COPY pyproject.toml README.md ./
COPY rose_ray/__init__.py rose_ray/__init__.py
# The local package itself: its dependencies are pinned by pyproject ranges.
# hadolint ignore=DL3013
RUN pip install ".[vllm]" "torch==${TORCH_VERSION}" && pip uninstall -y rose_ray \
    && if [ -n "${FLASH_ATTN_WHEEL}" ]; then pip install --no-deps "${FLASH_ATTN_WHEEL}"; fi
COPY . .
RUN pip install --no-deps -e ".[vllm]" \
    && java -version \
    && python -c "import rose_ray, torch, ray, scienceworld; print('rose_ray', rose_ray.__version__, 'torch', torch.__version__, 'ray', ray.__version__)" \
    && rose-ray check --backends

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bash"]
