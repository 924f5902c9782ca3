"""Every role's loss, on a real local Ray cluster: engines killed (SIGKILL) or hung (SIGSTOP) are
replaced and their episodes replayed; a killed learner rank sends the group back to the latest
checkpoint; a hung env pool trips the watchdog (report, checkpoint, exit); a teacher server that
goes away for good stops the run naming the role; and a run killed between checkpoints, then resumed,
gives every sampled game exactly one outcome. Nothing here is faked: processes are stopped or
killed with signals, an absent server is a closed port."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from rose_ray.config import load_config
from rose_ray.inference.engine import EngineConfig
from rose_ray.inference.openai import OpenAIEngine, OpenAIServerError, OpenAIServerGone
from rose_ray.reliability import RoleFailed, Stalled, Watchdog
from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
from rose_ray.run import RunParts
from rose_ray.train import Trainer, train
from rose_ray.types import GameId

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


def read_jsonl(path: Path, partial_ok: bool = False) -> list[dict]:
    """Records of a JSONL file; with partial_ok, a last line still being written is left out."""
    lines = path.read_text().split("\n")
    if partial_ok:
        lines = lines[:-1]  # after the last newline: nothing, or a line not finished yet
    return [json.loads(line) for line in lines if line.strip()]


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


async def until(what: str, cond, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def actor_pid(handle) -> int:
    import ray

    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def drive(parts: RunParts, chaos) -> tuple[dict | None, BaseException | None]:
    """Run the loop over the started `parts` beside `chaos(trainer)`; (summary, None) or (None, the error)."""
    trainer = Trainer(parts)

    async def main():
        run = asyncio.create_task(trainer.run())
        while trainer.stop is None:
            await asyncio.sleep(0.01)
        side = asyncio.create_task(chaos(trainer))
        try:
            return await run
        finally:
            if not side.done():
                side.cancel()
            elif side.exception() is not None:
                raise side.exception()

    try:
        return asyncio.run(main()), None
    except RoleFailed as e:
        return None, e


# --------------------------------------------------------------------------- no cluster
def test_the_failure_channel_hands_each_failure_to_the_loop_once_in_order():
    """What the parts report reaches the loop as exceptions, oldest first, each once; the loop's
    wait (`reported`) is set while any is left."""
    from rose_ray.learner.learner import LearnerLost
    from rose_ray.run import Failures

    async def main():
        failures = Failures()
        waiting = asyncio.create_task(failures.reported.wait())
        await asyncio.sleep(0)
        assert not waiting.done() and failures.take() is None
        lost, failed = LearnerLost("learner rank 1 lost"), RoleFailed("teacher engine: lost 2 times")
        failures.report(lost)
        failures.report(failed)
        await asyncio.wait_for(waiting, 1)
        assert failures.take() is lost and failures.reported.is_set()
        assert failures.take() is failed and not failures.reported.is_set()
        assert failures.take() is None

    asyncio.run(main())


def test_the_ledger_gives_every_draw_one_outcome_across_going_back():
    games = [GameId("t", i, f"sciworld_{i}") for i in range(5)]

    def ledger(path, fresh=True):
        return EpisodeLedger(path, GameSampler(games, seed=3), fresh=fresh)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episodes.jsonl"
        a = ledger(path)
        d = [a.draw() for _ in range(4)]
        a.record(d[0].episode_id, "trained", step=1)
        a.record(d[1].episode_id, "dropped_stale")
        state = a.state()  # d[2], d[3] open at the checkpoint
        more = [a.draw() for _ in range(3)]  # crosses an epoch: 7 draws of 5 games
        a.record(d[2].episode_id, "trained", step=2)
        a.record(more[0].episode_id, "failed")
        a.close()
        # Going back: the file is cut, the open episodes come first, then the same draws again.
        b = ledger(path, fresh=False)
        b.load_state(state)
        again = [b.draw() for _ in range(5)]
        assert [x.n for x in again] == [2, 3, 4, 5, 6]
        assert [x.game for x in again] == [d[2].game, d[3].game] + [m.game for m in more]
        assert (again[0].epoch, again[0].position) == (d[2].epoch, d[2].position)  # the same decay seed
        b.record(again[0].episode_id, "trained", step=2)
        b.stop()  # the rest was in flight
        b.close()
        records = read_jsonl(path)
        assert [(r["n"], r["outcome"]) for r in records] == [
            (0, "trained"), (1, "dropped_stale"), (2, "trained"), (3, "in_flight"), (4, "in_flight"),
            (5, "in_flight"), (6, "in_flight")]


def test_the_buffer_reports_stale_drops_and_checkpoints_counters_without_open_episodes():
    from rose_ray.rollout.buffer import TrajectoryBuffer
    from rose_ray.types import Trajectory

    def traj(i: int) -> Trajectory:
        return Trajectory(GameId("boil", i, f"sciworld_{i}"), [], student_version=0, episode_id=f"e{i}")

    dropped: list = []

    async def main() -> TrajectoryBuffer:
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1, on_drop=dropped.append)  # room for 4
        for _ in range(3):
            await buf.admit()
        assert await buf.add(traj(0), learner_version=0)  # fresh: buffered
        assert not await buf.add(traj(1), learner_version=2)  # two versions behind: stale
        return buf  # e0 buffered, one episode still in flight

    buf = asyncio.run(main())
    assert [t.episode_id for t in dropped] == ["e1"]
    saved = buf.resumable_counters()
    assert (saved.admitted, saved.accepted, saved.dropped_stale) == (1, 0, 1)
    assert TrajectoryBuffer(2, 1, counters=saved).accounting_holds()  # a resume starts balanced


def test_the_openai_client_waits_for_a_server_that_comes_back_and_names_one_that_does_not():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here until the server below starts

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    url = f"http://127.0.0.1:{port}/v1"
    gone = OpenAIEngine(EngineConfig(backend="openai", base_url=url, retry_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(OpenAIServerGone, match=f"127.0.0.1:{port}.*no answer after 2 attempts.*retry_s 1"):
        gone.models()
    assert 0.4 < time.monotonic() - t0 < 5  # one backoff of 0.5 s, then it gave up

    servers = []

    def come_back() -> None:  # the server comes back after 1.2 s
        time.sleep(1.2)
        servers.append(http.server.HTTPServer(("127.0.0.1", port), Models))
        servers[0].serve_forever()

    starter = threading.Thread(target=come_back, daemon=True)
    starter.start()
    try:
        patient = OpenAIEngine(EngineConfig(backend="openai", base_url=url, retry_s=30.0))
        assert patient.models() == ["m"]
        assert patient.stats()["retries"] >= 2  # refused at 0 s and 0.5 s, answered at 1.5 s
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        starter.join(timeout=10)


def test_the_watchdog_waits_while_a_role_is_replaced_then_stops_a_stall():
    async def main() -> list[str]:
        busy, reports = [True], []

        async def report() -> str:
            reports.append("asked")
            return "driver: waiting for a batch"

        dog = Watchdog(0.4, report, busy=lambda: busy[0])
        task = asyncio.create_task(dog.run())
        await asyncio.sleep(1.5)  # almost 4 periods, all of them replacing a role: no warning
        assert not task.done() and not reports
        busy[0] = False
        with pytest.raises(Stalled, match=r"(?s)2 x reliability.watchdog_s 0.4.*driver: waiting for a batch"):
            await asyncio.wait_for(task, 5)
        return reports

    assert len(asyncio.run(main())) == 2  # the warning after one period, the stop after two


def test_the_openai_client_waits_out_a_rate_limit():
    """A 429 (OpenAI's API under load) is retried after its Retry-After; other 4xx are not."""
    answers = [429, 429, 200]

    class Limited(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            code = answers.pop(0) if answers else 400
            body = json.dumps({"data": [{"id": "m"}]} if code == 200 else {"error": {"message": f"code {code}"}})
            self.send_response(code)
            if code == 429:
                self.send_header("Retry-After", "0.3")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Limited)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        engine = OpenAIEngine(EngineConfig(backend="openai", base_url=f"http://127.0.0.1:{server.server_port}/v1",
                                           retry_s=30.0))
        t0 = time.monotonic()
        assert engine.models() == ["m"]
        assert engine.stats()["retries"] == 2 and time.monotonic() - t0 >= 0.6  # waited as asked, twice
        with pytest.raises(OpenAIServerError, match="400: code 400"):  # a client error: at once
            engine.models()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --------------------------------------------------------------------------- engines alone
def test_the_supervisor_replaces_a_killed_engine_then_gives_up_past_max_restarts(tiny_models, ray_cluster):
    from rose_ray.inference.engine import GenerationRequest
    from rose_ray.rollout.actors import start_agents, stop_agents
    from rose_ray.rollout.supervisor import EngineSupervisor
    from rose_ray.types import SamplingParams

    config = EngineConfig(model=str(tiny_models["student"]), dtype="float32", threads=1, context_tokens=512)
    agent, _ = start_agents(config, None, student_cpus=0.25)
    started, failed = [], []

    async def on_start(role, handle):
        started.append((role, handle))

    sup = EngineSupervisor(max_restarts=1, health_every_s=0.5, health_timeout_s=10, start_timeout_s=120,
                           on_start=on_start, on_failed=failed.append)
    sup.watch("student engine", agent)
    prompt = agent.chat.opening_ids([("user", "hello"), ("assistant", "OK")]) + agent.chat.user_ids("a door")
    request = GenerationRequest(prompt, SamplingParams(0.0, 1.0, 4))

    async def main():
        monitor = asyncio.create_task(sup.monitor())
        first = agent.engine
        pid = (await first.health.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        await until("a replacement", lambda: agent.engine is not first, 120)
        assert started == [("student engine", agent.engine)]  # on_start ran before it served
        assert (await agent.engine.generate.remote(request)).token_ids
        assert sup.role_of(await_error(first)) == "student engine"  # the old actor's errors are known
        second = agent.engine
        os.kill((await second.health.remote())["pid"], signal.SIGKILL)
        await until("giving up", lambda: sup.failed is not None, 120)
        monitor.cancel()
        with pytest.raises(RoleFailed, match="student engine: lost 2 times, more than reliability.max_restarts=1"):
            await sup.recover("student engine", handle=second)

    def await_error(handle):
        import ray

        try:
            ray.get(handle.health.remote(), timeout=30)
        except ray.exceptions.RayActorError as e:
            return e
        raise AssertionError("a killed engine answered")

    try:
        asyncio.run(main())
    finally:
        stop_agents(agent)
    assert failed == [sup.failed]


# --------------------------------------------------------------------------- whole runs
@pytest.mark.slow
def test_a_run_survives_a_killed_student_a_hung_teacher_and_a_killed_learner_rank(
        tiny_models, ray_cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    steps = 6
    cfg = load_config(None, overrides(tiny_models, run_dir, steps, "learner.ranks=2", "learner.cpus_per_rank=0.25"))
    run_dir.mkdir()
    parts = RunParts(cfg, run_dir, resume=False)
    seen: dict = {}

    async def chaos(t: Trainer) -> None:
        await until("step 1", lambda: t.step >= 1)
        seen["student"] = t.parts.student.engine
        os.kill((await t.parts.student.engine.health.remote())["pid"], signal.SIGKILL)
        await until("the student's replacement", lambda: t.engines.restarts()["student engine"] == 1
                    and t.parts.student.engine is not seen["student"] and t.step >= 2)
        # Hung, not dead: only the health ping (no answer within health_timeout_s) can tell.
        hung = (await t.parts.teacher.engine.health.remote())["pid"]
        seen["teacher"] = t.parts.teacher.engine
        os.kill(hung, signal.SIGSTOP)
        try:
            await until("the teacher's replacement", lambda: t.parts.teacher.engine is not seen["teacher"])
        finally:
            try:
                os.kill(hung, signal.SIGCONT)  # a no-op once the replacement's kill has landed
            except ProcessLookupError:
                pass
        await until("an odd step", lambda: t.step % 2 == 1 and t.step >= 3)  # past the last checkpoint
        seen["step_killed"] = t.step
        os.kill(await asyncio.to_thread(actor_pid, t.learner.workers[1]), signal.SIGKILL)

    try:
        parts.start()
        summary, error = drive(parts, chaos)
        version = asyncio.run(_health(parts.student.engine))["version"]
    finally:
        parts.close()
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
    resumed = RunParts(cfg, run_dir, resume=True)

    async def kill_student(t: Trainer) -> None:
        await until("a step after the resume", lambda: t.step > steps)
        engine = t.parts.student.engine
        os.kill((await engine.health.remote())["pid"], signal.SIGKILL)
        await until("the student's replacement", lambda: t.engines.restarts()["student engine"] == 1
                    and t.parts.student.engine is not engine)

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


@pytest.mark.slow
def test_a_killed_vllm_student_engine_is_replaced_and_serves_the_latest_weights(tiny_models, ray_cluster, tmp_path):
    """Both engines on vLLM, sync, ROSE with its OPD term: the student engine is killed after a
    publication; its replacement gets the learner's weights before it serves, so every later
    step's importance ratio (learner vs engine logprobs of the same ids) is still 1."""
    pytest.importorskip("vllm", reason="the vllm backend needs vLLM (launch/setup.sh installs it)")
    run_dir = tmp_path / "run"
    steps = 4
    cfg = load_config(None, overrides(tiny_models, run_dir, steps, "mode=sync", "algorithm.lam=0.5",
                                      "student_engine.backend=vllm", "teacher_engine.backend=vllm",
                                      "student_engine.kv_cache_mb=64", "teacher_engine.kv_cache_mb=64"))
    run_dir.mkdir()
    parts = RunParts(cfg, run_dir, resume=False)
    killed_at: list[int] = []

    async def kill_student(t: Trainer) -> None:
        await until("step 2", lambda: t.step >= 2)
        engine = t.parts.student.engine
        killed_at.append(t.step)
        os.kill((await engine.health.remote())["pid"], signal.SIGKILL)
        await until("the student's replacement", lambda: t.engines.restarts()["student engine"] == 1
                    and t.parts.student.engine is not engine)

    try:
        parts.start()
        summary, error = drive(parts, kill_student)
        version = asyncio.run(_health(parts.student.engine))["version"]
    finally:
        parts.close()
    assert error is None, error
    assert summary["steps"] == steps and version == steps
    assert summary["restarts"]["student engine"] == 1
    logged = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    assert len(logged) == steps and killed_at[0] < steps
    for m in logged:  # before the loss and after it: the engine served the learner's weights
        assert m["learner/opd_ratio"] == pytest.approx(1.0, abs=1e-3), m
    check_exactly_once(run_dir, steps)


@pytest.mark.slow
def test_the_watchdog_names_a_hung_env_pool_then_checkpoints_and_stops(tiny_models, ray_cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = load_config(None, overrides(tiny_models, run_dir, 100, "reliability.watchdog_s=6"))
    run_dir.mkdir()
    parts = RunParts(cfg, run_dir, resume=False)
    pids: list[int] = []

    async def chaos(t: Trainer) -> None:
        await until("step 1", lambda: t.step >= 1)
        pids.append(await asyncio.to_thread(actor_pid, t.parts.pools[0]))
        os.kill(pids[0], signal.SIGSTOP)  # every env call now waits forever

    try:
        parts.start()
        summary, error = drive(parts, chaos)
        step = parts.progress.step
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)  # so that closing it is quick
        parts.close()
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
                                     f"teacher_engine.base_url={server.url}",
                                     "teacher_engine.retry_s=1", "reliability.max_restarts=1")])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "rose-ray train: error: teacher engine: lost 2 times, more than reliability.max_restarts=1" in err
    assert f"{server.url}: no answer after" in err
    assert "the stop wrote checkpoint step_0" in err
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_0"
    records = read_jsonl(run_dir / "episodes.jsonl")
    assert records and {r["outcome"] for r in records} == {"in_flight"}  # none lost: all to play again


