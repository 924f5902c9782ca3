"""Weight publication's parts that start no process: flat byte buffers (rose_ray/publish/flat.py)
and the publication settings' checks; the publications into real engine actors are
tests/integration/test_publish.py."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from rose_ray.errors import ConfigError
from rose_ray.publish.flat import FlatHeader, FlatState, MalformedHeader, byte_view, pack, unpack


def odd_state() -> dict[str, torch.Tensor]:
    """Every float dtype a model holds, in layouts a learner hands over: non-contiguous
    (transposed, strided), 0-dim and empty tensors, special values (bit patterns compared)."""
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(6, 10, generator=g)
    special = torch.tensor([float("inf"), -0.0, float("nan"), 1e-40, -3.5])
    return {
        "fp32": torch.randn(3, 5, generator=g),
        "fp32.transposed": wide.t(),
        "bf16.strided": torch.randn(4, 8, generator=g).to(torch.bfloat16)[:, ::3],
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "fp16": torch.randn(2, 3, 4, generator=g).to(torch.float16).permute(2, 0, 1),
        "fp16.scalar": torch.tensor(2.5, dtype=torch.float16),
        "fp32.empty": torch.zeros(0, 4),
        "fp32.special": special,
        "bf16.special": special.to(torch.bfloat16),
        "int64": torch.arange(5),
    }


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(byte_view(a), byte_view(b))


@pytest.mark.parametrize("bucket_mb", [0, 0.0001, 256])
def test_pack_unpack_round_trip_is_exact(bucket_mb):
    state = odd_state()
    flat = pack(state, bucket_mb)
    if bucket_mb == 0:
        assert len(flat.buffers) == len(state)
    elif bucket_mb == 256:
        assert len(flat.buffers) == 1
    else:  # 104-byte buckets: several, none over the limit unless one tensor alone is
        assert 1 < len(flat.buffers) < len(state)
        for n, size in enumerate(flat.header.bucket_bytes):
            alone = [e for e in flat.header.entries if e.bucket == n]
            assert size <= 104 or len(alone) == 1
    assert all(e.offset % 64 == 0 for e in flat.header.entries)
    # As the object store delivers it: numpy buffers, pickled out of band, read-only.
    wire = pickle.loads(pickle.dumps(flat.numpy(), protocol=5))
    header = FlatHeader.from_json(flat.header.to_json())
    for got in (unpack(flat), unpack(FlatState(header, wire.buffers))):
        assert list(got) == list(state)
        for name, t in state.items():
            assert same_bits(got[name], t), name


def test_unpacked_tensors_are_views_of_the_buffers():
    state = {"a": torch.randn(100, 10), "b": torch.randn(50).to(torch.bfloat16)}
    flat = pack(state, 256)
    got = unpack(flat)
    buf = flat.buffers[0]
    for t in got.values():
        assert buf.data_ptr() <= t.data_ptr() < buf.data_ptr() + buf.numel()
    got["a"][0, 0] = 7.0  # writes through to the buffer: no copy was made
    assert unpack(flat)["a"][0, 0] == 7.0
    reused = pack(state, 256, out=flat.buffers)  # a second pack into the same buffers
    assert reused.buffers[0] is buf and same_bits(unpack(reused)["a"], state["a"])


def test_a_malformed_header_is_refused_naming_the_fault():
    flat = pack({"w": torch.randn(4, 4), "b": torch.randn(4).to(torch.bfloat16)}, 256)
    raw = json.loads(flat.header.to_json())

    def header_with(**change) -> str:
        broken = json.loads(json.dumps(raw))
        entry = broken["entries"][1]
        for k, v in change.items():
            entry[["name", "dtype", "shape", "bucket", "offset", "nbytes"].index(k)] = v
        return json.dumps(broken)

    cases = [("not json {", "not JSON"),
             (json.dumps({**raw, "version": 99}), "version 1"),
             (json.dumps({**raw, "entries": [["w", "float32"]]}), "entries must be"),
             (header_with(dtype="complex64"), "dtype 'complex64'"),
             (header_with(nbytes=7), "7 bytes, but shape"),
             (header_with(shape=[-4]), "must be counts"),
             (header_with(bucket=3), "bucket 3 of 1"),
             (header_with(offset=10**6), "do not lie aligned inside bucket 0"),
             (header_with(offset=65), "do not lie aligned"),
             (header_with(name="w"), "unique")]
    for text, message in cases:
        with pytest.raises(MalformedHeader, match=message):
            FlatHeader.from_json(text)
    short = FlatState(flat.header, [flat.buffers[0][:-8]])
    with pytest.raises(MalformedHeader, match="the buffers hold"):
        unpack(short)
    with pytest.raises(MalformedHeader, match="not bytes"):
        unpack(FlatState(flat.header, [flat.buffers[0].view(torch.int16)]))
    with pytest.raises(TypeError, match="complex64"):
        pack({"z": torch.zeros(2, dtype=torch.complex64)})


def test_publish_config_names_an_unknown_method_and_a_collective_without_an_actor():
    from rose_ray.config import load_config

    with pytest.raises(ConfigError, match=r"publish.method: must be one of .*got 'nccl'"):
        load_config(None, ["publish.method=nccl"])
    with pytest.raises(ConfigError, match="publish.bucket_mb"):
        load_config(None, ["publish.bucket_mb=-1"])
    with pytest.raises(ConfigError, match="collective needs a student engine that is a local Ray actor"):
        load_config(None, ["publish.method=collective", "student_engine.backend=openai",
                           "student_engine.backend.base_url=http://localhost:1/v1", "student_warmup.enabled=false",
                           "student_engine.tokenizer=x"])
    assert load_config(None, []).publish.method == "auto"


def test_publish_in_flight_is_validated_naming_the_key():
    from rose_ray.config import load_config
    from rose_ray.publish.route import PublishConfig

    with pytest.raises(ConfigError, match=r"publish.in_flight: must be one of \('wait', 'keep'\), got 'abort'"):
        load_config(None, ["publish.in_flight=abort"])
    with pytest.raises(ConfigError, match="publish.in_flight_wait_ms: must be >= 0"):
        load_config(None, ["publish.in_flight_wait_ms=-1"])
    with pytest.raises(ConfigError, match="publish.in_flight: keep .* student_engine.backend is 'hf'"):
        load_config(None, ["publish.in_flight=keep", "student_engine.backend=hf"])
    assert load_config(None, []).publish.in_flight == "wait"  # the drain stays the default
    assert PublishConfig().keep_after_ms is None
    assert PublishConfig(in_flight="keep", in_flight_wait_ms=250).keep_after_ms == 250.0
