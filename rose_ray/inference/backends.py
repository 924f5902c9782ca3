"""The engine-backend factory: builds the GenerationEngine an EngineConfig names.

The backend names themselves (`engine.BACKENDS`: "hf", "openai") stay beside EngineConfig,
which validates them; this module is the one place that imports the backends, so engine.py
(the shared types) imports none of them and hf.py / openai.py import only engine.py.
"""

from __future__ import annotations

from typing import Any

from rose_ray.inference.engine import EngineConfig, GenerationEngine


def make_engine(config: EngineConfig, **kwargs: Any) -> GenerationEngine:
    """Build the configured backend (imports lazily: the openai client needs no torch model)."""
    if config.backend == "hf":
        from rose_ray.inference.hf import HFEngine

        return HFEngine(config, **kwargs)
    from rose_ray.inference.openai import OpenAIEngine

    return OpenAIEngine(config, **kwargs)
