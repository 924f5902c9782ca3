"""Flat weight buffers (rose_ray/publish/flat.py) on their own, no Ray cluster: `plan` puts
tensors in order into buckets of up to `bucket_mb` at 64-byte offsets (an exact fit stays, the
next tensor opens a bucket, a tensor larger than a bucket gets one of its own, `bucket_mb=0` one
per tensor); `pack`/`unpack` give back every tensor bit for bit (bf16, fp32, fp16, int64; odd,
0-dim and empty shapes; NaN and -0.0), also through the header's JSON and numpy buffers; a pack
into the buffers of another plan makes new ones instead of writing into them; a header that does
not describe its buffers is refused naming the fault; and a `WeightGroup` (rose_ray/publish/group.py) over gloo carries rank
0's buckets bit for bit into a second process (spawned, on this host), which reuses its buffers
for the next publication. More header faults, and publication into real engines:
tests/integration/test_publish.py."""

from __future__ import annotations

import pickle

import pytest
import torch

from rose_ray.publish.flat import (
    ALIGN,
    FlatHeader,
    FlatState,
    MalformedHeader,
    TensorEntry,
    byte_view,
    pack,
    plan,
    unpack,
)

LIMIT = 256  # bytes: the bucket size the boundary tests plan with
BUCKET_MB = LIMIT / 2**20


def boundary_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors sized to land on a 256-byte bucket's edges (bytes in the comments)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(16, generator=g),  # 64 fp32
        "b": torch.randn(4, 8, generator=g).to(torch.bfloat16),  # 64 bf16, at 64
        "c": torch.randn(2, 16, generator=g),  # 128: bucket 0 exactly full (256)
        "d": torch.randn(5, 4, 5, generator=g),  # 400: larger than a bucket, one of its own
        "e": torch.tensor([float("nan"), -0.0, 1e-40], dtype=torch.bfloat16),  # 6 odd bytes
        "f": torch.randn(5, generator=g),  # 20 fp32, aligned to 64 after e
        "g": torch.tensor(3.25, dtype=torch.bfloat16),  # 0-dim
        "h": torch.zeros(0, 3),  # empty: no bytes
        "i": torch.randn(3, 5, 7, generator=g).to(torch.float16),  # 210
        "j": torch.arange(-3, 4),  # int64, 56
    }


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(byte_view(a), byte_view(b))


def test_plan_fills_buckets_in_order_up_to_the_limit():
    header = plan(boundary_state(), BUCKET_MB)
    where = {e.name: (e.bucket, e.offset, e.nbytes) for e in header.entries}
    assert where == {
        "a": (0, 0, 64), "b": (0, 64, 64), "c": (0, 128, 128),  # an exact fit stays in its bucket
        "d": (1, 0, 400),  # over the limit: a bucket of its own
        "e": (2, 0, 6), "f": (2, 64, 20), "g": (2, 128, 2), "h": (2, 192, 0),
        "i": (3, 0, 210),  # 192 + 210 > 256: the next bucket
        "j": (4, 0, 56),  # 256 + 56 > 256
    }
    assert header.bucket_bytes == (256, 400, 192, 210, 56)
    assert all(e.offset % ALIGN == 0 for e in header.entries)
    assert [e.shape for e in header.entries] == [tuple(t.shape) for t in boundary_state().values()]
    # One byte less room: c no longer fits behind a and b.
    assert [e.bucket for e in plan(boundary_state(), (LIMIT - 1) / 2**20).entries][:4] == [0, 0, 1, 2]
    # A first tensor over the limit gets bucket 0 alone; what follows opens the next.
    big_first = plan({"d": torch.zeros(100), "a": torch.zeros(16)}, BUCKET_MB)
    assert [(e.bucket, e.offset) for e in big_first.entries] == [(0, 0), (1, 0)]
    assert plan(boundary_state(), 0).bucket_bytes == tuple(e.nbytes for e in header.entries)


@pytest.mark.parametrize("bucket_mb", [0, BUCKET_MB, 256])
def test_pack_unpack_gives_back_every_tensor_bit_for_bit(bucket_mb):
    state = boundary_state()
    flat = pack(state, bucket_mb)
    assert len(flat.buffers) == {0: len(state), BUCKET_MB: 5, 256: 1}[bucket_mb]
    assert all(b.dtype == torch.uint8 and b.dim() == 1 for b in flat.buffers)
    # As a receiver gets them: the header through JSON, the buffers as numpy (the object store's).
    wire = pickle.loads(pickle.dumps(flat.numpy(), protocol=5))
    received = FlatState(FlatHeader.from_json(flat.header.to_json()), wire.buffers)
    for got in (unpack(flat), unpack(received)):
        assert list(got) == list(state)
        for name, t in state.items():
            assert same_bits(got[name], t), name


def test_a_pack_into_buffers_of_another_plan_makes_new_ones():
    state = boundary_state()
    flat = pack(state, BUCKET_MB)
    again = pack(boundary_state(seed=1), BUCKET_MB, out=flat.buffers)  # same plan: written in place
    assert all(a is b for a, b in zip(again.buffers, flat.buffers))
    assert same_bits(unpack(flat)["d"], boundary_state(seed=1)["d"])
    kept = [b.clone() for b in flat.buffers]
    other = pack({**state, "k": torch.ones(3)}, BUCKET_MB, out=flat.buffers)  # one more tensor
    assert not any(a is b for a, b in zip(other.buffers, flat.buffers))
    assert all(torch.equal(a, b) for a, b in zip(kept, flat.buffers))  # the old ones untouched
    assert same_bits(unpack(other)["k"], torch.ones(3))


def test_a_header_that_does_not_describe_its_buffers_is_refused_naming_the_fault():
    flat = pack(boundary_state(), BUCKET_MB)
    with pytest.raises(MalformedHeader, match=r"buckets of \[256, 400, 192, 210, 56\] bytes, the buffers hold "
                                              r"\[256, 400, 192, 210\]"):
        unpack(FlatState(flat.header, flat.buffers[:-1]))
    with pytest.raises(MalformedHeader, match="the buffers hold"):  # the buckets out of order
        unpack(FlatState(flat.header, flat.buffers[::-1]))
    entries = list(flat.header.entries)
    cases = [
        (TensorEntry("d", "float32", (4, 5, 5, 2), 1, 0, 400), r"'d': 400 bytes, but shape \(4, 5, 5, 2\)"),
        (TensorEntry("d", "bfloat16", (5, 4, 5), 1, 0, 400), "bytes, but shape"),
        (TensorEntry("a", "float32", (5, 4, 5), 1, 0, 400), "'a': names must be unique"),
        (TensorEntry("d", "float32", (5, 4, 5), 0, 0, 400), r"do not lie aligned inside bucket 0 of 256 bytes"),
        (TensorEntry("d", "float32", (5, 4, 5), 9, 0, 400), "bucket 9 of 5"),
    ]
    for entry, message in cases:
        header = FlatHeader(tuple(entries[:3] + [entry] + entries[4:]), flat.header.bucket_bytes)
        with pytest.raises(MalformedHeader, match=message):
            unpack(FlatState(header, flat.buffers))
    with pytest.raises(TypeError, match="dtype complex64 is not one of"):
        pack({"z": torch.zeros(2, dtype=torch.complex64)}, BUCKET_MB)


