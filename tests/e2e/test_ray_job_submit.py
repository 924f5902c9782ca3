"""The slow half of tests/integration/test_launch_submit.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_launch_submit import ROOT

PORT_FLAGS = ("port", "dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port",
              "node-manager-port", "object-manager-port")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(sid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines() if line.strip()) if int(s) == sid]


class LocalHead:
    """`ray start --head --block` with a dashboard, in its own session and temp dir, with token
    auth as launch/slurm.sbatch starts it: a token file of its own (`auth_env` finds it)."""

    def __init__(self, num_cpus: int = 2) -> None:
        # A short path: Ray's unix sockets live under it (108-byte limit).
        self.tmp = tempfile.mkdtemp(prefix="rrh", dir="/tmp")
        token = Path(self.tmp) / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self.ports = {flag: _free_port() for flag in PORT_FLAGS}
        self.dashboard = f"http://127.0.0.1:{self.ports['dashboard-port']}"
        cmd = ["ray", "start", "--head", "--block", f"--num-cpus={num_cpus}", "--num-gpus=0",
               "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={self.tmp}",
               *(f"--{flag}={port}" for flag, port in self.ports.items())]
        self.log = open(os.path.join(self.tmp, "head.log"), "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, start_new_session=True, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.auth_env})

    def wait_ready(self, timeout_s: float = 150.0) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}: {Path(self.log.name).read_text()[-2000:]}")
            token = Path(self.auth_env["RAY_AUTH_TOKEN_PATH"]).read_text()
            ask = urllib.request.Request(self.dashboard + "/api/version", headers={"Authorization": f"Bearer {token}"})
            try:
                urllib.request.urlopen(ask, timeout=2).read()
                return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"the dashboard at {self.dashboard} did not come up in {timeout_s} s")

    def stop(self) -> None:
        """Kill the head's session: `ray start`, GCS, raylet, dashboard, workers, their JVMs."""
        sid = self.proc.pid
        for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            for pid in _session_pids(sid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait_s
            while time.time() < deadline and [p for p in _session_pids(sid) if p != sid]:
                time.sleep(0.5)
            if self.proc.poll() is not None and not _session_pids(sid):
                break
        self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# A short tiny run (2 JVMs to boot, not 8; no evals): keeps a job short on 2 cores.
SHORT = ["rollout.max_turns=3", "teacher_warmup.enabled=false", "rollout.batch_episodes=2", "env.games_per_worker=2",
         "rollout.student_sampling.max_new_tokens=16", "rollout.teacher_sampling.max_new_tokens=16",
         "eval.before=false", "eval.teacher=false", "eval.after=false"]


@pytest.fixture(scope="module")
def head():
    """One Ray head for this file's jobs, stopped after them; none of its processes outlive it."""
    head = LocalHead(num_cpus=2)
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()
    assert _session_pids(head.proc.pid) == [], "processes of the test's Ray head are still running"


def documented_command(section: str) -> str:
    """The `ray job submit` command of docs/cluster.md's `section`, as a user copies it."""
    import re

    text = (ROOT / "docs/cluster.md").read_text()
    body = text[text.index(f"## {section}\n"):]
    body = body[:body.index("\n## ", 1)]
    block = next(b for b in re.findall(r"```\n(.*?)```", body, re.S) if "ray job submit" in b)
    return "\n".join(line for line in block.splitlines() if not line.startswith("#")).strip()


@pytest.mark.slow
def test_the_documented_ray_job_submit_command_runs_the_tiny_config(head, tmp_path, tiny_dir):
    """docs/cluster.md's plain `ray job submit` command, run as written from the repository with
    RAY_ADDRESS and ROSE_RAY_RUNS set as it says, and overrides appended that make the run short
    and find the test's tiny models: the job succeeds and its run is under ROSE_RAY_RUNS."""
    command = documented_command("`ray job submit`")
    assert command.startswith("ray job submit ") and command.endswith("--config configs/tiny.yaml")
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    env.update(RAY_ADDRESS=head.dashboard, ROSE_RAY_RUNS=str(runs), **head.auth_env)
    job = subprocess.run(["bash", "-c", " ".join([command, "steps=1", f"tiny_dir={tiny_dir}", *SHORT])],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = job.stdout + job.stderr
    assert job.returncode == 0 and "succeeded" in out, out[-4000:]
    summary = json.loads((runs / "tiny" / "version_0" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["run_dir"] == str(runs / "tiny" / "version_0")


@pytest.mark.slow
def test_a_submitted_run_lands_in_the_submitting_directory_and_outlives_the_job(head, tmp_path, tiny_dir):
    """No ROSE_RAY_RUNS and a head on this machine: submit.sh sends the run to ./runs here
    (absolute), not into the job's uploaded copy of the repository, which goes with the job."""
    env = {k: v for k, v in os.environ.items() if k not in ("ROSE_RAY_RUNS", "RAY_AUTH_TOKEN")}
    env.update(RAY_ADDRESS=head.dashboard, **head.auth_env)
    # A secret for the job goes by a file only its path of which the job's record keeps (the tiny
    # config's hf teacher takes no key: the secret is only in the driver's environment).
    secret = f"sk-{secrets.token_hex(8)}"
    env_file = tmp_path / "job.env"
    env_file.write_text(f"ROSE_RAY_API_KEY={secret}\n")
    env_file.chmod(0o600)
    overrides = ["steps=2", f"tiny_dir={tiny_dir}", *SHORT]
    job = subprocess.run(["bash", str(ROOT / "launch/submit.sh"), "--job-id", "rr-test-submit",
                          "--env-file", str(env_file), "configs/tiny.yaml", *overrides],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    assert "succeeded" in out.lower(), out[-2000:]
    record = subprocess.run(["ray", "list", "jobs", "--detail", "--format", "json", "--address", head.dashboard],
                            env=env, capture_output=True, text=True, timeout=60)
    assert "rr-test-submit" in record.stdout and str(env_file) in record.stdout, record.stdout + record.stderr
    assert secret not in record.stdout + out
    # Without the token the cluster's Jobs API answers nobody.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(head.dashboard + "/api/jobs/", timeout=10)
    assert refused.value.code in (401, 403)
    runs = tmp_path / "runs" / "tiny"
    assert f"submit.sh: the run goes to a new version_N folder in {runs} " in out
    run_dir = runs / "version_0"
    assert [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()] == []
    assert (runs / "latest").read_text() == "version_0\n"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["run_dir"] == str(run_dir)
    assert summary["model"] == str(run_dir / "model") and (run_dir / "model" / "model.safetensors").is_file()
    events = list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert events and all(e.stat().st_size > 0 for e in events), sorted(p.name for p in run_dir.rglob("*"))
    # The job's record in the dashboard says the same.
    status = subprocess.run(["ray", "job", "status", "--address", head.dashboard, "rr-test-submit"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert "rr-test-submit' succeeded" in status.stdout + status.stderr
