"""launch/submit.sh against a real local Ray head with a dashboard: the job runs `rose-ray
train` on the tiny config, and its run folder (summary.json, model/, TensorBoard files) is
found where submit.sh said, after the job and its working directory are gone.

The head is this test's own: a private --temp-dir, free ports for every listener, and
`ray start --block` in a new session, so stopping it kills exactly the processes it started
(a bare `ray stop` would kill every Ray instance on the machine, other users' too).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_submit_sh_refuses_runs_it_cannot_place_before_uploading(tmp_path):
    """Where runs go is settled before anything is sent: a relative run_dir, or no ROSE_RAY_RUNS
    with a head it cannot tell is this machine (here: no cluster answers), is refused naming
    what to set."""
    env = {k: v for k, v in os.environ.items() if k != "ROSE_RAY_RUNS"}
    env.update(RAY_ADDRESS="http://127.0.0.1:9", RAY_AUTH_MODE="disabled")
    submit = ["bash", str(ROOT / "launch/submit.sh"), "configs/tiny.yaml"]
    out = subprocess.run([*submit, "run_dir=mine"], cwd=tmp_path, env={**env, "ROSE_RAY_RUNS": "/shared/runs"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "run_dir mine is relative and does not follow ROSE_RAY_RUNS" in out.stderr
    out = subprocess.run(submit, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "cannot ask the Ray cluster at http://127.0.0.1:9 where its head runs" in out.stderr
    assert "set ROSE_RAY_RUNS" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_submit_sh_rejects_a_bad_override_before_uploading(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9", "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run(["bash", str(ROOT / "launch/submit.sh"), "configs/tiny.yaml", "rollout.max_turns=0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "rollout.max_turns" in out.stderr


def test_submit_sh_needs_an_address(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(["bash", str(ROOT / "launch/submit.sh"), "configs/tiny.yaml"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "RAY_ADDRESS" in out.stderr


def test_submit_sh_keeps_secrets_out_of_the_job_record(tmp_path):
    """A secret's name in --env is refused (the record keeps env_vars), and so is an env file
    other users can read; both before anything is sent."""
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9", "ROSE_RAY_RUNS": "/shared/runs"}
    submit = ["bash", str(ROOT / "launch/submit.sh")]
    for pair in ("ROSE_RAY_API_KEY=sk-1", "HF_TOKEN=hf_1", "DB_PASSWORD=x", "MY_SECRET_THING=x"):
        out = subprocess.run([*submit, "--env", pair, "configs/tiny.yaml"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "--env-file" in out.stderr, (pair, out.stderr)
        assert pair.partition("=")[2] not in out.stdout + out.stderr
    shared = tmp_path / "job.env"
    shared.write_text("ROSE_RAY_API_KEY=sk-1\n")
    shared.chmod(0o644)
    out = subprocess.run([*submit, "--env-file", str(shared), "configs/tiny.yaml"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and f"chmod 600 {shared}" in out.stderr


def test_submit_sh_refuses_an_api_key_on_its_command_line(tmp_path):
    """A literal key among the overrides would be printed and kept in the job's record (its
    command): refused before anything is sent, the key in no output; a key that names a
    variable the driver resolves goes through. (`ray` is a stand-in here: nothing is sent.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text("#!/bin/sh\necho \"ray $*\"\n")
    (bin_dir / "ray").chmod(0o755)
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9", "ROSE_RAY_RUNS": "/shared/runs",
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    submit = ["bash", str(ROOT / "launch/submit.sh"), "configs/tiny.yaml"]
    for key in ("teacher_engine.backend.api_key", "student_engine.backend.api_key"):
        out = subprocess.run([*submit, f"{key}=sk-live-123"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and f"{key}=..." in out.stderr and "--env-file" in out.stderr, out.stderr
        assert "sk-live-123" not in out.stdout + out.stderr
    named = ["teacher_engine.backend=openai", "teacher_warmup.enabled=false",
             "teacher_engine.backend.api_key=${oc.env:ROSE_RAY_API_KEY,null}"]  # a served teacher's key
    out = subprocess.run([*submit, *named], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"-- python -m rose_ray.cli train --config configs/tiny.yaml {' '.join(named)}" \
        in out.stdout, out.stdout + out.stderr


def test_submit_sh_resumes_a_run_folder_by_its_absolute_path(tmp_path):
    """`--resume RUN` sends `train --resume RUN` (checked here when this machine sees RUN: a
    folder holding no run is refused, exit 2, before anything is sent); a relative RUN, or a
    config beside it, is refused."""
    from rose_ray.config import load_config
    from rose_ray.runs import saved_config

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text("#!/bin/sh\necho \"ray $*\"\n")
    (bin_dir / "ray").chmod(0o755)
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("ROSE_RAY_RUNS", None)
    submit = ["bash", str(ROOT / "launch/submit.sh")]
    run = tmp_path / "runs" / "tiny" / "slurm_7"
    run.mkdir(parents=True)
    out = subprocess.run([*submit, "--resume", str(run)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and f"{run}: not a run directory" in out.stderr, out.stderr
    (run / "config.yaml").write_text(saved_config(load_config(ROOT / "configs/tiny.yaml", [f"run_dir={run}"])))
    out = subprocess.run([*submit, "--resume", str(run), "steps=9"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"submit.sh: the run goes on in {run}" in out.stdout
    assert f"-- python -m rose_ray.cli train --resume {run} steps=9" in out.stdout
    for bad, says in ((["--resume", "runs/tiny"], "give an absolute path"),
                      (["--resume", str(run), "configs/tiny.yaml"], "goes on with the run's own config")):
        out = subprocess.run([*submit, *bad], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and says in out.stderr, out.stderr
