"""Transformers backend: batched generation with a KV cache, teacher-forced scoring, weight swaps.

A batch is left-padded, position ids from the attention mask, so a padded row computes what it
would alone; each request samples with its own torch.Generator (a seeded request gives the same
tokens whatever its batch). A finished row's keys/values go into a PrefixCache (matched by
content alone: callers need no conversation key), so a later prompt that starts the same way
feeds only its new tokens. Synchronous and single-threaded: concurrent
callers go through `inference.batcher.AsyncBatcher`.
"""

from __future__ import annotations

import inspect
import random
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rose_ray.inference.engine import (
    EngineConfig,
    GenerationRequest,
    GenerationResult,
    LocalEngine,
    check_scored,
    early_result,
    resolve_dtype,
)
from rose_ray.types import SamplingParams

# Bound on logits materialised at once when scoring (elements; 2^27 fp32 = 512 MiB).
SCORE_LOGITS_BUDGET = 1 << 27
MIN_PREFIX = 16  # prefix cache: shorter matches save less than the bookkeeping costs


@dataclass
class PrefixHit:
    key: int  # the entry's key in the cache
    length: int  # tokens reused (the common prefix, capped to leave one prompt token to feed)
    stored: list[tuple[torch.Tensor, torch.Tensor]]  # the entry's (keys, values) per layer

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:, : self.length], v[:, : self.length]) for k, v in self.stored]


class PrefixCache:
    """Entries (ids, and per layer (keys, values) each (heads, n, head_dim)) bounded by their total
    tokens; the least recently used leave first."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, tuple[torch.Tensor, Any]] = OrderedDict()
        self._keys = count()
        self.tokens = 0
        self.counters = {"prefix_hits": 0, "prefix_misses": 0, "prefix_cached_tokens": 0,
                         "prefix_evictions": 0}

    def stats(self) -> dict[str, int]:
        return {**self.counters, "prefix_entries": len(self._entries), "prefix_stored_tokens": self.tokens}

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def lookup(self, prompt: list[int]) -> PrefixHit | None:
        """The entry sharing the longest prefix with `prompt` (at least MIN_PREFIX tokens)."""
        if self.max_tokens <= 0:
            return None
        best: PrefixHit | None = None
        if len(prompt) > MIN_PREFIX:
            query = torch.tensor(prompt, dtype=torch.long)
            for key, (ids, kv) in self._entries.items():
                m = min(len(ids), len(query) - 1)  # one prompt token must be fed for logits
                differ = (ids[:m] != query[:m]).nonzero()
                length = int(differ[0, 0]) if len(differ) else m
                if length >= MIN_PREFIX and (best is None or length > best.length):
                    best = PrefixHit(key, length, kv)
        if best is None:
            self.counters["prefix_misses"] += 1
            return None
        self._entries.move_to_end(best.key)
        self.counters["prefix_hits"] += 1
        self.counters["prefix_cached_tokens"] += best.length
        return best

    def insert(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]],
               extends: PrefixHit | None = None) -> None:
        """Add an entry; the one it was built on goes if the new one contains it whole."""
        n = len(ids)
        if self.max_tokens <= 0 or n < MIN_PREFIX or n > self.max_tokens:
            return
        new = torch.tensor(ids, dtype=torch.long)
        old = self._entries[extends.key][0] if extends is not None and extends.key in self._entries else None
        # A conversation's next turn supersedes its last one; an entry that only shares the
        # opening (another episode of the same task) stays.
        if old is not None and len(old) <= n and torch.equal(old, new[: len(old)]):
            self._drop(extends.key)  # type: ignore[union-attr]
        self._entries[next(self._keys)] = (new, kv)
        self.tokens += n
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))
            self.counters["prefix_evictions"] += 1

    def _drop(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key)[0])


class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys/values sit in a buffer with `room` spare positions (DynamicLayer
    copies the whole cache every decode step)."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if not self.is_initialized or end > self._k.shape[-2]:
            self._grow(key_states, value_states, end + self.room)
        self._k[..., self.length : end, :] = key_states
        self._v[..., self.length : end, :] = value_states
        self.length = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def _grow(self, k: torch.Tensor, v: torch.Tensor, capacity: int) -> None:
        new_k = k.new_empty((*k.shape[:-2], capacity, k.shape[-1]))
        new_v = v.new_empty((*v.shape[:-2], capacity, v.shape[-1]))
        if self.is_initialized:
            new_k[..., : self.length, :] = self.keys
            new_v[..., : self.length, :] = self.values
        self._k, self._v = new_k, new_v
        self.device, self.is_initialized = k.device, True

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]


def kv_bytes_per_token(model: Any) -> int:
    """Memory of one token's keys and values over all layers."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * heads * head_dim * next(model.parameters()).element_size()


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits with everything outside the smallest set of mass >= top_p set to -inf."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Remove a token when the mass before it already reaches top_p (the first always stays).
    remove = (torch.cumsum(probs, dim=-1) - probs) >= top_p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)


