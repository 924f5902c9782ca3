"""The learner's speed settings (rose_ray/learner/speed.py) give the numbers of their reference
paths: per-token logprobs and every parameter's gradient of the learner's own loss (CE on the
teacher's tokens, OPD on the student's: `losses.loss`) within the tolerance of the other path
tests (test_learner_paths.py), on the tiny model, on the tiny Qwen3 (its special tokens and chat
template render the conversations) and, for the LM head, on a tiny Qwen3 with Qwen3's vocabulary.

The GPU-only kernels (torch's varlen FlashAttention, cut-cross-entropy, Liger: Triton) get the
same comparison in bf16 at the end, skipped without CUDA; bench/gpu_check.sh runs them there.
"""

from __future__ import annotations

import importlib.util
import inspect
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rose_ray.chat import ChatFormat
from rose_ray.learner import attention, speed
from rose_ray.learner.attention import transformers_name
from rose_ray.learner.batching import micro_batches, trained_targets
from rose_ray.learner.forward import PackedForward
from rose_ray.learner.learner import LearnerConfig
from rose_ray.learner.losses import aligned, denominators
from rose_ray.learner.losses import loss as batch_loss
from rose_ray.models import load_tokenizer
from rose_ray.rows import row_to_trajectory
from rose_ray.tokens import make_batch, render
from tests.unit.learner.test_learner import WEIGHTS, conversations
from tests.unit.learner.test_paths import RTOL, assert_same_grads, qwen3_vocab


@pytest.fixture(scope="module")
def models(tiny_models, tiny_qwen3, tmp_path_factory):
    """name -> (model folder, the folder whose tokenizer and template render the batch)."""
    return {"tiny": (tiny_models["student"], tiny_models["student"]),
            "tiny_qwen3": (tiny_qwen3["student"], tiny_qwen3["student"]),
            "qwen3_vocab": (qwen3_vocab(tmp_path_factory.mktemp("qwen3_vocab")), tiny_qwen3["student"])}


def rose_part(tokenizer_dir, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Trajectories rendered with the model's chat template, rose's token weights (CE on the
    teacher's turns, OPD on the student's, with teacher logprobs), all in one packed micro-batch
    of several segments; and the loss's denominators."""
    fmt = ChatFormat(load_tokenizer(tokenizer_dir))
    rng = np.random.default_rng(seed)
    seqs = []
    for row in conversations(4):
        seq = render(row_to_trajectory(row), fmt)
        seq.teacher_logprobs = rng.uniform(-6.0, -0.1, len(seq.input_ids)).tolist()
        seqs.append(seq)
    batch = make_batch(seqs, WEIGHTS, max_tokens=sum(len(s.input_ids) for s in seqs))
    (parts,) = micro_batches(batch, ranks=1, max_tokens=int(np.asarray(batch.attention_mask).size))
    return parts[0], denominators(batch)


def load(path, attn: str = "sdpa_varlen", dtype=torch.float32, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                attn_implementation=transformers_name(attn)).to(device).train()


def run(model, part, den, attn: str = "sdpa_varlen", head: str = "full", chunk: int = 32, device: str = "cpu"):
    """The learner's forward, loss and backward on one micro-batch (as a rank runs it):
    per-token logprobs [L-1] and the trained targets' indices."""
    t = {k: torch.from_numpy(np.array(v)).to(device) for k, v in part.items()}
    forward = PackedForward(model, attn, chunk, head)
    hidden = forward.hidden_states(model, t, part["cu_seq_lens"].tolist())
    trained = torch.from_numpy(trained_targets(part)).to(device)
    logp = forward.token_logprobs(hidden, t["input_ids"], trained)
    total, _ = batch_loss(logp, aligned(t), den, 0.2)
    total.backward()
    return logp.detach()[0].float().cpu(), trained.cpu()


def assert_same_logprobs(new: torch.Tensor, ref: torch.Tensor, rtol: float = RTOL, atol: float | None = None) -> None:
    torch.testing.assert_close(new, ref, rtol=rtol, atol=rtol * ref.abs().max().item() if atol is None else atol)


# --------------------------------------------------------------------------- the LM head
@pytest.mark.parametrize("name", ["tiny", "tiny_qwen3", "qwen3_vocab"])
def test_the_trained_head_equals_the_full_head(models, name):
    """`head: trained` scores only the targets a loss term weighs: their logprobs and every
    gradient are the full head's; the others (the prompt, the observations) read 0."""
    path, tok = models[name]
    part, den = rose_part(tok)
    ref, new = load(path), load(path)
    full, trained = run(ref, part, den, head="full")
    picked, _ = run(new, part, den, head="trained")
    untrained = np.setdiff1d(np.arange(full.numel()), trained.numpy())
    assert 0 < len(trained) and len(untrained) > len(trained)  # most tokens are context: the saving
    assert_same_logprobs(picked[trained], full[trained])
    assert (picked[untrained] == 0).all() and (full[untrained] != 0).all()
    assert_same_grads(ref, new)


# --------------------------------------------------------------------------- activation checkpointing
@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("name", ["tiny", "tiny_qwen3"])
def test_activation_checkpointing_equals_none(models, name, mode):
    """Recomputing layers in backward changes no number; `selective` recomputes every second
    layer (each counted: its MLP starts twice), `full` every layer."""
    path, tok = models[name]
    part, den = rose_part(tok)
    ref, new = load(path), load(path)
    speed.apply_checkpointing(new, mode)
    layers = new.model.layers
    runs = [0] * len(layers)
    for i, layer in enumerate(layers):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: runs.__setitem__(i, runs[i] + 1))
    lp_ref, trained = run(ref, part, den)
    lp_new, _ = run(new, part, den)
    recomputed = set(speed.checkpointed_layers(mode, len(layers)))
    assert runs == [2 if i in recomputed else 1 for i in range(len(layers))]
    assert recomputed == (set(range(len(layers))) if mode == "full" else set(range(0, len(layers), 2)))
    assert_same_logprobs(lp_new[trained], lp_ref[trained])
    assert_same_grads(ref, new)


