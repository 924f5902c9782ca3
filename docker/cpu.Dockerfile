# CPU node image: ScienceWorld env workers (and the head / job driver). No CUDA.
#   docker build -f docker/cpu.Dockerfile -t rose-ray/cpu:latest .
# The package depends on torch, so a CPU build is installed (a bare `torch` pulls CUDA wheels).
ARG PYTHON_VERSION=3.11
ARG DEBIAN_VERSION=bookworm
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_VERSION}

ARG TORCH_VERSION=2.7.1
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG RAY_VERSION=2.60.0

# TOKENIZERS_PARALLELISM is a switch, not a secret.
# hadolint ignore=DL3064
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    TOKENIZERS_PARALLELISM=false

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        default-jre-headless ca-certificates curl openssh-client rsync tini \
    && rm -rf /var/lib/apt/lists/*

RUN pip install --upgrade "pip>=24" \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
    && pip install "ray[default]==${RAY_VERSION}"

WORKDIR /opt/rose_ray
COPY pyproject.toml README.md ./
COPY rose_ray/__init__.py rose_ray/__init__.py
# The local package itself: its dependencies are pinned by pyproject ranges.
# hadolint ignore=DL3013
RUN pip install . && pip uninstall -y rose_ray
COPY . .
RUN pip install --no-deps -e . \
    && java -version \
    && python -c "import rose_ray, scienceworld, ray; print('rose_ray', rose_ray.__version__, 'ray', ray.__version__)"

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bash"]
