"""How the weights travel (`publish:`), and the route chosen for a set of engines (docs/engines.md,
"How the weights travel")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from rose_ray.errors import ConfigError

PUBLISH_METHODS = ("auto", "object_store", "collective")
COLLECTIVE_BACKENDS = ("auto", "gloo", "nccl")  # publish.collective_backend
IN_FLIGHT = ("wait", "keep")  # publish.in_flight
# `auto` for local actors where NCCL does not apply: bench/publish.py measured the object store
# as fast as or faster than gloo over loopback (docs/engines.md, "How the weights travel").
AUTO_LOCAL = "object_store"


@dataclass
class PublishConfig:
    """How learner rank 0 sends the weights to the student engines (docs/engines.md, "How the weights travel")."""

    method: str = "auto"  # auto | object_store | collective
    # >0 packs the tensors into buckets of up to this many MB first (one copy, the buffers
    # reused), 0 sends each tensor's own bytes (no copy; one buffer each). Both methods.
    bucket_mb: float = 0.0
    # The collective's group: auto (nccl where it applies: `nccl_problem`) | gloo | nccl
    collective_backend: str = "auto"
    # The collective's deadline for forming its group and for each broadcast; past it (or on an
    # error of the group's) the publisher falls back to the object store for the rest of the run.
    timeout_s: float = 300.0
    # Whether rank 0 waits until every engine has loaded the weights (either way every call
    # submitted after a publication runs on them); false: a failed load is raised by the next one.
    wait_for_load: bool = True
    # The requests an engine is running when the weights come. `wait`: they finish on the old
    # weights first. `keep` (vllm only): after at most `in_flight_wait_ms` the weights load
    # under them and they go on sampling from the new ones; such a result keeps the version it
    # started on and says where the weights changed (docs/engines.md, "How the weights travel").
    in_flight: str = "wait"  # wait | keep
    in_flight_wait_ms: float = 0.0  # keep: the most a publication waits for running requests

    def __post_init__(self) -> None:
        for key, allowed in (("method", PUBLISH_METHODS), ("collective_backend", COLLECTIVE_BACKENDS),
                             ("in_flight", IN_FLIGHT)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"publish.{key}: must be one of {allowed}, got {getattr(self, key)!r}")
        if self.collective_backend != "auto" and self.method not in ("auto", "collective"):
            raise ConfigError(f"publish.collective_backend: {self.collective_backend} is the collective's; "
                              f"publish.method is {self.method}: leave it auto or use publish.method=collective")
        for key, ok, rule in (("bucket_mb", self.bucket_mb >= 0, ">= 0 (0: no buckets)"),
                              ("timeout_s", self.timeout_s > 0, "> 0"),
                              ("in_flight_wait_ms", self.in_flight_wait_ms >= 0, ">= 0")):
            if not ok:
                raise ConfigError(f"publish.{key}: must be {rule}, got {getattr(self, key)!r}")

    def check(self, student: Any, colocate: bool) -> None:
        """Against the student engine (an EngineConfig) and whether it shares learner rank 0's GPU."""
        from rose_ray.inference.registry import BACKENDS, in_flight_backends

        if self.method == "collective" and not student.spec.takes_weights:
            takers = " or ".join(b.name for b in BACKENDS.values() if b.takes_weights)
            raise ConfigError(f"publish.method: collective needs a student engine that is a local Ray actor "
                              f"(backend {takers}), not {student.backend.name!r}; use "
                              "publish.method=object_store or auto")
        if self.collective_backend == "nccl" and (split := student.backend.tensor_parallel) and split.value > 1:
            # (each vLLM worker would have to join the group itself, as OpenRLHF's worker extension does)
            raise ConfigError(f"publish.collective_backend: nccl receives the weights in the engine actor's process, "
                              f"but student_engine.backend.{split.key} is {split.value:g} "
                              "(the weights live in its worker processes); with tensor parallelism use "
                              "publish.collective_backend=gloo or auto, or publish.method=object_store")
        if self.collective_backend == "nccl" and colocate:
            raise ConfigError("publish.collective_backend: nccl takes one rank per GPU, but resources.colocate puts "
                              "student engine 0 on learner rank 0's GPU; use publish.collective_backend=auto or gloo")
        if self.in_flight == "keep" and "keep" not in student.spec.in_flight:
            raise ConfigError(f"publish.in_flight: keep loads the weights under an engine's running requests, "
                              f"which only the {'/'.join(in_flight_backends('keep'))} backend can (the hf backend "
                              f"generates a batch to its end; an openai engine takes no weights); "
                              f"student_engine.backend is {student.backend.name!r}: use publish.in_flight=wait")

    @property
    def keep_after_ms(self) -> float | None:
        """What an engine's load takes: None to drain, else how long to wait before keeping."""
        return float(self.in_flight_wait_ms) if self.in_flight == "keep" else None


