"""`rose-ray serve`: an OpenAI-compatible HTTP endpoint over a transformers engine (`hf`), for
machines without vLLM, whose own OpenAI server is the one to use where it runs (docs/engines.md).
It speaks the vLLM extensions the learner relies on (`prompt_logprobs`, `return_tokens_as_token_ids`,
`token_ids` / `prompt_token_ids` on every choice).

Bad input never takes the server down: each bad request gets a 4xx JSON error naming what was
wrong, and a client that goes away costs only its own computation. Without an API key it answers
only a Host that is an IP address or localhost (against DNS rebinding); requiring JSON keeps web
pages from posting to it (a CORS preflight it never grants).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import itertools
import json
import logging
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from rose_ray.inference.batcher import async_frontend
from rose_ray.inference.engine import GenerationRequest, GenerationResult
from rose_ray.inference.protocol import (
    MAX_CONCURRENT,
    MAX_PROMPTS,
    RequestError,
    max_body_bytes,
    parse_chat,
    parse_completion,
    token_strings,
)

BATCHER = web.AppKey("batcher", object)  # an AsyncBatcher, or the engine's own frontend
PARSER = web.AppKey("parser", ThreadPoolExecutor)
# Bodies above this are tokenized off the event loop (seconds for a few MiB).
PARSE_INLINE_BYTES = 1 << 16
ROUTES = "GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions"
READ_TIMEOUT_S = 60.0  # for a request's body to arrive
IDLE_TIMEOUT_S = 75.0  # a connection with no request (or no next one) is closed after this
log = logging.getLogger(__name__)


def vllm_server(args: Any) -> list[str] | None:
    """The command of vLLM's own OpenAI server for `serve --backend vllm` (its module: `vllm serve`
    does not start on vLLM's CPU build); None for the backend this server runs."""
    if args.backend != "vllm":
        return None
    return ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, "--served-model-name",
            args.served_model_name or args.model, "--host", args.host, "--port", str(args.port),
            "--max-model-len", str(args.context_tokens), "--dtype", args.dtype]


