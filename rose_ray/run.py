"""A training run's house: its actors, checkpoints, weight publication and how it outlives
the loss of any of them. `train.py` holds the loop itself; `Trainer` is a `Run`.

- Actors (`start`): placement groups, the models (tiny ones built, a tiny teacher warmed:
  recipes/warmup.py), a student and a teacher engine under an `EngineSupervisor`, EnvPools,
  the episode runner, the episode ledger, the trajectory buffer and the learner group.
- Checkpoints: the learner's DeepSpeed state and the trainer's JSON side by side under
  `<run_dir>/checkpoints`; going back to one (`--resume`, or a learner group restarted after a
  rank's loss) restores counters, history, the game order and the episodes open then, and
  cuts the logs to match. `<run_dir>/model/` is the student as a Hugging Face folder.
- Reliability (README: Reliability): a lost student or teacher engine is replaced
  (rollout/supervisor.py); a replacement student gets the latest weights before it serves; a
  role lost for good, or a stall the watchdog sees (`reliability.py`), stops the run after a
  final checkpoint, which is skipped when the learner's state is unknown.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rose_ray.config import TrainConfig
from rose_ray.learner.learner import LearnerLost
from rose_ray.recipes.warmup import resolve_models
from rose_ray.reliability import RoleFailed, Watchdog
from rose_ray.types import Trajectory


class Run:
    """The actors and state of one training run (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.stop: asyncio.Event | None = None  # made inside the event loop
        self.step = 0
        self.history: dict[str, Any] = {"eval": []}
        self.rollout_window: list[Trajectory] = []
        self.t_start = time.time()
        self.weights_ms = 0.0
        self.learn_s = 0.0  # wall seconds in learn_step: batching, the learner's step, publication
        self.replies = {"replies": 0, "truncated": 0, "cut_before_action": 0}  # trained episodes' replies
        self.session = f"{cfg.name}-{os.urandom(3).hex()}"  # names its engines (a run folder is version_N)
        self.fatal: RoleFailed | None = None  # why the run must stop (a role lost for good, a stall)
        self.failed_in_a_row = 0  # episodes failed since the last one that finished
        self.learner_restarts = 0  # in this process (reliability.max_restarts counts these)
        self.restarts_before: dict[str, int] = {}  # per role, in the processes before a --resume
        self.producer: asyncio.Task | None = None
        self.episode_tasks: set[asyncio.Task] = set()
        self.eval_task: asyncio.Task | None = None
        # A learner call cut short (its thread goes on) or a restart not finished: the learner's
        # state is unknown, so the stop writes no checkpoint and no model/ over the latest good ones.
        self.learner_unsure = False
        self.restarting_learner = False
        self.learner_lost: LearnerLost | None = None  # met while publishing to a new engine
        self.learner_lost_event = asyncio.Event()
        self.crash: BaseException | None = None
        self.doing("starting")

    # ----------------------------------------------------------------- actors
    def start(self) -> None:
        from rose_ray.envs.worlds import get_world
        from rose_ray.learner.learner import LearnerGroup
        from rose_ray.metrics import MetricsLogger
        from rose_ray.models import load_tokenizer
        from rose_ray.placement import PlacementGroups, check_cluster, demands
        from rose_ray.rollout.actors import init_ray, start_agents, start_env_pools
        from rose_ray.rollout.episode import EpisodeConfig
        from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
        from rose_ray.rollout.runner import EpisodeRunner
        from rose_ray.rollout.supervisor import EngineSupervisor

        cfg = self.cfg
        init_ray(cfg.ray_address)
        if cfg.resources.check_placement:  # fail now, naming the role, rather than wait forever
            check_cluster(cfg, use_total=True)
        self.groups = PlacementGroups(demands(cfg), timeout_s=cfg.resources.placement_timeout_s)
        student_path, teacher_path = resolve_models(cfg)  # tiny models, the teacher warm-up
        self.student_path, self.teacher_path = student_path, teacher_path
        # The games: `rose-ray eval --n N --seed S` on the same split evaluates on the same ones.
        catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
        self.sampler = GameSampler(catalogue.sample(cfg.rollout.split, None, cfg.seed, tasks=cfg.tasks), seed=cfg.seed)
        self.eval_games = catalogue.sample(cfg.eval.split, cfg.eval.n, cfg.eval.seed, tasks=cfg.tasks)

        self.student, self.teacher = start_agents(
            replace(cfg.student_engine, model=student_path),
            replace(cfg.teacher_engine, model=teacher_path),
            cfg.resources.student_cpus, cfg.resources.teacher_cpus,
            cfg.resources.student_gpus, cfg.resources.teacher_gpus,
            # Named, so the dashboard (and bench/chaos.py) can tell them apart.
            student_options={**self.groups.options("student engine"), "name": f"rose_ray {self.session} student engine"},
            teacher_options={**self.groups.options("teacher engine"), "name": f"rose_ray {self.session} teacher engine"},
            enable_thinking=cfg.chat.enable_thinking, history=cfg.chat.history,
        )
        r = cfg.reliability  # a lost engine is replaced on its placement; past max_restarts the run stops
        self.engines = EngineSupervisor(r.max_restarts, r.health_every_s, r.health_timeout_s, r.start_timeout_s,
                                        on_start=self._engine_started, on_failed=self._role_failed)
        self.engines.watch("student engine", self.student)
        self.engines.watch("teacher engine", self.teacher)
        self.protocol = cfg.env.protocol()
        self.recipe = cfg.algorithm  # who acts when, which tokens train (rose_ray/recipes/)
        self.recipe.check_agents(cfg, self.teacher.chat is self.student.chat)
        self.token_weights = self.recipe.token_weights()
        self.pools = start_env_pools(cfg.env, max_turns=cfg.rollout.max_turns)
        self.runner = EpisodeRunner(self.pools, cfg.env.games_per_worker, cfg.rollout.max_retries, self.engines)
        self.eval_pools: list = []  # started at the first eval (none if evals are off)
        self.episode_cfg = EpisodeConfig(
            max_turns=cfg.rollout.max_turns,
            student_sampling=cfg.rollout.student_sampling,
            teacher_sampling=cfg.rollout.teacher_sampling,
            score_student_with_teacher=self.recipe.teacher_scores_student(),
            report=cfg.rollout.report,
        )
        self.handoff = self.recipe.turn_policy()
        self.ledger = EpisodeLedger(self.run_dir / "episodes.jsonl", self.sampler, fresh=not self.resume)
        self.buffer = self.new_buffer()
        self.learner = LearnerGroup(replace(cfg.learner, model=student_path),
                                    worker_options=lambda r: self.groups.options("learner ranks", r))
        tok = load_tokenizer(student_path)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.student.chat.eos_id
        self.metrics = MetricsLogger(self.run_dir)
        if not self.resume:
            (self.run_dir / "trajectories.jsonl").unlink(missing_ok=True)  # left by a run that never checkpointed
        self.start_state = self.checkpoint_state()  # where "back to the latest checkpoint" goes without one
        self.start_state["ledger"]["offset"] = 0
        if self.resume:
            self.restarts_before = dict(self.load_checkpoint().get("restarts", {}))

    def new_buffer(self, counters: Any = None) -> Any:
        from rose_ray.rollout.buffer import TrajectoryBuffer

        # Lag makes only the student's own tokens off-policy: a recipe that trains none of them
        # (ROSE without its OPD term) keeps every episode.
        return TrajectoryBuffer(self.cfg.rollout.batch_episodes, self.cfg.rollout.max_lag, counters,
                                on_drop=lambda t: self.ledger.record(t.episode_id, "dropped_stale"),
                                drop_stale=self.token_weights.trains("student"))

    # ----------------------------------------------------------------- checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoint_state(self) -> dict[str, Any]:
        """The trainer's side of a checkpoint, taken in the event loop (nothing moves meanwhile):
        the ledger's open episodes, and counters without them (a resume plays them again)."""
        return {"step": self.step, "version": self.learner.version, "ledger": self.ledger.state(),
                "buffer": self.buffer.resumable_counters().as_dict(),
                "runner": self.runner.resumable_counters(len(self.buffer.items)).as_dict(),
                "replies": dict(self.replies), "history": copy.deepcopy(self.history),
                "restarts": self.restarts()}

    def save_checkpoint(self, state: dict[str, Any] | None = None) -> None:
        state = state or self.checkpoint_state()
        tag = f"step_{self.learner.step}"
        # The trainer's file first: the learner writes `latest` last, so it never names a
        # checkpoint whose trainer state is missing.
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt_dir / f"trainer_{tag}.json.tmp"
        tmp.write_text(json.dumps({**state, "sampler": state["ledger"]["sampler"], "tag": tag}))
        os.replace(tmp, self.ckpt_dir / f"trainer_{tag}.json")
        self.learner.save_checkpoint(self.ckpt_dir)
        # Keep the newest `keep_checkpoints`.
        tags = sorted((p.name for p in self.ckpt_dir.glob("step_*") if p.is_dir()),
                      key=lambda t: int(t.split("_")[1]))
        for old in tags[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(self.ckpt_dir / old, ignore_errors=True)
            (self.ckpt_dir / f"trainer_{old}.json").unlink(missing_ok=True)

    async def checkpoint(self) -> None:
        state = self.checkpoint_state()
        await self.in_learner(self.save_checkpoint, state)

    async def in_learner(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on the learner, in a thread. Cancelled meanwhile (a stall, a lost role),
        the thread goes on, so the learner's state is unknown from then on."""
        try:
            return await asyncio.to_thread(fn, *args)
        except asyncio.CancelledError:
            self.learner_unsure = True
            raise

    def load_checkpoint(self, publish: bool = True) -> dict[str, Any]:
        """Back to the latest checkpoint (or the start, without one): the learner, the game order
        and the episodes open then (played again first), counters, and the logs cut to match.
        Returns the trainer's state it went back to."""
        from rose_ray.rollout.buffer import BufferCounters
        from rose_ray.rollout.ledger import keep_steps
        from rose_ray.rollout.runner import RunnerCounters

        state = self.start_state
        if (self.ckpt_dir / "latest").is_file():
            info = self.learner.load_checkpoint(self.ckpt_dir)
            state = json.loads((self.ckpt_dir / f"trainer_{info['tag']}.json").read_text())
        self.step = state["step"]
        self.history = copy.deepcopy(state["history"])  # a copy: the state may be restored again
        self.replies = dict(state.get("replies", self.replies))
        if "ledger" in state:
            self.ledger.load_state(state["ledger"])
            self.buffer = self.new_buffer(BufferCounters(**state["buffer"]))
            self.runner.counters = RunnerCounters(**state["runner"])
        else:  # a checkpoint from before the ledger: its game order only
            self.sampler.load_state(state["sampler"])
        for log in ("trajectories.jsonl", "metrics.jsonl"):  # steps after it are trained again
            keep_steps(self.run_dir / log, self.step)
        if publish:
            self.publish_now(self.student.engine)  # the student engine starts from the checkpoint's weights
        print(f"train: {self.run_dir} at step {self.step} (policy version {self.learner.version}); "
              f"{len(self.ledger.replay)} open episodes to play again", flush=True)
        return state

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"

    def export_model(self) -> None:
        """The student as a Hugging Face folder, `<run_dir>/model/`, replaced atomically."""
        from rose_ray.export import MODEL_INFO, model_info

        info = model_info(self.cfg, self.run_dir, self.step, self.learner.version, self.student_path)
        self.learner.export(self.model_dir, {MODEL_INFO: info})

    def publish_now(self, engine: Any) -> None:
        self.weights_ms = self.learner.publish_weights([engine])["total_ms"]

    async def publish(self) -> None:
        """The learner's weights to the student engine. A student engine lost meanwhile is
        replaced first (the replacement gets the weights before it serves), then sent them."""
        while True:
            engine = self.student.engine
            try:
                return await asyncio.to_thread(self.publish_now, engine)
            except LearnerLost:
                raise
            except Exception:
                if not await self.engines.lost("student engine", engine):
                    raise

    async def _engine_started(self, role: str, engine: Any) -> None:
        """A replacement engine, before it serves: the student's gets the latest weights."""
        if role == "student engine":
            try:
                await asyncio.to_thread(self.publish_now, engine)
            except LearnerLost as lost:  # not the engine's fault: the loop restarts the learner group,
                self.learner_lost = lost  # which then publishes to this engine
                self.learner_lost_event.set()

    def _role_failed(self, error: RoleFailed) -> None:
        self.fatal = self.fatal or error
        self.stop.set()

    # ----------------------------------------------------------------- evals
    def eval_runner(self) -> Any:
        """The runner of the held-out evals: env pools of its own, started at the first eval."""
        from rose_ray.rollout.actors import start_env_pools
        from rose_ray.rollout.runner import EpisodeRunner

        if not self.eval_pools:
            eval_env = replace(self.cfg.env, workers=1, resources=dict(self.cfg.env.resources))
            self.eval_pools = start_env_pools(eval_env, max_turns=self.cfg.eval.max_turns)
            self._eval_runner = EpisodeRunner(self.eval_pools, eval_env.games_per_worker, engines=self.engines)
        return self._eval_runner

    # ----------------------------------------------------------------- supervision
    async def supervise(self, loop: Any) -> None:
        """Run `loop` beside the engines' monitor (a lost engine is replaced) and a watchdog
        that gives up on it when nothing moves for too long. A role lost for good is kept in
        `fatal`, a crash in `crash`: both are raised by `wind_down`, after the stop's checkpoint."""
        cfg = self.cfg
        # A role being replaced is not a stall (each replacement has its own time limit).
        self.watchdog = Watchdog(cfg.reliability.watchdog_s, self.waiting_report,
                                 busy=lambda: self.restarting_learner or self.engines.replacing())
        monitor = asyncio.create_task(self.engines.monitor())
        try:
            self.watchdog.progress()
            waits = {asyncio.create_task(loop)}
            if cfg.reliability.watchdog_s:
                waits.add(asyncio.create_task(self.watchdog.run()))
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                if isinstance(task.exception(), RoleFailed):
                    self.fatal = self.fatal or task.exception()
                elif task.exception() is not None:
                    self.crash = task.exception()
        finally:
            monitor.cancel()

    async def wind_down(self) -> None:
        """The stop: a final checkpoint and model/ (when the learner's state is known), the
        ledger's open episodes marked; then a crash or a lost role is raised, naming the
        checkpoint a `--resume` goes on from."""
        try:
            saved = await self.final_checkpoint()
            if saved:
                try:
                    await asyncio.to_thread(self.export_model)  # before the eval: a failing eval keeps it
                except Exception as e:
                    if self.fatal is None and self.crash is None:
                        raise
                    print(f"\ntrain: no model/ at the stop: {type(e).__name__}: {e}", flush=True)
        finally:
            self.ledger.stop()  # after the checkpoint: a resume plays these again
        if self.crash is not None:
            raise self.crash
        if self.fatal is not None:
            latest = self.ckpt_dir / "latest"
            where = f"checkpoint {latest.read_text().strip()}" if latest.is_file() else "no checkpoint"
            raise type(self.fatal)(f"{self.fatal}\n{'the stop wrote' if saved else 'the stop could not write one; the latest is'} "
                                   f"{where} (rose-ray train --resume {self.run_dir} goes on from it)")

    async def restart_learner(self, lost: LearnerLost) -> None:
        """A rank is gone: new ranks on the same placement, back to the latest checkpoint and
        its weights published; RoleFailed past `reliability.max_restarts`."""
        limit = self.cfg.reliability.max_restarts
        self.learner_unsure, self.restarting_learner = True, True
        while True:
            self.learner_restarts += 1
            if self.learner_restarts > limit:
                raise RoleFailed(f"learner: lost {self.learner_restarts} times, more than reliability.max_restarts="
                                 f"{limit}; the last time: {lost}") from lost
            print(f"\ntrain: {lost}; restarting the learner group from the latest checkpoint "
                  f"({self.learner_restarts}/{limit})", flush=True)
            self.doing("restarting the learner group")
            try:
                await asyncio.to_thread(self.learner.restart)
                await asyncio.to_thread(self.load_checkpoint, False)
                await self.publish()
                break
            except LearnerLost as again:
                lost = again
        self.learner_unsure, self.restarting_learner = False, False
        self.watchdog.progress()

    async def run_scalars(self, batch: list[Trajectory]) -> dict[str, float]:
        """A step's numbers from the run's own counters: throughput, lag, env pools, weights, restarts."""
        now = time.time()
        self.rollout_window = [t for t in self.rollout_window + batch if now - t.timing["finished_at"] < 60]
        window_s = max(now - min(t.timing["finished_at"] for t in self.rollout_window), 1e-3)
        try:  # awaited, never blocking the loop; a hung pool costs its numbers, not the step
            health = [h for hs in await asyncio.wait_for(asyncio.gather(
                *(p.health.remote() for p in self.pools)), 5) for h in hs]
        except Exception:  # noqa: BLE001
            health = []
        p50 = [h["step_ms_p50"] for h in health if h["step_ms_p50"] is not None]
        p95 = [h["step_ms_p95"] for h in health if h["step_ms_p95"] is not None]
        lags = self.buffer.lags[-len(batch):]
        restarts = self.restarts()
        return {
            "rollout/episodes_per_s": len(self.rollout_window) / window_s,
            "async/policy_lag": sum(lags) / len(lags) if lags else 0.0,
            "async/buffer_size": float(len(self.buffer.items)),
            "async/dropped_stale": float(self.buffer.counters.dropped_stale),
            "env/step_ms_p50": sorted(p50)[len(p50) // 2] if p50 else 0.0,
            "env/step_ms_p95": max(p95) if p95 else 0.0,
            "env/restarts": float(self.runner.counters.restarts + sum(h["restarts"] for h in health)),
            "weights/sync_ms": self.weights_ms,
            "weights/version": float(self.learner.version),
            "reliability/engine_restarts": float(sum(n for role, n in restarts.items() if role != "learner")),
            "reliability/learner_restarts": float(restarts["learner"]),
        }

    async def final_checkpoint(self) -> bool:
        """The stop's checkpoint; False when the learner's state is unknown (a call cut short, a
        restart unfinished: the latest checkpoint stands), or when it cannot write one (gone,
        or hung: then its ranks are ended, which frees every thread still waiting on them)."""
        if self.learner_unsure:
            print("\ntrain: no checkpoint at the stop: a learner call was cut short, so its state is "
                  "unknown; the latest checkpoint stands", flush=True)
            return False
        try:
            # After a failure the learner itself may hang: then it gets a bounded time to answer.
            bound = max(self.cfg.reliability.watchdog_s, 120) if self.fatal or self.crash else None
            await asyncio.wait_for(self.checkpoint(), bound)
            return True
        except Exception as e:
            if self.fatal is None and self.crash is None and not isinstance(e, LearnerLost):
                raise
            print(f"\ntrain: no checkpoint at the stop: {type(e).__name__}: {e}", flush=True)
            self.learner.shutdown()
            return False

    async def waiting_report(self) -> str:
        """Which role waits on what (the watchdog's report), one line each."""
        from rose_ray.rollout.actors import ping_pools

        what, since = self.phase
        lines = [f"driver: {what} for {time.monotonic() - since:.0f} s (step {self.step}/{self.cfg.steps}; "
                 f"{len(self.buffer.items)} of {self.cfg.rollout.batch_episodes} episodes ready, "
                 f"{self.buffer.in_flight} in flight)"]
        lines += self.runner.waiting()
        lines += await self.engines.describe()
        lines += await ping_pools(self.pools) or [f"env pools: all {len(self.pools)} answer a ping"]
        return "\n  ".join(lines)

    def restarts(self) -> dict[str, int]:
        """Replacements per role over the whole run: this process's, plus those before a resume
        (kept in each checkpoint; a learner group going back to one keeps counting on)."""
        now = {**self.engines.restarts(), "learner": self.learner_restarts}
        roles = {**self.restarts_before, **now}
        return {role: self.restarts_before.get(role, 0) + now.get(role, 0) for role in roles}

    def doing(self, what: str) -> None:
        self.phase = (what, time.monotonic())

    def summary(self) -> dict[str, Any]:
        evals = self.history["eval"]
        student = [e for e in evals if e["who"] == "student"]
        teacher = [e for e in evals if e["who"] == "teacher"]
        return {
            "run_dir": str(self.run_dir), "steps": self.step, "version": self.learner.version,
            "model": str(self.model_dir),
            "before": student[0] if student and student[0]["step"] == 0 else None,
            "after": student[-1] if student and student[-1]["step"] == self.step and self.step else None,
            "teacher": teacher[0] if teacher else None,
            "buffer": self.buffer.counters.as_dict(), "runner": self.runner.counters.as_dict(),
            "replies": self.replies,
            "accounting_holds": self.buffer.accounting_holds(),
            "restarts": self.restarts(),
            "episodes": dict(self.ledger.outcomes),  # outcomes in episodes.jsonl
        }

    def close(self) -> None:
        from rose_ray.rollout.actors import close_pools, stop_agents

        close_pools(getattr(self, "pools", []) + getattr(self, "eval_pools", []))
        stop_agents(getattr(self, "student", None), getattr(self, "teacher", None))
        if getattr(self, "learner", None) is not None:
            self.learner.shutdown()
        if getattr(self, "groups", None) is not None:
            self.groups.remove()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        if getattr(self, "ledger", None) is not None:
            self.ledger.close()


def results_table(summary: dict[str, Any]) -> str:
    rows = [("student before", summary["before"]), ("student after", summary["after"]),
            ("teacher", summary["teacher"])]
    lines = ["| model | games | Score | Success | Pass |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in rows:
        if r is not None:
            lines.append(f"| {name} | {r['games']} | {r['score']:.4f} | {r['success']:.3f} | {r['pass']:.3f} |")
    return "\n".join(lines)
