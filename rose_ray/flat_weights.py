"""Weights as flat byte buffers: what the learner publishes and the engines load.

A state dict {name: tensor} is packed into a few flat uint8 buffers (buckets) and a small
typed header saying where each tensor lies (name, dtype, shape, bucket, offset, bytes). Every
dtype travels as its raw bytes (bf16 and fp32 exactly, nothing converted), so no tensor is
pickled: Ray's object store sends numpy buffers zero-copy (a pickled torch tensor costs ~1000x
more per MB: DESIGN.md, "Moving weights"), and a collective sends one buffer per bucket.
`unpack` gives tensors that are views into the buffers (no copy), which the engines'
`update_weights` copy into their models.

    flat = pack(state, bucket_mb=256)      # FlatState(header, buffers)
    state = unpack(flat)                   # {name: tensor view}

`bucket_mb=0` packs nothing: each tensor is sent as a byte view of its own storage (one buffer
per tensor, no copy for a contiguous CPU tensor), which suits the object store, where the
`ray.put` is the one copy anyway.

`WeightGroup` is a torch.distributed group of its own (a TCPStore and a ProcessGroupGloo or
ProcessGroupNCCL built directly, as vLLM's StatelessProcessGroup, OpenRLHF and verl do), so
learner rank 0 and the engine actors share a group without touching the learner's default
(DeepSpeed) group. Rank 0 broadcasts each bucket; the engines receive into buffers of the sizes
the header gives: host buffers over gloo, or, over NCCL, buffers on each member's GPU (packed
there on rank 0, loaded from there by the engine: no host round trip).

Nothing here may hang the learner: rank 0 forms the group and broadcasts `within` a deadline
(a call stuck in gloo or NCCL cannot be interrupted, so it runs on a thread of its own and
rank 0 goes on without it: CollectiveTimeout), an NCCL group is made so that its own timeout
aborts its communicator instead of ending the process (NCCL_GROUP_ENV), and every member runs
with the same NCCL settings (`nccl_env`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

ALIGN = 64  # bytes: every tensor starts at a multiple of this (any dtype can view it)
HEADER_VERSION = 1
# dtype name -> bytes per element; a dtype outside this list is refused by pack and unpack
ITEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4,
              "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


class MalformedHeader(ValueError):
    """A FlatState whose header does not describe its buffers (names the first fault)."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes lie."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class FlatHeader:
    """The typed description of a FlatState's buffers: entries, and each bucket's byte size."""

    entries: tuple[TensorEntry, ...]
    bucket_bytes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.bucket_bytes)

    def to_json(self) -> str:
        return json.dumps({"version": HEADER_VERSION, "bucket_bytes": list(self.bucket_bytes),
                           "entries": [[e.name, e.dtype, list(e.shape), e.bucket, e.offset, e.nbytes]
                                       for e in self.entries]})

    @classmethod
    def from_json(cls, text: str) -> FlatHeader:
        """Parse and check (MalformedHeader naming the fault)."""
        try:
            raw = json.loads(text)
        except (TypeError, ValueError) as e:
            raise MalformedHeader(f"flat weights header: not JSON ({e})") from None
        if not isinstance(raw, dict) or raw.get("version") != HEADER_VERSION:
            raise MalformedHeader(f"flat weights header: expected an object with version {HEADER_VERSION}, "
                                  f"got {str(raw)[:80]!r}")
        try:
            entries = tuple(TensorEntry(name, dtype, tuple(shape), bucket, offset, nbytes)
                            for name, dtype, shape, bucket, offset, nbytes in raw["entries"])
            header = cls(entries, tuple(raw["bucket_bytes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise MalformedHeader(f"flat weights header: entries must be [name, dtype, shape, bucket, "
                                  f"offset, nbytes] and bucket_bytes a list ({e})") from None
        header.check()
        return header

    def check(self, buffer_bytes: list[int] | None = None) -> None:
        """MalformedHeader unless every entry is a known dtype whose bytes match its shape and
        lie inside its bucket, names are unique, and (given) the buffers have the bucket sizes."""
        if not all(_is_count(b) for b in self.bucket_bytes):
            raise MalformedHeader(f"flat weights header: bucket sizes must be counts of bytes, got {self.bucket_bytes}")
        if buffer_bytes is not None and list(buffer_bytes) != list(self.bucket_bytes):
            raise MalformedHeader(f"flat weights: the header describes buckets of {list(self.bucket_bytes)} bytes, "
                                  f"the buffers hold {list(buffer_bytes)}")
        seen: set[str] = set()
        for e in self.entries:
            where = f"flat weights header: {e.name!r}"
            if not isinstance(e.name, str) or e.name in seen:
                raise MalformedHeader(f"{where}: names must be unique strings")
            seen.add(e.name)
            if e.dtype not in ITEM_BYTES:
                raise MalformedHeader(f"{where}: dtype {e.dtype!r} is not one of {sorted(ITEM_BYTES)}")
            if not all(_is_count(d) for d in e.shape):
                raise MalformedHeader(f"{where}: shape {e.shape} must be counts")
            if not (_is_count(e.nbytes) and e.nbytes == math.prod(e.shape) * ITEM_BYTES[e.dtype]):
                raise MalformedHeader(f"{where}: {e.nbytes!r} bytes, but shape {e.shape} of {e.dtype} "
                                      f"takes {math.prod(e.shape) * ITEM_BYTES[e.dtype]}")
            if not (_is_count(e.bucket) and e.bucket < len(self.bucket_bytes)):
                raise MalformedHeader(f"{where}: bucket {e.bucket!r} of {len(self.bucket_bytes)}")
            if not (_is_count(e.offset) and e.offset % ITEM_BYTES[e.dtype] == 0
                    and e.offset + e.nbytes <= self.bucket_bytes[e.bucket]):
                raise MalformedHeader(f"{where}: bytes [{e.offset}, {e.offset}+{e.nbytes}) do not lie aligned "
                                      f"inside bucket {e.bucket} of {self.bucket_bytes[e.bucket]} bytes")


@dataclass
class FlatState:
    """A header and its buffers (1-D uint8 numpy arrays or torch tensors, one per bucket)."""

    header: FlatHeader
    buffers: list[Any]

    @property
    def nbytes(self) -> int:
        return self.header.nbytes

    def numpy(self) -> FlatState:
        """The same bytes with numpy buffers (what Ray's object store sends zero-copy)."""
        import torch

        return FlatState(self.header, [b.numpy() if isinstance(b, torch.Tensor) else b for b in self.buffers])


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _dtype_name(t: Any) -> str:
    name = str(t.dtype).replace("torch.", "")
    if name not in ITEM_BYTES:
        raise TypeError(f"flat weights: dtype {name} is not one of {sorted(ITEM_BYTES)}")
    return name


def plan(state: dict[str, Any], bucket_mb: float) -> FlatHeader:
    """Where each tensor goes: in order, into buckets of up to `bucket_mb` (a larger tensor
    gets one of its own), each tensor aligned to ALIGN bytes; `bucket_mb=0`: one per tensor."""
    limit = int(bucket_mb * 2**20)
    entries, sizes = [], []
    for name, t in state.items():
        dtype = _dtype_name(t)
        nbytes = t.numel() * ITEM_BYTES[dtype]
        start = -(-sizes[-1] // ALIGN) * ALIGN if sizes else 0
        if not sizes or limit <= 0 or (start + nbytes > limit and sizes[-1] > 0):
            sizes.append(0)
            start = 0
        entries.append(TensorEntry(name, dtype, tuple(int(d) for d in t.shape), len(sizes) - 1, start, nbytes))
        sizes[-1] = start + nbytes
    return FlatHeader(tuple(entries), tuple(sizes))


def byte_view(t: Any) -> Any:
    """A 1-D uint8 view of a tensor's bytes (a copy only where it is not contiguous)."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def pack(state: dict[str, Any], bucket_mb: float = 256, out: list[Any] | None = None,
         device: Any = "cpu") -> FlatState:
    """`state` {name: tensor} as a FlatState of uint8 tensors on `device` (a GPU's for an NCCL
    broadcast). Each tensor is copied once into its bucket (from any device or layout); `out`,
    buffers of a previous pack with the same plan, is written into instead of new ones (no fresh
    pages to fault in). `bucket_mb=0`: no packing, each tensor's own bytes as its buffer (a copy
    only for a tensor on another device)."""
    import torch

    header = plan(state, bucket_mb)
    if bucket_mb <= 0:
        return FlatState(header, [byte_view(t.to(device)) for t in state.values()])
    if out is not None and [int(b.numel()) for b in out] == list(header.bucket_bytes) \
            and all(b.device == torch.device(device) for b in out):
        buffers = out
    else:
        buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in header.bucket_bytes]
    for e, t in zip(header.entries, state.values()):
        if e.nbytes:
            _view(buffers[e.bucket], e).copy_(t.detach())
    return FlatState(header, buffers)


def _view(buffer: Any, e: TensorEntry) -> Any:
    import torch

    if not e.nbytes:  # an empty tensor has no bytes to view
        return torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=buffer.device)
    return buffer[e.offset:e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape)


def as_byte_tensor(buffer: Any) -> Any:
    """A numpy or torch uint8 buffer as a 1-D uint8 tensor over the same memory."""
    import torch

    if isinstance(buffer, torch.Tensor):
        return buffer.reshape(-1)
    with warnings.catch_warnings():  # arrays from Ray's object store are read-only; only read
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(np.asarray(buffer)).reshape(-1)


def unpack(flat: FlatState) -> dict[str, Any]:
    """{name: tensor} viewing `flat`'s buffers (no copy); MalformedHeader where the header does
    not describe them."""
    buffers = [as_byte_tensor(b) for b in flat.buffers]
    for n, b in enumerate(buffers):
        if b.dtype.itemsize != 1:
            raise MalformedHeader(f"flat weights: buffer {n} holds {b.dtype}, not bytes")
    flat.header.check([int(b.numel()) for b in buffers])
    return {e.name: _view(buffers[e.bucket], e) for e in flat.header.entries}


def receive_buffers(header: FlatHeader, device: str = "cpu") -> list[Any]:
    """Empty buffers of the header's bucket sizes (what a receiver broadcasts into)."""
    import torch

    return [torch.empty(n, dtype=torch.uint8, device=device) for n in header.bucket_bytes]


def local_address() -> str:
    """This node's address as Ray knows it (where a group's store listens)."""
    import ray

    return ray.util.get_node_ip_address()


COLLECTIVE_BACKENDS = ("gloo", "nccl")

# The NCCL settings every member of a weight group runs with. The members are learner rank 0 and
# the student engine actors, each a Ray actor that sees one GPU (Ray sets CUDA_VISIBLE_DEVICES
# per actor), possibly on nodes whose raylets were started with different environments. NCCL
# never reconciles its settings across ranks: members that differ hang or fail (vLLM's
# weight-transfer code warns that "a process sharing this communicator must set the same NCCL_*
# variables or it will hang", vllm/utils/nccl.py; NCCL_CUMEM_ENABLE=0 on one side broke
# NeMo-RL's transfer group with CUDA IPC errors, NVIDIA-NeMo/RL#564). So a run gives each
# member's process the launcher's NCCL_* variables over these defaults (`nccl_env`, through
# Ray's runtime_env: NCCL reads them once per process, at its first use), and a publisher
# takes no NCCL group whose members report different ones (learner/weights.py `nccl_problem`).
NCCL_DEFAULTS = {
    # NVLink SHARP off. With one GPU visible per process it has returned all_gather results in
    # the wrong rank order (NVIDIA/nccl#1906: NCCL 2.26 on NVSwitch machines, a DeepSpeed
    # learner's all_gather included), hung or failed to bind its multicast memory while a
    # communicator was made (NVIDIA/nccl#1197, NVIDIA/nccl-tests#216; on H200 nodes under Ray,
    # NVIDIA-NeMo/RL#1963). A broadcast never uses it; sglang turns it off by default
    # (sgl-project/sglang#631) and vLLM pins it off for batch-invariant runs
    # (vllm/model_executor/determinism/batch_invariant.py). Set explicitly to keep NVLS.
    "NCCL_NVLS_ENABLE": "0",
}
# Set only while a weight group's ProcessGroupNCCL is made (its constructor reads it, for that
# group alone). torch's default, 3, ends the process when a collective of the group times out:
# learner rank 0 would die, restart and stall again at its next publication. 2 aborts the
# group's communicator and nothing else (pytorch.org/docs/stable/torch_nccl_environment_variables.html);
# the publisher then goes on without the group.
NCCL_GROUP_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
_ENV_LOCK = threading.Lock()
ABORT_WAIT_S = 10.0
T = TypeVar("T")


# NCCL_* names that are not NCCL's settings, left out of the comparison: torch's old name for
# TORCH_NCCL_ASYNC_ERROR_HANDLING, which vLLM's GPU worker removes from its own process ("This env
# var set by Ray causes exceptions with graph building", vllm/v1/worker/gpu_worker.py).
NOT_NCCL_SETTINGS = frozenset({"NCCL_ASYNC_ERROR_HANDLING"})


def _nccl_settings(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith("NCCL_") and k not in NOT_NCCL_SETTINGS}


def nccl_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NCCL_* variables every weight-group member runs with: the launching process's own
    (`environ`, default this process's) over NCCL_DEFAULTS."""
    return {**NCCL_DEFAULTS, **_nccl_settings(os.environ if environ is None else environ)}


def own_nccl_env() -> dict[str, str]:
    """The NCCL_* variables this process runs with (what a member reports to the publisher)."""
    return _nccl_settings(os.environ)


@contextlib.contextmanager
def _scoped_env(values: dict[str, str]) -> Iterator[None]:
    """`values` in this process's environment for the duration (as vLLM makes its communicators
    under its own NCCL settings: vllm/utils/nccl.py `unpinned_nccl_env`)."""
    with _ENV_LOCK:
        before = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class CollectiveTimeout(TimeoutError):
    """A weight group that did not form, or a broadcast that did not end, in its time."""


def within(timeout_s: float, what: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, waited for at most `timeout_s`; CollectiveTimeout naming `what` when it has
    not returned by then. A call stuck in gloo or NCCL cannot be interrupted from Python, so it
    runs on a daemon thread of its own, which is left to the group's own timeout (or its abort)
    while the caller goes on; an error it raises in time is raised here. The thread works on the
    caller's CUDA device (a new thread starts on device 0)."""
    import torch

    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    done = threading.Event()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"weights: {what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise CollectiveTimeout(f"{what}: not done within {timeout_s:g} s (publish.timeout_s)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def cuda_device_id() -> str | None:
    """This process's current CUDA device as a GPU UUID (the same whatever CUDA_VISIBLE_DEVICES
    numbers it), None without CUDA: how a publisher tells whether two processes share a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


class WeightGroup:
    """A group of its own: rank 0 (the learner) and the engine actors, on a TCPStore that rank 0
    hosts; `backend` gloo (host buffers) or nccl (buffers on each member's current CUDA device;
    NCCL takes one rank per GPU). Create rank 0's store with `WeightGroup.open_store` (its
    `address` is what the others join with), the others with `WeightGroup.join(address, rank)`;
    every member must be constructing at the same time (the group's rendezvous waits for all,
    up to `timeout_s`, which also bounds each collective: then gloo raises, and NCCL aborts the
    group's communicator, NCCL_GROUP_ENV)."""

    def __init__(self, store: Any, name: str, rank: int, world_size: int, timeout_s: float,
                 backend: str = "gloo") -> None:
        from torch.distributed import PrefixStore

        if backend not in COLLECTIVE_BACKENDS:
            raise ValueError(f"weight group backend: must be one of {COLLECTIVE_BACKENDS}, got {backend!r}")
        self.store, self.name, self.rank, self.world_size = store, name, rank, world_size
        self.backend = backend
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "nccl":
            import torch
            from torch.distributed import ProcessGroupNCCL

            self.device = torch.device("cuda", torch.cuda.current_device())
            options = ProcessGroupNCCL.Options()
            options._timeout = timeout  # (the watchdog's: a collective running longer is aborted)
            # (its communicator is made by the first broadcast, on the buffers' device)
            with _scoped_env(NCCL_GROUP_ENV):
                self.group = ProcessGroupNCCL(PrefixStore(name, store), rank, world_size, options)
        else:
            from torch.distributed import ProcessGroupGloo

            self.device = "cpu"
            self.group = ProcessGroupGloo(PrefixStore(name, store), rank, world_size, timeout)

    @staticmethod
    def open_store(world_size: int, timeout_s: float, backend: str = "gloo") -> tuple[Any, dict[str, Any]]:
        """Rank 0's TCPStore on a free port, and the address the others join with."""
        from torch.distributed import TCPStore

        host = local_address()
        store = TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))
        return store, {"host": host, "port": store.port, "name": f"weights-{uuid.uuid4().hex[:12]}",
                       "world_size": world_size, "timeout_s": timeout_s, "backend": backend}

    @classmethod
    def join(cls, address: dict[str, Any], rank: int) -> WeightGroup:
        from torch.distributed import TCPStore

        store = TCPStore(address["host"], address["port"], address["world_size"], is_master=False,
                         timeout=datetime.timedelta(seconds=address["timeout_s"]))
        return cls(store, address["name"], rank, address["world_size"], address["timeout_s"],
                   address.get("backend", "gloo"))

    def abort(self) -> None:
        """Give the group up: an NCCL communicator is aborted, so a broadcast stuck in it ends and
        its kernels free the GPU (waited for at most ABORT_WAIT_S: an abort can itself hang on a
        communicator still being made, as vLLM's PyNcclCommunicator.destroy also allows for);
        gloo has nothing to abort (a stuck call ends at the group's timeout)."""
        abort = getattr(self.group, "abort", None) if self.backend == "nccl" else None
        if abort is not None:
            with contextlib.suppress(Exception):  # (already aborted by its watchdog, or still at it)
                within(ABORT_WAIT_S, "aborting the weight group", abort)

    def broadcast(self, buffers: list[Any]) -> None:
        """Rank 0's buffers into everyone's (same sizes, in order, on this group's device), one
        bucket at a time; returns once they are all in place (over NCCL: the stream synchronized,
        so another thread, the engine's, may read them and rank 0 may change its own)."""
        for b in buffers:
            if b.numel():
                self.group.broadcast(b, 0).wait()
        if self.backend == "nccl":
            import torch

            torch.cuda.current_stream(self.device).synchronize()

    def receive(self, header: FlatHeader, buffers: list[Any] | None = None) -> FlatState:
        """A publication's buckets from rank 0, into `buffers` when they have the header's sizes
        (the previous publication's, reused), else new ones on this group's device."""
        import torch

        if buffers is None or [int(b.numel()) for b in buffers] != list(header.bucket_bytes) \
                or any(b.device != torch.device(self.device) for b in buffers):
            buffers = receive_buffers(header, self.device)
        self.broadcast(buffers)
        return FlatState(header, buffers)
