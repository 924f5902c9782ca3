"""The half of tests/unit/test_placement.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rose_ray.config import load_config
from rose_ray.placement import (
    PlacementError,
    demands,
)
from tests.unit.test_placement import TINY


# --------------------------------------------------------------------------- a real cluster
@pytest.fixture(scope="module")
def cluster(env_node_cluster):
    """(cluster, env node ids, head node id) of conftest.env_node_cluster."""
    c, env_nodes = env_node_cluster
    return c, [n.node_id for n in env_nodes], c.head_node.node_id


FITS = ["env.workers=2", "env.cpus_per_worker=0.5", "env.resources.env_node=1",
        "resources.student_gpus=1", "resources.teacher_gpus=1", "learner.gpus_per_rank=0"]


def test_plan_prints_where_each_actor_goes(cluster, capsys):
    from rose_ray.cli import main

    _, env_nodes, head = cluster
    assert main(["plan", "--config", TINY, *FITS]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines() if line.startswith(("env", "eval", "student", "teacher", "learner"))}
    assert head[:8] in rows["student engine"] and head[:8] in rows["teacher engine"]
    assert "placement group 'student'" in rows["student engine"]
    assert {env_nodes[0][:8], env_nodes[1][:8]} == {n[:8] for n in env_nodes
                                                    if any(n[:8] in rows[k] for k in ("env workers #0", "env workers #1"))}
    assert "plan: the cluster can hold 'tiny'" in out
    # Memory per GPU: printed, not checked, when no one says how big the GPUs are.
    assert "GPU: unknown (pass --gpu-memory GiB to check that each role fits)" in out


def test_plan_rejects_what_the_cluster_cannot_hold(cluster, capsys):
    from rose_ray.cli import main

    # 3 GPUs wanted, 2 on the only GPU node.
    assert main(["plan", "--config", TINY, *FITS, "learner.gpus_per_rank=1"]) == 2
    err = capsys.readouterr().err
    assert "rose-ray plan: error:" in err and "GPU" in err
    assert any(role in err for role in ("learner ranks", "student engine", "teacher engine"))
    # An env worker bigger than any node (3 CPUs; nodes have 2, the cluster 6).
    assert main(["plan", "--config", TINY, *FITS, "env.cpus_per_worker=3"]) == 2
    err = capsys.readouterr().err
    assert "env workers" in err and "largest node has 2 CPU" in err
    # A custom resource no node has.
    assert main(["plan", "--config", TINY, *FITS, "env.resources.big_disk=1"]) == 2
    assert "no node has the resource 'big_disk'" in capsys.readouterr().err


def test_plan_cli_exits_2_against_ray_address(cluster):
    c, _, _ = cluster
    env = {**os.environ, "RAY_ADDRESS": c.address, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "rose_ray.cli", "plan", "--config", TINY, *FITS,
                          "resources.teacher_gpus=2"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "teacher engine" in out.stderr and "GPU" in out.stderr


def test_placement_groups_put_gpu_roles_on_the_gpu_node(cluster):
    import ray

    from rose_ray.placement import PlacementGroups

    _, _, head = cluster
    cfg = load_config(TINY, FITS)
    groups = PlacementGroups(demands(cfg), timeout_s=60)
    try:
        assert groups.options("env workers", 0) == {}  # CPU roles are placed freely

        @ray.remote(num_cpus=0.25, num_gpus=1)
        def where() -> str:
            return ray.get_runtime_context().get_node_id()

        for role in ("student engine", "teacher engine"):
            assert ray.get(where.options(**groups.options(role, 0)).remote(), timeout=60) == head
    finally:
        groups.remove()
    too_big = load_config(TINY, [*FITS, "resources.teacher_gpus=2"])
    with pytest.raises(PlacementError, match=r"placement group '(student|teacher)' \(.*GPU.*\) was not ready"):
        PlacementGroups(demands(too_big), timeout_s=3)
