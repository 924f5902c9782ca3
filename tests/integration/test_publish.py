"""Weight publication: flat byte buffers (rose_ray/publish/flat.py) and each `publish.method`
into real engine actors, checked against engines loaded fresh from the same weights."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest
import torch

from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.registry import VLLMSettings
from rose_ray.types import SamplingParams
from tests.unit.inference.test_engine import sharpened_state, special_ids

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


# ------------------------------------------------------------------ into engine actors


@pytest.fixture(scope="module")
def weights(tiny_models, tmp_path_factory):
    """(config, prompts, {version: state}, {version: greedy ids of an hf engine loaded fresh
    from a model folder of that state})."""
    from rose_ray.inference.hf import HFEngine
    from rose_ray.learner.export import write_hf_folder

    config = EngineConfig(model=str(tiny_models["student"]), dtype="float32", threads=1,
                          max_batch_size=8, context_tokens=512)
    base = HFEngine(config)
    chat = base.chat
    prompts = [chat.opening_ids([("user", "You are an agent. " * k), ("assistant", "OK")])
               + chat.user_ids("You see a door. " * (4 - k)) for k in range(1, 4)]
    states, fresh, folders = {}, {}, {}
    for v in (1, 2, 3):
        states[v] = sharpened_state(base.model, seed=v, quiet_ids=special_ids(base.tokenizer))
        folders[v] = tmp_path_factory.mktemp(f"published_v{v}")
        write_hf_folder(states[v], config.model, str(folders[v]), "float32")
        engine = HFEngine(replace(config, model=str(folders[v])))
        fresh[v] = greedy_ids(engine.generate, prompts)
        engine.close() if hasattr(engine, "close") else None
    assert fresh[1] != fresh[2] != fresh[3]  # the weights decide the outputs: the checks below can fail
    return config, prompts, states, fresh, folders


def greedy_ids(generate, prompts) -> list[list[int]]:
    return [r.token_ids for r in generate([GenerationRequest(p, GREEDY) for p in prompts])]


def actor_greedy(actor, prompts) -> list[list[int]]:
    import ray

    return [r.token_ids for r in ray.get(actor.generate_many.remote([GenerationRequest(p, GREEDY) for p in prompts]))]


@pytest.fixture(scope="module")
def hf_actor(weights, ray_cluster):
    from rose_ray.inference.actor import engine_actor

    actor = engine_actor(weights[0], num_cpus=1)
    yield actor
    ray_cluster.kill(actor)


SETTINGS = [{"method": "object_store"}, {"method": "object_store", "bucket_mb": 0.05},
            {"method": "collective"}, {"method": "collective", "bucket_mb": 0.05}]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_each_method_leaves_the_engine_as_a_fresh_load_of_the_weights(settings, weights, hf_actor):
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    _, prompts, states, fresh, _ = weights
    publisher = WeightPublisher(PublishConfig(**settings))
    for version in (2, 3, 1):  # each differs from the one before: a publication that did nothing fails
        out = publisher.publish(states[version], [hf_actor], version)
        assert out["method"] == settings["method"] and out["versions"] == [version]
        assert out["backend"] == ("gloo" if settings["method"] == "collective" else "")  # no CUDA here
        assert out["mb"] > 0 and out["load_ms"] > 0 and out["transfer_ms"] > 0
        # publish.bucket_mb packs for either method (0: each tensor's own bytes, one buffer each)
        tensors = len(states[version])
        assert 1 < out["buckets"] < tensors if settings.get("bucket_mb") else out["buckets"] == tensors
        assert actor_greedy(hf_actor, prompts) == fresh[version], (settings, version)


def test_auto_picks_the_local_method_for_a_local_engine(weights, hf_actor):
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import AUTO_LOCAL, PublishConfig

    _, prompts, states, fresh, _ = weights
    publisher = WeightPublisher(PublishConfig())
    out = publisher.publish(states[2], [hf_actor], 2)
    assert out["method"] == AUTO_LOCAL
    assert actor_greedy(hf_actor, prompts) == fresh[2]


def test_a_collective_group_follows_the_engines_it_publishes_to(weights, hf_actor, ray_cluster):
    """A replaced engine (another actor) gets a new group; two engines share one broadcast."""
    from rose_ray.inference.actor import engine_actor
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    config, prompts, states, fresh, _ = weights
    other = engine_actor(config, num_cpus=1)
    try:
        publisher = WeightPublisher(PublishConfig(method="collective", bucket_mb=0.05))
        publisher.publish(states[3], [hf_actor], 3)
        assert actor_greedy(hf_actor, prompts) == fresh[3]
        publisher.publish(states[2], [other], 2)
        assert actor_greedy(other, prompts) == fresh[2] and actor_greedy(hf_actor, prompts) == fresh[3]
        out = publisher.publish(states[1], [hf_actor, other], 1)
        assert out["versions"] == [1, 1]
        assert actor_greedy(hf_actor, prompts) == actor_greedy(other, prompts) == fresh[1]
    finally:
        ray_cluster.kill(other)


def test_a_collective_that_never_forms_falls_back_to_the_object_store_within_its_timeout(
        weights, hf_actor, ray_cluster, stop_process):
    """An engine that does not join the weight group (frozen here by SIGSTOP, as a peer whose
    NCCL init hangs would be): the publisher gives the collective up when publish.timeout_s has
    passed, not later, and sends that version through the object store once the engine answers
    again; every later publication goes there too, without trying the collective again."""
    import threading
    import time

    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    _, prompts, states, fresh, _ = weights
    timeout_s, frozen_s = 3.0, 8.0
    publisher = WeightPublisher(PublishConfig(method="collective", collective_backend="gloo", timeout_s=timeout_s))
    pid = ray_cluster.get(hf_actor.health.remote())["pid"]
    stop_process(pid)
    thaw = threading.Timer(frozen_s, os.kill, (pid, signal.SIGCONT))
    thaw.start()
    start = time.monotonic()
    try:
        out = publisher.publish(states[2], [hf_actor], 2)
    finally:
        thaw.cancel()
        os.kill(pid, signal.SIGCONT)
    waited = time.monotonic() - start
    assert out["method"] == "object_store" and out["versions"] == [2]
    assert out["fallback"] == (f"the collective over gloo gave up: forming the weight group (gloo: learner rank 0 "
                               f"and 1 engine(s)): not done within {timeout_s:g} s (publish.timeout_s)")
    # Had rank 0 waited longer than its timeout, the engine (back after frozen_s) would have
    # joined and the collective gone ahead; the object store's load waited for the engine.
    assert frozen_s <= waited < frozen_s + 30
    assert actor_greedy(hf_actor, prompts) == fresh[2]
    assert publisher.route_for([hf_actor]) == ("object_store", "")
    again = publisher.publish(states[3], [hf_actor], 3)
    assert (again["method"], again["fallback"]) == ("object_store", None)
    assert actor_greedy(hf_actor, prompts) == fresh[3]


def test_a_vllm_engine_after_a_publication_answers_as_when_loaded_fresh(weights, ray_cluster):
    """A vLLM engine actor started from version 2's folder; for each flat method version 3
    published (its outputs change), then version 2 again: the outputs are its fresh start's."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    from rose_ray.inference.actor import engine_actor
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    config, prompts, states, fresh, folders = weights
    actor = engine_actor(replace(config, backend=VLLMSettings(kv_cache_mb=64), model=str(folders[2])), num_cpus=1)
    try:
        loaded_fresh = actor_greedy(actor, prompts)
        assert loaded_fresh == fresh[2]  # as the hf engine's: the comparison is a real one
        version = 2
        for method in ("object_store", "collective"):
            publisher = WeightPublisher(PublishConfig(method=method, bucket_mb=0.05))
            publisher.publish(states[3], [actor], version := version + 1)
            assert actor_greedy(actor, prompts) == fresh[3], method
            publisher.publish(states[2], [actor], version := version + 1)
            assert actor_greedy(actor, prompts) == loaded_fresh, method
            assert ray_cluster.get(actor.version.remote()) == version
    finally:
        ray_cluster.kill(actor)


TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.skipif(not TWO_GPUS, reason="the NCCL publication needs CUDA and two GPUs (NCCL takes one rank per "
                    "GPU: this process as learner rank 0 on one, the engine actor on another); not here, so not run "
                    "(bench/gpu_check.sh runs it on a GPU machine)")
def test_an_nccl_publication_leaves_a_gpu_engine_as_a_fresh_load(weights, ray_cluster):
    """publish.collective_backend nccl: this process stands in for learner rank 0 on a GPU of
    its own, its state on that GPU; an hf engine actor on another GPU receives the buckets into
    buffers on its GPU. `auto` (method and backend) takes this path; after each publication the
    engine's greedy outputs are those of an engine loaded fresh from the same weights on a GPU."""
    from rose_ray.inference.actor import engine_actor
    from rose_ray.inference.hf import HFEngine
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import Member, PublishConfig

    config, prompts, states, _, folders = weights
    actor = engine_actor(config, num_cpus=1, num_gpus=1)
    try:
        engine_gpu = ray_cluster.get(actor.weight_receiver.remote()).gpu
        assert engine_gpu is not None
        mine = next(d for d in range(torch.cuda.device_count())
                    if str(torch.cuda.get_device_properties(d).uuid) != engine_gpu)
        torch.cuda.set_device(mine)
        assert Member.here().gpu != engine_gpu
        fresh = {}
        for v in (1, 2, 3):  # the reference: each version loaded fresh from its folder, on a GPU
            fresh[v] = greedy_ids(HFEngine(replace(config, model=str(folders[v])), device=f"cuda:{mine}").generate,
                                  prompts)
        for settings in ({}, {"method": "collective", "collective_backend": "nccl", "bucket_mb": 0.05}):
            publisher = WeightPublisher(PublishConfig(**settings))
            for version in (2, 3, 1):
                on_gpu = {k: t.to(f"cuda:{mine}") for k, t in states[version].items()}
                out = publisher.publish(on_gpu, [actor], version)
                assert (out["method"], out["backend"], out["versions"]) == ("collective", "nccl", [version])
                assert actor_greedy(actor, prompts) == fresh[version], (settings, version)
    finally:
        ray_cluster.kill(actor)


