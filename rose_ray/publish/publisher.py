"""Learner rank 0's side of a publication: the weights packed (flat.py) and sent to every engine
as one version by the route chosen for them (route.py); a collective that stalls or fails while
every engine lives falls back to the object store for good (docs/engines.md, `publish.timeout_s`)."""

from __future__ import annotations

import time
from typing import Any

from rose_ray.publish.flat import FlatState, pack
from rose_ray.publish.group import CollectiveTimeout, WeightGroup, within
from rose_ray.publish.route import Member, PublishConfig, choose_route


def _actor_key(engine: Any) -> str:
    return engine._actor_id.hex()


class WeightPublisher:
    """The route per set of engines, the pack buffers (reused), and the weight group (rebuilt
    when the engines change); after a collective fails, the object store for good (`fallback`)."""

    def __init__(self, config: PublishConfig | None = None) -> None:
        self.config = config or PublishConfig()
        self._routes: dict[tuple[str, ...], tuple[str, str]] = {}
        self._group: WeightGroup | None = None
        self._members: tuple[str, ...] | None = None
        self._pack_buffers: list[Any] | None = None
        self.fallback: str | None = None  # why the collective was given up, once it was
        self._stranded: list[Any] = []  # engine calls of a given-up collective (kept: errors unread)

    def route_for(self, engines: list[Any]) -> tuple[str, str]:
        """(method, collective backend) for these engines (`choose_route`; the engines are asked
        only where the settings leave a choice)."""
        import ray

        if self.fallback is not None or self.config.method == "object_store":
            return "object_store", ""
        if (self.config.method, self.config.collective_backend) == ("collective", "gloo"):
            return "collective", "gloo"
        key = tuple(_actor_key(e) for e in engines)
        if key not in self._routes:
            infos = ray.get([e.weight_receiver.remote() for e in engines])
            self._routes[key] = choose_route(self.config, Member.here(), infos)
        return self._routes[key]

    def state_device(self, engines: list[Any]) -> Any:
        """Where rank 0 gathers the state: its GPU for an NCCL publication, else the host."""
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.route_for(engines)[1] == "nccl" else "cpu"

    def publish(self, state: dict[str, Any], engines: list[Any], version: int) -> dict[str, Any]:
        """`state` to every engine as `version`, waiting until all have loaded it (or, without
        `wait_for_load`, queued it). Returns method, backend, mb, buckets, per-stage ms (pack,
        transfer, load: the slowest engine's, send: all) and `fallback` (why, or None)."""
        import ray

        method, backend = self.route_for(engines)
        start = time.perf_counter()
        fallback = None
        if method == "collective":
            flat, pack_ms, sent = self._pack(state, self.state_device(engines))
            loads = self._collective(flat, engines, version, backend)
            if loads is None:  # given up (`self.fallback` says why): the object store, now and later
                fallback, method, backend = self.fallback, "object_store", ""
        if method == "object_store":
            flat, pack_ms, sent = self._pack(state, "cpu")
            ref = ray.put(flat.numpy())
            loads = ray.get([e.load_weights.remote(ref, version, self.config.wait_for_load,
                                                   self.config.keep_after_ms) for e in engines])
        done = time.perf_counter()
        load = max(r["load_ms"] for r in loads)
        return {"mb": sum(flat.header.bucket_bytes) / 2**20, "buckets": len(flat.buffers), "pack_ms": pack_ms,
                "transfer_ms": (done - sent) * 1e3 - load, "load_ms": load,
                "versions": [int(r["version"]) for r in loads], "method": method, "backend": backend,
                "send_ms": (done - start) * 1e3, "engines": float(len(engines)), "version": float(version),
                "fallback": fallback}

    def _pack(self, state: dict[str, Any], device: Any) -> tuple[FlatState, float, float]:
        """`state` packed on `device`, the ms it took and when it ended."""
        import torch

        start = time.perf_counter()
        flat = pack(state, self.config.bucket_mb, self._pack_buffers, device)
        if self.config.bucket_mb > 0:  # the put or the broadcast copies them out: reusable next time
            self._pack_buffers = flat.buffers
        if device != "cpu":  # the pack's copies done before the clock reads (they run async on the GPU)
            torch.cuda.current_stream(device).synchronize()
        end = time.perf_counter()
        return flat, (end - start) * 1e3, end

    def _collective(self, flat: FlatState, engines: list[Any], version: int, backend: str) -> list | None:
        """Each engine's load of `flat` broadcast over `backend`; None where the collective gave up
        while every engine lives (`self.fallback` says why); a dead engine's error raised."""
        import ray

        calls: list[Any] = []
        stage = f"forming the weight group ({backend}: learner rank 0 and {len(engines)} engine(s))"
        try:
            group = self._connect(engines, backend, calls, stage)
            stage = f"broadcasting version {version} to {len(engines)} engine(s) over {backend}"
            receives = [e.receive_weights.remote(group.name, flat.header.to_json(), version,
                                                 self.config.wait_for_load, self.config.keep_after_ms)
                        for e in engines]
            calls += receives
            within(self.config.timeout_s, stage, group.broadcast, flat.buffers)
        except BaseException as e:
            if self._group is not None:  # a member may be gone: a new group next time
                self._group.abort()
            self._group, self._members = None, None
            if not isinstance(e, Exception):
                raise
            # an engine's death is its loss, not the collective's: raised, the run replaces it (waited
            # for up to 2 s: a broadcast can fail before Ray has seen the death)
            for ref in ray.wait(calls, num_returns=len(calls), timeout=2.0)[0] if calls else []:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as dead:
                    raise dead from e
                except Exception:  # noqa: BLE001 - the engine lives: the collective's failure
                    pass
            self._stranded += calls
            why = str(e) if isinstance(e, CollectiveTimeout) else f"{stage}: {type(e).__name__}: {e}"
            self.fallback = f"the collective over {backend} gave up: {why}"
            return None
        return ray.get(receives)  # each engine's load (behind its calls in flight: not bounded here)

    def _connect(self, engines: list[Any], backend: str, calls: list[Any], what: str) -> WeightGroup:
        """A weight group of rank 0 and exactly these engines over `backend` (kept while they
        stay the same), formed within publish.timeout_s; the engines' join calls go to `calls`.
        The group's own timeout (each member's calls, an NCCL group's watchdog) is twice that:
        rank 0's deadline comes first, and the members' calls end after it."""
        import ray

        members = (backend, *(_actor_key(e) for e in engines))
        if self._group is not None and self._members == members:
            return self._group
        self._group = None
        world, timeout_s = len(engines) + 1, self.config.timeout_s
        store, address = WeightGroup.open_store(world, 2 * timeout_s, backend)
        joins = [e.join_weight_group.remote(address, rank) for rank, e in enumerate(engines, start=1)]
        calls += joins
        ready, _ = ray.wait(joins, num_returns=len(joins), timeout=0.05)
        for ref in ready:  # an engine that refused at once (a backend that cannot receive)
            ray.get(ref)
        start = time.monotonic()
        group = within(timeout_s, what, WeightGroup, store, address["name"], 0, world, 2 * timeout_s, backend)
        try:  # every member is in the group by now: their calls return at once
            ray.get(joins, timeout=max(timeout_s - (time.monotonic() - start), 1.0))
        except ray.exceptions.GetTimeoutError:
            group.abort()
            raise CollectiveTimeout(f"{what}: an engine's join did not return within {timeout_s:g} s "
                                    "(publish.timeout_s)") from None
        self._group, self._members = group, members
        return group