# --------------------------------------------------------------------------- the optimizer
@pytest.mark.parametrize("name", ["tiny", "tiny_qwen3"])
def test_fused_adamw_steps_as_torchs_default(models, name):
    """torch's fused AdamW (its CPU kernel here) takes the steps of torch's default AdamW: every
    parameter after two steps of the learner's loss, weight decay on."""
    path, tok = models[name]
    part, den = rose_part(tok)
    cfg = LearnerConfig(model="m", lr=3e-3, weight_decay=0.1)
    ref, new = load(path), load(path)
    opts = [speed.make_optimizer(kind, m.parameters(), cfg) for kind, m in (("adamw", ref), ("adamw_fused", new))]
    assert opts[1].defaults["fused"] and not opts[0].defaults["fused"]
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    for _ in range(2):
        for model, opt in zip((ref, new), opts):
            run(model, part, den)
            opt.step()
            opt.zero_grad()
    params = dict(ref.named_parameters())
    for n, p in new.named_parameters():
        assert not torch.equal(params[n], start[n]), n  # it moved
        torch.testing.assert_close(p, params[n], rtol=RTOL, atol=RTOL * params[n].abs().max().item(), msg=n)


def test_auto_keeps_the_cpu_defaults():
    """On this CPU machine `auto` changes nothing: CPU runs keep their weights bit for bit."""
    cfg = LearnerConfig(model="m")
    assert speed.chosen(cfg, "qwen3", on_cuda=False) == {
        "attn_implementation": "sdpa_varlen", "optimizer": "adamw", "activation_checkpointing": "none",
        "fused_kernels": "none", "head": "full"}
    fp32 = LearnerConfig(model="m", dtype="float32")
    assert speed.chosen(fp32, "qwen3", on_cuda=True)["head"] == "trained"  # fused heads under bf16 only


