"""Parsing and validating OpenAI-style request bodies (completions and chat completions).

Every rejection is a RequestError naming the field (the server's 4xx). Whatever passes must not
fail inside the engine: a failing batch is rerun one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2.exceptions import TemplateError

from rose_ray.types import SamplingParams

MAX_TOP_LOGPROBS = 20
MAX_PROMPTS = 16  # prompts in one completions request (the body limit is sized on it)
# Stop strings are searched in the whole text at every step: bounded, so one request cannot slow its batch.
MAX_STOP_STRINGS = 16
MAX_CONCURRENT = 256  # requests a server holds in flight (read, queued or generating); more get 429
MAX_STOP_CHARS = 256
# A prompt's token costs ~8 bytes of JSON as an id, rarely over ~20 as text; 1 MiB covers the rest.
BODY_BYTES_PER_TOKEN = 32
BODY_HEADROOM_BYTES = 1 << 20
# As vLLM: below this a temperature means greedy (a vanishing one overflows to NaN probabilities).
GREEDY_BELOW = 1e-5
SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed takes


def max_body_bytes(context_tokens: int) -> int:
    """The largest request body a valid request can need: MAX_PROMPTS full-context prompts."""
    return BODY_HEADROOM_BYTES + MAX_PROMPTS * context_tokens * BODY_BYTES_PER_TOKEN


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclass
class ParsedRequest:
    prompts: list[list[int]]
    sampling: SamplingParams
    logprobs: int | None  # None: no logprobs; k: sampled token + k alternatives
    echo: bool
    prompt_logprobs: int | None
    token_ids_as_strings: bool


def _short(value: Any, limit: int = 80) -> str:
    """A value as error messages show it: its repr, cut (a bad field may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _number(body: dict[str, Any], key: str, default: Any, kind: type, lo: float | None = None,
            hi: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {_short(value)}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise RequestError(f"'{key}' must be between {lo} and {hi}, got {_short(value)}", key)
    return kind(value)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if not isinstance(value, (bool, type(None))):
        raise RequestError(f"'{key}' must be true or false, got {_short(value)}", key)
    return bool(value)


def _common(body: dict[str, Any], max_tokens_default: int | None) -> tuple[SamplingParams, int | None, bool]:
    if _flag(body, "stream"):
        # A reply is whole only when its batch is done: a stream would be one chunk at the end.
        raise RequestError("'stream': true is not supported by this server (each reply is sent "
                           "whole, when generated); send 'stream': false or leave it out", "stream")
    _number(body, "n", 1, int, 1, 1)
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _number(body, key, max_tokens_default, int, 0)
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        stops = list(stop)
    else:
        raise RequestError(f"'stop' must be a string or a list of non-empty strings, got {_short(stop)}", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"'stop' holds {len(stops):,} strings; at most {MAX_STOP_STRINGS} per request", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        longest = max(len(s) for s in stops)
        raise RequestError(f"'stop' holds a string of {longest:,} characters; at most {MAX_STOP_CHARS} each", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not SEED_RANGE[0] <= seed < SEED_RANGE[1]):
        raise RequestError(f"'seed' must be an integer in [-2**63, 2**64), got {_short(seed)}", "seed")
    temperature = _number(body, "temperature", 1.0, float, 0.0, 100.0)
    sampling = SamplingParams(
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=_number(body, "top_p", 1.0, float, 0.0, 1.0),
        max_new_tokens=max_tokens if max_tokens is not None else -1,
        stop=stops,
        seed=seed,
    )
    if sampling.top_p <= 0:
        raise RequestError("'top_p' must be greater than 0", "top_p")
    prompt_logprobs = _number(body, "prompt_logprobs", None, int, 0, 0)
    return sampling, prompt_logprobs, _flag(body, "return_tokens_as_token_ids")


def _fit(prompt: list[int], sampling: SamplingParams, context: int) -> None:
    if sampling.max_new_tokens < 0:  # not given: whatever room the context leaves
        sampling.max_new_tokens = max(context - len(prompt), 0)
    if len(prompt) + sampling.max_new_tokens > context:
        raise RequestError(
            f"this model's maximum context length is {context} tokens; the request has "
            f"{len(prompt)} prompt tokens and asks for {sampling.max_new_tokens} completion tokens",
            "max_tokens")


def parse_completion(body: dict[str, Any], tokenizer: Any, context: int) -> ParsedRequest:
    sampling, prompt_logprobs, as_ids = _common(body, 16)
    if "prompt" not in body:
        raise RequestError("'prompt' is required (a string, a list of token ids, or a list of either)", "prompt")
    raw = body["prompt"]
    vocab = len(tokenizer)
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise RequestError("'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt")
    if len(raw) > MAX_PROMPTS:
        raise RequestError(f"'prompt' holds {len(raw)} prompts; at most {MAX_PROMPTS} per request", "prompt")
    prompts = []
    for item in raw:
        if isinstance(item, str):
            item = list(tokenizer(item, add_special_tokens=False)["input_ids"])
        if not isinstance(item, list):
            raise RequestError(f"'prompt' items must be strings or lists of token ids, got {_short(item)}", "prompt")
        if not item:
            raise RequestError("'prompt' is empty", "prompt")
        for t in item:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise RequestError(f"'prompt' holds {_short(t)}, not a token id in [0, {vocab})", "prompt")
        _fit(item, sampling, context)
        prompts.append(item)
    logprobs = _number(body, "logprobs", None, int, 0, MAX_TOP_LOGPROBS)
    return ParsedRequest(prompts, sampling, logprobs, _flag(body, "echo"), prompt_logprobs, as_ids)


def parse_chat(body: dict[str, Any], chat: Any, context: int) -> ParsedRequest:
    sampling, prompt_logprobs, as_ids = _common(body, None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise RequestError(f"messages[{i}] needs a role of system, user or assistant, got {_short(m)}", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = [c.get("text") for c in content if isinstance(c, dict) and c.get("type") == "text"]
            if len(parts) != len(content) or not all(isinstance(t, str) for t in parts):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string, got {_short(content)}", "messages")
        clean.append({"role": m["role"], "content": content})
    # vLLM's way to reach template variables; only Qwen3's thinking switch is taken.
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    if not isinstance(kwargs, dict) or not isinstance(thinking, (bool, type(None))):
        raise RequestError("'chat_template_kwargs' must be an object; its 'enable_thinking' true or false",
                           "chat_template_kwargs")
    try:
        prompt = chat.render_ids(clean, add_generation_prompt=True, enable_thinking=thinking)
    except TemplateError as e:  # templates refuse some orders (Qwen3's: no user message)
        raise RequestError(f"the model's chat template refused these messages: {e}", "messages") from None
    _fit(prompt, sampling, context)
    logprobs = None
    if _flag(body, "logprobs"):
        logprobs = _number(body, "top_logprobs", 0, int, 0, MAX_TOP_LOGPROBS)
    elif body.get("top_logprobs"):
        raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return ParsedRequest([prompt], sampling, logprobs, False, prompt_logprobs, as_ids)


def token_strings(tokenizer: Any, ids: list[int], as_ids: bool) -> list[str]:
    """How tokens are shown: 'token_id:N' (exact, vLLM style) or each token's decoded text."""
    if as_ids:
        return [f"token_id:{t}" for t in ids]
    return [tokenizer.decode([t]) for t in ids]
