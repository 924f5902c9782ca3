"""The half of tests/unit/learner/test_learner.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rose_ray.chat import ChatFormat
from rose_ray.learner.learner import LearnerGroup
from rose_ray.rows import row_to_trajectory
from rose_ray.tokens import make_batch, render
from tests.unit.learner.test_learner import WEIGHTS, config, conversations


@pytest.fixture(scope="module")
def sequences(tiny_models):
    """Rendered trajectories with real teacher logprobs on student tokens (OPD inputs)."""
    from transformers import AutoModelForCausalLM

    from rose_ray.models import load_tokenizer

    fmt = ChatFormat(load_tokenizer(tiny_models["student"]))
    teacher = AutoModelForCausalLM.from_pretrained(tiny_models["teacher"], dtype=torch.float32)
    seqs = []
    for row in conversations(5):
        seq = render(row_to_trajectory(row), fmt)
        ids = torch.tensor([seq.input_ids])
        with torch.no_grad():
            logp = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1].float(), -1)
        seq.teacher_logprobs = [float("nan")] + logp.gather(1, ids[0, 1:, None])[:, 0].tolist()
        seqs.append(seq)
    return seqs


@pytest.fixture(scope="module")
def group(ray_cluster, tiny_models):
    g = LearnerGroup(config(tiny_models["student"], ranks=2, zero_stage=3))
    yield g
    g.shutdown()


def test_zero_stages_and_ranks_agree(group, tiny_models, sequences):
    """Every ZeRO stage, 1 and 2 ranks, on the lean paths (sdpa per segment, the head in chunks
    of 32 tokens, several micro-batches) gives the original path's steps: one rank, ZeRO 0, the
    dense L×L mask and whole logits."""
    single = LearnerGroup(config(tiny_models["student"], ranks=1))
    batch = make_batch(sequences, WEIGHTS, 256)
    results = {}
    try:
        single.setup(zero_stage=0, attn_implementation="dense_mask", logprob_chunk=0)
        results["dense"] = [single.train_step(batch) for _ in range(2)]
        for stage in (0, 2, 3):
            for g in (single, group):
                info = g.setup(zero_stage=stage, attn_implementation="auto", logprob_chunk=32)
                assert info["speed"]["attn_implementation"] == "sdpa_varlen"
                results[(stage, g.config.ranks)] = [g.train_step(batch) for _ in range(2)]
    finally:
        single.shutdown()
    ref = results["dense"]
    assert ref[0]["loss_ce"] > 0 and ref[0]["loss_opd"] != 0 and ref[1]["loss"] < ref[0]["loss"]
    assert results[(0, 1)][0]["micro_batches"] >= 2  # gradients accumulate over micro-batches
    for key, steps in results.items():
        assert steps[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-5), key  # same weights
        assert steps[1]["loss"] == pytest.approx(ref[1]["loss"], rel=1e-4), key  # same update
        assert steps[0]["grad_norm"] == pytest.approx(ref[0]["grad_norm"], rel=1e-3), key
        assert steps[0]["tokens"] == sum(len(s) for s in sequences)


def test_the_seed_settings_train(group, sequences):
    """The seed's learner settings (bf16, ZeRO-2, gradient checkpointing) on the lean paths:
    the first loss is the fp32 one to bf16 precision, and a second step lowers it."""
    batch = make_batch(sequences, WEIGHTS, 256)
    group.setup(zero_stage=2)
    fp32 = group.train_step(batch)
    try:
        group.setup(zero_stage=2, dtype="bfloat16", activation_checkpointing="full")
        steps = [group.train_step(batch) for _ in range(2)]
    finally:  # the next test's setup builds from the module's settings again
        group.config = replace(group.config, dtype="float32", activation_checkpointing="none")
    assert steps[0]["loss"] == pytest.approx(fp32["loss"], rel=2e-2)
    assert steps[1]["loss"] < steps[0]["loss"]
    # trained tokens: the batch's tokens carrying the CE term plus those carrying the OPD term
    ce, opd = (int((np.asarray(w)[:, 1:] > 0).sum()) for w in (batch.weights["ce"], batch.weights["opd"]))
    assert ce > 0 and opd > 0 and fp32["trained_tokens"] == ce + opd


def test_the_speed_settings_take_the_reference_steps(group, sequences, capsys):
    """Through DeepSpeed (ZeRO-2, 2 ranks, several micro-batches): the head on the trained tokens,
    selective checkpointing, torch's fused AdamW, overlap_comm with small buckets and the
    metrics kept on the device take the steps of the reference settings; the group says what
    it chose."""
    batch = make_batch(sequences, WEIGHTS, 256)
    reference = dict(zero_stage=2, head="full", optimizer="adamw", overlap_comm=False)
    levers = dict(zero_stage=2, head="trained", optimizer="adamw_fused", activation_checkpointing="selective",
                  overlap_comm=True, zero_bucket_size=1_000_000)
    try:
        group.setup(**reference)
        ref = [group.train_step(batch) for _ in range(2)]
        info = group.setup(**levers)
        new = [group.train_step(batch) for _ in range(2)]
    finally:
        group.config = replace(group.config, head="auto", optimizer="auto", activation_checkpointing="none",
                               overlap_comm=None, zero_bucket_size=500_000_000)
    assert info["speed"] == {"attn_implementation": "sdpa_varlen", "head": "trained", "optimizer": "adamw_fused",
                             "activation_checkpointing": "selective", "fused_kernels": "none", "overlap_comm": True}
    assert ("learner: attn_implementation=sdpa_varlen (auto), optimizer=adamw_fused, activation_checkpointing=selective, "
            "fused_kernels=none (auto), head=trained, overlap_comm=True") in capsys.readouterr().out
    assert ref[0]["micro_batches"] >= 2
    for r, n in zip(ref, new):
        for key in ("loss", "loss_ce", "loss_opd", "opd_reverse_kl", "opd_ratio", "grad_norm", "tokens"):
            assert n[key] == pytest.approx(r[key], rel=1e-4), key
    assert new[1]["loss"] < new[0]["loss"]


def test_resume_is_exact(group, tmp_path, sequences):
    group.setup(zero_stage=3, schedule="cosine", warmup_steps=1, total_steps=4)
    batches = [make_batch(sequences[:3], WEIGHTS, 256), make_batch(sequences[3:], WEIGHTS, 256)]
    probe = np.array([sequences[0].input_ids[:24]])
    group.train_step(batches[0])
    tag = group.save_checkpoint(tmp_path)
    straight = group.train_step(batches[1])
    straight_logits = group.logits(probe)

    group.setup()  # a fresh engine from the original weights, then the checkpoint
    state = group.load_checkpoint(tmp_path)
    assert state == {"tag": tag, "step": 1, "version": 1}
    resumed = group.train_step(batches[1])
    assert resumed["loss"] == straight["loss"] and resumed["lr"] == straight["lr"]
    assert resumed["version"] == straight["version"] == 2
    np.testing.assert_array_equal(group.logits(probe), straight_logits)


def test_export_loads_in_transformers(group, tmp_path, sequences):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    group.setup(zero_stage=3)
    group.train_step(make_batch(sequences, WEIGHTS, 256))
    info = group.export(tmp_path / "hf")
    assert info["dtype"] == "float32" and (tmp_path / "hf" / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.chat_template and model.model.rotary_emb.inv_freq.dtype == torch.float32
    ids = np.array([sequences[1].input_ids])
    with torch.no_grad():
        theirs = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, group.logits(ids), atol=1e-5, rtol=1e-5)


def test_published_weights_reach_an_engine(group, tiny_models, sequences):
    import ray

    from rose_ray.inference.actor import engine_actor
    from rose_ray.inference.engine import EngineConfig, GenerationRequest
    from rose_ray.publish.route import AUTO_LOCAL, PublishConfig
    from rose_ray.types import SamplingParams

    engine = engine_actor(EngineConfig(model=str(tiny_models["student"]), dtype="float32",
                                       threads=1), num_cpus=1)
    try:
        group.setup(zero_stage=2)
        for _ in range(3):
            group.train_step(make_batch(sequences, WEIGHTS, 256))
        prompt = sequences[0].input_ids[:30]
        completion = sequences[0].input_ids[30:40]
        before = ray.get(engine.score.remote(prompt, completion))
        out = group.publish_weights([engine])
        assert ray.get(engine.version.remote()) == group.version == 3
        assert out["mb"] > 0 and out["ms_per_mb"] > 0

        ids = np.array([prompt + completion])
        logp = torch.log_softmax(torch.from_numpy(np.array(group.logits(ids)[0])), -1)
        learner = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]
        after = ray.get(engine.score.remote(prompt, completion))
        np.testing.assert_allclose(after, learner, atol=1e-4)
        assert np.abs(np.array(before) - np.array(learner)).max() > 1e-2

        greedy = list(prompt)  # the learner model's greedy continuation
        for _ in range(8):
            greedy.append(int(group.logits(np.array([greedy]))[0, -1].argmax()))
        result = ray.get(engine.generate.remote(GenerationRequest(
            prompt_ids=prompt, sampling=SamplingParams(temperature=0.0, max_new_tokens=8))))
        n = len(result.token_ids)
        assert n > 0 and result.token_ids == greedy[len(prompt):len(prompt) + n]
        assert out["method"] == AUTO_LOCAL  # the engine is a local actor

        # Every other method, each after a step of its own: the engine scores as the learner.
        for method in ("object_store", "collective"):
            group.train_step(make_batch(sequences, WEIGHTS, 256))
            out = group.publish_weights([engine], PublishConfig(method=method))
            assert out["method"] == method and ray.get(engine.version.remote()) == group.version
            logp = torch.log_softmax(torch.from_numpy(np.array(group.logits(ids)[0])), -1)
            learner = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]
            np.testing.assert_allclose(ray.get(engine.score.remote(prompt, completion)), learner, atol=1e-4)
    finally:
        ray.kill(engine)
