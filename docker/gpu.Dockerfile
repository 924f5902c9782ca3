# GPU node image: student/teacher engines and learner ranks (and env workers if they land here).
#   docker build -f docker/gpu.Dockerfile -t rose-ray/gpu:latest .
# CUDA base + Python + headless JRE (ScienceWorld) + a CUDA torch + ray[default] + rose_ray.
ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=22.04
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu${UBUNTU_VERSION}

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.7.1
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG RAY_VERSION=2.60.0

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
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
    && pip install "ray[default]==${RAY_VERSION}"

WORKDIR /opt/rose_ray
# Dependencies first (a layer that survives code edits), then the code.
COPY pyproject.toml README.md ./
COPY rose_ray/__init__.py rose_ray/__init__.py
# The local package itself: its dependencies are pinned by pyproject ranges.
# hadolint ignore=DL3013
RUN pip install . && pip uninstall -y rose_ray
COPY . .
RUN pip install --no-deps -e . \
    && java -version \
    && python -c "import rose_ray, torch, ray, scienceworld; print('rose_ray', rose_ray.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bash"]
