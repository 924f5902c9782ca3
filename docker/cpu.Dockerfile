# CPU node image: ScienceWorld env workers (and the head / job driver). No CUDA.
#   docker build -f docker/cpu.Dockerfile -t rose-ray/cpu:latest .
# Every version from launch/constraints-cpu.txt (the tested CPU set); torch's CPU build from
# PyTorch's CPU index (a bare `torch` pulls CUDA wheels). It runs as the unprivileged user
# `rose` (uid 1000; mount shared storage writable by it).
ARG PYTHON_VERSION=3.11
ARG DEBIAN_VERSION=bookworm
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_VERSION}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

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
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --shell /bin/bash rose

WORKDIR /opt/rose_ray
COPY pyproject.toml README.md ./
COPY launch/constraints-cpu.txt launch/
COPY rose_ray/__init__.py rose_ray/__init__.py
RUN pip install --upgrade "pip>=24" \
    && pip install -c launch/constraints-cpu.txt --extra-index-url "${TORCH_INDEX}" . \
    && pip uninstall -y rose_ray
COPY . .
RUN pip install --no-deps -e . \
    && java -version \
    && python -c "import rose_ray, scienceworld, ray, torch; print('rose_ray', rose_ray.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"

USER 1000:1000
WORKDIR /home/rose
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bash"]