@dataclass(frozen=True, kw_only=True)
class Member:
    """Where a would-be weight-group member runs: its Ray node, its GPU (a UUID; None off CUDA)
    and its process's NCCL_* variables."""

    node_id: str
    gpu: str | None = None
    nccl_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def here(cls, **fields: Any) -> Self:
        """This process (its GPU by UUID, whatever CUDA_VISIBLE_DEVICES numbers it), with `fields`."""
        import ray
        import torch

        from rose_ray.publish.group import own_nccl_env

        cuda = torch.cuda.is_available()
        gpu = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid) if cuda else None
        node = ray.get_runtime_context().get_node_id()
        return cls(node_id=node, gpu=gpu, nccl_env=own_nccl_env(), **fields)


@dataclass(frozen=True, kw_only=True)
class ReceiverInfo(Member):
    """What an engine actor tells a publisher (its `weight_receiver`)."""

    backend: str
    takes_weights: bool
    device: str = "cpu"
    tensor_parallel_size: int = 1


def nccl_problem(rank0: Member, engines: list[ReceiverInfo]) -> str | None:
    """Why an NCCL weight group cannot join learner rank 0 and these engines, or None: every
    member needs its own CUDA device and the same NCCL_* settings, and a tensor-parallel vLLM
    engine's weights live in worker processes that do not join."""
    if rank0.gpu is None:
        return "learner rank 0 has no CUDA device"
    seen = {rank0.gpu: "learner rank 0"}
    for n, e in enumerate(engines):
        mine, theirs = rank0.nccl_env, e.nccl_env
        differ = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
        if differ:
            return (f"student engine {n} runs with other NCCL settings than learner rank 0 "
                    f"({', '.join(f'{k}={theirs.get(k)} against {mine.get(k)}' for k in differ)}); every member "
                    "of an NCCL group needs the same")
        if not e.takes_weights:
            return f"student engine {n} ({e.backend}) cannot join a weight group"
        if e.gpu is None:
            return f"student engine {n} ({e.backend}) runs on {e.device}, not a CUDA device"
        if e.tensor_parallel_size > 1:
            return (f"student engine {n} runs vLLM with tensor_parallel_size {e.tensor_parallel_size} (its "
                    "weights live in worker processes, which do not join the group)")
        if e.gpu in seen:
            return f"student engine {n} is on the same GPU as {seen[e.gpu]} (NCCL takes one rank per GPU)"
        seen[e.gpu] = f"student engine {n}"
    return None


def choose_route(config: PublishConfig, rank0: Member, engines: list[ReceiverInfo]) -> tuple[str, str]:
    """(method, collective backend; "" for the object store). ConfigError where nccl is asked
    for and cannot run (`nccl_problem`)."""
    problem = nccl_problem(rank0, engines)
    backend = config.collective_backend
    if backend == "auto":
        backend = "gloo" if problem else "nccl"
    method = config.method
    if method == "auto":
        local = all(e.node_id == rank0.node_id and e.takes_weights for e in engines)
        method = ("collective" if backend == "nccl" and not problem else AUTO_LOCAL) if local else "object_store"
    if method != "collective":
        return method, ""
    if backend == "nccl" and problem:
        raise ConfigError(f"publish.collective_backend: nccl, but {problem}; use publish.collective_backend=auto "
                          "or gloo (or publish.method=object_store)")
    return method, backend
