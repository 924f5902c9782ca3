"""The launch files and images: the seed configs load, the cluster definitions are valid and
can hold the seed's run (planned on the nodes they declare), scripts and Dockerfiles lint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rose_ray.config import load_config
from rose_ray.placement import NodeInfo, PlacementError, demands, plan
from rose_ray.rollout.handoff import turn_policy

ROOT = Path(__file__).resolve().parents[2]


SEEDS = {"rose": "configs/rose_qwen3_1p7b_32b.yaml", "opd": "configs/opd_qwen3_1p7b_32b.yaml",
         "sft": "configs/sft_qwen3_1p7b_32b.yaml"}


PIN = ["env.resources.env_node=1"]  # what every cluster launcher adds


def test_seed_configs_share_a_base_and_state_only_what_differs(tmp_path):
    from rose_ray.config import ConfigError, to_dict

    base = to_dict(load_config(ROOT / "configs/base_qwen3_1p7b_32b.yaml"))
    differs = {"rose": {"name", "algorithm"}, "sft": {"name", "algorithm"},
               "opd": {"name", "algorithm", "chat", "teacher_engine"}}
    for name, path in SEEDS.items():
        own = yaml.safe_load((ROOT / path).read_text())
        assert own.pop("base") == "base_qwen3_1p7b_32b.yaml" and set(own) == differs[name]
        cfg = to_dict(load_config(ROOT / path))
        # run_dir follows the name; the base alone runs rose with K=5 too
        assert {k for k in cfg if cfg[k] != base[k]} == differs[name] - ({"algorithm"} if name == "rose" else set()) | {"run_dir"}
    # A base of a base, overrides over both, a missing base and a cycle, each named.
    (tmp_path / "a.yaml").write_text("steps: 7\nmode: sync\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nsteps: 9\n")
    (tmp_path / "c.yaml").write_text("base: b.yaml\nname: c\n")
    cfg = load_config(tmp_path / "c.yaml", ["mode=async"])
    assert (cfg.name, cfg.steps, cfg.mode) == ("c", 9, "async")
    (tmp_path / "d.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="d.yaml: base: .*nowhere.yaml does not exist"):
        load_config(tmp_path / "d.yaml")
    (tmp_path / "a.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ConfigError, match="base: c.yaml -> b.yaml -> a.yaml -> c.yaml is a cycle"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_configs_load_with_the_seed_setup(name):
    cfg = load_config(ROOT / SEEDS[name])
    assert cfg.student_engine.model == "Qwen/Qwen3-1.7B" and cfg.teacher_engine.model == "Qwen/Qwen3-32B"
    assert cfg.learner.model == "Qwen/Qwen3-1.7B"
    assert cfg.rollout.max_turns == 10
    # the seed's K=5 for ROSE; OPD and SFT state no handoff, their recipes' policy is fixed
    assert cfg.algorithm.turn_policy() == {"rose": turn_policy("fixed", k=5), "opd": turn_policy("none"),
                                           "sft": turn_policy("teacher_only")}[name]
    assert cfg.rollout.student_sampling.temperature == 1.0
    assert cfg.rollout.student_sampling.max_new_tokens == cfg.rollout.teacher_sampling.max_new_tokens == 512
    assert cfg.student_engine.context_tokens == cfg.teacher_engine.context_tokens == 16384
    assert cfg.algorithm.name == {"rose": "rose", "opd": "opd", "sft": "teacher_sft"}[name]
    # Student, teacher and learner on separate GPU sets.
    gpus = [d for d in demands(cfg) if d.per_replica.get("GPU")]
    assert sorted(d.group for d in gpus) == ["learner", "student", "teacher"]


SHIPPED = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("rose_ray/configs/*.yaml")])


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_puts_runs_under_rose_ray_runs(config, monkeypatch):
    name = load_config(config).name
    monkeypatch.setenv("ROSE_RAY_RUNS", "/shared/runs")
    assert load_config(config).run_dir == f"/shared/runs/{name}"
    monkeypatch.delenv("ROSE_RAY_RUNS")
    assert load_config(config).run_dir == f"runs/{name}"
    monkeypatch.setenv("ROSE_RAY_RUNS", "")  # set to nothing: refused, not runs at /<name>
    with pytest.raises(ValueError, match="ROSE_RAY_RUNS is set but empty"):
        load_config(config)


def _nodes(node_types: dict[str, tuple[dict[str, float], int]]) -> list[NodeInfo]:
    out = []
    for name, (res, count) in node_types.items():
        for i in range(count):
            out.append(NodeInfo(f"{name}-{i}", name, dict(res), dict(res)))
    return out


def test_cluster_launcher_yaml_is_valid_and_holds_the_seed_run():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "launch/cluster.yaml").read_text())
    validate_config(prepare_config(raw))  # Ray's own schema
    types = raw["available_node_types"]
    nodes = _nodes({name: (t["resources"], t.get("min_workers", 1) if name != raw["head_node_type"] else 1)
                    for name, t in types.items()})
    for path in SEEDS.values():
        placed = plan(demands(load_config(ROOT / path, PIN)), nodes, use_total=True)
        env = {a.node.address for a in placed if a.unit.label.startswith("env workers")}
        assert env == {"env_worker"}, "env workers on the CPU env nodes only"
        assert all(a.node.address == "gpu_worker" for a in placed if a.unit.resources.get("GPU"))


def test_kuberay_rayjob_holds_the_seed_run():
    docs = list(yaml.safe_load_all((ROOT / "launch/rayjob.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    entry = job["spec"]["entrypoint"].split()
    config = entry[entry.index("--config") + 1].removeprefix("/opt/rose_ray/")
    cfg = load_config(ROOT / config, [e for e in entry if "=" in e])
    spec = job["spec"]["rayClusterSpec"]
    types = {"head": ({"CPU": float(spec["headGroupSpec"]["rayStartParams"]["num-cpus"])}, 1)}
    for g in spec["workerGroupSpecs"]:
        params = g["rayStartParams"]
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        res = {"CPU": float(limits["cpu"]), "GPU": float(params.get("num-gpus", 0))}
        assert float(limits.get("nvidia.com/gpu", 0)) == res["GPU"], g["groupName"]
        if "resources" in params:
            res.update(yaml.safe_load(yaml.safe_load(params["resources"])))
        types[g["groupName"]] = (res, g["minReplicas"])
    placed = plan(demands(cfg), _nodes(types), use_total=True)
    assert {a.node.address for a in placed if a.unit.label.startswith("env")} == {"env"}
    images = {c["image"] for g in spec["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]}
    assert images == {"rose-ray/gpu:latest", "rose-ray/cpu:latest"}
    # Without the env nodes' resource the same run cannot be placed: the plan says so.
    with pytest.raises(PlacementError, match="env_node"):
        plan(demands(cfg), _nodes({k: v for k, v in types.items() if k != "env"}), use_total=True)


def test_dockerignore_keeps_the_package_and_drops_runs():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ".git" in ignored and "runs" in ignored
    assert not any(p in ignored for p in ("rose_ray", "configs", "launch", "pyproject.toml"))


def test_cluster_definitions_run_ray_with_token_auth_and_only_their_own_pods_reach_it():
    launcher = yaml.safe_load((ROOT / "launch/cluster.yaml").read_text())
    starts = [c for c in launcher["head_start_ray_commands"] + launcher["worker_start_ray_commands"]
              if "ray start" in c]
    token = next(iter(launcher["file_mounts"]))  # the token file, copied to every node
    assert starts and all("RAY_AUTH_MODE=token" in c and f"RAY_AUTH_TOKEN_PATH={token}" in c for c in starts)
    assert "--dashboard-host=127.0.0.1" in starts[0]  # reached through `ray dashboard`'s ssh tunnel
    docs = list(yaml.safe_load_all((ROOT / "launch/rayjob.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "RayJob")
    spec = job["spec"]["rayClusterSpec"]
    assert spec["authOptions"] == {"mode": "token"}
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    selected = policy["spec"]["podSelector"]["matchLabels"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    assert all(selected.items() <= g["template"]["metadata"]["labels"].items() for g in groups)
    peers = [p for rule in policy["spec"]["ingress"] for p in rule["from"]]
    assert {"podSelector": {"matchLabels": selected}} in peers  # the run's own pods
    assert all("podSelector" in p for p in peers)  # no ipBlock or bare namespace: nothing else gets in
    for script in ("launch/slurm.sbatch", "launch/local.sh", "launch/submit.sh"):
        assert "RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}" not in (ROOT / script).read_text(), script


def test_the_cluster_page_opens_no_listener_to_every_address():
    """The trust model keeps listeners on 127.0.0.1 or the head's own address and reaches them by
    tunnel: no command on docs/cluster.md opens one to the whole network (TensorBoard's
    --bind_all, a 0.0.0.0 host)."""
    import re

    blocks = re.findall(r"```[^\n]*\n(.*?)```", (ROOT / "docs/cluster.md").read_text(), re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    assert any("tensorboard --logdir" in line for line in lines)
    assert [line for line in lines if "--bind_all" in line or "0.0.0.0" in line] == []
