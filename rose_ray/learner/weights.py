"""Full weights out of a (possibly ZeRO-3-partitioned) model: gather, export, publish.

Publication (`publish.method`, a `PublishConfig`; learner rank 0's `WeightPublisher`) sends
the weights as flat byte buffers (rose_ray/flat_weights.py: every dtype as its raw bytes, no
tensor pickled), by one of:

- `object_store`: one `ray.put` of the FlatState (numpy buffers: zero-copy reads on the same
  node), then each engine actor's `load_weights`. Works across nodes, needs nothing shared.
- `collective`: learner rank 0 and the engine actors in a group of their own (not the
  learner's DeepSpeed group), each bucket broadcast once to every engine, which receives it
  while it generates and then loads it. Engines that are local Ray actors (hf, vllm) only.
  `publish.collective_backend` (`choose_route`): `nccl` broadcasts buffers on the GPUs (rank 0
  gathers and packs on its GPU, each engine receives on its own and loads from there: no host
  round trip); `gloo` host buffers; `auto` nccl where it applies (`nccl_problem`: rank 0 and
  every engine on a CUDA device, no two on the same GPU, no vLLM engine with tensor-parallel
  workers), else gloo.
- `pickled`: the path before flat buffers (numpy where numpy has the dtype, torch tensors
  pickled), kept as bench/publish.py's baseline.
- `auto` (default): `collective` over NCCL where every engine is an hf/vllm actor on rank 0's
  node and NCCL applies, else `AUTO_LOCAL` where every engine is such an actor, else
  `object_store` (across nodes without a shared fabric).

Each engine loads the weights between its batches (behind the calls submitted before them),
so the returned version is the version every later request is sampled with. The requests
running when they come finish on the old weights first (`publish.in_flight: wait`), or, on a
vllm engine, go on under the new ones after at most `publish.in_flight_wait_ms` (`keep`).

A collective cannot hang the learner: forming the group and each broadcast get
`publish.timeout_s`. A group that does not form or a broadcast that does not end in time (or
that fails while every engine is still alive) makes the publisher send that publication, and
every later one, through the object store (`fallback` in its result says why); an NCCL group
is aborted, not left to end the process. An engine that died on the way is raised as it is:
the run replaces it, and the collective goes on with the replacement.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rose_ray.errors import ConfigError, InputError
from rose_ray.files import FOLDER_MARKER, is_empty_folder, out_path, writing_folder, written_here

PUBLISH_METHODS = ("auto", "object_store", "collective", "pickled")
COLLECTIVE_BACKENDS = ("auto", "gloo", "nccl")  # publish.collective_backend
IN_FLIGHT = ("wait", "keep")  # publish.in_flight (PublishConfig)
# What `auto` picks where every engine is a local actor and NCCL does not apply: the faster of
# the two host-buffer paths as bench/publish.py measured them on one node. On this CPU machine
# the object store (shared memory) was as fast or faster than gloo over loopback (e.g. 1 GiB:
# 0.44 vs 0.77 ms/MB), so the object store it is. Those were CPU measurements: where NCCL
# applies, `auto` takes the collective instead (`choose_route`), since the object store would
# take the weights GPU -> host -> GPU while NCCL moves them GPU to GPU (NVLink/PCIe, tens of
# GB/s; the anchors' ~0.1-0.5 s for 3.4 GB, issue 35), and the same-node condition is kept
# because only there is such a fabric sure (bench/gpu_check.py compares the two on a GPU).
AUTO_LOCAL = "object_store"

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


def check_model_out(out: str | Path, overwrite: bool, flag: str = "--out", offers_overwrite: bool = True) -> None:
    """Refuse (InputError naming the path) to write a model folder over anything but nothing,
    an empty folder, or, with `overwrite`, a model folder rose_ray wrote. `out` as it will be
    written: symlinks resolved (`out_path`). `offers_overwrite`: the command has --overwrite."""
    target = out_path(out)
    if not target.exists() or is_empty_folder(target):
        return
    if not target.is_dir():
        raise InputError(f"{flag} {target}: a file is there, not a folder; give a new folder")
    if not overwrite:
        raise InputError(f"{flag} {target}: already exists and is not an empty folder; give a new one"
                         + (" (or --overwrite to replace a model folder rose-ray wrote)" if offers_overwrite else ""))
    if not written_here(target):
        raise InputError(f"{flag} {target}: not a model folder rose-ray wrote (it has no {FOLDER_MARKER}), so "
                         "--overwrite does not replace it; it is left as it is: give a new folder")


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def gather_state(module: Any, zero3: bool, keep: bool, dtype: str | None = None,
                 device: Any = "cpu") -> dict[str, Any] | None:
    """{name: tensor on `device`} of unique parameters and persistent buffers; None where not
    `keep`. `device` is the host's, or the rank's own GPU for an NCCL publication.

    Under ZeRO-3 each parameter is gathered in turn (collective: every rank calls this), so
    peak memory is one full parameter, not the whole model (on `device`: the whole model).
    """
    import deepspeed

    cast = _torch_dtype(dtype) if dtype else None
    state: dict[str, Any] = {}
    for name, param in module.named_parameters():  # tied parameters: first name only
        if zero3:  # the gathered full tensor is freed on leaving the context: copy it
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                value = param.detach().to(device, copy=True) if keep else None
        else:  # no copy on its own device: callers read it before the next optimizer step
            value = param.detach().to(device) if keep else None
        if value is not None:
            state[name] = value.to(cast) if cast is not None else value
    if not keep:
        return None
    persistent = set(module.state_dict().keys())  # drops non-persistent buffers (inv_freq)
    for name, buf in module.named_buffers():
        if name in persistent:
            state[name] = buf.detach().to(device)
    return state


def source_dtype(model_path: str) -> str:
    """The dtype the source model's config declares (float32 when it declares none)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    return name if name in DTYPES else "float32"


