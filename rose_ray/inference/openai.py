"""The `openai` engine backend: a client for any OpenAI-compatible server.

Talks to `vllm serve` on a GPU node or to `rose-ray serve`, which is how a frozen teacher
can run outside the Ray job. Prompts go as token ids and sampled ids come back exactly
(`return_token_ids`, with "token_id:N" token strings as a fallback), so the learner trains
on the ids the server sampled. Scoring uses vLLM's `prompt_logprobs`, falling back to
`echo` + `logprobs`. Standard library only (urllib); a batch's requests go out concurrently
from a thread pool so the server can batch them.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rose_ray.inference.engine import (
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    context_result,
    resolve_prompt,
    validate_sampling,
)
from rose_ray.types import SamplingParams

MAX_BACKOFF_S = 10.0


class OpenAIServerError(RuntimeError):
    """The server answered with an error (status and its message), or could not be reached."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status, self.message = status, message

    def __reduce__(self):  # crosses Ray intact (the default would call __init__ with one argument)
        return type(self), (self.status, self.message)


class OpenAIServerGone(OpenAIServerError):
    """The server stayed unreachable (or kept failing) for `retry_s`: the engine cannot serve.
    A run treats it as the loss of that engine (the role is named), where a client error
    fails only its episode. `actor_id`: the engine actor that gave up (set by the actor)."""

    def __init__(self, status: int | None, message: str, actor_id: str | None = None) -> None:
        super().__init__(status, message)
        self.actor_id = actor_id

    def __reduce__(self):
        return type(self), (self.status, self.message, self.actor_id)


def _token_id(s: str) -> int:
    if not s.startswith("token_id:"):
        raise OpenAIServerError(None, f"server returned token {s!r}, expected 'token_id:N' "
                                "(does it support return_tokens_as_token_ids?)")
    return int(s.split(":", 1)[1])


