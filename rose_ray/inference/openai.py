"""The `openai` engine backend: a client for any OpenAI-compatible server (vLLM's, `rose-ray serve`).

Prompts go as token ids and the sampled ids come back exactly (`return_token_ids`, else
"token_id:N" token strings), so the learner trains on what the server sampled; scoring uses
vLLM's `prompt_logprobs`, else `echo` + `logprobs`. A batch's requests go out concurrently over
aiohttp, on an event loop of the client's own thread.

Failures (docs/reliability.md): a 4xx fails its request at once; a server that does not answer
(whole, within `timeout_s`), answers 5xx or stops taking connections gets `retry_s` to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import json
import math
import os
import sys
import threading
import time
import urllib.parse
import urllib.request
import weakref
from collections.abc import Awaitable, Coroutine, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import aiohttp

from rose_ray.errors import ConfigError, InputError
from rose_ray.inference.engine import (
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    check_scored,
    early_result,
    validate_sampling,
)
from rose_ray.inference.registry import SHARED_KEY_ENV
from rose_ray.types import SamplingParams

MAX_BACKOFF_S = 10.0
LIVENESS_S = 2.0  # how often the server of a request out is probed (`_send`)
PROBE_TIMEOUT_S = 5.0
# The largest reply read (a 32k-token prompt's prompt_logprobs take a few MB).
MAX_REPLY_BYTES = 64 * 2**20
MAX_ERROR_BYTES = 64 * 2**10  # of an error reply's body, for its message
T = TypeVar("T")


class OpenAIServerError(RuntimeError):
    """The server answered with an error (status and its message), or could not be reached.
    `actor_id`: the engine actor whose call it was (set by the actor), so a run can name the role."""

    def __init__(self, status: int | None, message: str, actor_id: str | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status, self.message, self.actor_id = status, message, actor_id

    def __reduce__(self):  # crosses Ray intact (the default would call __init__ with one argument)
        return type(self), (self.status, self.message, self.actor_id)


class OpenAIServerGone(OpenAIServerError):
    """The server stayed unreachable (or kept failing) for `retry_s`: a run loses that engine."""


class OpenAIRequestFailed(OpenAIServerError):
    """The server failed this request again (500) while it answered others: only its episode fails."""


class OpenAIBadAnswer(OpenAIServerError):
    """An answer a run cannot use (too large, not JSON, a field missing, a logprob not finite or
    above 0, a token id outside the vocabulary): only its episode fails."""


_MISSING = object()
_KINDS = {list: "a list", dict: "an object", str: "a string"}  # for messages


def _dig(reply: Any, *path: str | int, kind: type | tuple[type, ...] | None = None, default: Any = _MISSING,
         at: str = "") -> Any:
    """`reply[path[0]][path[1]]...`; a missing field (without `default`) or one not of `kind` (the
    first of several named) is an OpenAIBadAnswer naming it (`at`: where `reply` sits in the reply)."""
    value, where = reply, at
    for key in path:
        where += f"[{key}]" if isinstance(key, int) else (f".{key}" if where else key)
        found = (isinstance(value, list) and -len(value) <= key < len(value) if isinstance(key, int)
                 else isinstance(value, dict) and key in value)
        if not found:
            if default is not _MISSING:
                return default
            shape = (f"its keys: {sorted(map(str, reply))[:10]}" if isinstance(reply, dict)
                     else f"it is {type(reply).__name__} {str(reply)[:80]!r}")
            raise OpenAIBadAnswer(None, f"the server's reply has no {where} ({shape})")
        value = value[key]
    if kind is not None and not isinstance(value, kind):
        raise _unexpected(where, value, _KINDS[kind[0] if isinstance(kind, tuple) else kind])
    return value


def _unexpected(where: str, value: Any, expected: str) -> OpenAIBadAnswer:
    return OpenAIBadAnswer(None, f"the server's reply has {where} = {str(value)[:80]!r}, expected {expected}")


def _logprob(value: Any, where: str) -> float:
    """A logprob the server gave: a finite number, at most 0; else OpenAIBadAnswer naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _unexpected(where, value, "a logprob (a number)")
    x = float(value)
    if not math.isfinite(x) or x > 0.0:
        raise OpenAIBadAnswer(None, f"the server's reply has logprob {x!r} at {where}: a logprob must be finite "
                                    "and at most 0 (nothing of it is trained on)")
    return x