def checked_weights(state: dict[str, Any], shapes: dict[str, tuple[int, ...] | None]
                    ) -> list[tuple[str, torch.Tensor]]:
    """`state` (name -> tensor or array) as tensors, all checked against the model's names and
    shapes (None: any shape) before any is loaded."""
    unknown = sorted(set(state) - set(shapes))
    if unknown:
        raise KeyError(f"update_weights: unknown parameter names {unknown[:5]}")
    weights = []
    with warnings.catch_warnings():  # arrays from Ray's object store are read-only; only read
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for name, value in state.items():
            t = torch.as_tensor(value)
            if shapes[name] is not None and tuple(t.shape) != shapes[name]:
                raise ValueError(f"update_weights: {name} has shape {tuple(t.shape)}, "
                                 f"model expects {shapes[name]}")
            weights.append((name, t))
    return weights


@dataclass
class _Row:
    """Decoding state of one request inside a batch."""

    prompt: list[int]
    sampling: SamplingParams
    top_k: int
    max_new: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[dict[int, float]] = field(default_factory=list)
    finish: str | None = None
    cut: int | None = None  # text length before a matched stop string
    hit: PrefixHit | None = None  # the cached prefix its prompt reused

    def __post_init__(self) -> None:
        seed = self.sampling.seed if self.sampling.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator().manual_seed(seed)


