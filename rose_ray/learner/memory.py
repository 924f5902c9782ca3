"""The learner's activation memory per micro-batch, as the learner runs a model: what the GPU
memory plan (rose_ray/memory.py, which also counts the model states under ZeRO) reads.

No torch: a plan is made before any model is loaded. `config` is a Hugging Face config or a
dict with its fields (Qwen3's names: hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, vocab_size).

Activations, per token of a micro-batch, were measured on transformers 5.19's Qwen3 (bytes of
the tensors autograd saves, fitted over several shapes to within a byte per token; e = bytes of
an activation element, 2 in bf16, 4 in fp32):

- one decoder layer keeps H·(8 + 4e) + (Q + K)·(4 + 3e) + I·4e + 11·heads bytes, where
  Q = heads·head_dim and K = kv_heads·head_dim (RMSNorm keeps fp32 copies; attention keeps
  q, k, v, its output and an fp32 log-sum-exp per head: linear in the segment's length, the
  way sdpa_varlen and FlashAttention's varlen path run, no L×L term);
- with gradient checkpointing a layer keeps its input (e·H) and one layer's activations are
  rebuilt at a time in backward;
- outside the layers (the final norm's fp32 input and its output): ≈ (4 + e)·H.

The LM head runs `chunk` tokens at a time (learner/forward.py): its logits in e bytes, then in
fp32 through log-softmax and its backward, ≈ chunk·V·(e + 12) bytes at the peak (an upper
bound: ~13 bytes per logit measured in fp32). `chunk=0` is the original path: every token's
logits at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rose_ray.errors import InputError

# The seed configs' student (configs/*_qwen3_1p7b_32b.yaml), from its config.json.
QWEN3_1P7B = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 151936, "tie_word_embeddings": True}



def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)
    if value is None:
        raise InputError(f"model config: {key} is required")
    return value


def _shape(config: Any) -> tuple[int, int, int, int, int, int, int]:
    hidden = _get(config, "hidden_size")
    heads = _get(config, "num_attention_heads")
    head_dim = _get(config, "head_dim", hidden // heads)
    return (hidden, _get(config, "intermediate_size"), _get(config, "num_hidden_layers"), heads,
            _get(config, "num_key_value_heads", heads), head_dim, _get(config, "vocab_size"))


def learner_activation_bytes(config: Any, tokens: int, chunk: int, checkpointing: bool,
                             dtype_bytes: int = 2) -> dict[str, int]:
    """Peak activation memory of one micro-batch of `tokens` tokens: the body (layers,
    embeddings; with checkpointing, one layer's activations rebuilt: `layer`), the LM head at
    `chunk` tokens a pass (0: all at once), and their sum."""
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = _shape(config)
    e = dtype_bytes
    q, k = heads * head_dim, kv_heads * head_dim
    layer = hidden * (8 + 4 * e) + (q + k) * (4 + 3 * e) + inter * 4 * e + 11 * heads
    per_token = (4 + e) * hidden + (layers * e * hidden + layer if checkpointing else layers * layer)
    head_tokens = tokens if chunk <= 0 else min(chunk, tokens)
    body, head = tokens * per_token, head_tokens * vocab * (e + 12)
    return {"body": body, "layer": tokens * layer, "head": head, "total": body + head}
