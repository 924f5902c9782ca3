"""The slow half of tests/unit/test_reliability.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from rose_ray.checkpoint import read_checkpoint
from rose_ray.cli import main
from rose_ray.config import load_config
from rose_ray.inference.engine import EngineConfig
from rose_ray.reliability import RoleFailed, Stalled
from rose_ray.run import Run
from rose_ray.train import Trainer, train
from tests.unit.test_reliability import read_jsonl, until

BATCH = 2


def overrides(tiny_models, run_dir, steps: int, *extra: str) -> list[str]:
    """A tiny run: no evals, short episodes, checkpoints every 2 steps, quick health pings."""
    return [
        f"tiny_dir={tiny_models['student'].parent}", f"run_dir={run_dir}", f"steps={steps}",
        "teacher_warmup.enabled=false", "checkpoint_every=2", f"rollout.batch_episodes={BATCH}",
        "rollout.max_turns=4", "algorithm.handoff.k=2", "rollout.student_sampling.max_new_tokens=16",
        "rollout.teacher_sampling.max_new_tokens=16", "env.games_per_worker=2",
        "eval.before=false", "eval.after=false", "eval.teacher=false",
        "reliability.health_every_s=1", "reliability.health_timeout_s=12", "reliability.start_timeout_s=120",
        *extra,
    ]


def check_exactly_once(run_dir: Path, steps: int) -> list[dict]:
    """Every drawn game one outcome; steps 1..steps trained BATCH episodes each, none twice."""
    records = read_jsonl(run_dir / "episodes.jsonl")
    ns = Counter(r["n"] for r in records)
    assert sorted(ns) == list(range(len(ns))), "a drawn game has no outcome"
    assert set(ns.values()) == {1}, f"games with two outcomes: {[n for n, c in ns.items() if c > 1]}"
    trained = [r for r in records if r["outcome"] == "trained"]
    assert Counter(r["step"] for r in trained) == {s: BATCH for s in range(1, steps + 1)}
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted((r["episode_id"], r["step"]) for r in rows) == sorted((r["episode"], r["step"]) for r in trained)
    steps_logged = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert steps_logged == list(range(1, steps + 1))
    return records


def actor_pid(handle) -> int:
    import ray

    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def drive(run: Run, chaos) -> tuple[dict | None, BaseException | None]:
    """Run the loop over the started `run` beside `chaos(trainer)`; (summary, None) or (None, the error)."""
    trainer = Trainer(run)

    async def main():
        loop = asyncio.create_task(trainer.train())
        while trainer.stop is None:
            await asyncio.sleep(0.01)
        side = asyncio.create_task(chaos(trainer))
        try:
            return await loop
        finally:
            if not side.done():
                side.cancel()
            elif side.exception() is not None:
                raise side.exception()

    try:
        return asyncio.run(main()), None
    except RoleFailed as e:
        return None, e


# --------------------------------------------------------------------------- whole runs
@pytest.mark.slow
def test_a_run_survives_a_killed_student_a_hung_teacher_and_a_killed_learner_rank(
        tiny_models, ray_cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    steps = 6
    cfg = load_config(None, overrides(tiny_models, run_dir, steps, "learner.ranks=2", "learner.cpus_per_rank=0.25"))
    run_dir.mkdir()
    run = Run(cfg, run_dir, resume=False)
    seen: dict = {}

    async def chaos(t: Trainer) -> None:
        await until("step 1", lambda: t.step >= 1)
        seen["student"] = t.rollouts.student.engine
        os.kill((await t.rollouts.student.engine.health.remote())["pid"], signal.SIGKILL)
        await until("the student's replacement", lambda: t.rollouts.engines.restarts()["student engine"] == 1
                    and t.rollouts.student.engine is not seen["student"] and t.step >= 2)
        # Hung, not dead: only the health ping (no answer within health_timeout_s) can tell.
        hung = (await t.rollouts.teacher.engine.health.remote())["pid"]
        seen["teacher"] = t.rollouts.teacher.engine
        os.kill(hung, signal.SIGSTOP)
        try:
            await until("the teacher's replacement", lambda: t.rollouts.teacher.engine is not seen["teacher"])
        finally:
            try:
                os.kill(hung, signal.SIGCONT)  # a no-op once the replacement's kill has landed
            except ProcessLookupError:
                pass
        await until("an odd step", lambda: t.step % 2 == 1 and t.step >= 3)  # past the last checkpoint
        seen["step_killed"] = t.step
        os.kill(await asyncio.to_thread(actor_pid, t.learning.learner.workers[1]), signal.SIGKILL)

    try:
        run.start()
        summary, error = drive(run, chaos)
        version = asyncio.run(_health(run.rollouts.student.engine))["version"]
    finally:
        run.close()
    out = capsys.readouterr().out
    assert error is None, error
    assert summary["steps"] == steps and summary["version"] == steps
    assert version == steps  # the replacement student got every later publication
    assert summary["restarts"] == {"student engine": 1, "teacher engine": 1, "learner": 1}
    assert "teacher engine lost (TimeoutError: no answer to a health ping" in out
    assert "learner rank 1 lost" in out and "restarting the learner group from the latest checkpoint" in out
    assert summary["accounting_holds"]
    check_exactly_once(run_dir, steps)

    # Resumed, and the student engine lost once more: summary.json counts over the whole run.
    steps_after = steps + 4  # steps enough that the run cannot end on buffered episodes alone
    cfg = load_config(None, overrides(tiny_models, run_dir, steps_after, "learner.ranks=2", "learner.cpus_per_rank=0.25"))
    resumed = Run(cfg, run_dir, resume=True)

    async def kill_student(t: Trainer) -> None:
        await until("a step after the resume", lambda: t.step > steps)
        engine = t.rollouts.student.engine
        os.kill((await engine.health.remote())["pid"], signal.SIGKILL)
        await until("the student's replacement", lambda: t.rollouts.engines.restarts()["student engine"] == 1
                    and t.rollouts.student.engine is not engine)

    try:
        resumed.start()
        summary, error = drive(resumed, kill_student)
    finally:
        resumed.close()
    assert error is None, error
    assert summary["steps"] == steps_after
    assert summary["restarts"] == {"student engine": 2, "teacher engine": 1, "learner": 1}
    logged = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert logged[-1]["reliability/engine_restarts"] == 3 and logged[-1]["reliability/learner_restarts"] == 1
    check_exactly_once(run_dir, steps_after)


async def _health(engine) -> dict:
    return await engine.health.remote()


def hold_vllm_blocks(engine_actor_impl) -> None:
    """(Run inside a vllm engine actor, its engine idle.) A request added to vLLM's own engine
    and scheduled once, which none of ours tracks: its KV blocks stay held, so vLLM refuses the
    next prefix-cache reset (a state no caller of ours can reach on purpose)."""
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt

    core = engine_actor_impl.engine._llm.llm_engine
    core.add_request("held", TokensPrompt(prompt_token_ids=list(range(5, 300))), VllmSampling(max_tokens=64))
    core.step()


PUBLISH_TIMEOUT_S = 4


@pytest.mark.slow
def test_a_vllm_student_engine_that_stalls_dies_or_keeps_stale_kv_still_gets_every_version(
        hub_endpoint, tiny_models, ray_cluster, tmp_path, capsys, stop_process):
    """Both engines on vLLM, sync, ROSE with its OPD term, the weights published by the
    collective (gloo here; NCCL on GPUs). The student engine, in turn:
    - is frozen (SIGSTOP) when the first publication starts, and thawed only after
      publish.timeout_s and then some: it never joins the weight group in time, as a peer whose
      NCCL init hangs would not. The publication gives the collective up within the timeout,
      sends that version through the object store (once the engine is back), and every later one
      too; `publish/fallbacks` counts it and the run says so once;
    - is killed after a later publication: its replacement gets the learner's weights first;
    - (the replacement) refuses a publication's prefix-cache reset, as vLLM does while blocks are
      held: the engine stops rather than serve the old weights' keys and values, and is replaced.
    Every step's importance ratio (learner vs engine logprobs of the same ids) stays 1: the engine
    always served the learner's latest weights. The models are hub ids (`org/tiny-student`, as
    the seed configs name `Qwen/Qwen3-1.7B`), downloaded by the run's driver from a local hub
    (conftest.hub_endpoint: the real huggingface_hub client, an empty HF_HOME) once, whatever the
    actors and the replacement engines read after (a second run's download step sending no file:
    tests/unit/test_hub_ids.py): a hub-id student on vLLM trains and takes the learner's weights (vLLM's weight-name check reads the snapshot's safetensors), and the run
    trains on exactly the ids vLLM sampled. The only run on vLLM engines with an OPD term:
    tests/e2e/test_runs_on_qwen3_like_models.py runs opd itself on hf engines."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    import ray

    run_dir = tmp_path / "run"
    steps = 4
    cfg = load_config(None, overrides(tiny_models, run_dir, steps, "mode=sync", "algorithm.lam=0.5",
                                      "student_engine.backend=vllm", "teacher_engine.backend=vllm",
                                      "student_engine.backend.kv_cache_mb=64", "teacher_engine.backend.kv_cache_mb=64",
                                      "student_engine.model=org/tiny-student", "teacher_engine.model=org/tiny-teacher",
                                      "publish.method=collective", "publish.collective_backend=gloo",
                                      f"publish.timeout_s={PUBLISH_TIMEOUT_S}",
                                      # Nothing here hangs for the health ping to find (the test above
                                      # does that): the frozen engine must not be taken for hung once
                                      # thawed on a loaded machine (a CI run counted a third restart).
                                      f"reliability.health_timeout_s={PUBLISH_TIMEOUT_S + 60}"))
    run_dir.mkdir()
    run = Run(cfg, run_dir, resume=False)
    killed_at: list[int] = []
    faults: dict[str, object] = {}

    async def faults_on_the_way(t: Trainer) -> None:
        publish_now = t.learning.publish_now

        def publish_now_with_faults(engine) -> None:  # (in the publisher's thread, before the learner sends)
            if "stopped" not in faults:  # the first publication: a member that does not join
                pid = ray.get(engine.health.remote())["pid"]
                stop_process(pid)
                faults["stopped"] = threading.Timer(PUBLISH_TIMEOUT_S + 4, os.kill, (pid, signal.SIGCONT))
                faults["stopped"].start()
            elif t.learning.learner.version == 3 and "held" not in faults:  # sync: the engine is idle now
                faults["held"] = engine
                ray.get(engine.__ray_call__.remote(hold_vllm_blocks))
            publish_now(engine)

        t.learning.publish_now = publish_now_with_faults  # (the supervisor's replacements call it too)
        await until("step 2", lambda: t.step >= 2)
        engine = t.rollouts.student.engine
        killed_at.append(t.step)
        os.kill((await engine.health.remote())["pid"], signal.SIGKILL)
        await until("the student's replacement", lambda: t.rollouts.engines.restarts()["student engine"] == 1
                    and t.rollouts.student.engine is not engine)
        await until("the replacement's replacement", lambda: t.rollouts.engines.restarts()["student engine"] == 2)

    try:
        run.start()
        summary, error = drive(run, faults_on_the_way)
        version = asyncio.run(_health(run.rollouts.student.engine))["version"]
    finally:
        if "stopped" in faults:
            faults["stopped"].join()
        run.close()
    out = capsys.readouterr().out
    assert error is None, error
    assert summary["steps"] == steps and version == steps
    lost = [line for line in out.splitlines() if "engine lost" in line]
    assert summary["restarts"]["student engine"] == 2, lost
    fallback = [line for line in out.splitlines() if "every later one go through the object store" in line]
    assert len(fallback) == 1, out  # said once
    assert (f"the collective over gloo gave up: forming the weight group (gloo: learner rank 0 and 1 engine(s)): "
            f"not done within {PUBLISH_TIMEOUT_S} s (publish.timeout_s); version 1") in fallback[0]
    assert "student engine lost (RuntimeError: engine failed: PrefixCacheNotReset" in out
    assert hub_endpoint.file_downloads() == {(f"org/tiny-{role}", f.name): 1 for role in ("student", "teacher")
                                             for f in tiny_models[role].iterdir()}
    logged = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert len(logged) == steps and killed_at[0] < steps
    assert [m["publish/fallbacks"] for m in logged] == [1.0] * steps
    for m in logged:  # before each loss and after it: the engine served the learner's weights
        assert m["learner/opd_ratio"] == pytest.approx(1.0, abs=1e-3), m
        assert m["learner/opd_clip_frac"] == 0.0
        assert m["learner/loss_opd"] != 0.0  # the vLLM teacher scored the student's turns
    assert [m["weights/version"] for m in logged] == [float(s) for s in range(1, steps + 1)]
    rows = read_jsonl(run_dir / "trajectories.jsonl")
    for step in range(1, steps + 1):  # sync: each step's episodes sampled after the last publication
        assert {r["student_version"] for r in rows if r["step"] == step} == {step - 1}
    owners = {m["owner"] for r in rows for m in r["conversations"] if m["role"] == "assistant" and m["owner"] != "prompt"}
    assert owners == {"student", "teacher"}
    check_exactly_once(run_dir, steps)


