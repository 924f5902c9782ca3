"""The transformers engine in-process: sampling, batching, scoring, weights, context policy."""

from __future__ import annotations

import asyncio
import copy

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


def vllm_engine(config: EngineConfig, hf: HFEngine):
    """vLLM's engine for `config`, with the hf engine's weights (version 1)."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    from rose_ray.inference.vllm_engine import VLLMEngine

    eng = VLLMEngine(config)
    eng.update_weights({k: v.numpy() for k, v in hf.state_dict().items()}, version=1)
    return eng


@pytest.fixture(scope="module", params=["hf", "vllm"])
def engine(request, hf_engine):
    """The engine contract, run for every local backend: the same weights in each."""
    if request.param == "hf":
        yield hf_engine
        return
    config = EngineConfig.of("vllm", model=hf_engine.config.model, dtype="float32",
                          max_batch_size=8, context_tokens=512, kv_cache_mb=64)
    eng = vllm_engine(config, hf_engine)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts(hf_engine) -> list[list[int]]:
    chat = hf_engine.chat
    return [
        chat.opening_ids([("user", "You are an agent in a science world. " * k), ("assistant", "OK")])
        + chat.user_ids("You are in the kitchen. " * (9 - k))
        for k in range(1, 9)
    ]


def test_greedy_is_deterministic(engine, prompts):
    a = engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]
    b = engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]  # reuses a's cached prefix
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert len(a.token_ids) > 0 and a.finish_reason in ("stop", "length")
    assert len(set(a.token_ids)) > 3  # a real continuation, not one repeated token


def test_hf_greedy_is_deterministic_without_its_prefix_cache(hf_engine, prompts):
    a = hf_engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]
    uncached = _sibling(hf_engine, prefix_cache_mb=0)
    c, d = (uncached.generate([GenerationRequest(prompts[0], GREEDY)])[0] for _ in range(2))
    assert c.token_ids == d.token_ids == a.token_ids and c.logprobs == d.logprobs


def test_greedy_ids_and_logprobs_agree_across_backends(engine, hf_engine, prompts):
    """float32, the same weights: vLLM samples the ids transformers does, with its logprobs."""
    ours = engine.generate([GenerationRequest(p, GREEDY) for p in prompts])
    ref = [hf_engine.generate([GenerationRequest(p, GREEDY)])[0] for p in prompts]
    for a, b in zip(ours, ref):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_batched_greedy_equals_one_at_a_time(engine, prompts):
    assert len({len(p) for p in prompts}) == len(prompts)  # left padding is exercised
    single = [engine.generate([GenerationRequest(p, GREEDY)])[0] for p in prompts]
    batched = engine.generate([GenerationRequest(p, GREEDY) for p in prompts])
    assert max(engine.stats()["batch_sizes"][-30:]) == len(prompts)  # all in one batch
    for s, b in zip(single, batched):
        assert s.token_ids == b.token_ids
        assert s.finish_reason == b.finish_reason
        np.testing.assert_allclose(s.logprobs, b.logprobs, atol=1e-4)
    assert len({tuple(s.token_ids) for s in single}) > 1  # prompts lead to different outputs


def test_generate_logprobs_match_score(engine, prompts):
    sampling = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=20, seed=7)
    results = engine.generate([GenerationRequest(p, sampling) for p in prompts[:4]])
    scored = engine.score_many([(p, r.token_ids) for p, r in zip(prompts, results)])
    for r, s in zip(results, scored):
        assert len(r.logprobs) == len(r.token_ids) == len(s)
        np.testing.assert_allclose(r.logprobs, s, atol=1e-4)
    assert engine.score(prompts[0], results[0].token_ids) == pytest.approx(scored[0], abs=1e-5)


def test_seeded_sampling_is_reproducible_and_batch_independent(engine, prompts):
    s = SamplingParams(temperature=1.0, max_new_tokens=16, seed=123)
    alone = engine.generate([GenerationRequest(prompts[2], s)])[0]
    others = [GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=16, seed=i))
              for i, p in enumerate(prompts[:2])]
    in_batch = engine.generate([*others, GenerationRequest(prompts[2], s)])[-1]
    assert alone.token_ids == in_batch.token_ids
    other_seed = engine.generate([GenerationRequest(prompts[2], SamplingParams(1.0, 1.0, 16, [], 124))])[0]
    assert other_seed.token_ids != alone.token_ids


def test_stop_string_cuts_text_and_keeps_sampled_ids(engine, prompts):
    full = engine.generate([GenerationRequest(prompts[1], SamplingParams(0.0, 1.0, 24))])[0]
    text = full.text
    # A plain-ASCII window from the middle (a partial UTF-8 byte decodes differently mid-way).
    start = next(i for i in range(len(text) // 2, len(text) - 3) if text[i : i + 3].isascii()
                 and text[i : i + 3].strip())
    stop = text[start : start + 3]
    cut = engine.generate([GenerationRequest(prompts[1], SamplingParams(0.0, 1.0, 24, [stop]))])[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert stop in engine.chat.decode(cut.token_ids)  # the ids still hold the stop string


def test_stop_token_ends_generation_and_is_returned(engine, prompts):
    full = engine.generate([GenerationRequest(prompts[3], GREEDY)])[0]
    third = full.token_ids[2]
    saved = set(engine.stop_ids)
    engine.stop_ids = saved | {third}
    try:
        out = engine.generate([GenerationRequest(prompts[3], GREEDY)])[0]
    finally:
        engine.stop_ids = saved
    first = full.token_ids.index(third)
    assert out.token_ids == full.token_ids[: first + 1] and out.finish_reason == "stop"
    assert len(out.logprobs) == len(out.token_ids)


def test_update_weights_changes_outputs_and_version(engine, hf_engine, prompts):
    before = engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]
    original = hf_engine.state_dict()
    new = {k: v.numpy() for k, v in sharpened_state(hf_engine.model, seed=99).items()}  # numpy accepted
    engine.update_weights(new, version=7)
    try:
        after = engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]
        assert engine.version == 7 and after.version == 7 and before.version == 1
        assert after.token_ids != before.token_ids
    finally:
        engine.update_weights(original, version=1)
    assert engine.generate([GenerationRequest(prompts[0], GREEDY)])[0].token_ids == before.token_ids
    with pytest.raises(KeyError, match="no.such"):
        engine.update_weights({"no.such.weight": np.zeros(3)}, version=2)
    name = next(iter(original))
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({name: np.zeros(3)}, version=2)
    assert engine.version == 1


def test_context_window_limits_generation(engine, prompts):
    ctx = engine.config.context_tokens
    near = (prompts[0] * (ctx // len(prompts[0]) + 1))[: ctx - 5]
    res = engine.generate([GenerationRequest(near, SamplingParams(0.0, 1.0, 50))])[0]
    assert len(res.token_ids) == 5 and res.finish_reason == "length"
    over = engine.generate([GenerationRequest(near + near[:10], GREEDY)])[0]
    assert over.finish_reason == "context" and over.token_ids == []


def test_bad_sampling_is_a_clear_error(engine, prompts):
    with pytest.raises(ValueError, match="sampling.top_p"):
        engine.generate([GenerationRequest(prompts[0], SamplingParams(top_p=0.0))])
    with pytest.raises(ValueError, match="sampling.temperature"):
        engine.generate([GenerationRequest(prompts[0], SamplingParams(temperature=-1))])


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


def _like(engine, hf_engine, **overrides):
    """An engine of `engine`'s backend with other settings and the same weights."""
    if isinstance(engine, HFEngine):
        return HFEngine(EngineConfig.of("hf", model="tiny", **overrides), model=hf_engine.model, tokenizer=hf_engine.tokenizer)
    return vllm_engine(EngineConfig.of("vllm", model=engine.config.model, dtype="float32",
                                    kv_cache_mb=64, **overrides), hf_engine)


