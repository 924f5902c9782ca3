"""Attention over packed rows without an L×L mask (`learner.attn_implementation`).

A micro-batch reaches the model as one padding-free row of segments (learner/batching.py):
position ids restart at every segment and `cu_seq_lens` holds the segment boundaries, in the
form FlashAttention's variable-length kernels take (`cu_seq_lens_q/k`, `max_length_q/k`), so
one set of model arguments serves every implementation:

- `sdpa_varlen`: torch's scaled_dot_product_attention once per segment, causal inside it.
  No mask exists at all; torch's flash kernels (CPU and CUDA) keep memory linear in the
  segment's length. The CPU default.
- `flash_attention_2`: transformers' FlashAttention path, which reads the same boundaries
  (`flash_attn_varlen_func`). Needs CUDA, the `flash-attn` package and bf16.
- `dense_mask`: transformers' sdpa with an explicit [B, 1, L, L] block-diagonal mask: the
  learner's original path, kept as the reference the others are tested against.
- `auto`: flash_attention_2 where a GPU, flash-attn and bf16 are at hand, else sdpa_varlen.

flex_attention is not offered: torch 2.13 has no flex backward on CPU, so it could not be
tested here.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_IMPLEMENTATIONS = ("auto", "sdpa_varlen", "flash_attention_2", "dense_mask")
SDPA_VARLEN = "sdpa_varlen"


def sdpa_varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, attention_mask: torch.Tensor | None,
                          dropout: float = 0.0, scaling: float | None = None,
                          cu_seq_lens_q: torch.Tensor | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each segment of `cu_seq_lens_q` (one packed row, [1, heads, T, D]);
    without boundaries, plain causal attention over each whole row. Returns [B, T, heads, D]."""
    if attention_mask is not None:
        raise ValueError("sdpa_varlen takes segment boundaries (cu_seq_lens_q), not an attention mask")
    gqa = getattr(module, "num_key_value_groups", 1) > 1

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling,
                                              enable_gqa=gqa)

    if cu_seq_lens_q is None:
        out = causal(query, key, value)
    else:
        if query.shape[0] != 1:
            raise ValueError(f"sdpa_varlen packs segments into one row, got {query.shape[0]} rows")
        bounds = cu_seq_lens_q.tolist()
        out = torch.cat([causal(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e])
                         for s, e in zip(bounds[:-1], bounds[1:])], dim=2)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)


def resolve(name: str, dtype: str) -> str:
    """The implementation `name` stands for on this machine (`auto` chooses)."""
    if name != "auto":
        return name
    flash = torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
    return "flash_attention_2" if flash and dtype == "bfloat16" else SDPA_VARLEN


def transformers_name(resolved: str) -> str:
    """The name transformers knows the implementation by (the dense mask runs under sdpa)."""
    return "sdpa" if resolved == "dense_mask" else resolved


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """[B, 1, L, L] boolean mask: causal attention within each packed segment only (the
    `dense_mask` path). Padding (segment 0) attends to itself only, which keeps softmax finite."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    allowed = causal & same & (segments[:, :, None] > 0)
    allowed |= torch.eye(length, dtype=torch.bool, device=segments.device)
    return allowed[:, None]


def model_kwargs(resolved: str, segments: torch.Tensor, cu_seq_lens: torch.Tensor) -> dict[str, Any]:
    """What the model's forward needs to keep packed segments apart under `resolved`."""
    if resolved == "dense_mask":
        return {"attention_mask": segment_mask(segments)}
    lengths = np.diff(cu_seq_lens.cpu().numpy())
    longest = int(lengths.max()) if lengths.size else 0
    return {"cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": longest, "max_length_k": longest}
