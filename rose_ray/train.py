"""The online loop: episodes keep arriving while the learner trains on them, top to bottom.

    rose-ray train [--config configs/tiny.yaml] [key=value ...] [--resume RUN_DIR]

Each fresh run gets its own folder, `<run_dir>/version_N` (`runs.py`); `--resume <run_dir>` goes
on with the latest of them.

1. The run's actors start (`run.py`): env pools, a student and a teacher engine, the learner.
   The algorithm is a recipe (`recipes/`): who acts at each turn (the handoff), whether the
   teacher scores the student's tokens, and which tokens train.
2. Eval before training (student and teacher) on held-out games: the catalogue's sample of
   `eval.n` games, the same ones `rose-ray eval --n` picks at that seed.
3. The loop (async): episode tasks keep the buffer full (`play_one`: the student plays the
   first turns, the teacher the rest, in ROSE) while the learner takes batches (`learn_step`:
   trajectories to tokens with the recipe's weights, one optimizer step), publishes weights
   every N steps, evaluates every E steps and checkpoints every C steps. `mode: sync`
   alternates rollout and training instead.
4. The stop: a final checkpoint, the student as a Hugging Face folder `<run_dir>/model/`, an
   eval after, and a before/after table beside the teacher's.

Ctrl-C stops cleanly: the step in progress finishes, a final checkpoint and `model/` are
written, and every JVM is closed. A lost env worker, engine or learner rank costs only the
episodes or steps it was running (README: Reliability; `run.py`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rose_ray.config import TrainConfig, load_config, to_yaml
from rose_ray.errors import InputError
from rose_ray.learner.learner import LearnerLost
from rose_ray.reliability import RoleFailed, describe_error
from rose_ray.run import Run, results_table
from rose_ray.runs import holds_run, new_version, resolve_run
from rose_ray.types import Trajectory


class Trainer(Run):
    async def run(self) -> dict[str, Any]:
        """Evals before, the loop under the run's supervision, the stop, the eval after."""
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
            self.start_state["history"] = copy.deepcopy(self.history)  # a restart keeps them
        try:
            await self.supervise(self.train_loop())  # beside the engines' monitor and the watchdog
        finally:
            self.stop.set()
            await self.stop_rollouts()
            self.metrics.end_progress()
        if self.eval_task is not None and not self.eval_task.done():
            self.eval_task.cancel()
        await self.wind_down()  # the final checkpoint and model/; raises if a role was lost
        if cfg.eval.after and self.step >= cfg.steps:
            await self.log_eval(self.step, "student", await self.evaluate("student"))
        return self.summary()

    async def train_loop(self) -> None:
        """Batches through the learner until `steps`, a stop, or a role lost for good."""
        cfg = self.cfg
        self.start_rollouts()
        while self.step < cfg.steps and not self.stop.is_set():
            if cfg.mode == "sync":
                self.doing("playing a batch (mode sync)")
                await self.sync_rollout()
            try:
                self.doing("waiting for a batch")
                batch = await self.next_batch()
                if self.learner_lost is not None:  # met while publishing to a replacement engine
                    lost, self.learner_lost = self.learner_lost, None
                    self.learner_lost_event.clear()
                    raise lost
                if batch is None:
                    break
                metrics = await self.learn_step(batch)
                self.doing("logging the step")
                await self.log_step(metrics, batch)
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
                    if self.eval_task is None or self.eval_task.done():
                        self.eval_task = asyncio.create_task(self._eval_in_background(self.step))
                if self.step % cfg.checkpoint_every == 0:
                    self.doing("checkpointing")
                    await self.checkpoint()
            except LearnerLost as lost:
                # New ranks, back to the latest checkpoint; the steps after it are trained
                # again on the same games (RoleFailed past max_restarts).
                await self.stop_rollouts()
                if self.eval_task is not None and not self.eval_task.done():
                    self.eval_task.cancel()  # it plays weights that are about to roll back
                await self.restart_learner(lost)
                self.start_rollouts()

    # ----------------------------------------------------------------- episodes
    def start_rollouts(self) -> None:
        if self.cfg.mode == "async":
            self.producer = asyncio.create_task(self.rollouts())

    async def rollouts(self) -> None:
        """Keep episodes coming while there is room in the buffer (async mode)."""
        while not self.stop.is_set():
            await self.buffer.admit()
            task = asyncio.create_task(self.play_one(self.ledger.draw()))
            self.episode_tasks.add(task)
            task.add_done_callback(self.episode_tasks.discard)

    async def sync_rollout(self) -> None:
        """Sync mode: play one batch of episodes, then return to the learner."""
        async def one() -> None:
            await self.buffer.admit()
            await self.play_one(self.ledger.draw())

        await asyncio.gather(*(one() for _ in range(self.cfg.rollout.batch_episodes)))

    async def stop_rollouts(self) -> None:
        """Cancel the producer and every episode in flight (they stay open in the ledger)."""
        tasks = [t for t in (self.producer, *self.episode_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.producer = None

    async def play_one(self, draw: Any) -> None:
        """One admitted episode (a ledger Draw), from its game to the buffer or the ledger."""
        from rose_ray.rollout.episode import EpisodeInterrupted, run_episode

        game = draw.game
        # The decay policy's draws: the run's seed and the game's place in the (checkpointed)
        # game order, so a rerun or a resumed run decides the same, whatever the timing.
        handoff_seed = f"{self.cfg.seed}/{draw.epoch}/{draw.position}/{game.item_id}"

        async def episode(g, slot):
            return await run_episode(g, slot, self.student, self.teacher, self.episode_cfg, self.handoff,
                                     protocol=self.protocol, learner_step=self.step,
                                     request_prefix=f"s{self.step}/", handoff_seed=handoff_seed)
        try:
            t = await self.runner.play(game, episode)
        except asyncio.CancelledError:
            raise
        except RoleFailed:
            return  # the run is stopping: the episode stays open (in flight at the stop)
        except Exception as e:  # noqa: BLE001 - one bad episode must not stop the run
            # e.g. "teacher engine: OpenAIRequestFailed: 500: <the server's message>"
            role = self.engines.whose(e)
            error = f"{role + ': ' if role else ''}{describe_error(e)}"
            if not isinstance(e, EpisodeInterrupted):
                print(f"\ntrain: episode on {game.item_id} failed: {error}", flush=True)
            self.ledger.record(draw.episode_id, "failed", error=error)
            await self.buffer.fail()
            self.failed_in_a_row += 1
            limit = self.cfg.reliability.max_failed_in_a_row
            if limit and self.failed_in_a_row == limit:  # nothing works: stop, naming why, not draw on
                self._role_failed(RoleFailed(
                    f"{limit} episodes in a row failed, none finishing between them "
                    f"(reliability.max_failed_in_a_row={limit}); the last: {error}"))
            return
        self.failed_in_a_row = 0
        t.timing["finished_at"] = time.time()
        t.episode_id = draw.episode_id
        self.watchdog.progress()
        await self.buffer.add(t, self.learner.version)

    # ----------------------------------------------------------------- learning
    async def next_batch(self) -> list[Trajectory] | None:
        """The learner's next batch from the buffer; None when the run is told to stop first, or
        the learner was found lost meanwhile."""
        batch_task = asyncio.create_task(self.buffer.take_batch(self.learner.version))
        stop_task = asyncio.create_task(self.stop.wait())
        lost_task = asyncio.create_task(self.learner_lost_event.wait())
        try:
            await asyncio.wait({batch_task, stop_task, lost_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_task.cancel()
            lost_task.cancel()
            if not batch_task.done():
                batch_task.cancel()
        return batch_task.result() if batch_task.done() and not batch_task.cancelled() else None

    async def learn_step(self, batch: list[Trajectory]) -> dict[str, float]:
        from rose_ray.tokens import loss_turns, make_batch, render

        t0 = time.perf_counter()
        # Trajectories to tokens, each cut where its engine cut it, with the recipe's weights.
        seqs = [render(t, max_tokens=self.cfg.learner.max_tokens) for t in batch]
        made = make_batch(seqs, self.token_weights, self.cfg.learner.max_tokens, self.pad_id)
        self.doing("train_step")
        metrics = await self.in_learner(self.learner.train_step, made)
        self.step += 1
        self.watchdog.progress()
        with (self.run_dir / "trajectories.jsonl").open("a") as f:  # what the learner trained on
            for t, seq in zip(batch, seqs):  # `loss` per turn: did its tokens carry loss this step
                record = t.to_record(loss=loss_turns(seq, len(t.turns), self.token_weights))
                f.write(json.dumps({"step": self.step, **record}) + "\n")
        for t in batch:
            self.ledger.record(t.episode_id, "trained", step=self.step)
        if self.step % self.cfg.publish_every == 0:
            self.doing("publishing weights")
            await self.publish()
        self.learn_s += time.perf_counter() - t0  # the learner's side of a step (bench/pipeline.py's L)
        return metrics

    async def log_step(self, metrics: dict[str, float], batch: list[Trajectory]) -> None:
        from rose_ray.metrics import batch_scalars, trajectory_markdown

        scalars = {**batch_scalars(batch, metrics), **await self.run_scalars(batch)}
        self.metrics.log(self.step, scalars)
        for t in batch:
            self.replies["replies"] += t.rounds
            self.replies["truncated"] += t.truncated_turns
            self.replies["cut_before_action"] += t.cut_before_action
        if self.step == 1 or self.step % max(self.cfg.steps // 4, 1) == 0:
            for t in batch[: self.cfg.samples_to_log]:
                self.metrics.text(self.step, "samples/trajectory", trajectory_markdown(t.to_record()))
        self.metrics.progress(
            f"step {self.step}/{self.cfg.steps} loss {metrics.get('loss', math.nan):.3f} "
            f"score {scalars['rollout/score']:.3f} lag {scalars['async/policy_lag']:.2f} "
            f"buffer {len(self.buffer.items)} ep/s {scalars['rollout/episodes_per_s']:.2f} "
            f"v{self.learner.version} {time.time() - self.t_start:.0f}s"
        )

    # ----------------------------------------------------------------- evals
    async def evaluate(self, who: str) -> dict[str, Any]:
        """Greedy play of the held-out games by the student (or the teacher) alone."""
        from rose_ray.evaluate import evaluate_games, summarise
        from rose_ray.rollout.episode import EpisodeConfig
        from rose_ray.rollout.handoff import StudentOnly
        from rose_ray.types import SamplingParams

        agent = self.teacher if who == "teacher" else self.student
        ep = EpisodeConfig(max_turns=self.cfg.eval.max_turns, report=self.cfg.rollout.report,
                           student_sampling=SamplingParams(0.0, 1.0, self.cfg.eval.max_new_tokens))
        records = await evaluate_games(self.eval_runner(), self.eval_games, agent, None, ep, StudentOnly(),
                                       protocol=self.protocol)
        return summarise(records)["overall"]

    async def log_eval(self, step: int, who: str, result: dict[str, Any]) -> None:
        self.history["eval"].append({"step": step, "who": who, **result})
        if who == "student":
            self.metrics.log(step, {"eval/score": result["score"], "eval/success": result["success"],
                                    "eval/pass": result["pass"]})

    async def _eval_in_background(self, step: int) -> None:
        await self.log_eval(step, "student", await self.evaluate("student"))

    def _interrupt(self) -> None:
        if self.stop.is_set():  # a second Ctrl-C: stop waiting
            raise KeyboardInterrupt
        print("\ntrain: stopping after the current step (Ctrl-C again to force)", flush=True)
        self.stop.set()


# --------------------------------------------------------------------------- entry point
def train(config: str | None = None, overrides: list[str] | None = None, resume: str | None = None) -> dict[str, Any]:
    """A fresh run in a new `version_N` folder under the config's run_dir (or exactly in a
    `run_dir=` given as an override), or `resume`: a run folder, or a run_dir meaning its latest."""
    from rose_ray.check import check_served_engines

    if resume:
        try:
            run_dir = resolve_run(resume)
        except InputError as e:
            raise InputError(f"--resume {e}") from None
        cfg = load_config(run_dir / "config.yaml", overrides, saved=True)
    else:
        cfg = load_config(config, overrides)
    for line in check_served_engines(cfg):  # a served model that cannot do the job: exit 2, nothing written
        print(f"train: {line}", flush=True)
    if not resume:
        run_dir = fresh_run_dir(cfg, named=any(o.partition("=")[0].strip() == "run_dir" for o in overrides or []))
        # The config as given: its run_dir is where runs go, so training from this file again
        # makes the next version.
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        print(f"train: new run in {run_dir}", flush=True)
    trainer = Trainer(cfg, run_dir, resume=bool(resume))
    try:
        trainer.start()
        summary = asyncio.run(trainer.run())
    finally:
        trainer.close()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if any(summary[k] is not None for k in ("before", "after", "teacher")):  # no evals asked: no table
        print(results_table(summary))
    print(f"train: {summary['steps']} steps; model in {summary['model']} (rose-ray eval --model {summary['model']})")
    print(f"train: run in {run_dir} (TensorBoard: tensorboard --logdir {run_dir}/tb)")
    return summary


def fresh_run_dir(cfg: TrainConfig, named: bool) -> Path:
    """Where a fresh run goes: a new version under the config's run_dir; with `named` (run_dir=
    on the command line) that folder itself. A run already there is refused, never overwritten."""
    where = Path(cfg.run_dir)
    if named:
        if holds_run(where):
            raise InputError(f"run_dir {where} already holds a run: continue it with --resume {where}, or "
                             "give another run_dir= (without run_dir=, each run gets a new version_N folder "
                             "under the config's run_dir)")
        where.mkdir(parents=True, exist_ok=True)
        return where
    if (where / "config.yaml").is_file():  # one run, not a folder of versions (an older layout)
        raise InputError(f"run_dir {where} holds a run itself (its config.yaml): continue it with --resume "
                         f"{where}, or move it away (mv {where} {where}_old) so that runs go to "
                         f"{where}/version_N, or give another name=")
    return new_version(where)


def cli_main(args) -> int:
    try:
        train(args.config, args.overrides, args.resume)
    except RoleFailed as e:  # a role lost for good, or a stall: exit 1 with the reason
        print(f"rose-ray train: error: {e}", file=sys.stderr)
        return 1
    return 0
