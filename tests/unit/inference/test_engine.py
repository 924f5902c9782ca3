"""The transformers engine in-process: sampling, batching, scoring, weights, context policy."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from rose_ray.inference.batcher import AsyncBatcher
from rose_ray.inference.engine import (
    EngineConfig,
    GenerationRequest,
    resolve_dtype,
)
from rose_ray.inference.hf import HFEngine
from rose_ray.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


def sharpened_state(model: torch.nn.Module, seed: int, scale: float = 0.3,
                    quiet_ids: tuple[int, ...] = (0, 1, 2)) -> dict[str, torch.Tensor]:
    """Random weights large enough that a tiny model's outputs depend on its input.

    (At init scale the tiny model's logits are nearly flat and greedy decoding repeats one
    token whatever the prompt, which would make the batching checks vacuous.) The special
    tokens' (tied) embeddings are made small so they are rarely sampled and greedy runs last.
    """
    g = torch.Generator().manual_seed(seed)
    state = {
        name: p.detach().clone() if "norm" in name else torch.randn(p.shape, generator=g) * scale
        for name, p in model.named_parameters()
    }
    state["model.embed_tokens.weight"][list(quiet_ids)] *= 0.01
    return state


def special_ids(tokenizer) -> tuple[int, ...]:
    return tuple(tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))


@pytest.fixture(scope="module")
def hf_engine(tiny_models) -> HFEngine:
    """The transformers engine with sharpened weights (version 1)."""
    config = EngineConfig(model=str(tiny_models["student"]), dtype="float32", threads=1,
                          max_batch_size=8, context_tokens=512)
    eng = HFEngine(config)
    eng.update_weights(sharpened_state(eng.model, seed=0, quiet_ids=special_ids(eng.tokenizer)), version=1)
    return eng


@pytest.fixture(scope="module")
def prompts(hf_engine) -> list[list[int]]:
    chat = hf_engine.chat
    return [
        chat.opening_ids([("user", "You are an agent in a science world. " * k), ("assistant", "OK")])
        + chat.user_ids("You are in the kitchen. " * (9 - k))
        for k in range(1, 9)
    ]


def test_hf_greedy_is_deterministic_without_its_prefix_cache(hf_engine, prompts):
    a = hf_engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]
    uncached = _sibling(hf_engine, prefix_cache_mb=0)
    c, d = (uncached.generate([GenerationRequest(prompts[0], GREEDY)])[0] for _ in range(2))
    assert c.token_ids == d.token_ids == a.token_ids and c.logprobs == d.logprobs


def test_engine_config_validation_names_the_key():
    with pytest.raises(ValueError, match="engine.context_policy"):
        EngineConfig(model="m", context_policy="truncate")
    with pytest.raises(ValueError, match="engine.max_batch_size"):
        EngineConfig(model="m", max_batch_size=0)
    with pytest.raises(ValueError, match="engine.model"):
        EngineConfig(backend="hf")
    with pytest.raises(ValueError, match="engine.backend"):
        EngineConfig(backend="vllm-inproc", model="m")
    with pytest.raises(ValueError, match="engine.backend.prefix_cache_mb"):
        EngineConfig.of("hf", model="m", prefix_cache_mb=-1)


def test_auto_dtype_uses_bf16_when_the_cpu_has_it(tiny_models, prompts):
    from rose_ray.inference.engine import cpu_supports_bf16

    assert resolve_dtype("float32") == "float32"
    expected = "bfloat16" if cpu_supports_bf16() else "float32"
    assert resolve_dtype("auto") == expected
    eng = HFEngine(EngineConfig(model=str(tiny_models["student"]), dtype="auto", threads=1))
    assert str(eng.model.dtype) == f"torch.{expected}"
    res = eng.generate([GenerationRequest(prompts[0], SamplingParams(0.0, 1.0, 8))])[0]
    assert len(res.token_ids) == len(res.logprobs) > 0


def test_async_batcher_batches_concurrent_callers_and_orders_weight_updates(hf_engine, prompts):
    original = hf_engine.state_dict()
    new_state = sharpened_state(hf_engine.model, seed=5)

    async def main():
        batcher = AsyncBatcher(hf_engine, max_batch_size=8, max_wait_ms=50)
        try:
            reqs = [GenerationRequest(prompts[i % 8], SamplingParams(0.0, 1.0, 8)) for i in range(16)]
            first = await asyncio.gather(*(batcher.generate(r) for r in reqs))
            sizes = batcher.stats()["batcher_batch_sizes"]
            # Weights queued between two waves: the first wave sees v1, the second v2.
            wave1 = [asyncio.ensure_future(batcher.generate(r)) for r in reqs[:4]]
            await asyncio.sleep(0)  # the first wave is queued before the update
            update = batcher.queue_weights(new_state, 2)
            wave2 = [asyncio.ensure_future(batcher.generate(r)) for r in reqs[:4]]
            await asyncio.gather(*wave1, update, *wave2)
            return first, sizes, [w.result() for w in wave1], [w.result() for w in wave2]
        finally:
            await batcher.close()

    try:
        first, sizes, wave1, wave2 = asyncio.run(main())
    finally:
        hf_engine.update_weights(original, version=1)
    assert sizes == [8, 8]
    assert all(r.version == 1 for r in first + wave1) and all(r.version == 2 for r in wave2)
    assert [r.token_ids for r in wave1] == [r.token_ids for r in first[:4]]
    assert [r.token_ids for r in wave2] != [r.token_ids for r in wave1]


def _sibling(engine: HFEngine, **overrides) -> HFEngine:
    """Another engine over the same model object (same weights), with its own prefix cache."""
    fields = {"model": "tiny", "dtype": "float32", "max_batch_size": 8, "context_tokens": 512, **overrides}
    return HFEngine(EngineConfig.of("hf", **fields), model=engine.model, tokenizer=engine.tokenizer)


def _next_prompt(engine: HFEngine, prompt: list[int], result, turn: int) -> list[int]:
    """What the rollout sends next: the reply closed, then the next observation."""
    return prompt + engine.chat.finish_sampled(result.token_ids) + engine.chat.user_ids(
        f"You move to room {turn}. You see a door and a table. ")


def _play(engine: HFEngine, prompt: list[int], turns: int, sampling: SamplingParams) -> list:
    results = []
    for t in range(turns):
        results.append(engine.generate([GenerationRequest(prompt, sampling)])[0])
        prompt = _next_prompt(engine, prompt, results[-1], t)
    return results


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(1.0, 1.0, 24, [], 11)], ids=["greedy", "seeded"])
def test_prefix_cache_multi_turn_matches_no_cache(hf_engine, prompts, sampling):
    on, off = _sibling(hf_engine), _sibling(hf_engine, prefix_cache_mb=0)
    with_cache = _play(on, prompts[4], 4, sampling)
    without = _play(off, prompts[4], 4, sampling)
    for a, b in zip(with_cache, without):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert len({tuple(r.token_ids) for r in without}) > 1  # turns differ: the history matters
    stats = on.stats()
    assert stats["prefix_hits"] == 3 and stats["prefix_misses"] == 1
    assert stats["prompt_tokens_fed"] < stats["prompt_tokens"] / 2
    assert stats["prefix_entries"] == 1  # each turn superseded the last
    assert off.stats()["prefix_hits"] == 0 and off.stats()["prefix_entries"] == 0
    assert off.stats()["prompt_tokens_fed"] == off.stats()["prompt_tokens"]


def test_prefix_cache_mixed_batch_matches_each_alone(hf_engine, prompts):
    on, off = _sibling(hf_engine), _sibling(hf_engine, prefix_cache_mb=0)
    # Conversations 0..2 played for 1..3 turns: cached prefixes of different lengths.
    batch = []
    for k in range(3):
        results = _play(on, prompts[k], k + 1, GREEDY)
        prompt = prompts[k]
        for t, r in enumerate(results):
            prompt = _next_prompt(on, prompt, r, t)
        batch.append(prompt)
    first_reply = on.generate([GenerationRequest(prompts[5], GREEDY)])[0]
    branch = prompts[5] + on.chat.finish_sampled(first_reply.token_ids) + on.chat.user_ids("Nothing happens.")
    other = on.chat.opening_ids([("user", "Boil water, then freeze it."), ("assistant", "OK")]) \
        + on.chat.user_ids("This room is called the kitchen.")
    batch += [other, branch]  # a miss, and a hit on the first turn only
    before = on.stats()
    together = on.generate([GenerationRequest(p, GREEDY) for p in batch])
    after = on.stats()
    assert after["prefix_hits"] - before["prefix_hits"] == 4
    assert after["prefix_misses"] - before["prefix_misses"] == 1
    for p, r in zip(batch, together):
        alone = off.generate([GenerationRequest(p, GREEDY)])[0]
        assert r.token_ids == alone.token_ids
        np.testing.assert_allclose(r.logprobs, alone.logprobs, atol=1e-4)


def test_update_weights_empties_the_prefix_cache(tiny_models, hf_engine, prompts):
    config = EngineConfig(model=str(tiny_models["student"]), dtype="float32", context_tokens=512)
    eng, fresh = HFEngine(config), HFEngine(config)
    eng.update_weights(sharpened_state(eng.model, seed=0), version=1)
    results = _play(eng, prompts[2], 2, GREEDY)
    assert eng.stats()["prefix_stored_tokens"] > 0
    new = sharpened_state(eng.model, seed=3)
    eng.update_weights(new, version=2)
    fresh.update_weights(new, version=2)
    assert eng.stats()["prefix_stored_tokens"] == 0 and eng.stats()["prefix_entries"] == 0
    prompt = _next_prompt(eng, _next_prompt(eng, prompts[2], results[0], 0), results[1], 1)
    hits = eng.stats()["prefix_hits"]
    got = eng.generate([GenerationRequest(prompt, GREEDY)])[0]
    assert eng.stats()["prefix_hits"] == hits  # nothing stale was reused
    want = fresh.generate([GenerationRequest(prompt, GREEDY)])[0]
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs


def test_prefix_cache_evicts_within_its_token_budget(hf_engine, prompts):
    from rose_ray.inference.hf import kv_bytes_per_token

    budget = 2 * max(len(p) for p in prompts) + 60
    small = _sibling(hf_engine, prefix_cache_mb=budget * kv_bytes_per_token(hf_engine.model) / 2**20)
    assert small._prefix.max_tokens == budget
    for p in prompts:
        small.generate([GenerationRequest(p, GREEDY)])
        stats = small.stats()
        assert 0 < stats["prefix_stored_tokens"] <= budget
        assert stats["prefix_stored_tokens"] == sum(len(ids) for ids, _ in small._prefix._entries.values())
    assert stats["prefix_evictions"] > 0 and stats["prefix_entries"] < len(prompts)
    # The most recent conversation survived eviction and is reused.
    last = small.generate([GenerationRequest(prompts[-1], GREEDY)])[0]
    hits = small.stats()["prefix_hits"]
    small.generate([GenerationRequest(_next_prompt(small, prompts[-1], last, 0), GREEDY)])
    assert small.stats()["prefix_hits"] == hits + 1


def test_sliding_window_models_keep_transformers_cache_without_prefix_reuse(hf_engine, prompts):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=hf_engine.model.config.vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         use_sliding_window=True, sliding_window=32, max_window_layers=1,
                         layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    eng = HFEngine(EngineConfig(model="tiny", dtype="float32"), model=Qwen3ForCausalLM(config),
                   tokenizer=hf_engine.tokenizer)
    a, b = (eng.generate([GenerationRequest(prompts[0], GREEDY)])[0] for _ in range(2))
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0
    assert eng.stats()["prefix_hits"] == 0 and eng.stats()["prefix_entries"] == 0