def test_an_engine_cuts_nothing_a_prompt_without_room_gets_finish_context(engine, hf_engine):
    """Engines take prompt ids as given (the rollout cut them: rollout/context.py); one that
    leaves no room in the context samples nothing, whatever the engine's context_policy."""
    prompt = engine.chat.user_ids("observation " * 40)
    sampling = SamplingParams(0.0, 1.0, 16)
    for policy in ("drop_oldest", "end_episode"):
        small = _like(engine, hf_engine, context_tokens=len(prompt), context_policy=policy)
        res = small.generate([GenerationRequest(prompt, sampling)])[0]
        assert res.finish_reason == "context" and res.token_ids == [] and res.prompt_tokens == len(prompt)
        getattr(small, "close", lambda: None)()
    room = _like(engine, hf_engine, context_tokens=len(prompt) + 16)
    res = room.generate([GenerationRequest(prompt, sampling)])[0]
    assert res.finish_reason != "context" and res.prompt_tokens == len(prompt)
    getattr(room, "close", lambda: None)()


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
            update = asyncio.ensure_future(batcher.update_weights(new_state, 2))
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
        assert stats["prefix_stored_tokens"] == sum(len(e.ids) for e in small._prefix._entries.values())
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


@pytest.fixture(scope="module")
def vllm_only(hf_engine):
    config = EngineConfig.of("vllm", model=hf_engine.config.model, dtype="float32",
                          max_batch_size=8, context_tokens=1024, kv_cache_mb=64)
    eng = vllm_engine(config, hf_engine)
    yield eng
    eng.close()


