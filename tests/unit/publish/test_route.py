"""Which publication method and collective backend a publisher takes (rose_ray/publish/route.py
`choose_route`), and the `publish:` settings refused at start. No GPU needed: the engines are
their `weight_receiver` answers (ReceiverInfo), as an engine actor gives them."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from rose_ray.errors import ConfigError
from rose_ray.publish.route import (
    AUTO_LOCAL,
    Member,
    PublishConfig,
    ReceiverInfo,
    choose_route,
    nccl_problem,
)

RANK0_GPU = Member(node_id="node-a", gpu="GPU-0")
RANK0_CPU = Member(node_id="node-a", gpu=None)


def engine(gpu: str | None = "GPU-1", node: str = "node-a", backend: str = "vllm", tp: int = 1,
           takes_weights: bool = True) -> ReceiverInfo:
    return ReceiverInfo(node_id=node, backend=backend, takes_weights=takes_weights,
                        device="cuda" if gpu else "cpu", gpu=gpu, tensor_parallel_size=tp)


def route(rank0: Member, engines: list[ReceiverInfo], **settings) -> tuple[str, str]:
    return choose_route(PublishConfig(**settings), rank0, engines)


def test_auto_takes_the_nccl_collective_where_every_engine_is_a_local_gpu_of_its_own():
    assert route(RANK0_GPU, [engine("GPU-1"), engine("GPU-2", backend="hf")]) == ("collective", "nccl")


@pytest.mark.parametrize("rank0, engines, why", [
    (RANK0_CPU, [engine(None)], "learner rank 0 has no CUDA device"),
    (RANK0_CPU, [engine("GPU-1")], "learner rank 0 has no CUDA device"),
    (RANK0_GPU, [engine(None)], "student engine 0 (vllm) runs on cpu"),
    (RANK0_GPU, [engine("GPU-0")], "same GPU as learner rank 0"),  # colocated
    (RANK0_GPU, [engine("GPU-1"), engine("GPU-1")], "student engine 1 is on the same GPU as student engine 0"),
    (RANK0_GPU, [engine("GPU-1", tp=2)], "tensor_parallel_size 2"),
])
def test_where_nccl_does_not_apply_auto_keeps_the_host_paths(rank0, engines, why):
    assert why in nccl_problem(rank0, engines)
    assert route(rank0, engines) == (AUTO_LOCAL, "")  # local engines: the CPU-measured choice
    assert route(rank0, engines, method="collective") == ("collective", "gloo")
    with pytest.raises(ConfigError, match=f"publish.collective_backend: nccl, but .*{re.escape(why)}"):
        route(rank0, engines, method="collective", collective_backend="nccl")
    assert route(rank0, engines, method="collective", collective_backend="gloo") == ("collective", "gloo")


def test_an_engine_on_another_node_or_served_gets_the_object_store_under_auto():
    # NCCL could reach another node's GPU, but auto keeps the object store there (a shared
    # fabric is not sure); asked for, the collective goes over NCCL.
    far = [engine("GPU-1", node="node-b")]
    assert route(RANK0_GPU, far) == ("object_store", "")
    assert route(RANK0_GPU, far, method="collective") == ("collective", "nccl")
    served = [engine(None, backend="openai", takes_weights=False)]
    assert route(RANK0_GPU, served) == ("object_store", "")
    assert "cannot join a weight group" in nccl_problem(RANK0_GPU, served)


def test_an_explicit_method_is_kept():
    engines = [engine("GPU-1")]
    assert route(RANK0_GPU, engines, method="object_store") == ("object_store", "")
    assert route(RANK0_GPU, engines, method="collective", collective_backend="gloo") == ("collective", "gloo")
    assert route(RANK0_GPU, engines, collective_backend="gloo") == (AUTO_LOCAL, "")  # gloo: no reason to switch


def test_collective_backend_is_validated_naming_the_key():
    from rose_ray.config import load_config

    with pytest.raises(ConfigError, match=r"publish.collective_backend: must be one of \('auto', 'gloo', 'nccl'\), "
                                          r"got 'mpi'"):
        PublishConfig(collective_backend="mpi")
    with pytest.raises(ConfigError, match="publish.collective_backend: nccl is the collective's; publish.method is "
                                          "object_store"):
        load_config(None, ["publish.method=object_store", "publish.collective_backend=nccl"])
    with pytest.raises(ConfigError, match="publish.collective_backend: nccl .* student_engine.backend.tensor_parallel_size "
                                          "is 2"):
        load_config(None, ["publish.collective_backend=nccl", "student_engine.backend={name: vllm, tensor_parallel_size: 2}"])
    with pytest.raises(ConfigError, match="publish.collective_backend: nccl takes one rank per GPU, but "
                                          "resources.colocate"):
        load_config(None, ["publish.collective_backend=nccl", "resources.colocate=true"])
    config = load_config(None, ["publish.method=collective", "publish.collective_backend=nccl"])
    assert config.publish.collective_backend == "nccl"
    assert load_config(None, []).publish.collective_backend == "auto"


def test_nccl_needs_the_same_nccl_settings_on_every_member():
    """NCCL never reconciles its settings across ranks (a differing NCCL_CUMEM_ENABLE broke
    NeMo-RL's transfer group): an engine that runs with other NCCL_* than learner rank 0 gets no
    NCCL group (auto: the host paths; asked for: refused, naming the variable)."""
    from rose_ray.publish.group import NCCL_DEFAULTS, nccl_env

    run = nccl_env({"NCCL_CUMEM_ENABLE": "0", "NCCL_DEBUG": "WARN", "PATH": "/bin",
                    "NCCL_ASYNC_ERROR_HANDLING": "1"})  # (torch's, not NCCL's: vLLM's worker drops it)
    assert run == {**NCCL_DEFAULTS, "NCCL_CUMEM_ENABLE": "0", "NCCL_DEBUG": "WARN"}  # the launcher's over the defaults
    assert nccl_env({"NCCL_NVLS_ENABLE": "1"})["NCCL_NVLS_ENABLE"] == "1"  # a user's choice is kept
    rank0 = replace(RANK0_GPU, nccl_env=run)
    same = replace(engine("GPU-1"), nccl_env=dict(run))
    assert nccl_problem(rank0, [same]) is None
    assert route(rank0, [same]) == ("collective", "nccl")
    other = replace(engine("GPU-1"), nccl_env={**run, "NCCL_CUMEM_ENABLE": "1"})
    why = nccl_problem(rank0, [same, other])
    assert why == ("student engine 1 runs with other NCCL settings than learner rank 0 (NCCL_CUMEM_ENABLE=1 "
                   "against 0); every member of an NCCL group needs the same")
    assert route(rank0, [same, other]) == (AUTO_LOCAL, "")
    with pytest.raises(ConfigError, match="NCCL_CUMEM_ENABLE=1 against 0"):
        route(rank0, [other], method="collective", collective_backend="nccl")
    unset = replace(engine("GPU-1"), nccl_env={})  # started without the run's settings
    assert "NCCL_CUMEM_ENABLE=None against 0" in nccl_problem(rank0, [unset])


def test_the_removed_publication_settings_are_refused_naming_what_replaced_them(tmp_path, capsys):
    """`pickled` is no longer a method (bench/publish.py keeps it as its baseline), and one
    `publish.bucket_mb` replaced the object store's own bucket size: an old config is refused,
    exit 2, naming the key and the choices or the replacement; a run's saved config.yaml that
    holds the old key resumes without it."""
    from rose_ray.cli import main
    from rose_ray.config import load_config, to_yaml

    with pytest.raises(ConfigError, match=r"publish.method: must be one of \('auto', 'object_store', 'collective'\), "
                                          r"got 'pickled'"):
        PublishConfig(method="pickled")
    old = tmp_path / "old.yaml"
    for yaml, says in (("publish:\n  method: pickled\n",
                        "publish.method: must be one of ('auto', 'object_store', 'collective'), got 'pickled'"),
                       ("publish:\n  object_store_bucket_mb: 256\n",
                        "key 'publish.object_store_bucket_mb': removed; one bucket size for every method: "
                        "publish.bucket_mb")):
        old.write_text(yaml)
        assert main(["check", str(old)]) == 2
        assert says in capsys.readouterr().err
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(load_config(None, ["publish.bucket_mb=64"])).replace(
        "  bucket_mb: 64.0\n", "  bucket_mb: 64.0\n  object_store_bucket_mb: 256.0\n"))
    assert "object_store_bucket_mb" in saved.read_text()
    assert main(["migrate", str(tmp_path)]) == 0  # a run saved before: its bucket_mb kept
    assert load_config(saved).publish.bucket_mb == 64