# --------------------------------------------------------------------------- torch's varlen attention
def _segments(q, k, v, cu, causal: bool, gqa: bool, scale):
    """A CPU stand-in for torch's CUDA varlen kernel: SDPA per segment of [T, heads, D] inputs."""
    bounds = cu.tolist()
    out = [F.scaled_dot_product_attention(*(x[s:e].transpose(0, 1)[None] for x in (q, k, v)),
                                          is_causal=causal, scale=scale, enable_gqa=gqa)[0].transpose(0, 1)
           for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(out)


def varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    return _segments(query, key, value, cu_seq_q, is_causal, False, None)


def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1)):
    return _segments(query, key, value, cu_seq_q, tuple(window_size) == (-1, 0), False, scale)


def varlen_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    return _segments(query, key, value, cu_seq_q, tuple(window_size) == (-1, 0), enable_gqa, scale)


@pytest.mark.parametrize("kernel", [varlen_2_10, varlen_2_11, varlen_2_12], ids=["torch2.10", "torch2.11", "torch2.12+"])
def test_torch_varlen_calls_each_torchs_kernel_right(models, monkeypatch, kernel):
    """torch's varlen_attn runs on CUDA only, and its arguments changed between torch versions
    (is_causal, then a window; GQA from 2.12). A CPU stand-in with each version's signature
    (SDPA per segment, causal only if asked so, GQA only if told) gives the dense path's
    logprobs and gradients on the tiny Qwen3 (grouped-query attention): the layouts, the causal
    flag and the KV heads reach the kernel right."""
    monkeypatch.setattr(attention, "_varlen_api", lambda: (kernel, frozenset(inspect.signature(kernel).parameters)))
    path, tok = models["tiny_qwen3"]
    part, den = rose_part(tok)
    ref, new = load(path, "dense_mask"), load(path, "torch_varlen")
    assert new.config.num_key_value_heads < new.config.num_attention_heads
    lp_ref, trained = run(ref, part, den, attn="dense_mask")
    lp_new, _ = run(new, part, den, attn="torch_varlen")
    assert_same_logprobs(lp_new[trained], lp_ref[trained])
    assert_same_grads(ref, new)
    rows = torch.from_numpy(part["input_ids"][:, :64]).repeat(2, 1)  # unpacked rows (LearnerGroup.logits)
    with torch.no_grad():
        torch.testing.assert_close(new(input_ids=rows).logits, ref(input_ids=rows).logits, rtol=RTOL, atol=1e-5)


# --------------------------------------------------------------------------- the settings
def test_speed_settings_are_checked_by_key():
    for key, value, match in (("head", "fast", "learner.head: must be one of"),
                              ("head", "cce", "learner.head: cce is a Triton kernel"),
                              ("optimizer", "sgd", "learner.optimizer: must be one of"),
                              ("activation_checkpointing", "half", "learner.activation_checkpointing"),
                              ("fused_kernels", "liger", "learner.fused_kernels: liger is a Triton kernel"),
                              ("attn_implementation", "torch_varlen", "torch_varlen needs learner.dtype=bfloat16")):
        with pytest.raises(ValueError, match=match):
            LearnerConfig(model="m", **{key: value})
    with pytest.raises(ValueError, match="compile runs under ZeRO 0-2"):
        LearnerConfig(model="m", fused_kernels="compile", zero_stage=3)


def test_the_old_checkpointing_key_is_named_and_a_saved_run_keeps_its_setting(tmp_path):
    from rose_ray.cli import main
    from rose_ray.config import load_config
    from rose_ray.errors import ConfigError

    with pytest.raises(ConfigError, match="learner.gradient_checkpointing.*learner.activation_checkpointing"):
        load_config(None, ["learner.gradient_checkpointing=true"])
    saved = tmp_path / "config.yaml"
    saved.write_text("learner:\n  gradient_checkpointing: true\n")
    assert main(["migrate", str(tmp_path)]) == 0
    assert load_config(saved).learner.activation_checkpointing == "full"


# --------------------------------------------------------------------------- on a GPU
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and all(
    importlib.util.find_spec(p) for p in ("triton", "liger_kernel"))


@pytest.mark.skipif(not INTERPRETED, reason="Liger's fused head runs on CPU only under Triton's interpreter: set "
                                            "TRITON_INTERPRET=1 with triton and liger-kernel installed ('.[gpu]')")