def test_vllm_weight_update_leaves_no_stale_prefix_in_long_prompts(vllm_only, hf_engine, prompts):
    """vLLM caches prefixes in blocks (128 tokens on CPU): a conversation longer than a block,
    continued after a weight update, must be computed with the new weights only."""
    long = prompts[4] + hf_engine.chat.user_ids("You are in a long hallway with many doors. " * 30)
    assert len(long) > 3 * 128
    first = vllm_only.generate([GenerationRequest(long, GREEDY)])[0]
    cached = vllm_only.stats()["prefix_cached_tokens"]
    following = _next_prompt(hf_engine, long, first, 0)
    vllm_only.generate([GenerationRequest(following, GREEDY)])  # the cache now holds this prefix
    assert vllm_only.stats()["prefix_cached_tokens"] - cached >= 256  # and it was reused
    new = sharpened_state(hf_engine.model, seed=3, quiet_ids=special_ids(hf_engine.tokenizer))
    reference = HFEngine(EngineConfig.of("hf", model="tiny", dtype="float32", context_tokens=1024, prefix_cache_mb=0),
                         model=copy.deepcopy(hf_engine.model), tokenizer=hf_engine.tokenizer)
    reference.update_weights(new, version=2)
    try:
        vllm_only.update_weights({k: v.numpy() for k, v in new.items()}, version=2)
        got = vllm_only.generate([GenerationRequest(following, GREEDY)])[0]
        want = reference.generate([GenerationRequest(following, GREEDY)])[0]
        assert got.version == 2
        assert got.token_ids == want.token_ids
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
    finally:
        vllm_only.update_weights({k: v.numpy() for k, v in hf_engine.state_dict().items()}, version=1)


def test_vllm_frontend_orders_weight_updates_between_requests(vllm_only, hf_engine, prompts):
    """Requests awaited before an update run on the old weights, those after it on the new,
    and none is torn: the update waits for the running ones."""
    original = {k: v.numpy() for k, v in hf_engine.state_dict().items()}
    new = {k: v.numpy() for k, v in sharpened_state(hf_engine.model, seed=5).items()}
    sampling = SamplingParams(0.0, 1.0, 16)

    async def main():
        front = vllm_only.frontend()
        first = await front.generate_many([GenerationRequest(p, sampling) for p in prompts[:4]])
        wave1 = [asyncio.ensure_future(front.generate(GenerationRequest(p, sampling))) for p in prompts[:4]]
        await asyncio.sleep(0)  # the first wave is submitted before the update
        update = asyncio.ensure_future(front.update_weights(new, 2))
        await asyncio.sleep(0)
        wave2 = [asyncio.ensure_future(front.generate(GenerationRequest(p, sampling))) for p in prompts[:4]]
        await asyncio.gather(*wave1, update, *wave2)
        return first, [w.result() for w in wave1], [w.result() for w in wave2]

    try:
        first, wave1, wave2 = asyncio.run(main())
    finally:
        vllm_only.update_weights(original, version=1)
    assert all(r.version == 1 for r in first + wave1) and all(r.version == 2 for r in wave2)
    assert [r.token_ids for r in wave1] == [r.token_ids for r in first]
    assert [r.token_ids for r in wave2] != [r.token_ids for r in wave1]