@pytest.mark.slow
def test_a_run_killed_between_checkpoints_resumes_with_every_game_played_once(tiny_models, ray_cluster, tmp_path):
    import psutil

    run_dir = tmp_path / "run"
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "rose_ray.cli", "train", "ray_address=local",
                             *overrides(tiny_models, run_dir, 100)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, metrics = time.time() + 400, run_dir / "metrics.jsonl"
        while time.time() < deadline and proc.poll() is None:
            logged = [m["step"] for m in read_jsonl(metrics, True) if "learner/loss" in m] if metrics.exists() else []
            if logged and logged[-1] >= 3 and logged[-1] % 2 == 1:  # trained past the checkpoint
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
        # The whole job dies at once, as on a lost node: the driver, its Ray and its JVMs.
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    checkpoint = (run_dir / "checkpoints" / "latest").read_text().strip()
    saved = json.loads((run_dir / "checkpoints" / f"trainer_{checkpoint}.json").read_text())
    before = read_jsonl(run_dir / "episodes.jsonl", partial_ok=True)
    assert max(r.get("step", 0) for r in before) > saved["step"]  # work after the checkpoint was lost
    open_then = {d["n"] for d in saved["ledger"]["open"]}
    assert open_then  # in flight or buffered at the checkpoint

    steps = saved["step"] + 3
    summary = train(None, [f"steps={steps}"], resume=str(run_dir))
    assert summary["steps"] == steps
    records = check_exactly_once(run_dir, steps)
    outcome = {r["n"]: r["outcome"] for r in records}
    assert all(outcome[n] != "in_flight" for n in open_then), "an episode open at the checkpoint was skipped"
    # Counters go on from the checkpoint: every trained episode of both runs counted once.
    assert summary["buffer"]["trained"] == BATCH * steps
    assert summary["episodes"]["trained"] == BATCH * steps
    assert summary["accounting_holds"]
