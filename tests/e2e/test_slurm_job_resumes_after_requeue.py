"""launch/slurm.sbatch under a real SLURM: Debian's slurm-wlm (22.05), its own munged, slurmctld
and slurmd started by this test on this machine, with a config it writes into a temp dir (free
ports, state and spool there, SlurmUser=root). The node has this machine's CPUs and 2 fake GPUs
as gres: gres.conf names two plain files as their devices, which slurmd logs as "not a valid
character or block device" and counts all the same (a `Count=` alone registers none), so the job
books GPUs and the script hands them to Ray, which only counts them. `sbatch` runs the tiny
config through the script, `scontrol requeue` stops it after its first checkpoint, and the
requeued job goes on from that checkpoint to the last step.

What this cannot show: real GPUs (CUDA_VISIBLE_DEVICES, NCCL) and more than one host (one slurmd,
so one node: the env nodes of a heterogeneous job run in tests/unit/test_launch_files.py with
stand-ins for srun and scontrol). Skipped where slurm-wlm is not installed (.ci/run installs it
with apt) or the test is not root (its slurmd runs jobs as root).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.test_run_survives_failures import BATCH, check_exactly_once
from tests.unit.test_launch_files import ROOT

SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
GPUS = 2
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _why_not_here() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name, path=SBIN) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing; .ci/run installs slurm-wlm with apt)"
    if os.geteuid() != 0:
        return "the test's slurmd runs its jobs as root (SlurmUser=root): run the tests as root"
    return None


def _marked_pids(mark: str) -> list[int]:
    """Every process whose environment carries `mark`: the daemons, their jobs, and whatever
    those left behind (Ray's processes, JVMs), and nothing else on the machine."""
    needle = f"ROSE_RAY_TEST_SLURM={mark}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:  # gone, or a kernel thread
            pass
    return [p for p in pids if p != os.getpid()]


class LocalSlurm:
    """A SLURM cluster on this machine, in a temp dir of its own: a GPU node (`gpus` fake GPUs) and
    a CPU-only node, each with this machine's CPUs, each its own slurmd (Debian's build runs
    several on one host, each on its own port)."""

    def __init__(self, gpus: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rrslurm", dir="/tmp"))  # short: munge's socket path
        self.dir.chmod(0o755)  # munged wants every user able to reach its socket
        self.mark = secrets.token_hex(8)
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "ROSE_RAY_TEST_SLURM": self.mark}
        self.nodes = {"rr1": f" Gres=gpu:{gpus}", "rr2": ""}  # a GPU node, a CPU-only node
        self.cpus = os.cpu_count() or 1
        host = socket.gethostname().split(".")[0]
        for sub in ("state", *(f"spool/{n}" for n in self.nodes)):
            (self.dir / sub).mkdir(parents=True)
        devices = [self.dir / f"gpu{i}" for i in range(gpus)]
        for d in devices:
            d.touch()
        key = self.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self.socket = self.dir / "munge.socket"
        self.conf.write_text("\n".join([
            "ClusterName=rrtest", f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={self.dir}/state", f"SlurmdSpoolDir={self.dir}/spool/%n",
            f"SlurmctldPidFile={self.dir}/slurmctld.pid", f"SlurmdPidFile={self.dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.dir}/slurmctld.log", f"SlurmdLogFile={self.dir}/slurmd-%n.log",
            # No cgroups, accounting or MPI: none is set up on this machine.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "SwitchType=switch/none",
            "MailProg=/bin/true", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "GresTypes=gpu", "ReturnToService=2", "KillWait=10",
            *(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={self.cpus} "
              f"RealMemory=1000{gres} State=UNKNOWN" for n, gres in self.nodes.items()),
            f"PartitionName=rr Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP", ""]))
        (self.dir / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName=rr1 Name=gpu File={','.join(map(str, devices))}\n")
        self.log = open(self.dir / "daemons.log", "w")  # noqa: SIM115 - closed in stop()

    def _start(self, *cmd: str) -> None:
        exe = shutil.which(cmd[0], path=SBIN)
        subprocess.Popen([exe, *cmd[1:]], env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                         start_new_session=True)

    def start(self, timeout_s: float = 60.0) -> None:
        self._start("munged", "-F", f"--socket={self.socket}", f"--key-file={self.dir}/munge.key",
                    f"--pid-file={self.dir}/munged.pid", f"--seed-file={self.dir}/munged.seed",
                    f"--log-file={self.dir}/munged.log", "--num-threads=2")
        self._until(lambda: self.socket.exists(), timeout_s, "munged's socket")
        self._start("slurmctld", "-D", "-f", str(self.conf))
        for node in self.nodes:
            self._start("slurmd", "-D", "-N", node, "-f", str(self.conf))
        self._until(lambda: self.slurm("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.split() == ["idle"] * 2,
                    timeout_s, "both nodes idle")

    def _until(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not there after {timeout_s:g} s; {self.dir}:\n" + self.logs())
            time.sleep(0.5)

    def slurm(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        out = subprocess.run([shutil.which(cmd[0], path=SBIN), *cmd[1:]], env=kw.pop("env", self.env),
                             capture_output=True, text=True, timeout=60, **kw)
        if check and out.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {out.stdout}{out.stderr}")
        return out

    def job(self, job_id: str) -> dict[str, str]:
        """The job's fields (JobState, Restarts, ...) as `scontrol show job` gives them (a
        heterogeneous job: its first component's)."""
        out = self.slurm("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0]))

    def job_processes(self) -> list[str]:
        """The command lines of this cluster's processes other than its daemons."""
        out = []
        for pid in _marked_pids(self.mark):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if cmd.split(" ")[0].rsplit("/", 1)[-1] not in ("munged", "slurmctld", "slurmd", "slurmctld:"):
                out.append(cmd)
        return out

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.dir.glob("*.log")))

    def stop(self) -> None:
        """End exactly this cluster's processes and its jobs' (found by the mark), then its dir."""
        self.slurm("scancel", "--full", "--user=root", check=False)
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            for pid in _marked_pids(self.mark):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while _marked_pids(self.mark) and time.monotonic() < deadline:
                time.sleep(0.5)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


ENDED = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _wait_for(what: str, ready, timeout_s: float, slurm: LocalSlurm, job_id: str, log: Path, ended=(*ENDED, "COMPLETED")):
    """Poll `ready()` until it returns something true; fail naming `what` (with the job's log and
    the daemons' logs) when the job reaches a state of `ended` first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ready()
        if got:
            return got
        if slurm.job(job_id).get("JobState") in ended:
            break
        time.sleep(1)
    text = log.read_text(errors="replace")[-6000:] if log.exists() else "(no job log)"
    pytest.fail(f"{what}: not reached (job {slurm.job(job_id).get('JobState')})\n{text}\n{slurm.logs()}")


@pytest.mark.slow
def test_sbatch_trains_the_tiny_config_and_a_requeued_job_goes_on_from_its_checkpoint(tmp_path, tiny_dir):
    reason = _why_not_here()
    if reason:
        pytest.skip(reason)
    slurm = LocalSlurm(gpus=GPUS)
    ray_tmp = tempfile.mkdtemp(prefix="rrs", dir="/tmp")  # Ray's socket paths must stay short
    try:
        slurm.start()
        runs, secret = tmp_path / "runs", f"sk-{secrets.token_hex(8)}"
        env = {k: v for k, v in slurm.env.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
        env.update(ROSE_RAY_RUNS=str(runs), ROSE_RAY_TOKEN_DIR=str(tmp_path / "tokens"), RAY_TMPDIR=ray_tmp,
                   RAY_PORT=str(_free_port()), RAY_DASHBOARD_PORT=str(_free_port()),
                   RAY_CLIENT_PORT=str(_free_port()), PYTHON=sys.executable, PYTHONUNBUFFERED="1",
                   ROSE_RAY_API_KEY=secret)  # reaches the job's driver through the allocation's environment
        overrides = [f"steps={STEPS}", "checkpoint_every=1", "teacher_warmup.enabled=false", f"tiny_dir={tiny_dir}",
                     f"rollout.batch_episodes={BATCH}", "rollout.max_turns=4", "env.games_per_worker=2",
                     "rollout.student_sampling.max_new_tokens=16", "rollout.teacher_sampling.max_new_tokens=16",
                     "eval.before=false", "eval.teacher=false", "eval.after=false"]
        # A heterogeneous job as docs/cluster.md gives it: a GPU node, then a CPU-only env node.
        job_id = slurm.slurm("sbatch", "--parsable", f"--gpus-per-node={GPUS}", f"--cpus-per-task={slurm.cpus}",
                             f"--output={tmp_path}/slurm-%j.out", ":", "--nodes=1", f"--cpus-per-task={slurm.cpus}",
                             "launch/slurm.sbatch", "configs/tiny.yaml", *overrides,
                             cwd=ROOT, env=env).stdout.strip().split(";")[0]
        log = tmp_path / f"slurm-{job_id}.out"
        run_dir = runs / "tiny" / f"slurm_{job_id}"
        first = run_dir / "checkpoints" / "trainer_step_1.json"
        _wait_for("the first checkpoint", first.exists, 600, slurm, job_id, log)
        step_1 = next(line for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                      if json.loads(line)["step"] == 1)

        slurm.slurm("scontrol", "requeue", job_id)

        def running_again() -> bool:  # a requeued job waits ~2 minutes to start again: let it start now
            job = slurm.job(job_id)
            if job.get("Restarts") == "1" and job["JobState"] == "PENDING":
                slurm.slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
            return job.get("Restarts") == "1" and job["JobState"] == "RUNNING"

        _wait_for("the requeued job running", running_again, 300, slurm, job_id, log)
        _wait_for("the job's end", lambda: slurm.job(job_id)["JobState"] == "COMPLETED", 900, slurm, job_id, log)
        # Ending the batch script ended every process of the allocation (Ray's, the JVMs): the
        # daemons alone are left.
        _wait_for("every process of the job gone", lambda: slurm.job_processes() == [], 60, slurm, job_id, log, ended=())

        out = log.read_text()
        assert out.count(f"train: new run in {run_dir}") == 1, out[-4000:]  # the log keeps both attempts
        assert f"slurm.sbatch: job {job_id} requeued (restart 1): going on with {run_dir}" in out
        # Ray got what SLURM booked on each node: the GPU node's GPUs, the env node's CPUs alone.
        assert out.count(f"cluster: 2 node(s), {2 * slurm.cpus} CPU, {GPUS} GPU") == 2, out[-4000:]
        assert out.count("slurm.sbatch: head rr1 (") == 2 and "1 GPU node(s), 1 env node(s)" in out
        second = out[out.index("requeued (restart 1)"):]
        resumed = int(re.search(rf"train: {re.escape(str(run_dir))} at step (\d+)", second).group(1))
        assert 1 <= resumed < STEPS, second[-4000:]  # from its checkpoint, not step 0, not done
        # Every step trained once; the step before the requeue was kept as it was, not trained again.
        check_exactly_once(run_dir, STEPS)
        assert step_1 in (run_dir / "metrics.jsonl").read_text().splitlines()
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == STEPS and (run_dir / "model" / "model.safetensors").is_file()
        # No file of the run or log holds the secret the driver's environment had.
        assert [p for p in [log, *run_dir.rglob("*")] if p.is_file() and secret.encode() in p.read_bytes()] == []
        assert list((tmp_path / "tokens").iterdir()) == [], "the allocation's token outlives it"
    finally:
        slurm.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert _marked_pids(slurm.mark) == [], "processes of the test's SLURM cluster are still running"
