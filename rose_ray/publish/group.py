"""A weight group: learner rank 0 and the engine actors in a torch.distributed group of their own.

`WeightGroup` is a TCPStore and a ProcessGroupGloo or ProcessGroupNCCL built directly (as vLLM's
StatelessProcessGroup, OpenRLHF and verl do), so learner rank 0 and the engine actors share a
group without touching the learner's default (DeepSpeed) group. Rank 0 broadcasts each bucket of a
publication's flat buffers (flat.py); the engines receive into buffers of the
sizes the header gives: host buffers over gloo, or, over NCCL, buffers on each member's GPU
(packed there on rank 0, loaded from there by the engine: no host round trip).

Nothing here may hang the learner: rank 0 forms the group and broadcasts `within` a deadline
(a call stuck in gloo or NCCL cannot be interrupted, so it runs on a thread of its own and
rank 0 goes on without it: CollectiveTimeout), an NCCL group is made so that its own timeout
aborts its communicator instead of ending the process (NCCL_GROUP_ENV), and every member runs
with the same NCCL settings (`nccl_env`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from rose_ray.publish.flat import FlatHeader, FlatState, buffers_for

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
# takes no NCCL group whose members report different ones (route.py `nccl_problem`).
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
        """Rank 0's TCPStore on a free port of this node's address as Ray knows it, and the
        address the others join with."""
        import ray
        from torch.distributed import TCPStore

        host = ray.util.get_node_ip_address()
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
        buffers = buffers_for(header, self.device, buffers)
        self.broadcast(buffers)
        return FlatState(header, buffers)
