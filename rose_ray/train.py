"""The online loop: rollouts and learning overlap, top to bottom in one file.

    rose-ray train [--config configs/tiny.yaml] [key=value ...] [--resume RUN_DIR]

1. Models (`warmup.py`): tiny local models are built on first use; a tiny teacher can first be warmed by
   SFT on gold demonstrations, so that it is honestly better than the student.
2. Actors: EnvPools (one JVM per game), a student and a teacher engine, the learner group.
3. Eval before training (student and teacher), on held-out games.
4. Loop (async): episode tasks keep the buffer full (student K turns, then the teacher) while
   the learner takes batches, steps, and publishes weights every N steps; evals every E
   steps and checkpoints every C steps. `mode: sync` alternates rollout and training instead.
5. The student as a Hugging Face folder, `<run_dir>/model/`; eval after, and a before/after
   table beside the teacher's.

Ctrl-C stops cleanly: the step in progress finishes, a final checkpoint and `model/` are
written, and every JVM is closed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rose_ray.config import TrainConfig, load_config, to_yaml
from rose_ray.types import Trajectory
from rose_ray.warmup import choose_games, resolve_models

LEARNER_ALGORITHM = {"rose": "rose", "opd": "opd", "teacher_sft": "sft"}


# --------------------------------------------------------------------------- the trainer
class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.stop: asyncio.Event | None = None  # made inside the event loop
        self.step = 0
        self.history: dict[str, Any] = {"eval": []}
        self.rollout_window: list[Trajectory] = []
        self.t_start = time.time()
        self.weights_ms = 0.0
        self.episodes_started = 0
        self.replies = {"replies": 0, "truncated": 0, "cut_before_action": 0}  # trained episodes' replies
        self.session = f"{run_dir.name}-{os.urandom(3).hex()}"

    # ----------------------------------------------------------------- 2. actors
    def start(self) -> None:
        from rose_ray.envs.worlds import get_world
        from rose_ray.learner.learner import LearnerGroup
        from rose_ray.metrics import MetricsLogger
        from rose_ray.models import load_tokenizer
        from rose_ray.placement import PlacementGroups, check_cluster, demands
        from rose_ray.rollout.buffer import TrajectoryBuffer
        from rose_ray.rollout.episode import EpisodeConfig, HandoffConfig
        from rose_ray.rollout.workers import (
            EpisodeRunner,
            GameSampler,
            init_ray,
            start_agents,
            start_env_pools,
        )

        cfg = self.cfg
        init_ray(cfg.ray_address)
        if cfg.resources.check_placement:  # fail now, naming the role, rather than wait forever
            check_cluster(cfg, use_total=True)
        self.groups = PlacementGroups(demands(cfg), timeout_s=cfg.resources.placement_timeout_s)
        student_path, teacher_path = resolve_models(cfg)  # tiny models, the teacher warm-up
        self.student_path, self.teacher_path = student_path, teacher_path
        catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
        self.sampler = GameSampler(choose_games(cfg, catalogue, cfg.rollout.split, None, cfg.seed), seed=cfg.seed)
        self.eval_games = choose_games(cfg, catalogue, cfg.eval.split, cfg.eval.n, cfg.eval.seed)

        self.student, self.teacher = start_agents(
            replace(cfg.student_engine, model=student_path),
            replace(cfg.teacher_engine, model=teacher_path),
            cfg.resources.student_cpus, cfg.resources.teacher_cpus,
            cfg.resources.student_gpus, cfg.resources.teacher_gpus,
            student_options=self.groups.options("student engine"),
            teacher_options=self.groups.options("teacher engine"),
            enable_thinking=cfg.chat.enable_thinking,
        )
        self.protocol = cfg.env.protocol()
        if cfg.algorithm == "opd" and self.teacher.chat is not self.student.chat:
            raise ValueError("algorithm opd: the teacher must share the student's tokenizer "
                             "(it scores the student's tokens)")
        self.pools = start_env_pools(cfg.env, max_turns=cfg.rollout.max_turns)
        self.runner = EpisodeRunner(self.pools, cfg.env.games_per_worker, cfg.rollout.max_retries)
        self.eval_pools: list = []  # started at the first eval (none if evals are off)
        self.episode_cfg = EpisodeConfig(
            max_turns=cfg.rollout.max_turns,
            student_sampling=cfg.rollout.student_sampling,
            teacher_sampling=cfg.rollout.teacher_sampling,
            score_student_with_teacher=cfg.algorithm == "opd" or cfg.learner.lam > 0,
        )
        self.handoff = {"rose": cfg.rollout.handoff, "opd": HandoffConfig("none"),
                        "teacher_sft": HandoffConfig("teacher_only")}[cfg.algorithm]
        self.buffer = TrajectoryBuffer(cfg.rollout.batch_episodes, cfg.rollout.max_lag)
        self.learner = LearnerGroup(replace(cfg.learner, model=student_path,
                                            algorithm=LEARNER_ALGORITHM[cfg.algorithm]),
                                    worker_options=lambda r: self.groups.options("learner ranks", r))
        self.fmt = self.student.chat
        tok = load_tokenizer(student_path)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.fmt.eos_id
        self.metrics = MetricsLogger(self.run_dir)
        if self.resume:
            self.load_checkpoint()

    # ----------------------------------------------------------------- checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def save_checkpoint(self) -> None:
        tag = self.learner.save_checkpoint(self.ckpt_dir)
        state = {"step": self.step, "version": self.learner.version, "sampler": self.sampler.state(),
                 "buffer": self.buffer.counters.as_dict(), "runner": self.runner.counters.as_dict(),
                 "replies": self.replies, "history": self.history, "tag": tag}
        tmp = self.ckpt_dir / f"trainer_{tag}.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.ckpt_dir / f"trainer_{tag}.json")
        # Keep the newest `keep_checkpoints`.
        tags = sorted((p.name for p in self.ckpt_dir.glob("step_*") if p.is_dir()),
                      key=lambda t: int(t.split("_")[1]))
        for old in tags[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(self.ckpt_dir / old, ignore_errors=True)
            (self.ckpt_dir / f"trainer_{old}.json").unlink(missing_ok=True)

    def load_checkpoint(self) -> None:
        info = self.learner.load_checkpoint(self.ckpt_dir)
        state = json.loads((self.ckpt_dir / f"trainer_{info['tag']}.json").read_text())
        self.step = state["step"]
        self.sampler.load_state(state["sampler"])
        self.history = state["history"]
        self.replies = state.get("replies", self.replies)
        self.publish()  # the student engine starts from the checkpoint's weights
        print(f"train: resumed {self.run_dir} at step {self.step} (policy version {self.learner.version})")

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"

    def export_model(self) -> None:
        """The student as a Hugging Face folder, `<run_dir>/model/`, replaced atomically."""
        from rose_ray.export import MODEL_INFO, model_info

        info = model_info(self.cfg, self.run_dir, self.step, self.learner.version, self.student_path)
        self.learner.export(self.model_dir, {MODEL_INFO: info})

    def publish(self) -> None:
        out = self.learner.publish_weights([self.student.engine])
        self.weights_ms = out["total_ms"]

    # ----------------------------------------------------------------- 3/5. eval
    async def evaluate(self, who: str) -> dict[str, Any]:
        from rose_ray.evaluate import evaluate_games, summarise
        from rose_ray.rollout.episode import EpisodeConfig, HandoffConfig
        from rose_ray.rollout.workers import EpisodeRunner, start_env_pools
        from rose_ray.types import SamplingParams

        if not self.eval_pools:
            eval_env = replace(self.cfg.env, workers=1, resources=dict(self.cfg.env.resources))
            self.eval_pools = start_env_pools(eval_env, max_turns=self.cfg.eval.max_turns)
            self.eval_runner = EpisodeRunner(self.eval_pools, eval_env.games_per_worker)
        agent = self.teacher if who == "teacher" else self.student
        ep = EpisodeConfig(max_turns=self.cfg.eval.max_turns,
                           student_sampling=SamplingParams(0.0, 1.0, self.cfg.eval.max_new_tokens))
        records = await evaluate_games(self.eval_runner, self.eval_games, agent, None, ep, HandoffConfig("none"),
                                       protocol=self.protocol)
        return summarise(records)["overall"]

    # ----------------------------------------------------------------- 4. rollout + learn
    async def play_one(self) -> None:
        """One admitted episode, from sampling its game to the buffer."""
        from rose_ray.rollout.episode import EpisodeInterrupted, run_episode

        game = self.sampler.next()
        self.episodes_started += 1  # ids stay unique across resumes: one session tag per start
        episode_id = f"{self.session}-e{self.episodes_started}"
        # The decay policy's draws: the run's seed and the game's place in the (checkpointed)
        # game order, so a rerun or a resumed run decides the same, whatever the timing.
        at = self.sampler.state()
        handoff_seed = f"{self.cfg.seed}/{at['epoch']}/{at['position']}/{game.item_id}"

        async def episode(g, slot):
            return await run_episode(g, slot, self.student, self.teacher, self.episode_cfg, self.handoff,
                                     protocol=self.protocol, learner_step=self.step,
                                     request_prefix=f"s{self.step}/", handoff_seed=handoff_seed)
        try:
            t = await self.runner.play(game, episode)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one bad episode must not stop the run
            if not isinstance(e, EpisodeInterrupted):
                print(f"\ntrain: episode on {game.item_id} failed: {type(e).__name__}: {e}", flush=True)
            await self.buffer.fail()
            return
        t.timing["finished_at"] = time.time()
        t.episode_id = episode_id
        await self.buffer.add(t, self.learner.version)

    async def rollouts(self) -> None:
        """Keep episodes coming while there is room in the buffer (async mode)."""
        tasks: set[asyncio.Task] = set()
        try:
            while not self.stop.is_set():
                await self.buffer.admit()
                task = asyncio.create_task(self.play_one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()

    async def learn_step(self, batch: list[Trajectory]) -> dict[str, float]:
        from rose_ray.learner.batching import loss_turns, render

        seqs = [render(t, self.fmt, self.cfg.learner.max_tokens, self.cfg.learner.context_policy,
                       teacher_logprobs=_teacher_logprobs(t) if self.episode_cfg.score_student_with_teacher else None)
                for t in batch]
        made = self.learner.make_batch(seqs, self.pad_id)
        metrics = await asyncio.to_thread(self.learner.train_step, made)
        self.step += 1
        weights = self.learner.algorithm.owner_weights
        with (self.run_dir / "trajectories.jsonl").open("a") as f:  # what the learner trained on
            for t, seq in zip(batch, seqs):  # `loss` per turn: did its tokens carry loss this step
                record = t.to_record(loss=loss_turns(seq, len(t.turns), weights))
                f.write(json.dumps({"step": self.step, **record}) + "\n")
        if self.step % self.cfg.publish_every == 0:
            await asyncio.to_thread(self.publish)
        return metrics

    async def log_step(self, metrics: dict[str, float], batch: list[Trajectory]) -> None:
        now = time.time()
        self.rollout_window = [t for t in self.rollout_window + batch if now - t.timing["finished_at"] < 60]
        window_s = max(now - min(t.timing["finished_at"] for t in self.rollout_window), 1e-3)
        student_tokens = sum(len(x.token_ids) for t in batch for x in t.turns if x.owner == "student")
        handoffs = [t.handoff_turn for t in batch if t.handoff_turn is not None]
        actions = sum(t.rounds for t in batch) or 1
        health = [h for pool in self.pools for h in await pool.health.remote()]  # never block the loop
        p50 = [h["step_ms_p50"] for h in health if h["step_ms_p50"] is not None]
        p95 = [h["step_ms_p95"] for h in health if h["step_ms_p95"] is not None]
        lags = self.buffer.lags[-len(batch):]
        scalars = {f"learner/{k}": metrics.get(k, 0.0) for k in ("loss", "grad_norm", "lr", "tokens_per_s")}
        scalars.update({
            # The CE term trains teacher tokens (rose, teacher_sft); 0 = no such term this step.
            "learner/loss_teacher_ce": metrics.get("loss_ce", 0.0),
            "learner/loss_opd": metrics.get("loss_opd", 0.0),
            "rollout/score": sum(t.score for t in batch) / len(batch),
            "rollout/episodes_per_s": len(self.rollout_window) / window_s,
            "rollout/tokens_per_s": student_tokens / max(sum(t.timing.get("student_s", 0) for t in batch), 1e-6),
            "rollout/handoff_turn": sum(handoffs) / len(handoffs) if handoffs else 0.0,
            "rollout/invalid_action_rate": sum(t.invalid_actions for t in batch) / actions,
            # Replies cut at max_new_tokens, and those cut before an `Action:` line (thinking
            # that never reached an answer): a budget too small for the model shows here.
            "rollout/truncated_rate": sum(t.truncated_turns for t in batch) / actions,
            "rollout/cut_before_action_rate": sum(t.cut_before_action for t in batch) / actions,
            "async/policy_lag": sum(lags) / len(lags) if lags else 0.0,
            "async/buffer_size": float(len(self.buffer.items)),
            "async/dropped_stale": float(self.buffer.counters.dropped_stale),
            "env/step_ms_p50": sorted(p50)[len(p50) // 2] if p50 else 0.0,
            "env/step_ms_p95": max(p95) if p95 else 0.0,
            "env/restarts": float(self.runner.counters.restarts + sum(h["restarts"] for h in health)),
            "weights/sync_ms": self.weights_ms,
            "weights/version": float(self.learner.version),
        })
        ps = [t.handoff_p for t in batch if t.handoff_p is not None]
        if ps:  # decay: the takeover probability this batch's episodes played under
            scalars["rollout/handoff_p"] = sum(ps) / len(ps)
        self.metrics.log(self.step, scalars)
        for t in batch:
            self.replies["replies"] += t.rounds
            self.replies["truncated"] += t.truncated_turns
            self.replies["cut_before_action"] += t.cut_before_action
        if self.step == 1 or self.step % max(self.cfg.steps // 4, 1) == 0:
            for t in batch[: self.cfg.samples_to_log]:
                from rose_ray.metrics import trajectory_markdown

                self.metrics.text(self.step, "samples/trajectory", trajectory_markdown(t.to_record()))
        elapsed = time.time() - self.t_start
        self.metrics.progress(
            f"step {self.step}/{self.cfg.steps} loss {metrics.get('loss', math.nan):.3f} "
            f"score {scalars['rollout/score']:.3f} lag {scalars['async/policy_lag']:.2f} "
            f"buffer {len(self.buffer.items)} ep/s {scalars['rollout/episodes_per_s']:.2f} "
            f"v{self.learner.version} {elapsed:.0f}s"
        )

    async def log_eval(self, step: int, who: str, result: dict[str, Any]) -> None:
        self.history["eval"].append({"step": step, "who": who, **result})
        if who == "student":
            self.metrics.log(step, {"eval/score": result["score"], "eval/success": result["success"],
                                    "eval/pass": result["pass"]})

    async def run(self) -> dict[str, Any]:
        self.stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self._interrupt)
        loop.add_signal_handler(signal.SIGTERM, self._interrupt)
        cfg = self.cfg
        if not self.resume:
            if cfg.eval.before:
                await self.log_eval(0, "student", await self.evaluate("student"))
            if cfg.eval.teacher:
                await self.log_eval(0, "teacher", await self.evaluate("teacher"))
        producer = asyncio.create_task(self.rollouts()) if cfg.mode == "async" else None
        eval_task: asyncio.Task | None = None
        try:
            while self.step < cfg.steps and not self.stop.is_set():
                if cfg.mode == "sync":
                    await self.sync_rollout()
                batch_task = asyncio.create_task(self.buffer.take_batch(self.learner.version))
                stop_task = asyncio.create_task(self.stop.wait())
                await asyncio.wait({batch_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                stop_task.cancel()
                if not batch_task.done():
                    batch_task.cancel()
                    break
                batch = batch_task.result()
                metrics = await self.learn_step(batch)
                await self.log_step(metrics, batch)
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
                    if eval_task is None or eval_task.done():
                        eval_task = asyncio.create_task(self._eval_in_background(self.step))
                if self.step % cfg.checkpoint_every == 0:
                    await asyncio.to_thread(self.save_checkpoint)
        finally:
            self.stop.set()
            if producer is not None:
                producer.cancel()
            self.metrics.end_progress()
        if eval_task is not None and not eval_task.done():
            eval_task.cancel()
        await asyncio.to_thread(self.save_checkpoint)
        await asyncio.to_thread(self.export_model)  # before the eval: a failing eval keeps it
        if cfg.eval.after and self.step >= cfg.steps:
            await self.log_eval(self.step, "student", await self.evaluate("student"))
        return self.summary()

    async def sync_rollout(self) -> None:
        """Sync mode: play one batch of episodes, then return to the learner."""
        async def one() -> None:
            await self.buffer.admit()
            await self.play_one()

        await asyncio.gather(*(one() for _ in range(self.cfg.rollout.batch_episodes)))

    async def _eval_in_background(self, step: int) -> None:
        await self.log_eval(step, "student", await self.evaluate("student"))

    def _interrupt(self) -> None:
        if self.stop.is_set():  # a second Ctrl-C: stop waiting
            raise KeyboardInterrupt
        print("\ntrain: stopping after the current step (Ctrl-C again to force)", flush=True)
        self.stop.set()

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
        }

    def close(self) -> None:
        from rose_ray.rollout.workers import close_pools, stop_agents

        close_pools(getattr(self, "pools", []) + getattr(self, "eval_pools", []))
        stop_agents(getattr(self, "student", None), getattr(self, "teacher", None))
        if getattr(self, "learner", None) is not None:
            self.learner.shutdown()
        if getattr(self, "groups", None) is not None:
            self.groups.remove()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()


def _teacher_logprobs(t: Trajectory) -> list[list[float] | None]:
    """Per turn: the teacher's logprob of each token id (NaN past the scored ones)."""
    out: list[list[float] | None] = []
    for turn in t.turns:
        if turn.teacher_logprobs is None:
            out.append(None)
        else:
            pad = len(turn.token_ids) - len(turn.teacher_logprobs)
            out.append(list(turn.teacher_logprobs) + [math.nan] * pad)
    return out