class OpenAIEngine:
    """GenerationEngine over HTTP. The served model is frozen: update_weights is refused."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self.api_key = config.api_key or os.environ.get("ROSE_RAY_API_KEY")
        self._pool = ThreadPoolExecutor(max_workers=config.max_batch_size, thread_name_prefix="openai")
        self._counters = {"requests": 0, "generated_tokens": 0, "score_calls": 0, "http_s": 0.0, "retries": 0}

    @property
    def version(self) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        return dict(self._counters)

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url + path
        start, attempt = time.monotonic(), 0
        while True:  # a server that is down, restarting or overloaded gets retry_s to come back
            attempt += 1
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                    out = json.loads(resp.read())
                self._counters["http_s"] += time.perf_counter() - t0
                return out
            except urllib.error.HTTPError as e:
                if e.code < 500 and e.code != 429:  # a client error will not heal; a rate limit will
                    raise OpenAIServerError(e.code, _error_message(e)) from None
                error = f"{e.code}: {_error_message(e)}"
                if e.code == 429:  # wait at least what the server asks for
                    try:
                        retry_after = float(e.headers.get("Retry-After") or 0)
                    except ValueError:
                        retry_after = 0.0
                    if retry_after > 0 and time.monotonic() - start + retry_after <= self.config.retry_s:
                        self._counters["retries"] += 1
                        time.sleep(min(retry_after, MAX_BACKOFF_S * 4))
                        continue
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
                error = f"cannot reach {url}: {getattr(e, 'reason', e)}"
            pause = min(0.5 * 2 ** (attempt - 1), MAX_BACKOFF_S)
            waited = time.monotonic() - start
            if waited + pause > self.config.retry_s:
                raise OpenAIServerGone(None, f"{self.base_url}: no answer after {attempt} attempts over "
                                             f"{waited:.1f} s (engine retry_s {self.config.retry_s:g}): {error}")
            self._counters["retries"] += 1
            time.sleep(pause)

    def _model_field(self) -> dict[str, str]:
        """No model name: the server's default model (vLLM and rose-ray serve allow that)."""
        return {"model": self.config.model} if self.config.model else {}

    def models(self) -> list[str]:
        """The served model names (GET /models), under the config's timeout_s and retry_s."""
        return [str(m["id"]) for m in self._request("GET", "/models")["data"]]

    # ------------------------------------------------------------------ engine API
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        for r in requests:
            validate_sampling(r.sampling)
        return list(self._pool.map(self._generate_one, requests))

    def _generate_one(self, request: GenerationRequest) -> GenerationResult:
        ids, dropped, fits = resolve_prompt(request, self.config)
        if not fits:
            return context_result(request, len(ids), self.version)
        s = request.sampling
        max_tokens = min(s.max_new_tokens, self.config.context_tokens - len(ids))
        body: dict[str, Any] = {
            **self._model_field(), "prompt": ids, "max_tokens": max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "logprobs": request.top_logprobs,
            "return_tokens_as_token_ids": True, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": False,
        }
        if s.stop:
            body["stop"] = s.stop
        if s.seed is not None:
            body["seed"] = s.seed
        choice = self._request("POST", "/completions", body)["choices"][0]
        lp = choice.get("logprobs") or {}
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = [_token_id(t) for t in lp.get("tokens") or []]
        logprobs = lp.get("token_logprobs")
        if logprobs is None or len(logprobs) != len(token_ids):
            raise OpenAIServerError(None, "server returned no per-token logprobs for the sampled tokens")
        top = None
        if request.top_logprobs > 0:
            top = [{_token_id(k): v for k, v in (d or {}).items()} for d in lp.get("top_logprobs") or []]
        finish = choice.get("finish_reason") or "length"
        self._counters["requests"] += 1
        self._counters["generated_tokens"] += len(token_ids)
        return GenerationResult(
            text=choice.get("text", ""), token_ids=list(token_ids), logprobs=[float(x) for x in logprobs],
            finish_reason="stop" if finish == "stop" else "length", prompt_tokens=len(ids),
            version=self.version, request_id=request.request_id, dropped_turns=dropped, top_logprobs=top,
        )

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        if not prompt_ids:
            raise ValueError("score: empty prompt (the first token has no logprob)")
        if not completion_ids:
            return []
        ids = list(prompt_ids) + list(completion_ids)
        body = {**self._model_field(), "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0, "return_tokens_as_token_ids": True}
        choice = self._request("POST", "/completions", body)["choices"][0]
        self._counters["score_calls"] += 1
        n = len(completion_ids)
        plp = choice.get("prompt_logprobs")
        if plp is not None:
            out = []
            for tid, entry in zip(completion_ids, plp[-n:]):
                hit = (entry or {}).get(str(tid))
                if hit is None:
                    raise OpenAIServerError(None, f"prompt_logprobs lacks token {tid}")
                out.append(float(hit["logprob"] if isinstance(hit, dict) else hit))
            return out
        # Servers without prompt_logprobs: the legacy echo form.
        body = {**body, "echo": True, "logprobs": 0}
        body.pop("prompt_logprobs")
        choice = self._request("POST", "/completions", body)["choices"][0]
        lps = choice["logprobs"]["token_logprobs"][: len(ids)]
        return [float(x) for x in lps[-n:]]

    def chat(self, messages: list[dict[str, str]], sampling: SamplingParams,
             enable_thinking: bool | None = None, json_object: bool = False) -> tuple[str, str]:
        """One chat completion, the server applying its own chat template: (text, finish
        reason). Needs no local tokenizer, so it reaches any OpenAI-compatible server, OpenAI's
        own included (a judge). `enable_thinking` goes as vLLM's `chat_template_kwargs` only
        when given (other servers may refuse the field); `json_object` asks for JSON mode
        (`response_format`; a server without it, as `rose-ray serve`, ignores the field)."""
        validate_sampling(sampling)
        body: dict[str, Any] = {**self._model_field(), "messages": messages,
                                "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        if json_object:
            body["response_format"] = {"type": "json_object"}
        out = self._request("POST", "/chat/completions", body)
        try:
            choice = out["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise OpenAIServerError(None, f"server returned no chat message: {str(out)[:200]}") from None
        self._counters["requests"] += 1
        return str(text), str(choice.get("finish_reason") or "stop")

    def score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        return list(self._pool.map(lambda pc: self.score(*pc), pairs))

    def update_weights(self, state: dict[str, Any], version: int) -> None:
        raise NotImplementedError("the openai backend serves a frozen model; weights cannot be updated")

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
    except (ValueError, OSError):
        return e.reason or "error"
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
