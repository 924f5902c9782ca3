"""The half of tests/unit/test_runs.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from rose_ray.runs import new_version


def test_runs_started_at_once_never_share_a_folder(tmp_path):
    with ProcessPoolExecutor(4) as pool:
        made = list(pool.map(new_version, [tmp_path / "tiny"] * 16))
    assert sorted(made) == sorted({*made}) and len(made) == 16
    assert (tmp_path / "tiny" / (tmp_path / "tiny" / "latest").read_text().strip()) in made
