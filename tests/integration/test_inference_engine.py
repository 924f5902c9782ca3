"""The half of tests/unit/inference/test_engine.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.hf import HFEngine
from rose_ray.types import SamplingParams
from tests.unit.inference import test_engine as engine_tests
from tests.unit.inference.test_engine import GREEDY, _next_prompt, sharpened_state, special_ids

# the unit half's fixtures, shared: the transformers engine and its prompts
hf_engine, prompts = engine_tests.hf_engine, engine_tests.prompts


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


def test_greedy_is_deterministic(engine, prompts):
    a = engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]
    b = engine.generate([GenerationRequest(prompts[0], GREEDY)])[0]  # reuses a's cached prefix
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert len(a.token_ids) > 0 and a.finish_reason in ("stop", "length")
    assert len(set(a.token_ids)) > 3  # a real continuation, not one repeated token


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
        first = await asyncio.gather(*(front.generate(GenerationRequest(p, sampling)) for p in prompts[:4]))
        wave1 = [asyncio.ensure_future(front.generate(GenerationRequest(p, sampling))) for p in prompts[:4]]
        await asyncio.sleep(0)  # the first wave is submitted before the update
        update = front.queue_weights(new, 2)
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