def _loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):  # (not an address)
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    return False


def check_served_urls(engines: list[tuple[str, EngineConfig]], nodes: int) -> None:
    """On a cluster of several nodes, a served engine's URL (`engines`: role and engine) must not
    be a loopback address, which names each engine actor's own machine (ConfigError)."""
    for role, engine in engines if nodes > 1 else ():
        if engine.spec.served and _loopback(urllib.parse.urlsplit(engine.backend.base_url).hostname or ""):
            raise ConfigError(f"{role}_engine.backend.base_url: {engine.backend.base_url} is a loopback address, but "
                              f"this cluster has {nodes} nodes and the {role} engine's actor may run on any of them; "
                              "give the server's address as the other nodes reach it")


def flag_key_env(flag: str) -> str | None:
    """The variable holding the key of the served model a command's `flag` names (`--teacher`:
    ROSE_RAY_TEACHER_API_KEY), when it is set."""
    name = f"ROSE_RAY_{flag.lstrip('-').upper().replace('-', '_')}_API_KEY"
    return name if os.environ.get(name) else None


def endpoint_key(config: EngineConfig) -> tuple[str | None, str]:
    """The key an endpoint's requests carry, and its source (for messages): its `api_key`, else
    the variable `api_key_env` names (unset: an error), else the shared $ROSE_RAY_API_KEY. Over
    plain http to another host the shared key is not sent, an endpoint's own is, with a warning.
    An `api_key_env` of ROSE_RAY_API_KEY (a resumed run's saved config) is the shared key."""
    url = urllib.parse.urlsplit(config.backend.base_url)
    plain = url.scheme == "http" and not _loopback(url.hostname or "")
    env, shared = config.backend.api_key_env, config.backend.api_key_env == SHARED_KEY_ENV
    if config.backend.api_key and not shared:
        key, source = config.backend.api_key, "its api_key"
    elif env and not shared:
        key, source = os.environ.get(env), f"${env} (its api_key_env)"
        if not key:
            raise InputError(f"engine.backend.api_key_env: {env} is not set in the environment (the key of "
                             f"{config.backend.base_url})")
    else:
        key, source = config.backend.api_key or os.environ.get(SHARED_KEY_ENV) or None, f"${SHARED_KEY_ENV}"
        if key and plain:
            print(f"openai engine: {config.backend.base_url}: not sending ${SHARED_KEY_ENV} over plain http to another host "
                  "(anyone on the network path could read it); use https, or name the variable of this "
                  "endpoint's own key in api_key_env", file=sys.stderr, flush=True)
            return None, "none"
    if key and plain:
        print(f"openai engine: {config.backend.base_url}: warning: {source} goes over plain http to another host; anyone "
              "on the network path can read it (use https)", file=sys.stderr, flush=True)
    return key, source


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The event loop, on a thread of its own, that every openai engine of this process sends on."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="openai-client", daemon=True).start()
        return _LOOP


async def _new_session() -> aiohttp.ClientSession:
    # No pool limit: max_batch_size bounds what is out, and a pool wait would count in timeout_s.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


async def _gather(work: Iterable[Awaitable[T]]) -> list[T]:
    return list(await asyncio.gather(*work))


class _Status(Exception):
    """The server answered with an error status; a 429's Retry-After in seconds (an HTTP date is not read)."""

    def __init__(self, status: int, message: str, retry_after: str | None) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message
        seconds = status == 429 and (retry_after or "").replace(".", "", 1).isdecimal()
        self.retry_after = float(retry_after) if seconds else 0.0  # type: ignore[arg-type]


