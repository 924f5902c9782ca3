"""One engine replica as a Ray actor. Its methods are async, so many episodes' calls are in
flight at once and the batcher folds them into batches; weight updates queue behind the calls
already submitted. `health()`, the supervisor's ping, is answered from the event loop, so a hung
generation thread is found. Weights arrive as `publish.method` chooses (docs/engines.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import ray

from rose_ray.inference.backends import make_engine
from rose_ray.inference.batcher import async_frontend
from rose_ray.inference.engine import EngineConfig, GenerationRequest, GenerationResult
from rose_ray.inference.registry import in_flight_backends
from rose_ray.publish.flat import FlatHeader, FlatState, unpack
from rose_ray.publish.group import WeightGroup
from rose_ray.publish.route import ReceiverInfo

MAX_WEIGHT_GROUPS = 4


class EngineActorImpl:
    """The actor body (a plain class, so it can also be tested or used without Ray)."""

    def __init__(self, config: EngineConfig, threads: int = 1) -> None:
        import torch

        # Ray sets OMP_NUM_THREADS=1 in workers; use what the config (or the CPU grant) says.
        torch.set_num_threads(config.threads or max(1, threads))
        self.config = config
        # The device this process sees: Ray's GPUs may be resources only (a rehearsed cluster).
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        kwargs: dict[str, Any] = {"device": self.device} if config.spec.local else {}
        self.engine = make_engine(config, **kwargs)
        self.batcher: Any = None
        self._in_flight = 0
        self._progress_at = time.monotonic()  # the last call finished (or the first began)
        self._weight_groups: dict[str, WeightGroup] = {}  # by name, the latest MAX_WEIGHT_GROUPS
        self._receive_buffers: list[Any] | None = None  # reused by the next broadcast
        self._receiving = asyncio.Lock()  # one broadcast at a time
        self._loading: Any = None  # an update queued without waiting, until the next one settles it

    def _batcher(self) -> Any:
        if self.batcher is None:  # created lazily inside the actor's event loop
            self.batcher = async_frontend(self.engine)
        return self.batcher

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Count a call in flight; its end is progress. A served model's error is tagged with this
        actor's id, so the run knows which engine failed."""
        if self._in_flight == 0:
            self._progress_at = time.monotonic()
        self._in_flight += 1
        try:
            yield
        except Exception as e:
            from rose_ray.inference.openai import OpenAIServerError

            if isinstance(e, OpenAIServerError) and e.actor_id is None:
                e.actor_id = ray.get_runtime_context().get_actor_id()
            raise
        finally:
            self._in_flight -= 1
            self._progress_at = time.monotonic()

    async def ready(self) -> bool:
        return True

    async def health(self) -> dict[str, Any]:
        """Version, calls in flight, and `stalled_s`: how long calls have been waiting with
        none finishing (0 when idle)."""
        failure = getattr(self.engine, "failure", None)
        if failure is not None:  # an engine thread that stopped: the supervisor replaces this actor
            raise RuntimeError(f"engine failed: {failure!r}")
        stalled = time.monotonic() - self._progress_at if self._in_flight else 0.0
        return {"version": self.engine.version, "in_flight": self._in_flight, "stalled_s": stalled,
                "pid": os.getpid(), "device": self.device}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        with self._call():
            return await self._batcher().generate(request)

    async def generate_many(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        with self._call():
            return list(await asyncio.gather(*(self._batcher().generate(r) for r in requests)))

    async def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        with self._call():
            return await self._batcher().score(prompt_ids, completion_ids)

    async def load_weights(self, state: dict[str, Any] | FlatState, version: int,
                           wait: bool = True, keep_after_ms: float | None = None) -> dict[str, float]:
        """Load `state` (a FlatState, unpacked into views with no copy, or a dict) as `_load`
        says; returns `load_ms` and the version."""
        with self._call():
            state = unpack(state) if isinstance(state, FlatState) else state
            return await self._load(state, version, wait, keep_after_ms)

    async def _load(self, state: dict[str, Any], version: int, wait: bool,
                    keep_after_ms: float | None = None) -> dict[str, float]:
        """Queue the update behind the calls already submitted (`keep_after_ms`: see vllm_engine).
        `wait`: until it is loaded; else at once (`queued` 1), and the next publication waits for
        this load first (and raises its error, if any)."""
        await self._settle()
        # (after a broadcast, which rank 0 sends whatever happens here)
        if keep_after_ms is not None and "keep" not in self.config.spec.in_flight:
            raise ValueError(f"publish.in_flight: keep loads weights under running requests, which the "
                             f"{self.config.backend.name} backend cannot (it generates a batch to its end); "
                             f"backends that can: {tuple(in_flight_backends('keep'))}; use publish.in_flight=wait")
        start = time.perf_counter()
        loaded = self._batcher().queue_weights(state, version, keep_after_ms)
        if not wait:
            self._loading = loaded
            return {"load_ms": 0.0, "version": float(version), "queued": 1.0}
        await loaded
        return {"load_ms": (time.perf_counter() - start) * 1e3, "version": float(self.engine.version),
                "queued": 0.0}

    async def _settle(self) -> None:
        """The last update queued without waiting, loaded (its error raised here)."""
        loading, self._loading = self._loading, None
        if loading is not None:
            await loading

    async def weight_receiver(self) -> ReceiverInfo:
        """What a publisher needs to choose a route (rose_ray/publish/route.py `choose_route`)."""
        config = self.config
        return ReceiverInfo.here(backend=config.backend.name, takes_weights=config.spec.takes_weights,
                                 device=str(self.device), tensor_parallel_size=config.tensor_parallel_size)

    async def join_weight_group(self, address: dict[str, Any], rank: int) -> None:
        """Join a publisher's weight group as `rank`, once every member has joined; the latest
        MAX_WEIGHT_GROUPS groups are kept (a learner restarted, a second publisher)."""
        if not self.config.spec.takes_weights:
            raise NotImplementedError(f"the {self.config.backend.name} backend cannot receive weights")
        if address.get("backend") == "nccl" and not str(self.device).startswith("cuda"):
            raise RuntimeError(f"publish.collective_backend: nccl, but this engine runs on {self.device}")
        group = await asyncio.to_thread(WeightGroup.join, address, rank)
        self._weight_groups[address["name"]] = group
        while len(self._weight_groups) > MAX_WEIGHT_GROUPS:
            self._weight_groups.pop(next(iter(self._weight_groups)))

    async def receive_weights(self, group: str, header_json: str, version: int,
                              wait: bool = True, keep_after_ms: float | None = None) -> dict[str, float]:
        """One publication broadcast by the learner's rank 0: received into this actor's buffers
        now (one at a time, the buffers reused), then loaded as in `_load`."""
        weight_group = self._weight_groups.get(group)
        if weight_group is None:
            raise RuntimeError(f"receive_weights: this engine is not in weight group {group!r}")
        header = FlatHeader.from_json(header_json)
        async with self._receiving:
            start = time.perf_counter()
            try:
                with self._call():
                    await self._settle()
            finally:  # rank 0 sends it whatever the last load did (not a call the health ping counts)
                flat = await asyncio.to_thread(weight_group.receive, header, self._receive_buffers)
            self._receive_buffers = flat.buffers
            received = time.perf_counter()
            with self._call():
                out = await self._load(unpack(flat), version, wait, keep_after_ms)
            return {"receive_ms": (received - start) * 1e3, **out}

    async def version(self) -> int:
        return self.engine.version

    async def stats(self) -> dict[str, Any]:
        """Engine counters plus `batch_sizes` (requests per engine batch, most recent last)."""
        return {**self.engine.stats(), **(self.batcher.stats() if self.batcher is not None else {})}


def engine_actor(config: EngineConfig, num_cpus: float = 1, num_gpus: float = 0, **options: Any) -> Any:
    """Start an EngineActor with the given resources and Ray `options` (torch threads: the CPUs
    granted, unless config.threads says); returns the actor handle."""
    return EngineActor.options(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=1000,
                               **options).remote(config, max(1, int(num_cpus)))


EngineActor = ray.remote(EngineActorImpl)
