"""Dynamic batching of concurrent calls onto one synchronous engine: a background task waits up
to max_wait_ms for a batch to fill to max_batch_size and runs it in a one-thread executor.
Weight updates queue in order with the calls: those before run on the old weights, those after
on the new, none inside a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from concurrent.futures import InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rose_ray.inference.engine import (
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    check_scored,
    validate_sampling,
)

REGROUP_FACTOR = 10  # max_wait multiple allowed while a batch is smaller than the last one


@dataclass
class _Job:
    kind: str  # "generate" | "score" | "weights"
    payload: Any
    future: asyncio.Future = field(repr=False)
    queued_at: float = field(default_factory=time.perf_counter)


class AsyncBatcher:
    """Queue + background batching task over a GenerationEngine (create inside an event loop)."""

    def __init__(self, engine: GenerationEngine, max_batch_size: int | None = None,
                 max_wait_ms: float | None = None) -> None:
        self.engine = engine
        self.max_batch_size = int(max_batch_size or engine.config.max_batch_size)
        self.max_wait_s = float(engine.config.max_wait_ms if max_wait_ms is None else max_wait_ms) / 1000
        self._pending: deque[_Job] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._batch_sizes: deque[int] = deque(maxlen=1024)
        self._batches = 0
        self._queue_wait_s = 0.0
        self._last_size = 1

    # ------------------------------------------------------------------ calls
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        validate_sampling(request.sampling)  # a bad request fails its caller, not the batch
        return await self._enqueue("generate", request)

    async def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        check_scored([(prompt_ids, completion_ids)], math.inf)  # (the engine checks the length)
        return await self._enqueue("score", (list(prompt_ids), list(completion_ids)))

    def queue_weights(self, state: dict[str, Any], version: int,
                      keep_after_ms: None = None) -> asyncio.Future:
        """Queue a weight update now (calls submitted after this return run on the new weights);
        the future resolves once they are loaded. Call from the batcher's event loop."""
        return self._enqueue("weights", (state, version))

    def stats(self) -> dict[str, Any]:
        """Batches as the batcher formed them (a batch may mix generate and score calls)."""
        return {
            "batcher_batch_sizes": list(self._batch_sizes),
            "batcher_batches": self._batches,
            "queued": len(self._pending),
            "queue_wait_s": self._queue_wait_s,
        }

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ internals
    def _enqueue(self, kind: str, payload: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            # First call, or the task ended with its event loop (a new asyncio.run): start one here.
            if self._task is not None and not self._task.cancelled() and self._task.exception():
                raise RuntimeError("engine batching task died") from self._task.exception()
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        job = _Job(kind, payload, loop.create_future())
        self._pending.append(job)
        self._wake.set()  # type: ignore[union-attr]
        return job.future

    async def _next_batch(self) -> list[_Job]:
        """Jobs for one batch of calls, or a weights job alone (run between two batches)."""
        assert self._wake is not None
        while not self._pending:
            self._wake.clear()
            await self._wake.wait()
        batch = [self._pending.popleft()]
        if batch[0].kind == "weights":
            return batch
        # Episodes of the last batch come back at slightly different times (an env step each):
        # waiting longer for as many keeps them together instead of in groups that never merge.
        start = time.perf_counter()
        while len(batch) < self.max_batch_size:
            if self._pending:
                if self._pending[0].kind == "weights":  # the next batch: it runs right after this one
                    return batch
                batch.append(self._pending.popleft())
                continue
            wait = self.max_wait_s * (REGROUP_FACTOR if len(batch) < self._last_size else 1)
            remaining = start + wait - time.perf_counter()
            if remaining <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                break
        self._last_size = len(batch)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            if batch[0].kind != "weights":
                now = time.perf_counter()
                self._queue_wait_s += sum(now - j.queued_at for j in batch)
                self._batch_sizes.append(len(batch))
                self._batches += 1
            await self._execute_and_settle(batch)

    async def _execute_and_settle(self, batch: list[_Job]) -> None:
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self._execute, batch)
        except Exception as e:
            if len(batch) == 1:
                settle(batch[0].future, error=e)
            else:  # rerun one by one so only the bad call fails
                for job in batch:
                    await self._execute_and_settle([job])
        else:
            for job, result in zip(batch, results):
                settle(job.future, result=result)

    def _execute(self, batch: list[_Job]) -> list[Any]:
        if batch[0].kind == "weights":
            return [self.engine.update_weights(*batch[0].payload)]
        out: list[Any] = [None] * len(batch)
        for kind, run in (("generate", self.engine.generate), ("score", self.engine.score_many)):
            jobs = [(n, j.payload) for n, j in enumerate(batch) if j.kind == kind]
            if jobs:
                for (n, _), res in zip(jobs, run([p for _, p in jobs])):
                    out[n] = res
        return out


def settle(future: Any, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a future (asyncio's or concurrent's); one its caller gave up on (cancelled) gets nothing."""
    with contextlib.suppress(asyncio.InvalidStateError, InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def async_frontend(engine: GenerationEngine) -> Any:
    """The async calls callers await (generate, score, queue_weights, stats, close): the
    engine's own where it batches by itself (vllm), else an AsyncBatcher over it."""
    return engine.frontend() if hasattr(engine, "frontend") else AsyncBatcher(engine)