@pytest.mark.parametrize("method", ["object_store", "collective"])
def test_a_publication_that_does_not_wait_for_the_load_is_still_ordered_before_later_calls(
        method, weights, hf_actor, ray_cluster):
    """`wait_for_load: false`: rank 0 goes on while a long request is still generating on the
    old weights; calls submitted after the publication run on the new ones. Waiting (the
    default) returns only after the load, which comes after the request in flight."""
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    _, prompts, states, fresh, _ = weights
    WeightPublisher(PublishConfig(method=method)).publish(states[1], [hf_actor], 1)
    long = GenerationRequest(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=400))

    in_flight = hf_actor.generate.remote(long)
    ray_cluster.get(hf_actor.version.remote())  # (answered at once: the request is in flight by now)
    out = WeightPublisher(PublishConfig(method=method, wait_for_load=False)).publish(states[2], [hf_actor], 2)
    assert out["versions"] == [2] and out["load_ms"] == 0
    ready, _ = ray_cluster.wait([in_flight], timeout=0)
    assert not ready  # the publication did not wait for it
    after = ray_cluster.get(hf_actor.generate_many.remote([GenerationRequest(p, GREEDY) for p in prompts]))
    assert [r.token_ids for r in after] == fresh[2] and {r.version for r in after} == {2}
    first = ray_cluster.get(in_flight)
    assert first.version == 1 and len(first.token_ids) > 50

    in_flight = hf_actor.generate.remote(long)
    ray_cluster.get(hf_actor.version.remote())
    out = WeightPublisher(PublishConfig(method=method)).publish(states[3], [hf_actor], 3)
    ready, _ = ray_cluster.wait([in_flight], timeout=2)  # (its reply may still be on the way)
    assert ready and out["load_ms"] > 0  # the load waited for the request in flight
    assert ray_cluster.get(in_flight).version == 2 and actor_greedy(hf_actor, prompts) == fresh[3]


