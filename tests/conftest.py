"""Shared fixtures: tiny local models (built once per session) and a local Ray cluster."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{"student": Path, "teacher": Path}: tiny Qwen3 models sharing one tokenizer."""
    from rose_ray.models import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny_models"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """Tiny models that look like Qwen3 from the outside: its special tokens (<think> too) and
    a chat template that rewrites history as Qwen3's does (`rose-ray init-tiny --style qwen3`)."""
    from rose_ray.models import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny_qwen3"), seed=0, style="qwen3")


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster for the whole session (4 logical CPUs on 2 cores)."""
    import ray

    if not ray.is_initialized():
        # address="local": always a fresh cluster of our own, never one another process started
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