@pytest.mark.slow
def test_the_watchdog_names_a_hung_env_pool_then_checkpoints_and_stops(tiny_models, ray_cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = load_config(None, overrides(tiny_models, run_dir, 100, "reliability.watchdog_s=6"))
    run_dir.mkdir()
    run = Run(cfg, run_dir, resume=False)
    pids: list[int] = []

    async def chaos(t: Trainer) -> None:
        await until("step 1", lambda: t.step >= 1)
        pids.append(await asyncio.to_thread(actor_pid, t.rollouts.pools[0]))
        os.kill(pids[0], signal.SIGSTOP)  # every env call now waits forever

    try:
        run.start()
        summary, error = drive(run, chaos)
        step = run.learning.step
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)  # so that closing it is quick
        run.close()
    out = capsys.readouterr().out
    assert summary is None and isinstance(error, Stalled)
    message = str(error)
    assert "no learner step and no finished episode for" in message and "watchdog_s 6" in message
    assert "env pool 0: no answer to a ping within 5 s" in message
    assert "waiting on env pool 0" in message
    assert "driver: waiting for a batch" in message
    assert "train: watchdog: no learner step" in out  # the first period's report
    assert f"the stop wrote checkpoint step_{step}" in message
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{step}"
    records = read_jsonl(run_dir / "episodes.jsonl")
    assert Counter(r["outcome"] for r in records)["in_flight"] >= 1  # what the stall held up


