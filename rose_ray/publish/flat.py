"""Weights as flat byte buffers: a state dict packed into a few uint8 buffers (buckets) and a
typed header saying where each tensor lies. Every dtype travels as its raw bytes, so nothing is
pickled: Ray's object store sends numpy buffers zero-copy, a collective one buffer per bucket."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN = 64  # bytes: every tensor starts at a multiple of this (any dtype can view it)
HEADER_VERSION = 1
# dtype name -> bytes per element; a dtype outside this list is refused by pack and unpack
ITEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4,
              "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


class MalformedHeader(ValueError):
    """A FlatState whose header does not describe its buffers (names the first fault)."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes lie."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class FlatHeader:
    """The typed description of a FlatState's buffers: entries, and each bucket's byte size."""

    entries: tuple[TensorEntry, ...]
    bucket_bytes: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps({"version": HEADER_VERSION, "bucket_bytes": list(self.bucket_bytes),
                           "entries": [[e.name, e.dtype, list(e.shape), e.bucket, e.offset, e.nbytes]
                                       for e in self.entries]})

    @classmethod
    def from_json(cls, text: str) -> FlatHeader:
        """Parse and check (MalformedHeader naming the fault)."""
        try:
            raw = json.loads(text)
        except (TypeError, ValueError) as e:
            raise MalformedHeader(f"flat weights header: not JSON ({e})") from None
        if not isinstance(raw, dict) or raw.get("version") != HEADER_VERSION:
            raise MalformedHeader(f"flat weights header: expected an object with version {HEADER_VERSION}, "
                                  f"got {str(raw)[:80]!r}")
        try:
            entries = tuple(TensorEntry(name, dtype, tuple(shape), bucket, offset, nbytes)
                            for name, dtype, shape, bucket, offset, nbytes in raw["entries"])
            header = cls(entries, tuple(raw["bucket_bytes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise MalformedHeader(f"flat weights header: entries must be [name, dtype, shape, bucket, "
                                  f"offset, nbytes] and bucket_bytes a list ({e})") from None
        header.check()
        return header

    def check(self, buffer_bytes: list[int] | None = None) -> None:
        """MalformedHeader unless entries are unique, typed, sized and inside their buckets, and
        (given) the buffers have the bucket sizes."""
        if not all(_is_count(b) for b in self.bucket_bytes):
            raise MalformedHeader(f"flat weights header: bucket sizes must be counts of bytes, got {self.bucket_bytes}")
        if buffer_bytes is not None and list(buffer_bytes) != list(self.bucket_bytes):
            raise MalformedHeader(f"flat weights: the header describes buckets of {list(self.bucket_bytes)} bytes, "
                                  f"the buffers hold {list(buffer_bytes)}")
        seen: set[str] = set()
        for e in self.entries:
            where = f"flat weights header: {e.name!r}"
            if not isinstance(e.name, str) or e.name in seen:
                raise MalformedHeader(f"{where}: names must be unique strings")
            seen.add(e.name)
            if e.dtype not in ITEM_BYTES:
                raise MalformedHeader(f"{where}: dtype {e.dtype!r} is not one of {sorted(ITEM_BYTES)}")
            if not all(_is_count(d) for d in e.shape):
                raise MalformedHeader(f"{where}: shape {e.shape} must be counts")
            if not (_is_count(e.nbytes) and e.nbytes == math.prod(e.shape) * ITEM_BYTES[e.dtype]):
                raise MalformedHeader(f"{where}: {e.nbytes!r} bytes, but shape {e.shape} of {e.dtype} "
                                      f"takes {math.prod(e.shape) * ITEM_BYTES[e.dtype]}")
            if not (_is_count(e.bucket) and e.bucket < len(self.bucket_bytes)):
                raise MalformedHeader(f"{where}: bucket {e.bucket!r} of {len(self.bucket_bytes)}")
            if not (_is_count(e.offset) and e.offset % ITEM_BYTES[e.dtype] == 0
                    and e.offset + e.nbytes <= self.bucket_bytes[e.bucket]):
                raise MalformedHeader(f"{where}: bytes [{e.offset}, {e.offset}+{e.nbytes}) do not lie aligned "
                                      f"inside bucket {e.bucket} of {self.bucket_bytes[e.bucket]} bytes")


@dataclass
class FlatState:
    """A header and its buffers (1-D uint8 numpy arrays or torch tensors, one per bucket)."""

    header: FlatHeader
    buffers: list[Any]

    def numpy(self) -> FlatState:
        """The same bytes with numpy buffers (what Ray's object store sends zero-copy)."""
        import torch

        return FlatState(self.header, [b.numpy() if isinstance(b, torch.Tensor) else b for b in self.buffers])


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def plan(state: dict[str, Any], bucket_mb: float) -> FlatHeader:
    """Each tensor, in order, into buckets of up to `bucket_mb` (a larger one alone), aligned to
    ALIGN bytes; `bucket_mb=0`: one per tensor."""
    limit = int(bucket_mb * 2**20)
    entries, sizes = [], []
    for name, t in state.items():
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in ITEM_BYTES:
            raise TypeError(f"flat weights: dtype {dtype} is not one of {sorted(ITEM_BYTES)}")
        nbytes = t.numel() * ITEM_BYTES[dtype]
        start = -(-sizes[-1] // ALIGN) * ALIGN if sizes else 0
        if not sizes or limit <= 0 or (start + nbytes > limit and sizes[-1] > 0):
            sizes.append(0)
            start = 0
        entries.append(TensorEntry(name, dtype, tuple(int(d) for d in t.shape), len(sizes) - 1, start, nbytes))
        sizes[-1] = start + nbytes
    return FlatHeader(tuple(entries), tuple(sizes))


def byte_view(t: Any) -> Any:
    """A 1-D uint8 view of a tensor's bytes (a copy only where it is not contiguous)."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def pack(state: dict[str, Any], bucket_mb: float = 256, out: list[Any] | None = None,
         device: Any = "cpu") -> FlatState:
    """`state` as a FlatState of uint8 tensors on `device`, each tensor copied once into its
    bucket (into `out`, a previous pack's buffers, where they fit). `bucket_mb=0`: each tensor's
    own bytes as its buffer (a copy only from another device)."""

    header = plan(state, bucket_mb)
    if bucket_mb <= 0:
        return FlatState(header, [byte_view(t.to(device)) for t in state.values()])
    buffers = buffers_for(header, device, out)
    for e, t in zip(header.entries, state.values()):
        if e.nbytes:
            _view(buffers[e.bucket], e).copy_(t.detach())
    return FlatState(header, buffers)


def _view(buffer: Any, e: TensorEntry) -> Any:
    import torch

    if not e.nbytes:  # an empty tensor has no bytes to view
        return torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=buffer.device)
    return buffer[e.offset:e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape)


def unpack(flat: FlatState) -> dict[str, Any]:
    """{name: tensor} viewing `flat`'s buffers (numpy or torch; no copy); MalformedHeader if they
    do not match."""
    import torch

    with warnings.catch_warnings():  # arrays from Ray's object store are read-only; only read
        warnings.filterwarnings("ignore", message=".*not writable.*")
        buffers = [(b if isinstance(b, torch.Tensor) else torch.from_numpy(np.asarray(b))).reshape(-1)
                   for b in flat.buffers]
    for n, b in enumerate(buffers):
        if b.dtype.itemsize != 1:
            raise MalformedHeader(f"flat weights: buffer {n} holds {b.dtype}, not bytes")
    flat.header.check([int(b.numel()) for b in buffers])
    return {e.name: _view(buffers[e.bucket], e) for e in flat.header.entries}


def buffers_for(header: FlatHeader, device: Any = "cpu", reuse: list[Any] | None = None) -> list[Any]:
    """Buffers of the header's bucket sizes on `device`: `reuse` where it fits, else new ones."""
    import torch

    if reuse is not None and [int(b.numel()) for b in reuse] == list(header.bucket_bytes) \
            and all(b.device == torch.device(device) for b in reuse):
        return reuse
    return [torch.empty(n, dtype=torch.uint8, device=device) for n in header.bucket_bytes]
