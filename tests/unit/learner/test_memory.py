"""The learner's activation memory (rose_ray/learner/memory.py) against the model it describes: the
parameter count of a real Qwen3, and the activation bytes autograd keeps for a micro-batch
(measured with saved-tensor hooks on a shape the formula was not fitted on)."""

from __future__ import annotations

import pytest
import torch

from rose_ray.learner.memory import QWEN3_1P7B, learner_activation_bytes
from rose_ray.memory import ModelShape

SHAPE = {"hidden_size": 96, "intermediate_size": 320, "num_hidden_layers": 2, "num_attention_heads": 6,
         "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 500}


def qwen3(checkpointing: bool, dtype: torch.dtype, tied: bool = True):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import rose_ray.learner.attention  # noqa: F401  (registers sdpa_varlen)

    config = Qwen3Config(**SHAPE, tie_word_embeddings=tied)
    config._attn_implementation = "sdpa_varlen"
    model = Qwen3ForCausalLM(config).to(dtype).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def saved_bytes(model, tokens: int) -> int:
    """Bytes of the activations autograd keeps for backward (parameters left out)."""
    storages: dict[int, int] = {}

    def keep(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model.model(input_ids=torch.randint(0, 500, (1, tokens)), position_ids=torch.arange(tokens)[None])
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


def test_parameter_count_is_the_models():
    for tied in (True, False):
        model = qwen3(False, torch.float32, tied)
        shape = ModelShape.from_config("shape", "test", {**SHAPE, "tie_word_embeddings": tied})
        assert shape.parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("dtype, e", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_activation_bytes_are_what_autograd_keeps(dtype, e):
    tokens = 200
    full = saved_bytes(qwen3(False, dtype), tokens)
    plan = learner_activation_bytes(SHAPE, tokens, chunk=64, checkpointing=False, dtype_bytes=e)
    assert plan["body"] == pytest.approx(full, rel=0.05)
    # with checkpointing each layer keeps its input; backward rebuilds one layer at a time
    kept = saved_bytes(qwen3(True, dtype), tokens)
    plan_ckpt = learner_activation_bytes(SHAPE, tokens, chunk=64, checkpointing=True, dtype_bytes=e)
    assert plan_ckpt["body"] - plan_ckpt["layer"] == pytest.approx(kept, rel=0.05)
    assert plan["head"] == 64 * SHAPE["vocab_size"] * (e + 12)  # a chunk's logits, not the row's


def test_the_seed_learner_fits_per_rank_with_room():
    """Qwen3-1.7B, rows of 16,384 tokens, bf16, ZeRO-2 over 2 ranks, gradient checkpointing:
    the head in chunks is ~2 GiB where whole logits were ~32 GiB."""
    lean = learner_activation_bytes(QWEN3_1P7B, 16384, chunk=1024, checkpointing=True)
    whole = learner_activation_bytes(QWEN3_1P7B, 16384, chunk=0, checkpointing=True)
    p = ModelShape.from_config("Qwen3-1.7B", "test", QWEN3_1P7B).parameters()
    states = 2 * p + 2 * p + (4 + 12) * p / 2  # bf16 weights and gradients; fp32 gradients and Adam over 2 ranks
    assert 1.6e9 < p < 1.8e9
    assert lean["head"] < 2.5 * 2**30 < 30 * 2**30 < whole["head"]
    assert states + lean["total"] < 40 * 2**30 < states + whole["total"]  # half an 80 GB GPU, or not