@pytest.mark.slow
def test_a_teacher_server_that_goes_away_stops_the_run_naming_the_role(tiny_models, ray_cluster, tmp_path, capsys):
    """The server answers the run's check at its start (model, context, logprobs), then is gone
    for good: the teacher engine is replaced until the role has failed."""
    from rose_ray.cli import main
    from rose_ray.inference.hf import HFEngine
    from rose_ray.inference.server import OpenAIServer

    teacher = str(tiny_models["teacher"])  # tiny:teacher, served under its folder's name
    engine = HFEngine(EngineConfig(model=teacher, dtype="float32", threads=1, context_tokens=2048))
    server = OpenAIServer(engine, teacher).start_background()
    run_dir = tmp_path / "run"

    def go_away() -> None:  # once the run's actors start, its check of the server is behind it
        while not (run_dir / "episodes.jsonl").exists():
            time.sleep(0.05)
        server.stop()

    threading.Thread(target=go_away, daemon=True).start()
    code = main(["train", *overrides(tiny_models, run_dir, 3, "teacher_engine.backend=openai",
                                     f"teacher_engine.backend.base_url={server.url}",
                                     "teacher_engine.backend.retry_s=1", "reliability.max_restarts=1")])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "rose-ray train: error: teacher engine: lost 2 times, more than reliability.max_restarts=1" in err
    assert f"{server.url}: no answer after" in err
    assert "the stop wrote checkpoint step_0" in err
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_0"
    records = read_jsonl(run_dir / "episodes.jsonl")
    assert records and {r["outcome"] for r in records} == {"in_flight"}  # none lost: all to play again


