"""Placement (rose_ray/placement.py): per-node bin-packing of every role, `rose-ray plan` on a
simulated three-node cluster (one node with 2 GPUs, two CPU-only env nodes), and GPU placement
groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_ray.config import load_config
from rose_ray.placement import (
    NodeInfo,
    PlacementError,
    RoleDemand,
    demands,
    plan,
    units,
)

ROOT = Path(__file__).resolve().parents[2]


TINY = str(ROOT / "rose_ray/configs/tiny.yaml")


SEED = str(ROOT / "configs/rose_qwen3_1p7b_32b.yaml")


def node(name: str, **res: float) -> NodeInfo:
    return NodeInfo(name * 8, "10.0.0." + name, dict(res), dict(res))


# --------------------------------------------------------------------------- pure planning
def test_an_actor_must_fit_on_one_node_not_just_in_total():
    roles = [RoleDemand("teacher engine", 1, {"CPU": 1, "GPU": 2}, group="teacher")]
    two_small = [node("a", CPU=8, GPU=1), node("b", CPU=8, GPU=1)]  # 2 GPUs in all, 1 per node
    with pytest.raises(PlacementError) as e:
        plan(roles, two_small)
    msg = str(e.value)
    assert "teacher engine" in msg and "2 GPU on one node" in msg and "largest node has 1 GPU" in msg
    [a] = plan(roles, two_small + [node("c", CPU=4, GPU=2)])
    assert a.node.address == "10.0.0.c"


def test_seed_config_fits_an_eight_gpu_node_with_env_nodes_and_not_four_gpus():
    cfg = load_config(SEED, ["env.resources.env_node=1"])
    nodes = [node("g", CPU=32, GPU=8), node("e", CPU=64, env_node=1000), node("f", CPU=64, env_node=1000)]
    placed = plan(demands(cfg), nodes)
    where = {a.unit.label: a.node.address for a in placed}
    assert where["student engine"] == where["teacher engine"] == where["learner ranks #0"] == "10.0.0.g"
    env = [a.node.address for a in placed if a.unit.label.startswith("env workers")]
    assert len(env) == 8 and env.count("10.0.0.e") == env.count("10.0.0.f") == 4  # spread evenly
    with pytest.raises(PlacementError, match=r"(student engine|learner ranks #\d) .*GPU"):
        plan(demands(cfg), [node("g", CPU=32, GPU=4)] + nodes[1:])  # the teacher takes all four


def test_a_tensor_parallel_engine_reserves_one_bundle_of_its_gpus():
    cfg = load_config(SEED)  # teacher_engine.backend.tensor_parallel_size 4 on vllm
    teacher = next(u for u in units(demands(cfg)) if u.label == "teacher engine")
    assert teacher.resources["GPU"] == 4 and teacher.group == "teacher"
    # Two 4-GPU nodes: the teacher's four land together on one of them.
    placed = plan(demands(cfg), [node("a", CPU=32, GPU=4), node("b", CPU=32, GPU=4)])
    assert len({a.node.address for a in placed if a.unit.label == "teacher engine"}) == 1
    with pytest.raises(PlacementError, match=r"resources.teacher_gpus: 2, but teacher_engine.backend.tensor_parallel_size is 4.*"
                                             r"set resources.teacher_gpus: 4"):
        demands(load_config(SEED, ["resources.teacher_gpus=2"]))
    with pytest.raises(PlacementError, match=r"resources.student_gpus: 2, but student_engine.backend.tensor_parallel_size is 1"):
        demands(load_config(SEED, ["resources.student_gpus=2"]))
    # Another backend starts its section afresh: no tensor parallelism from the seed's vllm.
    assert load_config(SEED, ["teacher_engine.backend=hf"]).teacher_engine.tensor_parallel_size == 1
    demands(load_config(SEED, ["teacher_engine.backend.tensor_parallel_size=2", "resources.teacher_gpus=2"]))


def test_separate_gpu_sets_by_default_and_colocation_shares_bundles():
    student = RoleDemand("student engine", 1, {"CPU": 1, "GPU": 0.5}, group="student")
    learner = RoleDemand("learner ranks", 2, {"CPU": 1, "GPU": 0.5}, group="learner")
    separate = units([student, learner])
    assert [u.resources["GPU"] for u in separate] == [1.0, 1.0, 1.0]  # whole GPUs each
    with pytest.raises(PlacementError, match="GPU"):
        plan([student, learner], [node("a", CPU=8, GPU=2)])
    colocated = units([RoleDemand("student engine", 1, {"CPU": 1, "GPU": 0.5}, group="learner"), learner])
    assert [(u.label, u.resources["GPU"]) for u in colocated] == [
        ("student engine + learner ranks #0", 1.0), ("learner ranks #1", 1.0)]
    placed = plan([RoleDemand("student engine", 1, {"CPU": 1, "GPU": 0.5}, group="learner"), learner],
                  [node("a", CPU=8, GPU=2)])
    assert len(placed) == 2


def test_colocate_field_is_read_when_the_config_has_it():
    cfg = load_config(TINY, ["resources.student_gpus=0.5", "learner.gpus_per_rank=0.5"])
    assert [d.group for d in demands(cfg)][2:] == ["student", None, "learner"]
    cfg.resources.colocate = True  # a ResourcesConfig field
    assert [d.group for d in demands(cfg)][2:] == ["learner", None, "learner"]


def test_missing_custom_resource_is_named():
    roles = [RoleDemand("env workers", 2, {"CPU": 1, "env_node": 1}, "SPREAD")]
    with pytest.raises(PlacementError, match="env workers.*no node has the resource 'env_node'"):
        plan(roles, [node("a", CPU=8, GPU=2)])


