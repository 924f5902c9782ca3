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
  rebuilt at a time in backward (`learner.activation_checkpointing`: `full`, every layer;
  `selective`, every second one from the first, the others keeping all of theirs; `none`);
- outside the layers (the final norm's fp32 input and its output): ≈ (4 + e)·H.

The LM head runs `chunk` tokens at a time (learner/forward.py): its logits in e bytes, then in
fp32 through log-softmax and its backward, ≈ chunk·V·(e + 12) bytes at the peak (an upper
bound: ~13 bytes per logit measured in fp32). `chunk=0` is the original path: every token's
logits at once. The fused heads write no logits: cut-cross-entropy keeps a log-sum-exp and a
logprob per token (fp32) beside the trained tokens' hidden states (e·H each, gathered); Liger's
also a block of logits of about H fp32 values per token and the input's gradient (e·H), the
package's own accounting, not measured here. Liger's fused RMSNorm/SwiGLU keep less than
transformers' own ops: the body's count is an upper bound for them.

Outside the activations, at the optimizer step (when they are freed): torch's foreach AdamW
(`learner.optimizer: adamw` on a GPU) allocates a temporary of the fp32 parameters it steps (the
square roots of the second moments), the fused one none; ZeRO 1-2 keep a reduce and an
all-gather bucket of `learner.zero_bucket_size` elements, and with `overlap_comm` DeepSpeed
counts 4.5 times both (its documentation: 9 GB at the default 5e8 in 16-bit).
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


def checkpointed(mode: bool | str, layers: int) -> int:
    """How many decoder layers `learner.activation_checkpointing` recomputes (True: full)."""
    mode = {True: "full", False: "none"}.get(mode, mode) if isinstance(mode, bool) else mode
    return {"full": layers, "selective": (layers + 1) // 2, "none": 0}[mode]


def learner_activation_bytes(config: Any, tokens: int, chunk: int, checkpointing: bool | str,
                             dtype_bytes: int = 2, head: str = "full") -> dict[str, int]:
    """Peak activation memory of one micro-batch of `tokens` tokens: the body (layers,
    embeddings; with checkpointing, one layer's activations rebuilt: `layer`), the LM head
    (`head`: full or trained at `chunk` tokens a pass, 0: all at once; cce or liger fused), and
    their sum. `checkpointing`: none, full or selective (a bool: full or none)."""
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = _shape(config)
    e = dtype_bytes
    q, k = heads * head_dim, kv_heads * head_dim
    layer = hidden * (8 + 4 * e) + (q + k) * (4 + 3 * e) + inter * 4 * e + 11 * heads
    kept = checkpointed(checkpointing, layers)
    per_token = (4 + e) * hidden + kept * e * hidden + (layers - kept) * layer + (layer if kept else 0)
    if head == "cce":
        head_bytes = tokens * (e * hidden + 8)
    elif head == "liger":
        head_bytes = tokens * (2 * e * hidden + 4 * hidden + 8)
    else:  # full, trained (at most every token): a chunk's logits
        head_tokens = tokens if chunk <= 0 else min(chunk, tokens)
        head_bytes = head_tokens * vocab * (e + 12) + (tokens * e * hidden if head == "trained" else 0)
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