class HFEngine(LocalEngine):
    """A transformers causal LM as a generation engine (CPU or one GPU)."""

    def __init__(self, config: EngineConfig, model: Any = None, tokenizer: Any = None,
                 device: str = "cpu") -> None:
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        from rose_ray.models import load_model, load_tokenizer

        tokenizer = tokenizer or load_tokenizer(config.model)
        if model is None:
            model = load_model(config.model, dtype=resolve_dtype(config.dtype, device), device=device)
        super().__init__(config, device, tokenizer, {
            "batches": 0, "requests": 0, "generated_tokens": 0, "prompt_tokens": 0, "busy_s": 0.0,
            "score_calls": 0, "weight_updates": 0})
        self.model = model.eval()
        if config.backend.attn_implementation and hasattr(self.model, "set_attn_implementation"):
            self.model.set_attn_implementation(config.backend.attn_implementation)
        self.check_positions(getattr(self.model.config, "max_position_embeddings", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.chat.eos_id
        # transformers 5 renamed past_key_values -> cache
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self._lock = threading.Lock()  # one forward pass at a time, weights never torn
        # Prefix reuse and in-place cache growth need plain full-attention layers.
        self._plain = all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.model.config).layers)
        budget = int(config.backend.prefix_cache_mb * 2**20) // kv_bytes_per_token(self.model)
        self._prefix = PrefixCache(budget if self._plain else 0)

    def stats(self) -> dict[str, Any]:
        return super().stats(**self._prefix.stats())

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order; requests are run in batches of max_batch_size."""
        results = [early_result(r, self.config, self.version) for r in requests]  # all checked first
        pending = [i for i, result in enumerate(results) if result is None]
        size = self.config.max_batch_size
        for start in range(0, len(pending), size):
            chunk = pending[start : start + size]
            for i, out in zip(chunk, self._generate_batch([requests[i] for i in chunk])):
                results[i] = out
        return results  # type: ignore[return-value]

    def score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """Teacher-forced logprob of each completion token given the prompt and earlier tokens."""
        check_scored(pairs, self.config.context_tokens)
        out: list[list[float]] = [[] for _ in pairs]
        todo = [n for n, (_, c) in enumerate(pairs) if c]
        vocab = self.model.config.vocab_size
        while todo:
            chunk: list[int] = []
            longest = 0
            for n in todo:
                k = max(longest, len(pairs[n][1]) + 1)
                if chunk and (len(chunk) >= self.config.max_batch_size or (len(chunk) + 1) * k * vocab > SCORE_LOGITS_BUDGET):
                    break
                chunk.append(n)
                longest = k
            todo = todo[len(chunk):]
            for n, lp in zip(chunk, self._score_batch([pairs[n] for n in chunk])):
                out[n] = lp
        self._counters["score_calls"] += 1
        return out

    def update_weights(self, state: dict[str, Any], version: int) -> None:
        """Copy `state` (name -> tensor or array; a subset is fine) into the model."""
        # state_dict names, so tied aliases (lm_head.weight) a learner sends are accepted too.
        params = self.model.state_dict(keep_vars=True)
        weights = checked_weights(state, {name: tuple(p.shape) for name, p in params.items()})
        with self._lock, torch.no_grad():
            for name, t in weights:
                params[name].copy_(t)
            self.version = int(version)
            self._counters["weight_updates"] += 1
            self._prefix.clear()  # keys/values computed by the old weights are stale

    def clear_prefix_cache(self) -> None:
        """Forget cached prefixes (a benchmark's cold start; weights unchanged)."""
        with self._lock:
            self._prefix.clear()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ internals
    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [torch.tensor(s, dtype=torch.long) for s in seqs]
        ids = pad_sequence(rows, batch_first=True, padding_value=self.pad_id, padding_side="left")
        mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_side="left")
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return ids.to(self.device), mask.to(self.device), positions.to(self.device)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: Any = None, logits_to_keep: int = 1) -> tuple[torch.Tensor, Any]:
        kwargs: dict[str, Any] = {"use_cache": cache is not False, "logits_to_keep": logits_to_keep}
        if cache not in (None, False):
            kwargs[self._cache_kw] = cache
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs)
        return out.logits, out.get(self._cache_kw)

    def _score_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        keep = max(len(c) for _, c in pairs) + 1
        ids, mask, positions = self._left_pad([p + c for p, c in pairs])
        with self._lock, torch.inference_mode():
            logits, _ = self._forward(ids, mask, positions, cache=False, logits_to_keep=keep)
            logp = torch.log_softmax(logits.float(), dim=-1)
        out = []
        for r, (_, c) in enumerate(pairs):
            # logits[:, j] predicts the token at column (width - keep + j + 1).
            rows = logp[r, keep - len(c) - 1 : keep - 1]
            out.append(rows.gather(1, torch.tensor(c, device=rows.device)[:, None])[:, 0].tolist())
        return out

    def _choose(self, rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[float], torch.Tensor]:
        """Next token of each active row, its raw logprob, and the raw log-softmax."""
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logits.argmax(dim=-1)
        sampled = [r for r, row in enumerate(rows) if row.sampling.temperature > 0]
        if sampled:
            index = torch.tensor(sampled, device=logits.device)
            temps = torch.tensor([rows[r].sampling.temperature for r in sampled], device=logits.device)
            scaled = logits[index] / temps[:, None]
            for n, r in enumerate(sampled):
                if rows[r].sampling.top_p < 1.0:
                    scaled[n] = _top_p_filter(scaled[n], rows[r].sampling.top_p)
            probs = torch.softmax(scaled, dim=-1).cpu()
            # One generator per request: its draws do not depend on the rest of the batch.
            picks = [torch.multinomial(probs[n], 1, generator=rows[r].generator) for n, r in enumerate(sampled)]
            chosen[index] = torch.cat(picks).to(chosen.device)
        chosen_lp = logp.gather(1, chosen[:, None])[:, 0]
        return chosen.tolist(), chosen_lp.tolist(), logp

    def _check_stop(self, row: _Row) -> None:
        if row.ids[-1] in self.stop_ids:
            row.finish = "stop"
            return
        if row.sampling.stop:
            text = self.chat.decode(row.ids)
            hits = [text.find(s) for s in row.sampling.stop if s in text]
            if hits:
                row.finish, row.cut = "stop", min(hits)
                return
        if len(row.ids) >= row.max_new:
            row.finish = "length"

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        t0 = time.perf_counter()
        context = self.config.context_tokens
        prompts = [list(r.prompt_ids) for r in requests]
        rows = [_Row(p, r.sampling, r.top_logprobs, min(r.sampling.max_new_tokens, context - len(p)))
                for r, p in zip(requests, prompts)]
        with self._lock, torch.inference_mode():
            version = self.version
            self._decode(rows)  # (each has max_new >= 1: early_result answered the others)
        elapsed = time.perf_counter() - t0
        self._batch_sizes.append(len(rows))
        self._counters["batches"] += 1
        self._counters["requests"] += len(rows)
        self._counters["generated_tokens"] += sum(len(r.ids) for r in rows)
        self._counters["prompt_tokens"] += sum(len(p) for p in prompts)
        self._counters["busy_s"] += elapsed
        return [GenerationResult(
            text=self.chat.decode(row.ids)[: row.cut], token_ids=row.ids, logprobs=row.logprobs,
            finish_reason=row.finish or "length", prompt_tokens=len(row.prompt),
            version=version, request_id=req.request_id, top_logprobs=row.top if row.top_k > 0 else None,
        ) for row, req in zip(rows, requests)]

    def _decode(self, active: list[_Row]) -> None:
        """The KV-cache loop: prefill all prompts, then one token per active row per step."""
        logits, cache, mask, last_pos = self._prefill(active)
        while True:
            chosen, chosen_lp, logp = self._choose(active, logits[:, -1])
            keep: list[int] = []
            for r, row in enumerate(active):
                row.ids.append(chosen[r])
                row.logprobs.append(chosen_lp[r])
                if row.top_k > 0:
                    vals, idx = torch.topk(logp[r], row.top_k)
                    row.top.append(dict(zip(idx.tolist(), vals.tolist())))
                self._check_stop(row)
                if row.finish is None:
                    keep.append(r)
                else:
                    self._remember(row, mask[r], cache, r)
            if not keep:
                return
            if len(keep) < len(active):
                index = torch.tensor(keep, device=mask.device)
                cache.batch_select_indices(index)
                mask, last_pos = mask[index], last_pos[index]
                active = [active[r] for r in keep]
            step_ids = torch.tensor([[row.ids[-1]] for row in active], device=mask.device)
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            last_pos = last_pos + 1
            logits, cache = self._forward(step_ids, mask, last_pos[:, None], cache=cache)

    def _prefill(self, rows: list[_Row]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Forward the prompts, reusing cached prefixes: (logits, cache, mask, last position)."""
        for row in rows:
            row.hit = self._prefix.lookup(row.prompt)
        cached = [row.hit.length if row.hit else 0 for row in rows]
        ids, mask, positions = self._left_pad([row.prompt[n:] for row, n in zip(rows, cached)])
        cache = DynamicCache(config=self.model.config)
        if self._plain:  # room for the prompts' rest and the whole generation
            cache.layers = [RoomyLayer(ids.shape[1] + max(row.max_new for row in rows)) for _ in cache.layers]
        width = max(cached)  # always 0 when the prefix cache is off
        if width:
            positions = positions + torch.tensor(cached, device=positions.device)[:, None]
            past_mask = torch.zeros((len(rows), width), dtype=mask.dtype, device=mask.device)
            hits = {r: row.hit.kv() for r, row in enumerate(rows) if row.hit}
            for layer, (k0, v0) in enumerate(next(iter(hits.values()))):
                keys = k0.new_zeros((len(rows), k0.shape[0], width, k0.shape[2]))
                values = v0.new_zeros((len(rows), v0.shape[0], width, v0.shape[2]))
                for r, kv in hits.items():
                    keys[r, :, width - cached[r]:], values[r, :, width - cached[r]:] = kv[layer]
                cache.layers[layer].update(keys, values)
            for r, n in enumerate(cached):
                past_mask[r, width - n:] = 1
            mask = torch.cat([past_mask, mask], dim=1)
        logits, cache = self._forward(ids, mask, positions, cache=cache)
        return logits, cache, mask, positions[:, -1]

    def _remember(self, row: _Row, row_mask: torch.Tensor, cache: Any, r: int) -> None:
        """Store a finished row's keys/values: its prompt and every sampled id but the last (never fed)."""
        if self._prefix.max_tokens <= 0:
            return
        cols = row_mask.nonzero()[:, 0]
        ids = row.prompt + row.ids[:-1]
        assert len(cols) == len(ids), (len(cols), len(ids))
        kv = [(layer.keys[r][:, cols], layer.values[r][:, cols]) for layer in cache.layers]
        self._prefix.insert(ids, kv, extends=row.hit)
