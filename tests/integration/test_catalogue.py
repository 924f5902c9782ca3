"""The half of tests/unit/envs/test_catalogue.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from rose_ray.envs.sciworld.catalogue import all_tasks


def test_shipped_data_matches_a_live_jvm():
    from rose_ray.envs.sciworld.make_data import read_live_catalogue

    live = read_live_catalogue()
    shipped = [
        {
            "task_id": t.task_id, "task": t.task, "num_variations": t.num_variations,
            "train": list(t.train), "dev": list(t.dev), "test": list(t.test),
        }
        for t in all_tasks()
    ]
    assert live == shipped
