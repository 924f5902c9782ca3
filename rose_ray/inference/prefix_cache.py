"""An LRU of past conversations' key/value tensors, reused by the longest common prefix (matched
by content alone: callers need no conversation key), and `RoomyLayer`, the batch's own cache
layer, writing each new position into spare room instead of re-concatenating the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count

import torch
from transformers.cache_utils import DynamicLayer

MIN_PREFIX = 16  # shorter matches save less than the bookkeeping costs


@dataclass
class PrefixEntry:
    ids: torch.Tensor  # (n,) long
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (heads, n, head_dim)


@dataclass
class PrefixHit:
    key: int  # the entry's key in the cache
    length: int  # tokens reused (the common prefix, capped to leave one prompt token to feed)
    entry: PrefixEntry

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:, : self.length], v[:, : self.length]) for k, v in self.entry.kv]


class PrefixCache:
    """Entries bounded by their total tokens; the least recently used leave first."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
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
            for key, entry in self._entries.items():
                m = min(len(entry.ids), len(query) - 1)  # one prompt token must be fed for logits
                differ = (entry.ids[:m] != query[:m]).nonzero()
                length = int(differ[0, 0]) if len(differ) else m
                if length >= MIN_PREFIX and (best is None or length > best.length):
                    best = PrefixHit(key, length, entry)
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
        new = PrefixEntry(torch.tensor(ids, dtype=torch.long), kv)
        old = self._entries.get(extends.key) if extends is not None else None
        # A conversation's next turn supersedes its last one; an entry that only shares the
        # opening (another episode of the same task) stays.
        if old is not None and len(old.ids) <= n and torch.equal(old.ids, new.ids[: len(old.ids)]):
            self._drop(extends.key)  # type: ignore[union-attr]
        self._entries[next(self._keys)] = new
        self.tokens += n
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))
            self.counters["prefix_evictions"] += 1

    def _drop(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key).ids)


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
