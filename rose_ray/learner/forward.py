"""The learner's forward: a causal LM's final hidden states for packed micro-batches, then the
LM head in chunks of tokens, so token logprobs and logits never need [tokens, vocab] at once.

With Qwen3's vocabulary (151,936) the whole logits of a 16k-token row are ~10 GB in fp32, and
cross entropy keeps several such tensors alive. Here each chunk of `chunk` tokens goes through
the head and the log-softmax under `torch.utils.checkpoint`, which keeps only the chunk's input
(a view of the hidden states that backward keeps anyway) and recomputes the chunk's logits in
backward: the head's peak is O(chunk × vocab), forward and backward.

The model's own forward runs with `logits_to_keep=1` (its head sees one position) and the
body's output is captured by a hook. The chunk loop runs inside ONE call of the head module
(its class becomes `ChunkedLMHead`, same parameters): DeepSpeed's ZeRO-3 hooks then gather the
(partitioned, possibly tied) weight once per forward and once per backward, the same number of
collectives on every rank whatever its number of tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rose_ray.learner.attention import model_kwargs


def _logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              targets: torch.Tensor) -> torch.Tensor:
    return -F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="none")


class ChunkedLMHead(torch.nn.Linear):
    """The model's head (an nn.Linear) that, given targets, returns each target's logprob
    computed `chunk` tokens at a time (0: all at once, logits kept for backward)."""

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None,
                chunk: int = 0) -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        if chunk <= 0:
            return _logprobs(hidden, self.weight, self.bias, targets)
        pieces = []
        for s in range(0, hidden.shape[0], chunk):
            args = (hidden[s:s + chunk], self.weight, self.bias, targets[s:s + chunk])
            pieces.append(checkpoint(_logprobs, *args, use_reentrant=False)
                          if torch.is_grad_enabled() else _logprobs(*args))
        return torch.cat(pieces)


class PackedForward:
    """`model` (a transformers causal LM loaded with the attention implementation `attn`
    resolves to, learner/attention.py) run for the learner: final hidden states of packed
    micro-batches, then token logprobs and logits from its head, `chunk` tokens at a time."""

    def __init__(self, model: torch.nn.Module, attn: str, chunk: int) -> None:
        self.attn, self.chunk = attn, chunk
        self.head = model.get_output_embeddings()
        if type(self.head) not in (torch.nn.Linear, ChunkedLMHead):
            raise ValueError(f"the chunked head needs an nn.Linear output layer, not {type(self.head).__name__}")
        self.head.__class__ = ChunkedLMHead  # same module, parameters and hooks; one more way to call it
        self._captured: list[torch.Tensor] = []
        model.base_model.register_forward_hook(lambda _m, _a, out: self._captured.append(out.last_hidden_state))

    def hidden_states(self, run: Callable[..., Any], t: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, L, H] for the micro-batch `t`, through `run` (the model, or the DeepSpeed engine
        wrapping it, so its hooks fire). A packed micro-batch carries its segment boundaries
        (`cu_seq_lens`); rows without them are one sequence each (plain causal attention)."""
        kwargs = model_kwargs(self.attn, t["attention_mask"], t["cu_seq_lens"]) if "cu_seq_lens" in t else {}
        self._captured.clear()
        run(input_ids=t["input_ids"], position_ids=t["position_ids"], use_cache=False, logits_to_keep=1, **kwargs)
        return self._captured.pop()

    def token_logprobs(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """logp[b, t] = log π(input_ids[b, t+1] | prefix): [B, L-1], float32."""
        b, length, width = hidden.shape
        logp = self.head(hidden[:, :-1].reshape(-1, width), input_ids[:, 1:].reshape(-1), self.chunk)
        return logp.view(b, length - 1)

    @torch.no_grad()
    def logits_into(self, hidden: torch.Tensor, out: torch.Tensor | None) -> None:
        """The head's logits of `hidden` [B, L, H] written chunk by chunk into `out` [B, L, V]
        (float32). With `out` None the head still runs (under ZeRO-3 every rank must)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        target = out.view(-1, out.shape[-1]) if out is not None else None
        step = self.chunk if self.chunk > 0 else max(flat.shape[0], 1)
        for s in range(0, flat.shape[0], step):
            logits = self.head(flat[s:s + step])
            if target is not None:
                target[s:s + step] = logits.float().to(target.device)
