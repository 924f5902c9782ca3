"""Engines on a cluster with fake GPUs (Ray counts them; none exists here), as the seed's
placement puts them: the device is the actor's own view, and a tensor-parallel vLLM engine
serves from inside its placement-group bundle (vLLM's CPU build takes the GPU build's
executor selection, so the placement-group path runs here as on GPUs)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.hf import HFEngine
from rose_ray.types import SamplingParams
from tests.unit.inference.test_engine import sharpened_state, special_ids

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)
LONGER = SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def fake_gpu_cluster():
    """A local Ray cluster of 4 CPUs and 4 fake GPUs for this module, in place of the session's."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    session = ray.is_initialized()
    if session:
        ray.shutdown()
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if session:
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)


def prompt_of(model: str) -> list[int]:
    from rose_ray.chat import ChatFormat
    from rose_ray.models import load_tokenizer

    chat = ChatFormat(load_tokenizer(model))
    return chat.opening_ids([("user", "You are in the kitchen."), ("assistant", "OK")]) + chat.user_ids("look")


@pytest.mark.slow
def test_an_engine_given_fake_gpus_runs_on_what_it_sees(fake_gpu_cluster, tiny_models):
    """Asked with num_gpus=1 on a machine without GPUs, the engine runs on CPU (was: CUDA, and
    failed at start)."""
    from rose_ray.inference.actor import engine_actor

    ray = fake_gpu_cluster
    model = str(tiny_models["student"])
    actor = engine_actor(EngineConfig(model=model, dtype="float32", threads=1, context_tokens=256),
                         num_cpus=1, num_gpus=1)
    try:
        assert ray.get(actor.health.remote(), timeout=120)["device"] == "cpu"
        result = ray.get(actor.generate.remote(GenerationRequest(prompt_of(model), GREEDY)), timeout=120)
        assert len(result.token_ids) >= 1
    finally:
        ray.kill(actor)


def worker_pids(pid: int) -> set[int]:
    """The processes below `pid` (vLLM's multiprocessing executor starts one per rank)."""
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def gone(pids: set[int], timeout_s: float = 60.0) -> bool:
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_a_tp2_vllm_teacher_serves_from_its_bundle_and_is_replaced_there(fake_gpu_cluster, tiny_models):
    """The seed's teacher layout: one bundle of 2 (fake) GPUs, the actor holding them, TP=2 over
    vLLM's multiprocessing executor (on CPU: two rank processes, gloo). It serves, scores, is
    killed and replaced on the same bundle, and leaves no worker process behind. The replacement
    then takes a weight update (a TP=2 student's publication): it reaches both shards, so greedy
    ids and logprobs equal transformers' with the same weights (was a unit test's own TP=2
    engine: one engine start less, the same check)."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    from rose_ray.inference.actor import engine_actor
    from rose_ray.placement import PlacementGroups, RoleDemand

    ray = fake_gpu_cluster
    model = str(tiny_models["teacher"])
    config = EngineConfig.of("vllm", model=model, dtype="float32", tensor_parallel_size=2, threads=1,
                          kv_cache_mb=16, context_tokens=256, max_batch_size=2)
    groups = PlacementGroups([RoleDemand("teacher engine", 1, {"CPU": 1, "GPU": 2}, "PACK", "teacher")], timeout_s=60)
    prompt = prompt_of(model)
    try:
        answers = []
        for replacement in (False, True):  # the first engine, then its replacement on the same bundle
            actor = engine_actor(config, num_cpus=1, num_gpus=2, **groups.options("teacher engine"))
            health = ray.get(actor.health.remote(), timeout=600)
            assert health["device"] == "cpu"
            answers.append(ray.get(actor.generate.remote(GenerationRequest(prompt, GREEDY)), timeout=300).token_ids)
            scores = ray.get(actor.score.remote(prompt, answers[-1]), timeout=300)
            assert len(scores) == len(answers[-1]) and all(s <= 0 for s in scores)
            workers = worker_pids(health["pid"])
            assert len(workers) >= 2, workers  # one process per tensor-parallel rank
            if replacement:  # serves as the first did, then takes new weights on both shards
                assert answers[0] == answers[1]  # the same model, greedy
                reference = HFEngine(EngineConfig.of("hf", model=model, dtype="float32", threads=1,
                                                     context_tokens=256, prefix_cache_mb=0))
                new = sharpened_state(reference.model, seed=11, quiet_ids=special_ids(reference.tokenizer))
                reference.update_weights(new, version=2)
                state = {k: v.numpy() for k, v in new.items()}
                assert ray.get(actor.load_weights.remote(state, 2), timeout=300)["version"] == 2
                got = ray.get(actor.generate.remote(GenerationRequest(prompt, LONGER)), timeout=300)
                want = reference.generate([GenerationRequest(prompt, LONGER)])[0]
                assert got.version == 2 and got.token_ids == want.token_ids and got.token_ids[:4] != answers[0]
                np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
            ray.kill(actor)
            assert gone(workers | {health["pid"]}), "vLLM's rank processes outlived their engine"
    finally:
        groups.remove()