def results_table(summary: dict[str, Any]) -> str:
    rows = [("student before", summary["before"]), ("student after", summary["after"]),
            ("teacher", summary["teacher"])]
    lines = ["| model | games | Score | Success | Pass |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in rows:
        if r is not None:
            lines.append(f"| {name} | {r['games']} | {r['score']:.4f} | {r['success']:.3f} | {r['pass']:.3f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- entry point
def train(config: str | None = None, overrides: list[str] | None = None, resume: str | None = None) -> dict[str, Any]:
    if resume:
        run_dir = Path(resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ValueError(f"--resume {resume}: no config.yaml there (not a run directory)")
        cfg = load_config(saved, overrides)
    else:
        cfg = load_config(config, overrides)
        run_dir = Path(cfg.run_dir)
        if (run_dir / "checkpoints" / "latest").exists():
            raise ValueError(f"run_dir {run_dir} already holds a run: use --resume {run_dir} or another name=")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    trainer = Trainer(cfg, run_dir, resume=bool(resume))
    try:
        trainer.start()
        summary = asyncio.run(trainer.run())
    finally:
        trainer.close()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(results_table(summary))
    print(f"train: {summary['steps']} steps; model in {summary['model']} (rose-ray eval --model {summary['model']})")
    print(f"train: run in {run_dir} (TensorBoard: tensorboard --logdir {run_dir}/tb)")
    return summary


def cli_main(args) -> int:
    train(args.config, args.overrides, args.resume)
    return 0
