"""The `vllm` engine backend: vLLM's V1 engine in this process, stepped by a thread of its own
that adds each request as it arrives (continuous batching); callers wait on a future.

Weight updates come in order with the requests: running ones finish first (publish.in_flight
`wait`) or are preempted and recomputed on the new weights (`keep`, docs/engines.md). Weights
reload in place, then the prefix cache is reset; a reset vLLM keeps refusing stops the engine
(PrefixCacheNotReset) rather than serve the old keys and values.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rose_ray.inference.batcher import REGROUP_FACTOR, settle
from rose_ray.inference.engine import (
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    LocalEngine,
    check_scored,
    early_result,
    resolve_dtype,
)
from rose_ray.inference.hf import checked_weights

# Defaults set before vLLM is imported in this process:
VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process: weights pass as tensors
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the cores Ray gave this actor; do not pin
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
}
# vLLM warnings dropped from the log, each repeated on every reload or call: (logger, message
# start, first argument or None to match any).
EXPECTED_VLLM_WARNINGS = (
    # an in-place reload finds no checkpoint tensor for the (computed) rotary cache
    ("vllm.model_executor.model_loader.reload.layerwise", "%s: Failed to load weights", "RotaryEmbedding"),
    # its CPU worker turns torch.set_num_threads into a no-op that warns at each call, its own included
    ("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads`", None),
)
# A refused prefix-cache reset is tried this many times, PREFIX_RESET_WAIT_S apart, before the engine fails.
PREFIX_RESET_TRIES = 3
PREFIX_RESET_WAIT_S = 0.1


def _not_expected(record: logging.LogRecord) -> bool:
    return not any(record.name == name and str(record.msg).startswith(start)
                   and (arg is None or bool(record.args) and record.args[0] == arg)
                   for name, start, arg in EXPECTED_VLLM_WARNINGS)


_SET_TORCH_THREADS = torch.set_num_threads  # as it is before vLLM's CPU worker makes it a no-op


class EngineFailed(RuntimeError):
    """The engine thread stopped on an error: this engine cannot serve any more."""


class PrefixCacheNotReset(RuntimeError):
    """vLLM kept refusing to reset its prefix cache after a weight update: the engine stops."""


@dataclass
class _Job:
    kind: str  # "generate" | "score" | "weights" | "close"
    payload: Any
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future, repr=False)
    prompt: list[int] = field(default_factory=list)
    vllm_id: str = ""
    submitted: float = field(default_factory=time.perf_counter)
    version: int = 0  # the weights' version when it started
    tokens_on_version: int | None = None  # its tokens sampled before an update landed under it


class VLLMEngine(LocalEngine):
    """A GenerationEngine over an in-process vLLM engine (CPU, one GPU, or `tensor_parallel_size`)."""

    def __init__(self, config: EngineConfig, device: str = "cpu") -> None:
        from rose_ray.models import load_tokenizer, local_model

        self.model_dir = local_model(config.model)  # a hub id's cached snapshot: its files are read here
        super().__init__(config, device, load_tokenizer(config.tokenizer or self.model_dir), {
            "requests": 0, "generated_tokens": 0, "prompt_tokens": 0, "prefix_cached_tokens": 0,
            "score_calls": 0, "weight_updates": 0, "steps": 0, "sequence_steps": 0, "busy_s": 0.0,
            "weights_s": 0.0, "updates_kept": 0, "requests_kept": 0})
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.failure: BaseException | None = None  # why the engine thread stopped
        self._closing = False
        started: concurrent.futures.Future = concurrent.futures.Future()
        threads = self.config.threads or torch.get_num_threads()  # the config's, else the caller's
        self._thread = threading.Thread(target=self._run, args=(started, threads),
                                        name="vllm-engine", daemon=True)
        self._thread.start()
        started.result()  # what the engine's start raised, raised here

    # ------------------------------------------------------------------ public API
    def submit(self, kind: str, payload: Any) -> concurrent.futures.Future:
        """Queue a job for the engine thread; its future holds the result."""
        if self.failure is not None or self._closing or not self._thread.is_alive():
            raise EngineFailed(f"vllm engine stopped: {self.failure or 'closed'!r}") from self.failure
        job = _Job(kind, payload)
        if kind == "generate":
            job.prompt = list(payload.prompt_ids)
            # (checked here: a bad request fails its caller, not the engine)
            if (early := early_result(payload, self.config, self.version)) is not None:
                job.future.set_result(early)
                return job.future
        elif kind == "score" and not payload[1]:
            job.future.set_result([])
            return job.future
        self._jobs.put(job)
        return job.future

    def check_scored(self, pairs: list[tuple[list[int], list[int]]]) -> None:
        """vLLM scores a sequence as a prompt with one token to generate: one less than max_model_len."""
        check_scored(pairs, min(self.config.context_tokens, self.max_model_len - 1),
                     f" (vLLM generates a token within max_model_len {self.max_model_len})")

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order; all requests run at once in the engine's batch."""
        futures = [self.submit("generate", r) for r in requests]
        return [f.result() for f in futures]

    def score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """Teacher-forced logprob of each completion token (one engine pass per pair)."""
        self.check_scored(pairs)
        futures = [self.submit("score", (list(p), list(c))) for p, c in pairs]
        return [f.result() for f in futures]

    def update_weights(self, state: dict[str, Any], version: int, keep_after_ms: float | None = None) -> None:
        """Reload `state` (checkpoint names -> tensors or arrays) in place; later requests run on
        the new weights, running ones as `keep_after_ms` says (module docstring)."""
        self.submit("weights", (state, int(version), keep_after_ms)).result()

    def clear_prefix_cache(self) -> None:
        """Forget cached prefixes (a benchmark's cold start; weights unchanged)."""
        self.submit("weights", (None, self.version, None)).result()

    def frontend(self) -> VLLMFrontend:
        """The async face the engine actor and the HTTP server use (the engine batches by itself)."""
        return VLLMFrontend(self)

    def close(self) -> None:
        self._closing = True
        if self._thread.is_alive():
            self._jobs.put(_Job("close", None))
            self._thread.join(timeout=60)

    # ------------------------------------------------------------------ the engine thread
    def _start(self) -> Any:
        for key, value in VLLM_ENV.items():
            os.environ.setdefault(key, value)
        from transformers import AutoConfig
        from vllm import LLM

        for name, _, _ in EXPECTED_VLLM_WARNINGS:
            logging.getLogger(name).addFilter(_not_expected)  # (a filter already there is not added again)

        c = self.config
        on_gpu = self.device.startswith("cuda")
        # (on CPU vLLM would otherwise take a share of host memory for its KV cache)
        kwargs: dict[str, Any] = (
            {"gpu_memory_utilization": float(c.backend.gpu_memory_utilization)} if on_gpu
            else {"kv_cache_memory_bytes": int(c.backend.kv_cache_mb * 2**20)})
        if c.backend.tensor_parallel_size > 1:
            # One process per rank, children of this actor: in a placement group vLLM's Ray
            # executor would refuse a bundle of several GPUs (and CPUs).
            kwargs["distributed_executor_backend"] = "mp"
        positions = getattr(AutoConfig.from_pretrained(self.model_dir), "max_position_embeddings", None)
        self.check_positions(positions)
        # One more position than context_tokens where the model has it: vLLM scores a sequence as a
        # prompt with one token to generate.
        ctx = c.context_tokens
        self.max_model_len = ctx + 1 if positions is None or positions > ctx else ctx
        return LLM(
            model=self.model_dir, tokenizer=c.tokenizer or self.model_dir, dtype=resolve_dtype(c.dtype, self.device),
            max_model_len=self.max_model_len, max_num_seqs=c.max_batch_size,
            tensor_parallel_size=c.backend.tensor_parallel_size,
            enforce_eager=not (on_gpu and c.backend.cuda_graphs), enable_prefix_caching=True,
            logprobs_mode="raw_logprobs", seed=0, disable_log_stats=True, use_tqdm_on_load=False,
            **kwargs,
        )

    def _run(self, started: concurrent.futures.Future, threads: int) -> None:
        # OpenMP's thread count is per thread (a new one starts at the core count), and vLLM's CPU
        # kernels read it where they run; vLLM then makes torch's setter a no-op.
        _SET_TORCH_THREADS(threads)
        try:
            self._llm = self._start()
        except BaseException as e:  # noqa: BLE001 - the constructor raises it
            started.set_exception(e)
            return
        cache = self._llm.llm_engine.vllm_config.cache_config
        self._counters.update(kv_cache_bytes=cache.kv_cache_memory_bytes, kv_blocks=cache.num_gpu_blocks,
                              kv_block_tokens=cache.block_size)
        started.set_result(None)
        running: dict[str, _Job] = {}
        waiting: deque[_Job] = deque()  # in submission order; a weights job holds back the rest
        try:
            self._serve(running, waiting)
            error: BaseException = EngineFailed("vllm engine closed")
        except BaseException as e:  # noqa: BLE001 - the engine is gone: every caller hears why
            self.failure = error = e
        for job in [*running.values(), *waiting]:
            settle(job.future, error=EngineFailed(f"vllm engine stopped: {error!r}"))
        while not self._jobs.empty():
            settle(self._jobs.get_nowait().future, error=EngineFailed(f"vllm engine stopped: {error!r}"))
        del self._llm

    def _serve(self, running: dict[str, _Job], waiting: deque[_Job]) -> None:
        """Add jobs and step the engine until a close job comes."""
        from vllm.exceptions import VLLMClientError

        refused = (ValueError, VLLMClientError)  # vLLM's validation errors (max_tokens, lengths)
        wave = 1  # requests the last wave started from idle held
        while True:
            if not running and not waiting:
                waiting.append(self._jobs.get())  # idle: sleep until a job comes
                wave = self._gather(waiting, wave)
            while not self._jobs.empty():  # (this thread is the queue's only reader)
                waiting.append(self._jobs.get_nowait())
            while waiting:
                job = waiting[0]
                if job.kind == "close":
                    return
                if job.kind == "weights":
                    # Under running requests only after `keep_after_ms`, and with no score request
                    # running (a preemption would compute its pieces twice).
                    keep_after_ms = job.payload[2]
                    waited_ms = (time.perf_counter() - job.submitted) * 1e3
                    if running and (keep_after_ms is None or waited_ms < keep_after_ms
                                    or any(j.kind == "score" for j in running.values())):
                        break  # the barrier: requests before it finish on the old weights (for now)
                    waiting.popleft()
                    self._reload(job, running)
                    continue
                waiting.popleft()
                if not job.future.cancelled():
                    try:
                        self._add(job, running)
                    except refused as e:  # vLLM refused this request: its caller's error, not the engine's
                        settle(job.future, error=ValueError(f"vllm refused the request: {e}"))
            if running:
                self._step(running)

    def _gather(self, waiting: deque[_Job], wave: int) -> int:
        """From idle, wait for the rest of a wave before the first step, as AsyncBatcher does: up to
        `max_wait_ms`, REGROUP_FACTOR times that while fewer have come than the last wave held.
        A weights job or a close ends the wait."""
        start, wait = time.perf_counter(), self.config.max_wait_ms / 1000
        while waiting[-1].kind not in ("close", "weights"):
            generating = sum(j.kind == "generate" for j in waiting)
            limit = wait * (REGROUP_FACTOR if generating < wave else 1)
            remaining = start + limit - time.perf_counter()
            if remaining <= 0 or generating >= self.config.max_batch_size:
                break
            try:
                waiting.append(self._jobs.get(timeout=remaining))
            except queue.Empty:
                break
        return max(1, sum(j.kind == "generate" for j in waiting))

    def _add(self, job: _Job, running: dict[str, _Job]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if job.kind == "score":
            prompt_ids, completion = job.payload
            ids = prompt_ids + completion
            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
            self._counters["score_calls"] += 1
        else:
            request: GenerationRequest = job.payload
            s = request.sampling
            ids = job.prompt
            max_tokens = min(s.max_new_tokens, self.config.context_tokens - len(ids))  # >= 1 (early_result)
            params = SamplingParams(
                temperature=s.temperature, top_p=s.top_p, max_tokens=max_tokens, seed=s.seed,
                logprobs=request.top_logprobs, stop=list(s.stop) or None, stop_token_ids=sorted(self.stop_ids),
                ignore_eos=False, skip_special_tokens=False, detokenize=bool(s.stop),
            )
            self._counters["requests"] += 1
            self._counters["prompt_tokens"] += len(ids)
        job.version = self.version
        (job.vllm_id,) = self._llm.enqueue([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        # vLLM's id is "<the id outputs carry>-<8 random characters>" (assign_request_id).
        running[job.vllm_id.rsplit("-", 1)[0]] = job

    def _step(self, running: dict[str, _Job]) -> None:
        engine = self._llm.llm_engine
        gone = [i for i, job in running.items() if job.future.cancelled()]
        if gone:  # callers that gave up free their sequences now
            engine.abort_request([running.pop(i).vllm_id for i in gone], internal=True)
            if not running:
                return
        self._batch_sizes.append(len(running))
        self._counters["sequence_steps"] += len(running)
        t0 = time.perf_counter()
        outputs = engine.step()
        self._counters["busy_s"] += time.perf_counter() - t0
        self._counters["steps"] += 1
        for out in outputs:
            if not out.finished or out.request_id not in running:
                continue
            job = running.pop(out.request_id)
            try:
                result = self._score_result(job, out) if job.kind == "score" else self._result(job, out)
            except Exception as e:  # noqa: BLE001 - one odd output fails its own caller
                settle(job.future, error=e)
            else:
                settle(job.future, result)

    def _result(self, job: _Job, out: Any) -> GenerationResult:
        request: GenerationRequest = job.payload
        o = out.outputs[0]
        if o.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vllm: request {request.request_id!r} ended with {o.finish_reason!r}")
        ids = list(o.token_ids)
        logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vllm: {len(logprobs)} logprobs for {len(ids)} sampled tokens")
        text = self.chat.decode(ids)
        stops = [text.find(s) for s in request.sampling.stop if s in text]
        if isinstance(o.stop_reason, str) and stops:
            text = text[: min(stops)]  # the ids keep the stop string's tokens, the text ends before it
        top = None
        if request.top_logprobs > 0:
            k = request.top_logprobs
            top = [{int(t): float(lp.logprob) for t, lp in step.items() if lp.rank is not None and lp.rank <= k}
                   for step in o.logprobs]
        self._counters["generated_tokens"] += len(ids)
        self._counters["prefix_cached_tokens"] += int(out.num_cached_tokens or 0)
        return GenerationResult(
            text=text, token_ids=ids, logprobs=logprobs, finish_reason=o.finish_reason,
            prompt_tokens=len(job.prompt), version=job.version, request_id=request.request_id,
            top_logprobs=top,
            version_end=None if job.tokens_on_version is None else self.version,
            tokens_on_version=job.tokens_on_version,
        )

    @staticmethod
    def _score_result(job: _Job, out: Any) -> list[float]:
        _, completion = job.payload
        entries = out.prompt_logprobs[-len(completion):]
        return [float(entry[t].logprob) for entry, t in zip(entries, completion)]

    def _reload(self, job: _Job, running: dict[str, _Job]) -> None:
        """Load a weights job's state (None: only forget cached prefixes), under `running`
        requests where `keep` allowed it (preempted; their results say where it changed)."""
        state, version, _ = job.payload
        t0 = time.perf_counter()
        try:
            if state is not None:
                weights = self._checkpoint_weights(state)
                sampled = self._sampled_so_far(running) if running else {}
                if running:  # a batch scheduled ahead (async scheduling, GPUs) done first, as vLLM's pause does
                    self._llm.collective_rpc("synchronize_device")
                self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                                   "is_checkpoint_format": True})
                self.version = version
                self._counters["weight_updates"] += 1
                for key, held in running.items():
                    n = sampled.get(key)
                    if n == 0:  # nothing sampled yet (queued in vLLM, or prefilling): all on the new weights
                        held.version = version
                    elif held.tokens_on_version is None:  # (a second update under it changes nothing here)
                        # n None: vLLM's scheduler did not say; count none as the old weights'
                        held.tokens_on_version = n if n is not None else 0
                        self._counters["requests_kept"] += 1
                self._counters["updates_kept"] += bool(running)
            # The old weights' keys/values are stale, running requests' too (recomputed when next scheduled).
            self._reset_prefix_cache(bool(running))
        except (KeyError, ValueError) as e:  # a bad state: the caller's error, the engine is fine
            settle(job.future, error=e)
            return
        except BaseException as e:  # the engine's: it stops, and this job (no longer queued) hears why
            settle(job.future, error=EngineFailed(f"vllm engine stopped: {e!r}"))
            raise
        self._counters["weights_s"] += time.perf_counter() - t0
        settle(job.future, None)

    def _reset_prefix_cache(self, running: bool) -> None:
        """vLLM's reset, which returns False while blocks are held, tried PREFIX_RESET_TRIES times;
        then PrefixCacheNotReset stops the engine (the supervisor replaces it)."""
        for attempt in range(PREFIX_RESET_TRIES):
            if attempt:
                time.sleep(PREFIX_RESET_WAIT_S)
            if self._llm.reset_prefix_cache(reset_running_requests=running):
                return
        held = self._llm.llm_engine.has_unfinished_requests()
        raise PrefixCacheNotReset(
            f"vllm refused to reset its prefix cache {PREFIX_RESET_TRIES} times after a weight update "
            f"(blocks held{' by requests this engine does not track' if held else ''}): the keys and values "
            "of the old weights would be reused, so this engine stops")

    def _sampled_so_far(self, running: dict[str, _Job]) -> dict[str, int]:
        """Tokens each running request has sampled so far, from vLLM's scheduler ({} out of reach)."""
        try:
            requests = self._llm.llm_engine.engine_core.engine_core.scheduler.requests
            return {key: int(requests[job.vllm_id].num_output_tokens)
                    for key, job in running.items() if job.vllm_id in requests}
        except AttributeError:
            return {}

    def _checkpoint_weights(self, state: dict[str, Any]) -> list[tuple[str, Any]]:
        """(name, tensor) pairs, checked against the checkpoint's names and shapes. A tied output
        head goes along with the embedding (vLLM's in-place reload leaves it unloaded otherwise)."""
        weights = checked_weights(state, {"lm_head.weight": None, **self._names})
        tied = getattr(self._llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False)
        if "lm_head.weight" not in state and "model.embed_tokens.weight" in state and tied:
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
        return weights

    @functools.cached_property
    def _names(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor names and shapes, read from the model folder's safetensors headers."""
        from safetensors import safe_open

        names: dict[str, tuple[int, ...]] = {}
        for f in sorted(Path(self.model_dir).glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for key in st.keys():
                    names[key] = tuple(st.get_slice(key).get_shape())
        if not names:
            raise ValueError(f"update_weights: {self.config.model} has no safetensors weights to check names against")
        return names


@dataclass
class VLLMFrontend:
    """The engine's async calls, shaped like `AsyncBatcher` (the actor and the server use either)."""

    engine: VLLMEngine

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await asyncio.wrap_future(self.engine.submit("generate", request))

    async def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        self.engine.check_scored([(prompt_ids, completion_ids)])
        return await asyncio.wrap_future(self.engine.submit("score", (list(prompt_ids), list(completion_ids))))

    def queue_weights(self, state: dict[str, Any], version: int, keep_after_ms: float | None = None) -> asyncio.Future:
        """Queue a weight update now (as `VLLMEngine.update_weights`); the future resolves once it is loaded."""
        return asyncio.wrap_future(self.engine.submit("weights", (state, int(version), keep_after_ms)))

    def stats(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        """Nothing of its own to stop: the engine stays up for other callers (`engine.close()` ends it)."""
