"""The model side: generation engines (transformers in-process, OpenAI-compatible client),
the dynamic batcher, the Ray actor wrapper and the OpenAI-compatible server."""

from rose_ray.inference.engine import (
    ContextExceeded,
    EngineConfig,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    fit_context,
    make_engine,
)

__all__ = [
    "ContextExceeded",
    "EngineConfig",
    "GenerationEngine",
    "GenerationRequest",
    "GenerationResult",
    "fit_context",
    "make_engine",
]
