"""The learner's forward: final hidden states of packed micro-batches (the model runs with
`logits_to_keep=1`, a hook captures the body's output), then the LM head on the tokens a loss
term trains (`learner.head`, docs/learner.md) inside ONE call of the head module, so ZeRO-3
gathers its weight once per forward and backward, whatever a rank's number of tokens."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rose_ray.learner.attention import model_kwargs

FUSED_HEADS = {"cce": "cut_cross_entropy", "liger": "liger_kernel"}  # head: the package it needs


def _logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              targets: torch.Tensor) -> torch.Tensor:
    return -F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="none")


def _fused_logprobs(kernel: str, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    targets: torch.Tensor) -> torch.Tensor:
    """Each target's logprob through a fused linear + cross-entropy kernel (no gradient filtering)."""
    if bias is not None:
        raise ValueError(f"learner.head={kernel}: the fused head takes no bias")
    if kernel == "cce":
        from cut_cross_entropy import linear_cross_entropy

        nll = linear_cross_entropy(hidden, weight, targets, reduction="none", filter_eps=None, impl="cce")
    else:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        nll = liger_fused_linear_cross_entropy(hidden, weight, targets, reduction="none")
    return -nll.float()


class ChunkedLMHead(torch.nn.Linear):
    """The model's head that, given targets, returns each target's logprob `chunk` tokens at a
    time (0: all at once), or by a fused kernel (`kernel`: cce, liger)."""

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None,
                chunk: int = 0, kernel: str = "torch") -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        if kernel != "torch":
            return _fused_logprobs(kernel, hidden, self.weight, self.bias, targets)
        if chunk <= 0 or hidden.shape[0] == 0:
            return _logprobs(hidden, self.weight, self.bias, targets)
        pieces = []
        for s in range(0, hidden.shape[0], chunk):
            args = (hidden[s:s + chunk], self.weight, self.bias, targets[s:s + chunk])
            pieces.append(checkpoint(_logprobs, *args, use_reentrant=False)
                          if torch.is_grad_enabled() else _logprobs(*args))
        return torch.cat(pieces) if len(pieces) != 1 else pieces[0]


class PackedForward:
    """`model` run for the learner: final hidden states of packed micro-batches, then token
    logprobs and logits from its head (`head`, resolved), `chunk` tokens at a time."""

    def __init__(self, model: torch.nn.Module, attn: str, chunk: int, head: str = "full") -> None:
        self.attn, self.chunk, self.mode = attn, chunk, head
        self.head = model.get_output_embeddings()
        if type(self.head) not in (torch.nn.Linear, ChunkedLMHead):
            raise ValueError(f"the chunked head needs an nn.Linear output layer, not {type(self.head).__name__}")
        self.head.__class__ = ChunkedLMHead  # same module, parameters and hooks; one more way to call it
        self._captured: list[torch.Tensor] = []
        model.base_model.register_forward_hook(lambda _m, _a, out: self._captured.append(out.last_hidden_state))

    def hidden_states(self, run: Callable[..., Any], t: dict[str, torch.Tensor],
                      bounds: Sequence[int] | None = None) -> torch.Tensor:
        """[B, L, H] for the micro-batch `t`, through `run` (the model, or the DeepSpeed engine
        wrapping it). Rows without `cu_seq_lens` are one sequence each."""
        kwargs = (model_kwargs(self.attn, t["attention_mask"], t["cu_seq_lens"], bounds)
                  if "cu_seq_lens" in t else {})
        self._captured.clear()
        run(input_ids=t["input_ids"], position_ids=t["position_ids"], use_cache=False, logits_to_keep=1, **kwargs)
        return self._captured.pop()

    def token_logprobs(self, hidden: torch.Tensor, input_ids: torch.Tensor,
                       trained: torch.Tensor | None = None) -> torch.Tensor:
        """logp[b, t] = log π(input_ids[b, t+1] | prefix): [B, L-1], float32. `trained`: flat
        indices of the targets a loss term weighs; other heads than `full` score only those (0 elsewhere)."""
        b, length, width = hidden.shape
        flat = hidden[:, :-1].reshape(-1, width)
        targets = input_ids[:, 1:].reshape(-1)
        kernel = self.mode if self.mode in FUSED_HEADS else "torch"
        if trained is not None and trained.numel() == 0:
            kernel = "torch"  # nothing to train here: the head still runs (ZeRO-3), on no token
        if self.mode == "full" or trained is None:
            logp = self.head(flat, targets, self.chunk, kernel)
        else:
            picked = self.head(flat.index_select(0, trained), targets.index_select(0, trained), self.chunk, kernel)
            logp = flat.new_zeros(targets.shape, dtype=torch.float32).index_put((trained,), picked)
        return logp.view(b, length - 1)

    @torch.no_grad()
    def logits_into(self, hidden: torch.Tensor, out: torch.Tensor | None) -> None:
        """The head's logits of `hidden` written chunk by chunk into `out` [B, L, V] (float32); with
        `out` None the head still runs (under ZeRO-3 every rank must)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        target = out.view(-1, out.shape[-1]) if out is not None else None
        step = self.chunk if self.chunk > 0 else max(flat.shape[0], 1)
        for s in range(0, flat.shape[0], step):
            logits = self.head(flat[s:s + step])
            if target is not None:
                target[s:s + step] = logits.float().to(target.device)
