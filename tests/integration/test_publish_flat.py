"""The half of tests/unit/publish/test_flat.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import multiprocessing

from rose_ray.publish.flat import (
    FlatHeader,
    pack,
    unpack,
)
from rose_ray.publish.group import WeightGroup
from tests.unit.publish.test_flat import BUCKET_MB, boundary_state, same_bits


def receiver(address: dict, header_json: str, results) -> None:
    """Rank 1 of a WeightGroup: two publications received, each checked against the state rank
    0 packed (seeds 0, then 1); puts (names that differ, whether the buffers were reused)."""
    header = FlatHeader.from_json(header_json)
    group = WeightGroup.join(address, 1)
    first = group.receive(header)
    got = unpack(first)
    bad = [name for name, t in boundary_state(0).items() if not same_bits(got[name], t)]
    second = group.receive(header, first.buffers)
    got = unpack(second)
    bad += [f"{name} (second)" for name, t in boundary_state(1).items() if not same_bits(got[name], t)]
    results.put((bad, all(a is b for a, b in zip(second.buffers, first.buffers))))


def test_a_gloo_weight_group_carries_the_buckets_bit_for_bit_to_another_process():
    flat = pack(boundary_state(0), BUCKET_MB)
    store, address = WeightGroup.open_store(2, 30.0)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=receiver, args=(address, flat.header.to_json(), results), daemon=True)
    child.start()
    try:
        group = WeightGroup(store, address["name"], 0, 2, 30.0)  # waits for rank 1 to join
        group.broadcast(flat.buffers)
        group.broadcast(pack(boundary_state(1), BUCKET_MB, out=flat.buffers).buffers)
        bad, reused = results.get(timeout=60)
        child.join(timeout=30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    assert bad == [] and reused
