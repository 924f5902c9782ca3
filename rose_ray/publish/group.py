"""A weight group: learner rank 0 and the engine actors in a torch.distributed group of their own
(a TCPStore and a ProcessGroupGloo or ProcessGroupNCCL built directly, as vLLM's
StatelessProcessGroup does). Nothing here may hang the learner: rank 0 waits `within` a deadline
and an NCCL group's timeout aborts only its communicator (NCCL_GROUP_ENV)."""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from rose_ray.publish.flat import FlatHeader, FlatState, buffers_for

# The NCCL settings every member of a weight group runs with (the launcher's NCCL_* over these):
# NCCL never reconciles its settings across ranks, and members that differ hang or fail.
# docs/engines.md ("NCCL settings") says why each default is set.
NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0"}  # NVLink SHARP: wrong all_gather order, hangs (NVIDIA/nccl#1906)
# Set only while a weight group's ProcessGroupNCCL is made: 2 aborts the group's communicator on
# a timeout, where torch's default (3) would end learner rank 0's process.
NCCL_GROUP_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
_ENV_LOCK = threading.Lock()
ABORT_WAIT_S = 10.0
T = TypeVar("T")
# Not NCCL's settings (torch's old TORCH_NCCL_ASYNC_ERROR_HANDLING, which vLLM's worker removes):
NOT_NCCL_SETTINGS = frozenset({"NCCL_ASYNC_ERROR_HANDLING"})


def own_nccl_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NCCL_* variables of `environ` (default: this process's, what a member reports)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith("NCCL_") and k not in NOT_NCCL_SETTINGS}


def nccl_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NCCL_* variables every weight-group member runs with: the launching process's own
    (`environ`, default this process's) over NCCL_DEFAULTS."""
    return {**NCCL_DEFAULTS, **own_nccl_env(environ)}


class CollectiveTimeout(TimeoutError):
    """A weight group that did not form, or a broadcast that did not end, in its time."""


def within(timeout_s: float, what: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, waited for at most `timeout_s` (else CollectiveTimeout naming `what`). A call
    stuck in gloo or NCCL cannot be interrupted, so it runs on a daemon thread (on the caller's
    CUDA device), left to the group's own timeout while the caller goes on."""
    import torch

    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    result: Future[T] = Future()

    def run() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            result.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            result.set_exception(e)

    threading.Thread(target=run, name=f"weights: {what}", daemon=True).start()
    if not wait([result], timeout_s).done:
        raise CollectiveTimeout(f"{what}: not done within {timeout_s:g} s (publish.timeout_s)")
    return result.result()


class WeightGroup:
    """Rank 0 (the learner) and the engine actors on a TCPStore that rank 0 hosts
    (`open_store`; the others `join` its address), over gloo or nccl. Every member constructs at
    once; `timeout_s` bounds the rendezvous and each collective."""

    def __init__(self, store: Any, name: str, rank: int, world_size: int, timeout_s: float,
                 backend: str = "gloo") -> None:
        from torch.distributed import PrefixStore

        self.store, self.name, self.rank, self.world_size = store, name, rank, world_size
        self.backend = backend
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "nccl":
            import torch
            from torch.distributed import ProcessGroupNCCL

            self.device = torch.device("cuda", torch.cuda.current_device())
            options = ProcessGroupNCCL.Options()
            options._timeout = timeout  # the watchdog's: a collective running longer is aborted
            with _ENV_LOCK:  # NCCL_GROUP_ENV only while the group is made
                before = {k: os.environ.get(k) for k in NCCL_GROUP_ENV}
                os.environ.update(NCCL_GROUP_ENV)
                try:
                    self.group = ProcessGroupNCCL(PrefixStore(name, store), rank, world_size, options)
                finally:
                    for k, v in before.items():
                        if v is None:
                            del os.environ[k]
                        else:
                            os.environ[k] = v
        else:
            from torch.distributed import ProcessGroupGloo

            self.device = "cpu"
            self.group = ProcessGroupGloo(PrefixStore(name, store), rank, world_size, timeout)

    @staticmethod
    def open_store(world_size: int, timeout_s: float, backend: str = "gloo") -> tuple[Any, dict[str, Any]]:
        """Rank 0's TCPStore on a free port, and the address the others join with."""
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
        """Give the group up: an NCCL communicator is aborted (waited for at most ABORT_WAIT_S: an
        abort can hang on a communicator still being made); gloo's stuck calls end at its timeout."""
        abort = getattr(self.group, "abort", None) if self.backend == "nccl" else None
        if abort is not None:
            with contextlib.suppress(Exception):  # already aborted by its watchdog
                within(ABORT_WAIT_S, "aborting the weight group", abort)

    def broadcast(self, buffers: list[Any]) -> None:
        """Rank 0's buffers into everyone's, one bucket at a time; returns once they are in place
        (over NCCL: the stream synchronized, so other threads may read them)."""
        for b in buffers:
            if b.numel():
                self.group.broadcast(b, 0).wait()
        if self.backend == "nccl":
            import torch

            torch.cuda.current_stream(self.device).synchronize()

    def receive(self, header: FlatHeader, buffers: list[Any] | None = None) -> FlatState:
        """A publication's buckets from rank 0, into `buffers` where they fit (`buffers_for`)."""
        buffers = buffers_for(header, self.device, buffers)
        self.broadcast(buffers)
        return FlatState(header, buffers)