class OpenAIServer(contextlib.AbstractContextManager):
    """The aiohttp app for one engine; `run` blocks, `start_background` returns at once."""

    def __init__(self, engine: Any, model_name: str, api_key: str | None = None,
                 max_concurrent: int = MAX_CONCURRENT, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.engine = engine
        self.model_name = model_name
        self.api_key = api_key or None
        self.context_tokens = engine.config.context_tokens
        self.max_body = max_body_bytes(self.context_tokens)
        self.max_concurrent = max_concurrent
        self.read_timeout_s = read_timeout_s
        self.in_flight = 0  # only the event loop's thread counts

    # ------------------------------------------------------------------ app
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._access, self._limit],
                              client_max_size=self.max_body)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", functools.partial(self._generate, chat=False))
        app.router.add_post("/v1/chat/completions", functools.partial(self._generate, chat=True))

        async def start(app: web.Application) -> None:
            app[BATCHER] = async_frontend(self.engine)
            app[PARSER] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parse")

        async def stop(app: web.Application) -> None:
            await app[BATCHER].close()
            app[PARSER].shutdown(wait=False, cancel_futures=True)

        app.on_startup.append(start)
        app.on_cleanup.append(stop)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as e:
            return _error(e.status, e.message, e.param)
        except web.HTTPException as e:
            what = {404: f"no endpoint {request.method} {request.path}",
                    405: f"{request.method} is not allowed on {request.path}"}.get(e.status)
            return _error(e.status, f"{what}; this server has {ROUTES}" if what else e.reason or "error")
        except ValueError as e:  # engine-side validation (sampling, lengths)
            return _error(400, str(e))
        except ConnectionError:  # the client went away mid-body; nobody reads this answer
            return _error(400, "the request body ended early (the client went away)")
        except Exception as e:  # not bad input we could name: say what failed, log it, keep serving
            log.exception("error handling %s %s", request.method, request.path)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            return _error(500, f"internal server error: {type(e).__name__}: {first} (logged by the server)",
                          kind="server_error")

    @web.middleware
    async def _access(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """With a key, /v1/ needs it; without, only a Host that is an IP address or localhost (see the
        module's note)."""
        host = request.headers.get("Host")
        if self.api_key and request.path.startswith("/v1/"):
            # aiohttp decodes header bytes that are not UTF-8 as surrogates; encode them back.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
                return _error(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                              kind="authentication_error")
        elif not self.api_key and host is not None and not _literal_host(host):
            return _error(403, f"Host {host[:100]!r} refused: this server has no API key, so it answers only "
                               "requests to an IP address or localhost (start it with --api-key to serve a name)",
                          kind="permission_error")
        return await handler(request)

    @web.middleware
    async def _limit(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/v1/") or request.method != "POST":
            return await handler(request)
        if self.in_flight >= self.max_concurrent:
            return _error(429, f"this server is handling {self.in_flight} requests, its limit "
                               f"(max_concurrent {self.max_concurrent}); retry shortly",
                          kind="rate_limit_error", headers={"Retry-After": "1"})
        self.in_flight += 1
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1

    # ------------------------------------------------------------------ handlers
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": self.engine.version})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "rose_ray",
             "max_model_len": self.context_tokens}]})

    async def _body(self, request: web.Request) -> tuple[dict[str, Any], int]:
        """The request's JSON object and its size in bytes."""
        if request.content_type != "application/json":  # aiohttp's default when none is sent: octet-stream
            raise RequestError(f"Content-Type {request.headers.get('Content-Type', '(none)')[:100]!r}: "
                               "this server reads JSON bodies only; send 'Content-Type: application/json'",
                               status=415)
        size = request.content_length
        if size is not None and size > self.max_body:  # refused before a byte is read
            raise RequestError(self._too_big(size), status=413)
        try:
            raw = await asyncio.wait_for(request.read(), self.read_timeout_s)
        except web.HTTPRequestEntityTooLarge:  # a chunked body, counted as it came
            raise RequestError(self._too_big(None), status=413) from None
        except asyncio.TimeoutError:
            raise RequestError(f"the request body did not arrive within {self.read_timeout_s:g} s",
                               status=408) from None
        try:
            body = json.loads(raw, parse_constant=_finite, parse_float=_finite)
        except RecursionError:
            raise RequestError("request body is nested too deeply") from None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, NaN, ints over 4,300 digits
            raise RequestError(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise RequestError(f"the model {model!r} does not exist; this server serves "
                               f"{self.model_name!r}", "model", status=404)
        return body, len(raw)

    def _too_big(self, size: int | None) -> str:
        said = f" ({size:,} bytes)" if size is not None else ""
        return (f"request body too large{said}: this server takes at most {self.max_body:,} bytes, "
                f"room for {MAX_PROMPTS} prompts of {self.context_tokens:,} tokens (its context)")

    async def _generate(self, request: web.Request, chat: bool) -> web.Response:
        """Both completion routes in vLLM's shapes; big bodies are parsed on the parse thread."""
        tok = self.engine.tokenizer
        parse, parse_with = (parse_chat, self.engine.chat) if chat else (parse_completion, tok)
        body, size = await self._body(request)
        if size <= PARSE_INLINE_BYTES:
            p = parse(body, parse_with, self.context_tokens)
        else:
            p = await asyncio.get_running_loop().run_in_executor(
                request.app[PARSER], parse, body, parse_with, self.context_tokens)
        runs = await asyncio.gather(*(self._run(request.app[BATCHER], prompt, p) for prompt in p.prompts))

        def shown(ids: list[int]) -> list[str]:
            return token_strings(tok, ids, p.token_ids_as_strings)

        choices = []
        for index, (prompt, (result, prompt_lps)) in enumerate(zip(p.prompts, runs)):
            ids = result.token_ids
            finish = "length" if result.finish_reason == "context" else result.finish_reason
            choice: dict[str, Any] = {"index": index, "finish_reason": finish, "token_ids": ids,
                                      "prompt_token_ids": prompt, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": result.text}
                if p.logprobs is not None and p.sampling.max_new_tokens > 0:  # (something was sampled)
                    tops = result.top_logprobs or [{}] * len(ids)
                    choice["logprobs"] = {"content": [
                        {**_chat_token(s, lp), "top_logprobs": [_chat_token(shown([k])[0], v)
                                                                for k, v in top.items()]}
                        for s, lp, top in zip(shown(ids), result.logprobs, tops)]}
            else:
                choice["text"] = (tok.decode(prompt) + result.text) if p.echo else result.text
                if p.logprobs is not None:
                    strings = shown((prompt + ids) if p.echo else ids)
                    tops = None
                    if p.logprobs > 0:
                        tops = [{shown([k])[0]: v for k, v in d.items()} for d in result.top_logprobs or []]
                        if p.echo:
                            tops = [None, *({s: lp} for s, lp in zip(strings[1:], prompt_lps)), *tops]
                    lps = ([None, *prompt_lps] if p.echo else []) + result.logprobs
                    offsets = list(itertools.accumulate(map(len, strings), initial=0))[:-1]
                    choice["logprobs"] = {"tokens": strings, "token_logprobs": lps, "top_logprobs": tops,
                                          "text_offset": offsets}
            if p.prompt_logprobs is not None:  # vLLM's: None for the first token, then {id: {logprob, ...}}
                choice["prompt_logprobs"] = [None] + [
                    {str(t): {"logprob": lp, "rank": None, "decoded_token": tok.decode([t])}}
                    for t, lp in zip(prompt[1:], prompt_lps)]
            choices.append(choice)
        # vLLM's chat reply has the prompt's ids and logprobs beside its one choice.
        fields = {k: choices[0].pop(k) for k in ("prompt_token_ids", "prompt_logprobs")
                  if chat and k in choices[0]}
        prompt_tokens, completion_tokens = sum(map(len, p.prompts)), sum(len(c["token_ids"]) for c in choices)
        return web.json_response({
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices, **fields,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "rose_ray": {"version": self.engine.version}})

    async def _run(self, batcher: Any, prompt: list[int], p: Any) -> tuple[GenerationResult, list[float]]:
        """Generation (max_tokens 0: nothing sampled) and prompt scoring, concurrently."""
        want_prompt = p.prompt_logprobs is not None or (p.echo and p.logprobs is not None)
        request = GenerationRequest(prompt, p.sampling, top_logprobs=p.logprobs or 0)
        if not (want_prompt and len(prompt) > 1):
            return await batcher.generate(request), []
        scored = batcher.score(prompt[:1], prompt[1:])
        result, prompt_lps = await asyncio.gather(batcher.generate(request), scored)
        return result, prompt_lps

    # ------------------------------------------------------------------ running
    def run(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        web.run_app(self.app(), host=host, port=port, print=None, keepalive_timeout=IDLE_TIMEOUT_S)

    def start_background(self, host: str = "127.0.0.1", port: int = 0) -> OpenAIServer:
        """Serves on an event-loop thread of its own (tests, notebooks) and returns at once, with
        `port` bound and `url` set; `stop()`, or leaving a `with`, stops it."""
        self._runner = web.AppRunner(self.app(), keepalive_timeout=IDLE_TIMEOUT_S)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-server", daemon=True)
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(host, port), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        self.url = f"http://{host}:{self.port}/v1"
        return self

    async def _start(self, host: str, port: int) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
           headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status, headers=headers)


def _literal_host(host: str) -> bool:
    """Whether a Host header names an IP address (v6 in brackets) or localhost, port or not."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1:host.find("]")] if "]" in host else ""
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    with contextlib.suppress(ValueError):  # (not an address)
        return name in ("localhost", "localhost.") or bool(ipaddress.ip_address(name))
    return False


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # NaN, Infinity (no JSON numbers), or 1e999 (parses as inf)
        raise ValueError(f"{text} is {'out of range' if text[-1].isdigit() else 'not a JSON number'}")
    return value


def _chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