def test_the_liger_head_under_tritons_interpreter_equals_the_full_head(models):
    """Liger's own Triton kernels, run by Triton's CPU interpreter: per-token logprobs (reduction
    none, each weighed by the loss in backward) and every gradient as the full head's. (Its
    RMSNorm, RoPE and SwiGLU kernels, and cut-cross-entropy's, do not run in the interpreter.)"""
    path, tok = models["tiny_qwen3"]
    part, den = rose_part(tok)
    ref, new = load(path), load(path)
    full, trained = run(ref, part, den, head="full")
    fused, _ = run(new, part, den, head="liger")
    assert_same_logprobs(fused[trained], full[trained])
    assert_same_grads(ref, new)


GPU_LEVERS = {  # lever: (what it needs besides CUDA, its settings against the reference's)
    "torch_varlen": (attention.torch_varlen_available, {"attn": "torch_varlen"}),
    "cce": (lambda: importlib.util.find_spec("cut_cross_entropy") and importlib.util.find_spec("triton"),
            {"head": "cce"}),
    "liger_head": (lambda: importlib.util.find_spec("liger_kernel") and importlib.util.find_spec("triton"),
                   {"head": "liger"}),
    "liger_kernels": (lambda: speed.liger_supports("qwen3"), {"fused": "liger"}),
}


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="GPU-only kernels (FlashAttention in torch, Triton: cut-cross-entropy, Liger) need CUDA; "
                           "bench/gpu_check.sh runs this on the GPU machine")
@pytest.mark.parametrize("lever", list(GPU_LEVERS))
def test_gpu_kernels_equal_their_reference(models, lever, monkeypatch):
    """bf16 on the GPU against the reference path in bf16 on the same GPU (dense mask or
    per-segment SDPA, the chunked head, transformers' own ops): logprobs within bf16's
    tolerance, every gradient within 5% of its norm."""
    needs, settings = GPU_LEVERS[lever]
    if not needs():
        pytest.skip(f"{lever}: its package (or this torch's varlen module) is not installed here")
    path, tok = models["tiny_qwen3"]
    part, den = rose_part(tok)
    ref_attn = "dense_mask" if "attn" in settings else "sdpa_varlen"
    ref = load(path, ref_attn, torch.bfloat16, "cuda")
    lp_ref, trained = run(ref, part, den, attn=ref_attn, head="trained", device="cuda")  # before Liger's patch
    from transformers.models.qwen3 import modeling_qwen3

    for name in ("apply_rotary_pos_emb", "Qwen3RMSNorm", "Qwen3MLP"):  # Liger patches the module: undone after
        monkeypatch.setattr(modeling_qwen3, name, getattr(modeling_qwen3, name))
    new = load(path, settings.get("attn", "sdpa_varlen"), torch.bfloat16, "cuda")
    speed.apply_fused_kernels(new, settings.get("fused", "none"))
    lp_new, _ = run(new, part, den, attn=settings.get("attn", "sdpa_varlen"), head=settings.get("head", "trained"),
                    device="cuda")
    assert_same_logprobs(lp_new[trained], lp_ref[trained], rtol=2e-2, atol=5e-2)
    grads = dict(ref.named_parameters())
    for name, p in new.named_parameters():
        g_ref, g = grads[name].grad.float(), p.grad.float()
        assert (g - g_ref).norm() <= 0.05 * g_ref.norm() + 1e-6, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's fused AdamW on CUDA needs a GPU")
def test_fused_adamw_on_the_gpu_steps_as_the_foreach_one(models):
    path, tok = models["tiny_qwen3"]
    part, den = rose_part(tok)
    cfg = LearnerConfig(model="m", lr=3e-3, weight_decay=0.1)
    ref, new = load(path, device="cuda"), load(path, device="cuda")
    opts = [speed.make_optimizer(kind, m.parameters(), cfg) for kind, m in (("adamw", ref), ("adamw_fused", new))]
    for _ in range(2):
        for model, opt in zip((ref, new), opts):
            run(model, part, den, device="cuda")
            opt.step()
            opt.zero_grad()
    params = dict(ref.named_parameters())
    for n, p in new.named_parameters():
        torch.testing.assert_close(p, params[n], rtol=1e-4, atol=1e-4 * params[n].abs().max().item(), msg=n)
