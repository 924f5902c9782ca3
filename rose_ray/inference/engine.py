"""The generation-engine contract: requests, results, config and the context-budget policy.

Every backend takes prompt ids in and gives token ids, logprobs, a finish reason and the
weights' version out, so the learner trains on exactly the sampled ids. An engine cuts no
prompt (the rollout does: `rollout/context.py`). Logprobs are always the model's raw
log-softmax (temperature 1, no top-p), as `score` returns them. This module imports no
backend: `backends.make_engine` builds the one a config names.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rose_ray.errors import ConfigError, InputError, at_least
from rose_ray.inference.registry import (
    Backend,
    BackendSettings,
    get_backend,
    own_settings,
    settings_owner,
)
from rose_ray.tagged import chosen, tagged
from rose_ray.types import CONTEXT_TOKENS, SamplingParams

FinishReason = Literal["stop", "length", "context"]
CONTEXT_POLICIES: tuple[str, ...] = ("drop_oldest", "end_episode")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16")


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 matmul (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """'auto' becomes bfloat16 on GPUs and bf16-capable CPUs, else float32."""
    if name != "auto":
        return name
    if device.startswith("cuda") or cpu_supports_bf16():
        return "bfloat16"
    return "float32"


@dataclass
class GenerationRequest:
    """One completion: continue `prompt_ids`. `top_logprobs` > 0 asks for the k most likely
    tokens at each sampled position."""

    prompt_ids: list[int] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    top_logprobs: int = 0


@dataclass
class GenerationResult:
    """What one request produced.

    `token_ids` are exactly the sampled ids (a stop string's tokens kept, `text` cut before it);
    `logprobs[i]` is the logprob of `token_ids[i]`. finish_reason "context": the prompt left no
    room, nothing sampled. `version`: the weights it started on; an update that landed while it
    ran (publish.in_flight keep) sets `version_end` and `tokens_on_version`, the count of its
    first tokens sampled by `version` (both None when one version sampled it all).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    version: int
    request_id: str = ""
    top_logprobs: list[dict[int, float]] | None = None
    version_end: int | None = None
    tokens_on_version: int | None = None


@dataclass
class EngineConfig:
    """One engine replica: the settings every backend shares, and its backend's section, chosen
    by name: `backend: vllm`, or `backend: {name: vllm, kv_cache_mb: 256}`.

    The agent of this engine cuts a conversation longer than context_tokens as context_policy
    says (rollout/context.py); keep_first_turns protects that many turns after the prompt turns
    (the first observation carries the task description).
    """

    # hf | vllm | openai (registry.py), with its own settings: {name: vllm, kv_cache_mb: 256}
    backend: Any = tagged(BackendSettings, "hf")
    model: str = ""  # a local folder, a hub id, tiny:student / tiny:teacher, or the served name (openai)
    dtype: str = "auto"  # auto | float32 | bfloat16
    max_batch_size: int = 16  # sequences decoded at once (openai: requests in flight)
    max_wait_ms: float = 5.0  # how long a batch waits to fill before it starts
    context_tokens: int = CONTEXT_TOKENS  # prompt + reply
    context_policy: str = "drop_oldest"  # a prompt that no longer fits: drop_oldest pairs, or end_episode
    keep_first_turns: int = 1  # turns after the opening that drop_oldest never drops
    threads: int = 0  # torch threads (0: leave torch's setting)
    tokenizer: str | None = None  # a folder to read the tokenizer from instead of the model's

    def __post_init__(self) -> None:
        self.backend = chosen(BackendSettings, self.backend, "engine.backend")
        if self.spec.local and not self.model:
            raise ConfigError(f"engine.model: a model folder or name is required for backend {self.backend.name!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"engine.dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.context_policy not in CONTEXT_POLICIES:
            raise ConfigError(
                f"engine.context_policy: must be one of {CONTEXT_POLICIES}, got {self.context_policy!r}"
            )
        at_least(self, "engine.", 1, "max_batch_size", "context_tokens")
        at_least(self, "engine.", 0, "max_wait_ms", "keep_first_turns", "threads")

    @classmethod
    def of(cls, backend: str, **fields_: Any) -> EngineConfig:
        """An engine config from flat fields: each of the backend's own settings goes to its
        section (`EngineConfig.of("vllm", model=m, kv_cache_mb=64)`); another backend's is refused."""
        spec = get_backend(backend)
        section = {k: fields_.pop(k) for k in list(fields_) if k in own_settings(spec)}
        for key in fields_:
            owner = settings_owner(key)
            if owner is not None:
                raise ConfigError(f"engine.{key}: a setting of the {owner.name} backend, not of {backend}")
        return cls(backend=spec.settings(**section), **fields_)

    @property
    def spec(self) -> Backend:
        """The registered backend this engine runs on: what callers ask instead of its name."""
        return get_backend(self.backend.name)

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs one engine spans: its backend's tensor parallelism where it splits a model, else 1."""
        tp = self.backend.tensor_parallel
        return 1 if tp is None else int(tp.value)

    @property
    def label(self) -> str:
        """The model, or a served engine's URL when it names no model (for messages)."""
        return self.model or str(getattr(self.backend, "base_url", ""))


def validate_sampling(s: SamplingParams) -> None:
    """Raise InputError (a ValueError) naming the bad field."""
    at_least(s, "sampling.", 0, "temperature", "max_new_tokens")
    if not 0 < s.top_p <= 1:
        raise InputError(f"sampling.top_p: must be in (0, 1], got {s.top_p!r}")
    if any(not isinstance(x, str) or not x for x in s.stop):
        raise InputError(f"sampling.stop: must be non-empty strings, got {s.stop!r}")


def early_result(request: GenerationRequest, config: EngineConfig, version: int) -> GenerationResult | None:
    """Check a request (a ValueError naming what is wrong); the result of one with nothing to
    sample (its prompt leaves no room in the context, or it asks for no token), else None."""
    validate_sampling(request.sampling)
    n = len(request.prompt_ids)
    if not n:
        raise ValueError(f"generate: request {request.request_id or '?'} has an empty prompt")
    if n >= config.context_tokens or request.sampling.max_new_tokens == 0:
        finish = "context" if n >= config.context_tokens else "length"
        return GenerationResult("", [], [], finish, n, version, request.request_id)
    return None


def check_scored(pairs: list[tuple[list[int], list[int]]], longest: float, why: str = "") -> None:
    """A ValueError naming the first (prompt, completion) pair that cannot be scored."""
    for n, (prompt, completion) in enumerate(pairs):
        if not prompt:
            raise ValueError(f"score: pair {n} has an empty prompt (the first token has no logprob)")
        if len(prompt) + len(completion) > longest:
            raise ValueError(f"score: pair {n} has {len(prompt) + len(completion)} tokens; this engine "
                             f"scores at most {longest}{why}")


class LocalEngine:
    """What the engines that compute here (hf, vllm) share: the tokenizer and its stop ids, the
    weights' `version`, the counters `stats()` reports, `score` as one `score_many` pair."""

    def __init__(self, config: EngineConfig, device: str, tokenizer: Any, counters: dict[str, Any]) -> None:
        from rose_ray.chat import ChatFormat

        self.config = config
        self.device = device
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.stop_ids = {self.chat.eos_id} | ({tokenizer.eos_token_id} - {None})
        self.version = 0
        self._counters = counters
        self._batch_sizes: deque[int] = deque(maxlen=1024)  # requests per batch (vllm: per step)

    def check_positions(self, positions: int | None) -> None:
        """Refuse more context than the model has positions (None: unbounded)."""
        if positions is not None and self.config.context_tokens > positions:
            raise ConfigError(f"engine.context_tokens: {self.config.context_tokens} is more than the model's "
                              f"max_position_embeddings ({positions})")

    def stats(self, **more: Any) -> dict[str, Any]:
        out = {**self._counters, **more}
        fed = out["prompt_tokens"] - out["prefix_cached_tokens"]
        return {**out, "prompt_tokens_fed": fed, "batch_sizes": list(self._batch_sizes),
                "version": self.version}

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        return self.score_many([(prompt_ids, completion_ids)])[0]  # type: ignore[attr-defined]


class GenerationEngine(Protocol):
    """What rollout, learner and server use; the Ray actor wraps any of these."""

    config: EngineConfig
    version: int  # the weights' version

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]: ...

    def score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]: ...

    def update_weights(self, state: dict[str, Any], version: int) -> None: ...