def write_hf_folder(state: dict[str, Any], model_path: str, out_dir: str, dtype: str,
                    extra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """A Hugging Face folder (config, model.safetensors, tokenizer with its chat template,
    generation config, `extra_files` {name: text} and FOLDER_MARKER) written whole
    (files.writing_folder: built beside `out_dir`, swapped in). What is at `out_dir` (symlinks
    resolved) is replaced only when it is empty or a model folder rose_ray wrote (anything
    else: InputError, left as it is); commands that must not replace one at all check first
    (`check_model_out`)."""
    from huggingface_hub import save_torch_state_dict
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out = out_path(out_dir)
    check_model_out(out, overwrite=True)
    with writing_folder(out, "--out") as tmp:
        src = Path(model_path)
        if src.is_dir():  # tokenizer, chat template, generation config: copied as they are
            for f in src.iterdir():
                if f.is_file() and f.name not in ("config.json", FOLDER_MARKER) and not f.name.endswith(WEIGHT_FILES):
                    shutil.copy2(f, tmp / f.name)
        else:
            AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp)
            try:
                GenerationConfig.from_pretrained(model_path).save_pretrained(tmp)
            except OSError:
                pass  # a model without a generation config
        config = AutoConfig.from_pretrained(model_path)
        config.dtype = dtype
        config.save_pretrained(tmp)
        # ZeRO-1/2 keep parameters as views into one flat buffer (fp32 stays uncast): safetensors
        # refuses a tensor that does not cover its storage, so such a view is copied.
        state = {k: v if v.untyped_storage().nbytes() == v.numel() * v.element_size() else v.clone()
                 for k, v in state.items()}
        save_torch_state_dict(state, tmp, max_shard_size="5GB")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        (tmp / FOLDER_MARKER).write_text(json.dumps({"written_by": "rose_ray", "dtype": dtype,
                                                     "tensors": len(state)}) + "\n")
    mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
    return {"path": str(out), "tensors": len(state), "mb": mb, "dtype": dtype}