def test_vllm_engine_config_sizes_its_kv_cache(vllm_only):
    """The KV cache is what the config says (64 MiB here), not vLLM's share of host memory."""
    stats = vllm_only.stats()
    assert stats["kv_cache_bytes"] == 64 * 2**20
    model = vllm_only.config.model
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model)
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # float32
    assert stats["kv_blocks"] * stats["kv_block_tokens"] * per_token == pytest.approx(64 * 2**20, rel=0.05)


def test_vllm_engine_closes_for_good_and_says_so(hf_engine, prompts):
    """A frontend's close leaves the engine to its other callers; the engine's own close ends
    it, and a request after that fails at once instead of waiting forever."""
    config = EngineConfig.of("vllm", model=hf_engine.config.model, dtype="float32", max_batch_size=2,
                          context_tokens=512, kv_cache_mb=16)
    eng = vllm_engine(config, hf_engine)
    from rose_ray.inference.vllm_engine import EngineFailed

    async def twice():
        for _ in range(2):
            front = eng.frontend()
            await front.generate(GenerationRequest(prompts[0], GREEDY))
            await front.close()

    asyncio.run(twice())
    eng.close()
    with pytest.raises(EngineFailed, match="closed"):
        eng.generate([GenerationRequest(prompts[0], GREEDY)])


def test_a_refused_prefix_cache_reset_fails_the_vllm_engine_and_vllm_says_why(hf_engine, prompts):
    """vLLM refuses to reset its prefix cache (returns False) while blocks are held. Here a
    request the engine does not track holds them: it is added to vLLM's own engine directly, as
    no caller of ours can (the engine thread is idle meanwhile). The weight update's reset is
    tried again, then the engine fails, so the run's supervisor replaces it (its health ping
    raises; tests/e2e/test_run_survives_failures.py runs that); it never serves the old weights' keys and
    values. vLLM's own warning about it is logged (its logger's handler prints it), not silenced."""
    import logging

    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt

    from rose_ray.inference.vllm_engine import PREFIX_RESET_TRIES, EngineFailed, PrefixCacheNotReset

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    config = EngineConfig.of("vllm", model=hf_engine.config.model, dtype="float32", max_batch_size=2,
                             context_tokens=512, kv_cache_mb=16)
    eng = vllm_engine(config, hf_engine)
    kept = Kept()
    logging.getLogger("vllm").addHandler(kept)
    try:
        core = eng._llm.llm_engine
        core.add_request("held", TokensPrompt(prompt_token_ids=prompts[0]), VllmSampling(max_tokens=64))
        core.step()  # scheduled: its blocks are allocated, and nobody will finish it
        with pytest.raises(EngineFailed, match="PrefixCacheNotReset"):
            eng.update_weights({k: v.numpy() for k, v in hf_engine.state_dict().items()}, version=2)
        assert isinstance(eng.failure, PrefixCacheNotReset)
        assert "blocks held by requests this engine does not track" in str(eng.failure)
        with pytest.raises(EngineFailed):  # no later request runs on it
            eng.generate([GenerationRequest(prompts[0], GREEDY)])
        refused = [m for m in kept.messages if m.startswith("Failed to reset prefix cache because some blocks")]
        assert len(refused) == PREFIX_RESET_TRIES
        assert not any("RotaryEmbedding: Failed to load weights" in m for m in kept.messages)  # (expected: dropped)
    finally:
        logging.getLogger("vllm").removeHandler(kept)
        eng.close()