@pytest.mark.slow
def test_a_run_killed_mid_save_resumes_and_exports_from_the_newest_whole_step(
        tiny_models, ray_cluster, tmp_path, monkeypatch, capsys):
    """The whole job (driver, Ray, JVMs) SIGKILLed in the middle of step 4's save, its learner
    rank stopped at a crash point (rose_ray/files.py) with DeepSpeed's files of step 4 not yet
    written, under keep_checkpoints 1. `export` and `--resume` go on from step 2, the newest
    whole step; the resume clears the killed save's temp folder, plays every game once and logs
    every step once; it ends at a step it has just checkpointed, and the stop does not write that
    step again (before, it rewrote the newest checkpoint in place: a kill then left none)."""
    import psutil

    from rose_ray.checkpoint import kept_steps
    from rose_ray.export import MODEL_INFO
    from rose_ray.files import CRASH_ENV, TEMP_TAG
    from rose_ray.learner.learner import LearnerGroup

    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1", **{CRASH_ENV: "checkpoint-write#2"})
    log = tmp_path / "killed_run.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rose_ray.cli", "train", "ray_address=local",
                                 *overrides(tiny_models, run_dir, 100, "keep_checkpoints=1")],
                                env=env, stdout=out, stderr=subprocess.STDOUT)

    def family() -> list[psutil.Process]:
        try:
            return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def is_stopped(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_STOPPED
        except psutil.NoSuchProcess:
            return False

    try:
        deadline, stopped = time.time() + 400, False
        while time.time() < deadline and proc.poll() is None and not stopped:
            stopped = any(is_stopped(p) for p in family())
            time.sleep(0.2)
        assert stopped, f"no process stopped at its crash point:\n{log.read_text()[-3000:]}"
        # The whole job dies at once, as on a lost node: the driver, its Ray and its JVMs.
        for p in family():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = read_checkpoint(run_dir)  # the one --resume goes on from
    assert saved.step == 2 and kept_steps(run_dir) == [2]
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if TEMP_TAG in p.name]  # the killed save's
    before = read_jsonl(run_dir / "episodes.jsonl", partial_ok=True)
    assert max(r.get("step", 0) for r in before) > saved.step  # work after the checkpoint was lost
    open_then = {d["n"] for d in saved.rollouts.ledger["open"]}
    assert open_then  # in flight or buffered at the checkpoint
    assert main(["export", str(run_dir), "--out", str(tmp_path / "exported")]) == 0
    assert json.loads((tmp_path / "exported" / MODEL_INFO).read_text())["step"] == 2

    saves: list[int] = []
    real_save = LearnerGroup.save_checkpoint

    def counted(self, *args, **kwargs):
        saves.append(self.step)
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(LearnerGroup, "save_checkpoint", counted)
    steps = saved.step + 4
    summary = train(None, [f"steps={steps}"], resume=str(run_dir))
    assert saves == [4, 6]  # the stop at step 6 wrote only its record again
    assert kept_steps(run_dir) == [6] and not [p for p in run_dir.rglob(f"*{TEMP_TAG}*")]
    assert json.loads((run_dir / "model" / MODEL_INFO).read_text())["step"] == 6
    assert summary["steps"] == steps
    records = check_exactly_once(run_dir, steps)
    outcome = {r["n"]: r["outcome"] for r in records}
    assert all(outcome[n] != "in_flight" for n in open_then), "an episode open at the checkpoint was skipped"
    # Counters go on from the checkpoint: every trained episode of both runs counted once.
    assert summary["buffer"]["trained"] == BATCH * steps
    assert summary["episodes"]["trained"] == BATCH * steps
    assert summary["accounting_holds"]
