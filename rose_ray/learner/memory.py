"""The learner's activation memory per micro-batch, as the learner runs a model: what the GPU
memory plan (rose_ray/memory.py) reads. No torch. `config`: a dict of Qwen3's config.json names.
Bytes per token fitted on transformers 5.19's Qwen3 (e = bytes of an activation element; attention
is linear in the segment's length, no L×L term).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rose_ray.learner.speed import checkpointed_layers

# The seed configs' student (configs/*_qwen3_1p7b_32b.yaml), from its config.json.
QWEN3_1P7B = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 151936, "tie_word_embeddings": True}


def learner_activation_bytes(config: Mapping[str, Any], tokens: int, chunk: int, checkpointing: bool | str,
                             dtype_bytes: int = 2, head: str = "full") -> dict[str, int]:
    """Peak activation memory of one micro-batch of `tokens` tokens: the body (layers,
    embeddings; with checkpointing, one layer's activations rebuilt: `layer`), the LM head
    (`head`: full or trained at `chunk` tokens a pass, 0: all at once; cce or liger fused), and
    their sum. `checkpointing`: none, full or selective (a bool: full or none)."""
    hidden, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    e, head_dim = dtype_bytes, config.get("head_dim", hidden // heads)
    q, k = heads * head_dim, config.get("num_key_value_heads", heads) * head_dim
    layer = hidden * (8 + 4 * e) + (q + k) * (4 + 3 * e) + config["intermediate_size"] * 4 * e + 11 * heads
    mode = ("full" if checkpointing else "none") if isinstance(checkpointing, bool) else checkpointing
    kept = len(checkpointed_layers(mode, layers))
    per_token = (4 + e) * hidden + kept * e * hidden + (layers - kept) * layer + (layer if kept else 0)
    if head == "cce":
        head_bytes = tokens * (e * hidden + 8)
    elif head == "liger":  # by Liger's own accounting: also ~H fp32 values and e·H
        head_bytes = tokens * (2 * e * hidden + 4 * hidden + 8)
    else:  # full, trained (at most every token): a chunk's logits
        head_tokens = tokens if chunk <= 0 else min(chunk, tokens)
        head_bytes = (head_tokens * config["vocab_size"] * (e + 12)
                      + (tokens * e * hidden if head == "trained" else 0))
    body = tokens * per_token
    return {"body": body, "layer": tokens * layer if kept else 0, "head": head_bytes, "total": body + head_bytes}


def optimizer_step_bytes(parameters: int, ranks: int, zero_stage: int, optimizer: str, on_gpu: bool) -> int:
    """Temporaries of one optimizer step: torch's foreach AdamW (its default on a GPU) holds the
    square roots of the second moments of what it steps (fp32, the rank's partition under ZeRO
    1-3); the fused one, and the per-tensor loop on CPU, next to nothing."""
    if optimizer == "adamw_fused" or not on_gpu:
        return 0
    return 4 * (parameters // ranks if zero_stage >= 1 else parameters)


def zero_bucket_bytes(parameters: int, zero_stage: int, bucket: int, overlap: bool, dtype_bytes: int) -> float:
    """DeepSpeed's reduce and all-gather buckets under ZeRO 1-2 (16-bit or fp32 elements); with
    overlap_comm, 4.5 times as much (DeepSpeed's own figure)."""
    if zero_stage not in (1, 2):
        return 0.0
    return (4.5 if overlap else 1.0) * 2 * min(parameters, bucket) * dtype_bytes