def test_keep_is_refused_by_an_engine_that_cannot_keep(weights, hf_actor, ray_cluster):
    """An hf engine generates a batch to its end: `keep` is refused, naming the key, and the
    engine is left as it was."""
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    _, prompts, states, fresh, _ = weights
    WeightPublisher(PublishConfig(method="object_store")).publish(states[1], [hf_actor], 1)
    with pytest.raises(Exception, match="publish.in_flight: keep .* hf backend cannot"):
        WeightPublisher(PublishConfig(method="object_store", in_flight="keep")).publish(states[2], [hf_actor], 2)
    assert ray_cluster.get(hf_actor.version.remote()) == 1 and actor_greedy(hf_actor, prompts) == fresh[1]


def _decoding(actor, ray_cluster, steps_before: int, steps: int = 5) -> None:
    """Until the engine has stepped `steps` more times (a request in flight is sampling)."""
    import time

    deadline = time.monotonic() + 60
    while ray_cluster.get(actor.stats.remote())["steps"] < steps_before + steps:
        assert time.monotonic() < deadline, "the request in flight never started decoding"
        time.sleep(0.01)


LONG = 1500  # tokens: still decoding after the publication returns, with seconds to spare here


@pytest.mark.slow  # a 1500-token request decoded twice over
def test_a_vllm_publication_that_keeps_requests_in_flight_does_not_wait_for_them(weights, ray_cluster):
    """`publish.in_flight: keep` on a vLLM engine: with a long request decoding, a publication
    that waits for the load returns while the request still runs; the request finishes on the
    new weights (its version the one it started on, `version_end` the new one, and its tokens
    after the swap what the new weights continue its prefix with); later calls answer as a
    fresh load of the new weights. `wait` (the default) still drains: it returns only after
    the request in flight, which then ran on the old weights throughout. (Keeping is the
    engine's side: the method only carries the weights, and object_store is the local default.)"""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    from rose_ray.inference.actor import engine_actor
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    config, prompts, states, fresh, folders = weights
    actor = engine_actor(replace(config, backend=VLLMSettings(kv_cache_mb=64), model=str(folders[2]),
                                 context_tokens=4096), num_cpus=1)
    long = GenerationRequest(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=LONG))
    try:
        assert actor_greedy(actor, prompts) == fresh[2]
        publisher = WeightPublisher(PublishConfig(method="object_store", in_flight="keep", in_flight_wait_ms=0))
        publisher.publish(states[2], [actor], 2)  # (a warm publication: a collective's group is joined)

        steps = ray_cluster.get(actor.stats.remote())["steps"]
        in_flight = actor.generate.remote(long)
        _decoding(actor, ray_cluster, steps)
        out = publisher.publish(states[3], [actor], 3)
        ready, _ = ray_cluster.wait([in_flight], timeout=0)
        assert not ready and out["versions"] == [3] and out["load_ms"] > 0  # loaded, the request still running
        assert actor_greedy(actor, prompts) == fresh[3]  # while it runs: calls after it are on the new weights
        kept = ray_cluster.get(in_flight)
        assert kept.finish_reason == "length" and len(kept.token_ids) == len(kept.logprobs) == LONG
        assert kept.version == 2 and kept.version_end == 3
        swap = kept.tokens_on_version
        assert 0 < swap < len(kept.token_ids)
        # the tokens after the swap are the new weights' continuation of the tokens before it:
        # the request's keys/values were recomputed, not left from the old weights
        cont = ray_cluster.get(actor.generate.remote(GenerationRequest(
            prompts[0] + kept.token_ids[:swap], replace(GREEDY, max_new_tokens=10))))
        assert cont.token_ids == kept.token_ids[swap:swap + 10]
        stats = ray_cluster.get(actor.stats.remote())
        assert stats["updates_kept"] >= 1 and stats["requests_kept"] >= 1

        steps = stats["steps"]
        in_flight = actor.generate.remote(replace(long, sampling=replace(long.sampling, max_new_tokens=400)))
        _decoding(actor, ray_cluster, steps)
        WeightPublisher(PublishConfig(method="object_store")).publish(states[2], [actor], 4)
        ready, _ = ray_cluster.wait([in_flight], timeout=2)  # (its reply may still be on the way)
        assert ready  # the drain: the load waited for the request in flight
        drained = ray_cluster.get(in_flight)
        assert drained.version == 3 and drained.version_end is None and drained.tokens_on_version is None
        assert actor_greedy(actor, prompts) == fresh[2]
    finally:
        ray_cluster.kill(actor)
