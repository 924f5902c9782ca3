"""The engine as a Ray actor: concurrent callers are batched; weights swap between batches."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from rose_ray.inference.actor import engine_actor
from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.hf import HFEngine
from rose_ray.types import SamplingParams
from tests.unit.inference.test_engine import sharpened_state

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def setup(tiny_models, ray_cluster):
    config = EngineConfig(model=str(tiny_models["student"]), dtype="float32", threads=1,
                          max_batch_size=16, max_wait_ms=50, context_tokens=512)
    local = HFEngine(config)
    special = tuple(local.tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    states = {v: {k: t.numpy() for k, t in sharpened_state(local.model, seed=v, quiet_ids=special).items()}
              for v in (1, 2)}
    local.update_weights(states[1], 1)
    actor = engine_actor(config, num_cpus=1)
    assert ray_cluster.get(actor.load_weights.remote(ray_cluster.put(states[1]), 1))["version"] == 1
    chat = local.chat
    prompts = [chat.opening_ids([("user", f"You are agent {i}. " * (1 + i % 5)), ("assistant", "OK")])
               + chat.user_ids("You see a door. " * (1 + i % 3)) for i in range(16)]
    return actor, local, states, prompts


def test_sixteen_concurrent_callers_are_served_in_batches(setup):
    actor, local, _, prompts = setup

    async def episode(i: int) -> list:
        """An episode-like caller: two turns, the second continuing from the first."""
        prompt = list(prompts[i])
        out = []
        for _ in range(2):
            result = await actor.generate.remote(GenerationRequest(prompt, GREEDY, request_id=str(i)))
            out.append((list(prompt), result))
            prompt = prompt + local.chat.finish_sampled(result.token_ids) + local.chat.user_ids("ok")
        return out

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(16)))

    before = len(ray_get(actor.stats.remote())["batch_sizes"])
    runs = asyncio.run(main())
    stats = ray_get(actor.stats.remote())
    sizes = stats["batch_sizes"][before:]
    assert sum(sizes) == 32
    assert max(sizes) >= 8 and len(sizes) <= 8, sizes  # batched, not one by one
    # Batching does not change what each request gets.
    for i, turns in enumerate(runs):
        for prompt, result in turns:
            assert result.request_id == str(i) and result.version == 1
            assert result.token_ids == local.generate([GenerationRequest(prompt, GREEDY)])[0].token_ids


def test_score_through_the_actor_matches_generate(setup):
    actor, _, _, prompts = setup
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    result = ray_get(actor.generate.remote(GenerationRequest(prompts[0], sampling)))
    scored = ray_get(actor.score.remote(prompts[0], result.token_ids))
    np.testing.assert_allclose(result.logprobs, scored, atol=1e-4)


def test_update_weights_lands_between_batches(setup):
    """A batch in flight finishes on the old weights; every result is whole under one version."""
    actor, local, states, prompts = setup
    long = SamplingParams(temperature=0.0, max_new_tokens=48)
    reqs = [GenerationRequest(p, long) for p in prompts[:6]]
    refs = {1: [r.token_ids for r in local.generate(reqs)]}
    local.update_weights(states[2], 2)
    refs[2] = [r.token_ids for r in local.generate(reqs)]
    assert refs[1] != refs[2]
    state2 = ray_get_put(states[2])
    try:
        running = [actor.generate.remote(r) for r in reqs]
        time.sleep(0.2)  # the batch is generating when the update arrives
        update = actor.load_weights.remote(state2, 2)
        racing = [actor.generate.remote(r) for r in reqs]  # no order promised vs the update
        assert ray_get(update)["version"] == 2 and ray_get(actor.version.remote()) == 2
        after = ray_get([actor.generate.remote(r) for r in reqs])
        running, racing = ray_get(running), ray_get(racing)
        assert [r.version for r in running] == [1] * 6 and [r.version for r in after] == [2] * 6
        assert [r.token_ids for r in running] == refs[1]
        assert [r.token_ids for r in after] == refs[2]
        for n, r in enumerate(racing):  # never a generation torn between two weight sets
            assert r.token_ids == refs[r.version][n]
    finally:
        ray_get(actor.load_weights.remote(ray_get_put(states[1]), 1))
        local.update_weights(states[1], 1)


def ray_get(ref):
    import ray

    return ray.get(ref, timeout=120)


def ray_get_put(value):
    import ray

    return ray.put(value)
