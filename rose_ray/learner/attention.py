"""Attention over packed rows without an L×L mask (`learner.attn_implementation`): one padding-free
row of segments, positions restarting at each, `cu_seq_lens` the boundaries in the form
FlashAttention's varlen kernels take. docs/learner.md compares the implementations."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

SDPA_VARLEN = "sdpa_varlen"
TORCH_VARLEN = "torch_varlen"


def sdpa_varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, attention_mask: torch.Tensor | None,
                          dropout: float = 0.0, scaling: float | None = None,
                          cu_seq_lens_q: torch.Tensor | None = None,
                          segment_bounds: Sequence[int] | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each segment (`segment_bounds`, else `cu_seq_lens_q`) of one packed
    row [1, heads, T, D]; without boundaries, over each whole row. Returns [B, T, heads, D]."""
    if attention_mask is not None:
        raise ValueError("sdpa_varlen takes segment boundaries (cu_seq_lens_q), not an attention mask")
    gqa = getattr(module, "num_key_value_groups", 1) > 1

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling,
                                             enable_gqa=gqa)
        return out.transpose(1, 2)

    if segment_bounds is None and cu_seq_lens_q is not None:
        segment_bounds = cu_seq_lens_q.tolist()  # a host sync per layer: callers pass the bounds
    if segment_bounds is None or len(segment_bounds) <= 2:
        return causal(query, key, value).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError(f"sdpa_varlen packs segments into one row, got {query.shape[0]} rows")
    return torch.cat([causal(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e])
                      for s, e in zip(segment_bounds[:-1], segment_bounds[1:])], dim=1), None


@functools.cache
def _varlen_api() -> tuple[Any, frozenset[str]] | None:
    """torch's varlen_attn and the keyword arguments this torch's version takes, or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def torch_varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: torch.Tensor | None,
                           dropout: float = 0.0, scaling: float | None = None,
                           cu_seq_lens_q: torch.Tensor | None = None, max_length_q: int | None = None,
                           **_: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each segment of one packed row [1, heads, T, D] in one call of
    torch's variable-length kernel. Returns [1, T, heads, D]."""
    api = _varlen_api()
    if api is None:
        raise RuntimeError(f"torch_varlen: torch {torch.__version__} has no torch.nn.attention.varlen")
    if attention_mask is not None or dropout:
        raise ValueError("torch_varlen takes segment boundaries (cu_seq_lens_q) and no dropout")
    if cu_seq_lens_q is None:  # unpacked rows (LearnerGroup.logits): each row one sequence
        return sdpa_varlen_attention(module, query, key, value, None, dropout, scaling)
    if query.shape[0] != 1:
        raise ValueError(f"torch_varlen packs segments into one row, got {query.shape[0]} rows")
    varlen_attn, params = api
    length = query.shape[2]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, D] views
    kwargs: dict[str, Any] = {"scale": scaling} if "scale" in params else {}
    # torch 2.10 takes is_causal; later versions a window, (-1, 0) being causal
    kwargs.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # a torch without GQA in the kernel: each KV head repeated for its query heads
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    longest = int(max_length_q) if max_length_q is not None else length
    out = varlen_attn(q, k, v, cu_seq_lens_q, cu_seq_lens_q, longest, longest, **kwargs)
    return out[None], None


AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)
AttentionInterface.register(TORCH_VARLEN, torch_varlen_attention)


def torch_varlen_available() -> bool:
    """Whether torch_varlen can run here: a CUDA device and a torch with the varlen module."""
    return torch.cuda.is_available() and _varlen_api() is not None


def transformers_name(resolved: str) -> str:
    """The name transformers knows the implementation by (the dense mask runs under sdpa)."""
    return "sdpa" if resolved == "dense_mask" else resolved


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """[B, 1, L, L] boolean mask (`dense_mask`): causal within each segment; padding (segment 0)
    attends to itself only, which keeps softmax finite."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    allowed = causal & same & (segments[:, :, None] > 0)
    allowed |= torch.eye(length, dtype=torch.bool, device=segments.device)
    return allowed[:, None]


def model_kwargs(resolved: str, segments: torch.Tensor, cu_seq_lens: torch.Tensor,
                 bounds: Sequence[int] | None = None) -> dict[str, Any]:
    """The model's arguments that keep packed segments apart under `resolved`; `bounds`: the
    boundaries as ints where the caller has them (else read once)."""
    if resolved == "dense_mask":
        return {"attention_mask": segment_mask(segments)}
    bounds = [int(b) for b in (cu_seq_lens.tolist() if bounds is None else bounds)]
    longest = int(np.diff(bounds).max()) if len(bounds) > 1 else 0
    kwargs = {"cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens,
              "max_length_q": longest, "max_length_k": longest}
    if resolved == SDPA_VARLEN:
        kwargs["segment_bounds"] = tuple(bounds)
    return kwargs