def to_wire(state: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays where numpy has the dtype (zero-copy in the object store), else tensors."""
    import torch

    return {k: v.numpy() if v.dtype in (torch.float32, torch.float16) else v for k, v in state.items()}


def wire_mb(wire: dict[str, Any]) -> float:
    return sum(np.asarray(v).nbytes if isinstance(v, np.ndarray) else v.numel() * v.element_size()
               for v in wire.values()) / 2**20


@dataclass
class PublishConfig:
    """How learner rank 0 sends the weights to the student engines (docs/engines.md, "How the weights travel")."""

    method: str = "auto"  # auto | object_store | collective | pickled
    # Bucket sizes: >0 packs the tensors into buckets of up to this many MB first (one copy),
    # 0 sends each tensor's own bytes (no copy; one broadcast or object-store buffer each).
    # bench/publish.py --bucketed on this CPU machine: 256 MB buckets were a little faster at
    # 0.3 GiB and much slower at 1 GiB (the pack's copy outweighs fewer, larger transfers).
    bucket_mb: float = 0.0  # the collective's
    object_store_bucket_mb: float = 0.0  # the object store's
    # The collective's group: auto (nccl where it applies: `nccl_problem`) | gloo | nccl
    collective_backend: str = "auto"
    # The collective's deadline for forming its group and for each broadcast; past it (or on an
    # error of the group's) the publisher falls back to the object store for the rest of the run.
    timeout_s: float = 300.0
    # Whether rank 0 waits until every engine has loaded the weights. Either way an engine
    # queues them before it answers, so every call submitted after a publication runs on them;
    # false: rank 0 goes on at once instead of waiting for the engine's calls in flight (its
    # longest request) and the load; a failed load is raised by the next publication.
    wait_for_load: bool = True
    # The requests an engine is running when the weights come. `wait`: they finish on the old
    # weights first (a drain: the load, and everything submitted after it, waits for the
    # engine's longest request). `keep` (vllm only): they are waited for at most
    # `in_flight_wait_ms`, then the weights load under them and they go on sampling from the
    # new ones (their keys/values recomputed; vLLM's pause_generation(mode="keep")), so neither
    # the engine nor a learner that waits for the load waits for a long request. Such a
    # request's result keeps the version it started on (what max_lag counts: conservative) and
    # says where the weights changed (GenerationResult.version_end, tokens_on_version); the
    # logprobs of its tokens from before that are the old weights', as PipelineRL's in-flight
    # updates leave them. `wait` stays the default: bench/publish.py --busy measured both
    # (docs/engines.md "How the weights travel"), and `keep` changes what a trajectory holds.
    in_flight: str = "wait"  # wait | keep
    in_flight_wait_ms: float = 0.0  # keep: the most a publication waits for running requests

    def __post_init__(self) -> None:
        if self.method not in PUBLISH_METHODS:
            raise ConfigError(f"publish.method: must be one of {PUBLISH_METHODS}, got {self.method!r}")
        if self.collective_backend not in COLLECTIVE_BACKENDS:
            raise ConfigError(f"publish.collective_backend: must be one of {COLLECTIVE_BACKENDS}, "
                              f"got {self.collective_backend!r}")
        if self.collective_backend != "auto" and self.method not in ("auto", "collective"):
            raise ConfigError(f"publish.collective_backend: {self.collective_backend} is the collective's; "
                              f"publish.method is {self.method}: leave it auto or use publish.method=collective")
        for key in ("bucket_mb", "object_store_bucket_mb"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"publish.{key}: must be >= 0 (0: no buckets), got {getattr(self, key)!r}")
        if not self.timeout_s > 0:
            raise ConfigError(f"publish.timeout_s: must be > 0, got {self.timeout_s!r}")
        if self.in_flight not in IN_FLIGHT:
            raise ConfigError(f"publish.in_flight: must be one of {IN_FLIGHT}, got {self.in_flight!r}")
        if not self.in_flight_wait_ms >= 0:
            raise ConfigError(f"publish.in_flight_wait_ms: must be >= 0, got {self.in_flight_wait_ms!r}")

    @property
    def keep_after_ms(self) -> float | None:
        """What an engine's load takes: None to drain, else how long to wait before keeping."""
        return float(self.in_flight_wait_ms) if self.in_flight == "keep" else None


def _actor_key(engine: Any) -> str:
    return engine._actor_id.hex()


def _dead_engine(calls: list[Any], wait_s: float = 2.0) -> BaseException | None:
    """The error of an engine call among `calls` that failed because its actor died (waited for
    up to `wait_s`: a broadcast to a dead engine can fail before Ray has seen the death), else None."""
    import ray

    if not calls:
        return None
    ready, _ = ray.wait(calls, num_returns=len(calls), timeout=wait_s)
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            return e
        except Exception:  # noqa: BLE001 - the engine lives: the collective's failure, not its
            pass
    return None


def nccl_problem(rank0: dict[str, Any], engines: list[dict[str, Any]]) -> str | None:
    """Why an NCCL weight group cannot join learner rank 0 (`rank0`: its `gpu`, a GPU UUID or
    None, and its `nccl_env`) and these engines (their `weight_receiver` infos), or None when it
    can: every member needs a CUDA device and the same NCCL_* settings, NCCL takes one rank per
    GPU (a colocated engine on rank 0's GPU cannot join; gloo can), and a vLLM engine with
    tensor-parallel workers receives in its actor's process while the weights live in its
    workers' (each would have to join the group itself, as OpenRLHF's worker extension and
    vLLM's weight-transfer API do: not used, docs/engines.md says why)."""
    if rank0.get("gpu") is None:
        return "learner rank 0 has no CUDA device"
    seen = {rank0["gpu"]: "learner rank 0"}
    mine = rank0.get("nccl_env", {})
    for n, e in enumerate(engines):
        theirs = e.get("nccl_env", {})
        differ = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
        if differ:  # NCCL does not reconcile its settings across ranks (weight_group.NCCL_DEFAULTS)
            return (f"student engine {n} runs with other NCCL settings than learner rank 0 "
                    f"({', '.join(f'{k}={theirs.get(k)} against {mine.get(k)}' for k in differ)}); every member "
                    "of an NCCL group needs the same")
        if not e["takes_weights"]:
            return f"student engine {n} ({e['backend']}) cannot join a weight group"
        if e.get("gpu") is None:
            return f"student engine {n} ({e['backend']}) runs on {e.get('device', 'cpu')}, not a CUDA device"
        if e.get("tensor_parallel_size", 1) > 1:
            return (f"student engine {n} runs vLLM with tensor_parallel_size {e['tensor_parallel_size']} (its "
                    "weights live in worker processes, which do not join the group)")
        if e["gpu"] in seen:
            return f"student engine {n} is on the same GPU as {seen[e['gpu']]} (NCCL takes one rank per GPU)"
        seen[e["gpu"]] = f"student engine {n}"
    return None


def choose_route(config: PublishConfig, rank0: dict[str, Any], engines: list[dict[str, Any]]) -> tuple[str, str]:
    """(method, collective backend) for learner rank 0 (`rank0`: its `node_id` and `gpu`) and
    these engines (`weight_receiver` infos); the backend is "" for a method that is not the
    collective. ConfigError naming publish.collective_backend where nccl is asked for and
    cannot run (`nccl_problem`)."""
    problem = nccl_problem(rank0, engines)
    backend = config.collective_backend
    if backend == "auto":
        backend = "gloo" if problem else "nccl"
    method = config.method
    if method == "auto":
        local = all(e["node_id"] == rank0["node_id"] and e["takes_weights"] for e in engines)
        method = ("collective" if backend == "nccl" and not problem else AUTO_LOCAL) if local else "object_store"
    if method != "collective":
        return method, ""
    if backend == "nccl" and problem:
        raise ConfigError(f"publish.collective_backend: nccl, but {problem}; use publish.collective_backend=auto "
                          "or gloo (or publish.method=object_store)")
    return method, backend


class CollectiveFailed(RuntimeError):
    """A weight group that did not form, or a broadcast that did not end (in publish.timeout_s,
    or with an error while every engine lived): the publisher falls back to the object store."""


class WeightPublisher:
    """Learner rank 0's side of publication: the method for a set of engines, the pack buffers
    (reused from one publication to the next), and the weight group (rebuilt when the engines
    change, e.g. a replaced engine). Once a collective has failed it publishes through the object
    store for good (`fallback`: why)."""

    def __init__(self, config: PublishConfig | None = None) -> None:
        self.config = config or PublishConfig()
        self._routes: dict[tuple[str, ...], tuple[str, str]] = {}
        self._group: Any = None
        self._members: tuple[Any, ...] | None = None
        self._pack_buffers: list[Any] | None = None
        self.fallback: str | None = None  # why the collective was given up, once it was
        self._stranded: list[Any] = []  # engine calls of a given-up collective (kept: errors unread)

    def route_for(self, engines: list[Any]) -> tuple[str, str]:
        """(method, collective backend) for these engines (`choose_route`; asked once per set)."""
        import ray

        from rose_ray.weight_group import cuda_device_id, own_nccl_env

        if self.fallback is not None:
            return "object_store", ""
        needs_infos = self.config.method == "auto" or (
            self.config.method == "collective" and self.config.collective_backend != "gloo")
        if not needs_infos:
            return self.config.method, "gloo" if self.config.method == "collective" else ""
        key = tuple(_actor_key(e) for e in engines)
        if key not in self._routes:
            rank0 = {"node_id": ray.get_runtime_context().get_node_id(), "gpu": cuda_device_id(),
                     "nccl_env": own_nccl_env()}
            infos = ray.get([e.weight_receiver.remote() for e in engines])
            self._routes[key] = choose_route(self.config, rank0, infos)
        return self._routes[key]

    def state_device(self, engines: list[Any]) -> Any:
        """Where rank 0 should gather the state for these engines: its GPU for an NCCL
        publication (nothing goes through the host), else the host."""
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.route_for(engines)[1] == "nccl" else "cpu"

    def publish(self, state: dict[str, Any], engines: list[Any], version: int) -> dict[str, Any]:
        """`state` to every engine as `version`; waits until all have loaded it (or, without
        `wait_for_load`, queued it). Returns the method (and `backend`, the collective's), MB
        sent and per-stage ms: pack, transfer (put or broadcast and the call), load (the slowest
        engine's, its wait behind calls submitted before included; 0 when not waited for), send
        (all); `fallback`: why this publication gave the collective up for the object store (None)."""
        method, backend = self.route_for(engines)
        start = time.perf_counter()
        fallback = None
        if method == "pickled":
            out = self._pickled(state, engines, version)
        elif method == "object_store":
            out = self._object_store(state, engines, version)
        else:
            try:
                out = self._collective(state, engines, version, backend)
            except CollectiveFailed as e:
                self.fallback = fallback = f"the collective over {backend} gave up: {e}"
                method, backend = "object_store", ""
                out = self._object_store(state, engines, version)
        out.update(method=method, backend=backend, send_ms=(time.perf_counter() - start) * 1e3,
                   engines=float(len(engines)), version=float(version), fallback=fallback)
        return out

    def _pickled(self, state: dict[str, Any], engines: list[Any], version: int) -> dict[str, Any]:
        import ray

        t0 = time.perf_counter()
        wire = to_wire(state)
        t1 = time.perf_counter()
        ref = ray.put(wire)
        loads = ray.get([e.load_weights.remote(ref, version, self.config.wait_for_load, self.config.keep_after_ms)
                          for e in engines])
        return self._timings(wire_mb(wire), t0, t1, loads)

    def _object_store(self, state: dict[str, Any], engines: list[Any], version: int) -> dict[str, Any]:
        import ray

        from rose_ray.flat_weights import pack

        t0 = time.perf_counter()
        flat = pack(state, self.config.object_store_bucket_mb, self._pack_buffers)
        if self.config.object_store_bucket_mb > 0:  # the put copies them: reusable next time
            self._pack_buffers = flat.buffers
        flat = flat.numpy()
        t1 = time.perf_counter()
        ref = ray.put(flat)
        loads = ray.get([e.load_weights.remote(ref, version, self.config.wait_for_load, self.config.keep_after_ms)
                          for e in engines])
        return self._timings(flat.nbytes / 2**20, t0, t1, loads)

    def _collective(self, state: dict[str, Any], engines: list[Any], version: int, backend: str) -> dict[str, Any]:
        import ray
        import torch

        from rose_ray.flat_weights import pack
        from rose_ray.weight_group import CollectiveTimeout, within

        t0 = time.perf_counter()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
        flat = pack(state, self.config.bucket_mb, self._pack_buffers, device)
        if self.config.bucket_mb > 0:
            self._pack_buffers = flat.buffers
        if backend == "nccl":  # the pack's copies done before the clock reads (they run async on the GPU)
            torch.cuda.current_stream(device).synchronize()
        t1 = time.perf_counter()
        calls: list[Any] = []
        stage = f"forming the weight group ({backend}: learner rank 0 and {len(engines)} engine(s))"
        try:
            self._connect(engines, backend, calls, stage)
            stage = f"broadcasting version {version} to {len(engines)} engine(s) over {backend}"
            receives = [e.receive_weights.remote(self._group.name, flat.header.to_json(), version,
                                                 self.config.wait_for_load, self.config.keep_after_ms)
                        for e in engines]
            calls += receives
            within(self.config.timeout_s, stage, self._group.broadcast, flat.buffers)
        except Exception as e:
            self._give_up_group()  # a member may be gone: a new group next time
            dead = _dead_engine(calls)
            if dead is not None:  # the engine's loss, not the collective's: the run replaces it
                raise dead from e
            self._stranded += calls
            raise CollectiveFailed(str(e) if isinstance(e, CollectiveTimeout) else
                                   f"{stage}: {type(e).__name__}: {e}") from e
        except BaseException:
            self._give_up_group()
            raise
        loads = ray.get(receives)  # each engine's load (behind its calls in flight: not bounded here)
        return self._timings(flat.nbytes / 2**20, t0, t1, loads)

    def _give_up_group(self) -> None:
        if self._group is not None:
            self._group.abort()
        self._group, self._members = None, None

    def _connect(self, engines: list[Any], backend: str, calls: list[Any], what: str) -> None:
        """A weight group of rank 0 and exactly these engines over `backend` (kept while they
        stay the same), formed within publish.timeout_s; the engines' join calls go to `calls`.
        The group's own timeout (each member's calls, an NCCL group's watchdog) is twice that:
        rank 0's deadline comes first, and the members' calls end after it."""
        import ray

        from rose_ray.weight_group import CollectiveTimeout, WeightGroup, within

        members = (backend, *(_actor_key(e) for e in engines))
        if self._group is not None and self._members == members:
            return
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

    @staticmethod
    def _timings(mb: float, t0: float, t1: float, loads: list[dict[str, float]]) -> dict[str, Any]:
        done = time.perf_counter()
        load = max(r["load_ms"] for r in loads)
        return {"mb": mb, "pack_ms": (t1 - t0) * 1e3, "transfer_ms": (done - t1) * 1e3 - load, "load_ms": load,
                "versions": [int(r["version"]) for r in loads]}
