"""The generation-engine contract: requests, results, config and the context-budget policy.

Every backend (transformers in-process, an OpenAI-compatible server) takes token ids in and
gives token ids out, so the learner trains on exactly the sampled ids. A request may carry
the conversation's turns instead of ready ids; the engine then applies the context policy
(`fit_context`) and records what it did in the result. This module imports no backend:
`backends.make_engine` builds the one a config names.

Logprobs are always the model's raw log-softmax (temperature 1, no top-p), which is what
`score` returns for the same tokens and what the learner's importance ratios compare against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rose_ray.errors import ConfigError, InputError
from rose_ray.types import CONTEXT_TOKENS, SamplingParams, Turn

FinishReason = Literal["stop", "length", "context"]
CONTEXT_POLICIES: tuple[str, ...] = ("drop_oldest", "end_episode")
BACKENDS: tuple[str, ...] = ("hf", "vllm", "openai")
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


class ContextExceeded(ValueError):
    """A conversation does not fit the context budget under the configured policy."""


@dataclass
class GenerationRequest:
    """One completion: continue `prompt_ids` (or the concatenated ids of `turns`).

    With `turns`, the engine builds the prompt under its context policy; `prompt_ids` is then
    ignored. `top_logprobs` > 0 asks for the k most likely tokens at each sampled position.
    """

    prompt_ids: list[int] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    turns: list[Turn] | None = None
    top_logprobs: int = 0


@dataclass
class GenerationResult:
    """What one request produced.

    `token_ids` are exactly the sampled ids (the end-of-turn token included when the model
    produced it; a stop string's token is kept while `text` is cut before the stop string).
    `logprobs[i]` is the model's logprob of `token_ids[i]`. finish_reason "context" means the
    prompt left no room (policy end_episode, or nothing left to drop): no tokens were sampled.
    `dropped_turns` counts turns the drop_oldest policy removed from the front of the history.
    `version` is the weights' version it started on. A weight update that landed while it ran
    (publish.in_flight keep; the vllm backend) sets `version_end`, the version that sampled its
    last tokens, and `tokens_on_version`: its first that many tokens (and their logprobs) are
    `version`'s, the rest a later one's. Both None when one version sampled it all.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    version: int
    request_id: str = ""
    dropped_turns: int = 0
    top_logprobs: list[dict[int, float]] | None = None
    version_end: int | None = None
    tokens_on_version: int | None = None


@dataclass
class EngineConfig:
    """One engine replica. `model` is a local HF folder (hf, vllm) or the served model name (openai).

    context_tokens bounds prompt + completion; context_policy says what to do with a longer
    conversation; keep_first_turns protects that many turns after the prompt turns (the first
    observation carries the task description). threads=0 leaves torch's setting alone.
    prefix_cache_mb bounds the memory of the keys/values the hf backend keeps from past
    generations to skip re-encoding a conversation's earlier turns (0 disables; a token costs
    2 * layers * kv_heads * head_dim * dtype bytes: 112 KiB for Qwen3-1.7B in bf16).

    vllm: the KV cache is vLLM's paged cache, sized by the config and never by vLLM's default
    share of host memory: `kv_cache_mb` on CPU, `gpu_memory_utilization` (the fraction of
    each GPU for weights, activations and KV) on GPUs. `tensor_parallel_size` GPUs serve one
    engine (its placement bundle holds that many). `max_batch_size` bounds the sequences
    decoded at once; `cuda_graphs` off runs eagerly on GPUs (CPUs always run eagerly).
    """

    backend: str = "hf"
    model: str = ""
    dtype: str = "auto"
    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    context_tokens: int = CONTEXT_TOKENS
    context_policy: str = "drop_oldest"
    keep_first_turns: int = 1
    threads: int = 0
    attn_implementation: str = "sdpa"
    prefix_cache_mb: float = 1024.0
    # vllm backend
    kv_cache_mb: float = 512.0
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    cuda_graphs: bool = True
    # openai backend
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str | None = None  # this endpoint's key (docs/engines.md: Served models, keys)
    api_key_env: str | None = None  # else the environment variable holding it (default: $ROSE_RAY_API_KEY)
    timeout_s: float = 600.0
    # How long to keep retrying a server that does not answer (down, restarting, overloaded),
    # from a request's first failure, with backoff from 0.5 s to 10 s between attempts, before
    # giving up with an error (the run then replaces the engine).
    retry_s: float = 60.0
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"engine.backend: must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend in ("hf", "vllm") and not self.model:
            raise ConfigError(f"engine.model: a model folder or name is required for backend {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"engine.dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.context_policy not in CONTEXT_POLICIES:
            raise ConfigError(
                f"engine.context_policy: must be one of {CONTEXT_POLICIES}, got {self.context_policy!r}"
            )
        for key in ("max_batch_size", "context_tokens", "tensor_parallel_size"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"engine.{key}: must be >= 1, got {getattr(self, key)!r}")
        for key in ("max_wait_ms", "timeout_s", "prefix_cache_mb", "retry_s"):
            if float(getattr(self, key)) < 0:
                raise ConfigError(f"engine.{key}: must be >= 0, got {getattr(self, key)!r}")
        if not float(self.kv_cache_mb) > 0:
            raise ConfigError(f"engine.kv_cache_mb: must be > 0, got {self.kv_cache_mb!r}")
        if not 0 < float(self.gpu_memory_utilization) <= 1:
            raise ConfigError(f"engine.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization!r}")
        for key in ("keep_first_turns", "threads"):
            if int(getattr(self, key)) < 0:
                raise ConfigError(f"engine.{key}: must be >= 0, got {getattr(self, key)!r}")


def validate_sampling(s: SamplingParams) -> None:
    """Raise ValueError naming the bad field."""
    if s.temperature < 0:
        raise InputError(f"sampling.temperature: must be >= 0, got {s.temperature!r}")
    if not 0 < s.top_p <= 1:
        raise InputError(f"sampling.top_p: must be in (0, 1], got {s.top_p!r}")
    if s.max_new_tokens < 0:
        raise InputError(f"sampling.max_new_tokens: must be >= 0, got {s.max_new_tokens!r}")
    if any(not isinstance(x, str) or not x for x in s.stop):
        raise InputError(f"sampling.stop: must be non-empty strings, got {s.stop!r}")


def _length(turn: Turn) -> int:
    return len(turn.token_ids)


def droppable_from(turns: list[Turn], keep_first_turns: int = 1) -> int:
    """The first turn drop_oldest may drop: after the prompt turns and `keep_first_turns`."""
    head = 0
    while head < len(turns) and turns[head].owner == "prompt":
        head += 1
    return min(head + keep_first_turns, len(turns))


def fit_context(
    turns: list[Turn], max_tokens: int, policy: str, keep_first_turns: int = 1
) -> tuple[list[Turn], int]:
    """Turns whose ids fit in `max_tokens`, and how many turns were dropped.

    Protected: the prompt turns (owner "prompt": instruction + acknowledgement), the first
    `keep_first_turns` turns after them, and the last turn (the observation being answered).
    drop_oldest removes the oldest unprotected turns two at a time (an action and the
    observation it caused), so user and assistant turns still alternate. Raises
    ContextExceeded when the policy is end_episode, or nothing more can be dropped.
    """
    if policy not in CONTEXT_POLICIES:
        raise ValueError(f"context_policy: must be one of {CONTEXT_POLICIES}, got {policy!r}")
    total = sum(_length(t) for t in turns)
    if total <= max_tokens:
        return list(turns), 0
    if policy == "end_episode":
        raise ContextExceeded(f"conversation has {total} tokens, budget {max_tokens}")
    start, end = droppable_from(turns, keep_first_turns), len(turns) - 1  # droppable: turns[start:end]
    dropped = 0
    while total > max_tokens and end - (start + dropped) >= 2:
        total -= _length(turns[start + dropped]) + _length(turns[start + dropped + 1])
        dropped += 2
    if total > max_tokens:
        raise ContextExceeded(
            f"conversation has {total} tokens after dropping {dropped} turns, budget {max_tokens}"
        )
    return turns[:start] + turns[start + dropped :], dropped


def prompt_budget(config: EngineConfig, sampling: SamplingParams) -> int:
    """Prompt tokens allowed so that a full reply still fits the context."""
    return max(config.context_tokens - sampling.max_new_tokens, 0)


def resolve_prompt(request: GenerationRequest, config: EngineConfig) -> tuple[list[int], int, bool]:
    """(prompt ids, dropped turns, fits) for a request under the config's context policy.

    Plain prompt_ids requests are never cut (the caller owns them); they only "fit" or not.
    """
    if request.turns is None:
        ids = list(request.prompt_ids)
        return ids, 0, len(ids) < config.context_tokens
    budget = prompt_budget(config, request.sampling)
    try:
        kept, dropped = fit_context(
            request.turns, budget, config.context_policy, config.keep_first_turns
        )
    except ContextExceeded:
        ids = [i for t in request.turns for i in t.token_ids]
        return ids, 0, False
    return [i for t in kept for i in t.token_ids], dropped, True


def context_result(request: GenerationRequest, prompt_len: int, version: int) -> GenerationResult:
    """The result for a request whose prompt does not fit: nothing sampled."""
    return GenerationResult(
        text="",
        token_ids=[],
        logprobs=[],
        finish_reason="context",
        prompt_tokens=prompt_len,
        version=version,
        request_id=request.request_id,
    )


@runtime_checkable
class GenerationEngine(Protocol):
    """What rollout, learner and server use; the Ray actor wraps any of these."""

    config: EngineConfig

    @property
    def version(self) -> int: ...

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]: ...

    def score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]: ...

    def update_weights(self, state: dict[str, Any], version: int) -> None: ...