class _CutOff(Exception):
    """A request cut off: no whole answer within timeout_s, or its server stopped taking connections."""


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """A body's first `limit` + 1 bytes at most (more than `limit`: it goes on)."""
    try:
        return await response.content.readexactly(limit + 1)
    except asyncio.IncompleteReadError as e:  # the whole body, shorter
        return e.partial


async def _error_message(response: aiohttp.ClientResponse) -> str:
    try:
        body = json.loads(await _read_at_most(response, MAX_ERROR_BYTES))
    except (ValueError, RecursionError, aiohttp.ClientError):
        return response.reason or "error"
    err = body.get("error", body) if isinstance(body, dict) else body
    return str(err.get("message", err) if isinstance(err, dict) else err)


class OpenAIEngine:
    """GenerationEngine over HTTP (aiohttp). The served model is frozen: update_weights is refused."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.base_url = config.backend.base_url.rstrip("/")
        self.api_key, self.api_key_source = endpoint_key(config)
        self._tokenizer = config.tokenizer or config.model
        self._counters = {"requests": 0, "generated_tokens": 0, "score_calls": 0, "http_s": 0.0, "retries": 0,
                          "cut_off": 0}
        self._answered_at = 0.0  # when the server last answered a request (any)
        self._in_flight = asyncio.Semaphore(config.max_batch_size)  # requests out at once
        self._probe: asyncio.Future[str | None] | None = None  # the latest liveness probe (`_send`)
        self._probed_at = -math.inf
        url = urllib.parse.urlsplit(self.base_url)
        self._address = (url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80))
        # The environment's proxy, as urllib reads it; through one, a direct probe says nothing.
        proxy = urllib.request.getproxies().get(url.scheme)
        self._proxy = proxy if proxy and not urllib.request.proxy_bypass(self._address[0]) else None
        self._session = session = self._run(_new_session())
        # Closed with the engine, or when it is collected without close().
        self._close = weakref.finalize(self, _loop().call_soon_threadsafe,
                                       lambda: asyncio.ensure_future(session.close()))

    version = 0  # the served model's weights never change here

    def stats(self) -> dict[str, Any]:
        return dict(self._counters)

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` on the client's loop; its result here."""
        return asyncio.run_coroutine_threadsafe(work, _loop()).result()

    # ------------------------------------------------------------------ HTTP
    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        url = self.base_url + path
        failing_since: float | None = None  # retry_s counts from the first failure, not from a long wait
        rejected_at: float | None = None  # this request's first 500
        async with self._in_flight:
            for attempt in itertools.count(1):  # a server down or overloaded gets retry_s to come back
                retry_after = 0.0
                t0 = time.perf_counter()
                try:
                    out = await self._send(method, url, data)
                    self._counters["http_s"] += time.perf_counter() - t0
                    self._answered_at = time.monotonic()
                    return out
                except _Status as e:
                    if e.status < 500 and e.status != 429:  # a client error will not heal; a rate limit will
                        raise OpenAIServerError(e.status, e.message) from None
                    if e.status == 500:  # the request's own failure, or the server's?
                        if rejected_at is not None and await self._answers_others(rejected_at):
                            raise OpenAIRequestFailed(500, f"{e.message} (this request failed {attempt} times "
                                                           f"while {self.base_url} answered others)") from None
                        rejected_at = rejected_at or time.monotonic()
                    error, retry_after = str(e), e.retry_after  # a rate limit waits at least what it asks
                except _CutOff as e:
                    error = str(e)
                except (aiohttp.ClientError, OSError) as e:
                    error = f"cannot reach {url}: {e}"
                failing_since = failing_since or time.monotonic()
                waited = time.monotonic() - failing_since
                pause = min(0.5 * 2 ** (attempt - 1), MAX_BACKOFF_S)
                if retry_after > 0 and waited + retry_after <= self.config.backend.retry_s:
                    pause = min(retry_after, MAX_BACKOFF_S * 4)
                elif waited + pause > self.config.backend.retry_s:
                    raise OpenAIServerGone(None, f"{self.base_url}: no answer after {attempt} attempts over "
                                                 f"{waited:.1f} s (engine retry_s {self.config.backend.retry_s:g}): "
                                                 f"{error}")
                self._counters["retries"] += 1
                await asyncio.sleep(pause)

    async def _send(self, method: str, url: str, data: bytes | None, timeout_s: float | None = None) -> Any:
        """One HTTP exchange, its JSON answer. While it is out, its server is probed (a TCP connect,
        one for all requests out, not through a proxy) every LIVENESS_S: one that refuses
        connections is going away and would never answer, so the exchange is cut off."""
        timeout_s = timeout_s or self.config.backend.timeout_s
        exchange = asyncio.ensure_future(self._exchange(method, url, data, timeout_s))
        try:
            while not (await asyncio.wait({exchange}, timeout=LIVENESS_S if self._proxy is None else None))[0]:
                if time.monotonic() - self._probed_at >= LIVENESS_S:
                    self._probe, self._probed_at = asyncio.ensure_future(self._unreachable()), time.monotonic()
                # The answer may come while the probe is out: it is returned at once (the probe goes on).
                await asyncio.wait({exchange, self._probe}, return_when=asyncio.FIRST_COMPLETED)
                if exchange.done():
                    break
                if (why := self._probe.result()) is not None:
                    self._counters["cut_off"] += 1
                    raise _CutOff(f"{self.base_url} stopped taking connections ({why}) while the request was "
                                  "out: the server is going away")
            return exchange.result()
        except asyncio.TimeoutError:
            self._counters["cut_off"] += 1
            raise _CutOff(f"{self.base_url}: no whole answer within {timeout_s:g} s (engine timeout_s)") from None
        finally:
            exchange.cancel()

    async def _exchange(self, method: str, url: str, data: bytes | None, timeout_s: float) -> Any:
        """The request and its whole answer within `timeout_s` (a trickled answer trips it too);
        aiohttp drops the key on a redirect to another scheme, host or port."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s > 0 else None)
        async with self._session.request(method, url, data=data, headers=headers, proxy=self._proxy,
                                         timeout=timeout) as response:
            if response.status >= 400:
                raise _Status(response.status, await _error_message(response), response.headers.get("Retry-After"))
            raw = await _read_at_most(response, MAX_REPLY_BYTES)
        if len(raw) > MAX_REPLY_BYTES:
            raise OpenAIBadAnswer(None, f"{url}: the reply is larger than {MAX_REPLY_BYTES // 2**20} MiB; "
                                        "not read further")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise OpenAIBadAnswer(None, f"{url}: the reply is not JSON ({type(e).__name__}: {str(e)[:120]}): "
                                        f"{raw[:80]!r}") from None

    async def _unreachable(self) -> str | None:
        """Why the server's address refuses a TCP connection, or None when it takes one."""
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(*self._address), PROBE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            return str(e) or type(e).__name__
        writer.close()
        return None

    def key_hint(self) -> str:
        """Which key a refused request carried, for the error."""
        if self.api_key:
            return f"the key from {self.api_key_source} was refused"
        return (f"no key was sent: set the endpoint's own key (api_key, api_key_env, ROSE_RAY_<FLAG>_API_KEY) or "
                f"{SHARED_KEY_ENV}")

    async def _answers_others(self, since: float) -> bool:
        """Whether the server answered another request after `since`, or answers a one-token probe now."""
        if self._answered_at > since:
            return True
        probe = {**self._model_field(), "prompt": [0], "max_tokens": 1, "temperature": 0.0}
        try:
            await self._send("POST", self.base_url + "/completions", json.dumps(probe).encode(),
                             timeout_s=min(self.config.backend.timeout_s, 60.0))
        except (_Status, _CutOff, aiohttp.ClientError, OSError):
            return False
        except OpenAIBadAnswer:  # an answer all the same
            pass
        return True

    def _model_field(self) -> dict[str, str]:
        """No model name: the server's default model (vLLM and rose-ray serve allow that)."""
        return {"model": self.config.model} if self.config.model else {}

    def served(self) -> dict[str, int | None]:
        """The served models (GET /models): name -> `max_model_len` (None where a server does not say)."""
        models = _dig(self._run(self._request("GET", "/models")), "data", kind=list)
        limits = [_dig(models, i, "max_model_len", default=None, at="data") for i in range(len(models))]
        return {_dig(models, i, "id", kind=str, at="data"): limit if type(limit) is int else None
                for i, limit in enumerate(limits)}

    def models(self) -> list[str]:
        return list(self.served())

    # ------------------------------------------------------------------ engine API
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        for r in requests:
            validate_sampling(r.sampling)
        vocab = self._vocab  # here, not on the loop: the first call loads the tokenizer
        return self._run(_gather(self._generate_one(r, vocab) for r in requests))

    async def _generate_one(self, request: GenerationRequest, vocab: int | None) -> GenerationResult:
        ids = list(request.prompt_ids)
        if (early := early_result(request, self.config, self.version)) is not None:
            return early
        s = request.sampling
        max_tokens = min(s.max_new_tokens, self.config.context_tokens - len(ids))
        body: dict[str, Any] = {
            **self._model_field(), "prompt": ids, "max_tokens": max_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "logprobs": request.top_logprobs,
            "return_tokens_as_token_ids": True, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": False, "stop": s.stop, "seed": s.seed,
        }
        reply = await self._request("POST", "/completions", body)
        choice = _dig(reply, "choices", 0, kind=dict)
        lp = _dig(choice, "logprobs", default=None, at="choices[0]") or {}  # [] or "" from some servers: none
        at = "choices[0].token_ids"
        token_ids = _dig(choice, "token_ids", kind=(list, type(None)), default=None, at="choices[0]")
        if token_ids is None:  # servers without return_token_ids: "token_id:N" token strings
            at = "choices[0].logprobs.tokens"
            token_ids = _dig(lp, "tokens", kind=list, default=[], at="choices[0].logprobs")
        token_ids = [self._token_id(t, f"{at}[{i}]", vocab) for i, t in enumerate(token_ids)]
        logprobs = _dig(lp, "token_logprobs", default=None, at="choices[0].logprobs")
        if not isinstance(logprobs, list) or len(logprobs) != len(token_ids):
            raise OpenAIServerError(None, "server returned no per-token logprobs for the sampled tokens")
        logprobs = [_logprob(x, f"choices[0].logprobs.token_logprobs[{i}]") for i, x in enumerate(logprobs)]
        top = None
        if request.top_logprobs > 0:
            top = []
            for i, d in enumerate(_dig(lp, "top_logprobs", kind=list, default=None, at="choices[0].logprobs") or []):
                here = f"choices[0].logprobs.top_logprobs[{i}]"
                top.append({self._token_id(k, here, vocab): _logprob(v, f"{here}[{k!r}]")
                            for k, v in _dig(d or {}, kind=dict, at=here).items()})
        self._counters["requests"] += 1
        self._counters["generated_tokens"] += len(token_ids)
        return GenerationResult(
            text=str(choice.get("text", "")), token_ids=token_ids, logprobs=logprobs, prompt_tokens=len(ids),
            finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
            version=self.version, request_id=request.request_id, top_logprobs=top,
        )

    def _token_id(self, value: Any, where: str, vocab: int | None) -> int:
        """A token id the server gave (an int, or "token_id:N"): in [0, the local tokenizer's size);
        else OpenAIBadAnswer."""
        if isinstance(value, str):
            if not value.startswith("token_id:") or not value[len("token_id:"):].isdigit():
                raise OpenAIBadAnswer(None, f"the server's reply has token {value!r} at {where}, expected "
                                            "'token_id:N' (does it support return_tokens_as_token_ids?)")
            value = int(value[len("token_id:"):])
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise OpenAIBadAnswer(None, f"the server's reply has token id {str(value)[:40]} at {where}: a "
                                        "token id is an int >= 0")
        if vocab is not None and value >= vocab:
            raise OpenAIBadAnswer(None, f"the server's reply has token id {value} at {where}: outside the "
                                        f"vocabulary [0, {vocab}) of {self._tokenizer}")
        return value

    @functools.cached_property
    def _vocab(self) -> int | None:
        """The local tokenizer's size; None without a tokenizer here (a judge talks text)."""
        from rose_ray.models import ModelNotAvailable, load_tokenizer

        try:
            return len(load_tokenizer(self._tokenizer)) if self._tokenizer else None
        except ModelNotAvailable:
            return None

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        return self.score_many([(prompt_ids, completion_ids)])[0]

    def score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        check_scored(pairs, math.inf)  # (the server checks the length)
        return self._run(_gather(self._score(p, c) for p, c in pairs))

    async def _score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        if not completion_ids:
            return []
        ids = list(prompt_ids) + list(completion_ids)
        body = {**self._model_field(), "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0, "return_tokens_as_token_ids": True}
        choice = _dig(await self._request("POST", "/completions", body), "choices", 0, kind=dict)
        self._counters["score_calls"] += 1
        n = len(completion_ids)
        plp = _dig(choice, "prompt_logprobs", kind=(list, type(None)), default=None, at="choices[0]")
        if plp is None:  # a server without prompt_logprobs: the legacy echo form
            body = {**{k: v for k, v in body.items() if k != "prompt_logprobs"}, "echo": True, "logprobs": 0}
            choice = _dig(await self._request("POST", "/completions", body), "choices", 0, kind=dict)
            lps = _dig(choice, "logprobs", "token_logprobs", kind=list, at="choices[0]")[: len(ids)]
            if len(lps) < n:
                raise OpenAIBadAnswer(None, f"the server's reply has {len(lps)} echoed logprobs "
                                            f"for {n} tokens")
            return [_logprob(x, f"choices[0].logprobs.token_logprobs[{len(lps) - n + i}]")
                    for i, x in enumerate(lps[-n:])]
        if len(plp) < n:
            raise OpenAIBadAnswer(None, f"the server's reply has choices[0].prompt_logprobs of {len(plp)} "
                                        f"entries for a prompt of {len(ids)} tokens")
        out = []
        for i, (tid, entry) in enumerate(zip(completion_ids, plp[-n:])):
            where = f"choices[0].prompt_logprobs[{len(plp) - n + i}][{str(tid)!r}]"
            hit = entry.get(str(tid)) if isinstance(entry, dict) else None
            if hit is None:
                raise OpenAIServerError(None, f"prompt_logprobs lacks token {tid}")
            out.append(_logprob(_dig(hit, "logprob", at=where) if isinstance(hit, dict) else hit, where))
        return out

    def chat(self, messages: list[dict[str, str]], sampling: SamplingParams,
             enable_thinking: bool | None = None, json_object: bool = False) -> tuple[str, str]:
        """One chat completion with the server's chat template: (text, finish reason). Needs no
        local tokenizer (a judge). `enable_thinking` goes as vLLM's `chat_template_kwargs` only
        when given; `json_object` asks for JSON mode (`response_format`)."""
        validate_sampling(sampling)
        body: dict[str, Any] = {**self._model_field(), "messages": messages, "seed": sampling.seed,
                                "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature}
        if enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
        if json_object:
            body["response_format"] = {"type": "json_object"}
        choice = _dig(self._run(self._request("POST", "/chat/completions", body)), "choices", 0, kind=dict)
        text = _dig(choice, "message", kind=dict, at="choices[0]").get("content") or ""
        self._counters["requests"] += 1
        return str(text), str(choice.get("finish_reason") or "stop")

    def update_weights(self, state: dict[str, Any], version: int) -> None:
        raise NotImplementedError("the openai backend serves a frozen model; weights cannot be updated")

    def close(self) -> None:
        self._close()


@dataclass(frozen=True)
class SettingNames:
    """The names (config keys or a command's flags) errors give an openai engine's settings."""

    base_url: str
    model: str
    context_tokens: str
    tokenizer: str

    @classmethod
    def of_section(cls, section: str) -> SettingNames:
        """The keys of a config section, e.g. `teacher_engine`."""
        return cls(f"{section}.backend.base_url", *(f"{section}.{key}" for key in ("model", "context_tokens", "tokenizer")))


@dataclass(frozen=True)
class ServedModel:
    """What a server said about the model a run will use."""

    name: str
    url: str
    max_model_len: int | None  # None where the server does not say
    scores: bool  # prompt scoring was checked too

    def __str__(self) -> str:
        context = f"max_model_len {self.max_model_len}" if self.max_model_len is not None else "context not said"
        return f"{self.name!r} served at {self.url} ({context}; logprobs{' and scoring' if self.scores else ''} checked)"


def check_served(config: EngineConfig, names: SettingNames, scores: bool = False) -> ServedModel:
    """Before a run, asking the server once: it serves `config.model` (or a default), with a
    `max_model_len` of at least `config.context_tokens`, and gives sampled ids and logprobs (and
    prompt logprobs when the run `scores`: OPD); the local tokenizer loads. Raises
    InputError (exit 2) naming the setting."""
    from rose_ray.models import ModelNotAvailable, load_tokenizer

    url = config.backend.base_url
    try:
        load_tokenizer(config.tokenizer or config.model)
    except ModelNotAvailable as e:
        raise InputError(f"{names.tokenizer}: an openai engine needs the served model's tokenizer on this "
                         f"machine (prompts go as token ids): {e}") from None
    engine = OpenAIEngine(replace(config, max_batch_size=1, backend=replace(config.backend, retry_s=0.0)))
    with contextlib.closing(engine):
        try:
            served = engine.served()
        except OpenAIServerGone as e:
            raise InputError(f"{names.base_url}: {e}") from None
        except OpenAIServerError as e:
            hint = f" ({engine.key_hint()})" if e.status in (401, 403) else ""
            raise InputError(f"{names.base_url}: {url}/models: {e}{hint}") from None
        if not served:
            raise InputError(f"{names.base_url}: the server at {url} serves no model")
        if config.model and config.model not in served:
            raise InputError(f"{names.model}: the server at {url} does not serve {config.model!r}; it "
                             f"serves {sorted(served)}")
        name = config.model or next(iter(served))  # without a name the server answers with its first
        limit = served[name]
        if limit is not None and config.context_tokens > limit:
            raise InputError(f"{names.context_tokens}: {config.context_tokens} tokens is more than the "
                             f"served model's context ({name!r} at {url}: max_model_len {limit}); set "
                             f"{limit} or less, or serve it with a longer --max-model-len")
        try:
            engine.generate([GenerationRequest([0, 1], SamplingParams(0.0, max_new_tokens=1))])
            if scores:
                engine.score([0], [1])
        except OpenAIServerError as e:
            what = "token ids and logprobs of sampled tokens" + (", and prompt logprobs to score tokens"
                                                                  if scores else "")
            raise InputError(f"{names.model}: {name!r} at {url} does not give what a run needs ({what}): "
                             f"{e}") from None
    return ServedModel(name, url, limit, scores)
