"""The online loop: episodes keep arriving while the learner trains on them, top to bottom.

    rose-ray train [--config configs/tiny.yaml] [key=value ...] [--resume RUN_DIR] [--print-config]
    rose_ray.train("configs/tiny.yaml", ["steps=4"])     # the same from Python (a notebook too)

Each fresh run gets its own folder, `<run_dir>/version_N` (`runs.py`); `--resume <run_dir>` goes
on with the latest of them.

1. The run's parts start (`run.py`: env pools, a student and a teacher engine, the learner,
   the buffer, the publisher, the failure channel) and are handed to the `Trainer`, which
   drives them. The algorithm is a recipe (`recipes/`): who acts at each turn (the handoff),
   whether the teacher scores the student's tokens, and which tokens train.
2. Eval before training (student and teacher) on held-out games: the catalogue's sample of
   `eval.n` games, the same ones `rose-ray eval --n` picks at that seed.
3. The loop (async): episode tasks keep the buffer full (`play_one`: the student plays the
   first turns, the teacher the rest, in ROSE) while the learner takes batches (`learn_step`:
   trajectories to tokens with the recipe's weights, one optimizer step), publishes weights
   every N steps, plays `eval.every_n` dev games every E steps (`eval.every`) and checkpoints
   every C steps. `mode: sync` alternates rollout and training instead.
4. The stop: a final checkpoint, the student as a Hugging Face folder `<run_dir>/model/`, an
   eval after, and a before/after table beside the teacher's.

Ctrl-C stops cleanly: the step in progress finishes, a final checkpoint and `model/` are
written, and every JVM is closed. A lost env worker, engine or learner rank costs only the
episodes or steps it was running (docs/reliability.md). A failure the parts cannot handle
themselves reaches the loop as one exception from the run's failure channel, raised where it
waits for a batch: a lost learner rank (LearnerLost) sends it back to the latest checkpoint
with new ranks; a role lost for good or a stall (RoleFailed) ends the loop, and the stop writes
a final checkpoint when the learner's state is known, then raises it naming that checkpoint.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rose_ray import callable_module
from rose_ray.config import TrainConfig, load_config
from rose_ray.errors import InputError
from rose_ray.files import write_file
from rose_ray.learner.learner import LearnerLost
from rose_ray.reliability import RoleFailed, describe_error
from rose_ray.run import RunParts, results_table
from rose_ray.runs import holds_run, new_version, resolve_run, saved_config
from rose_ray.supervision import Supervision
from rose_ray.types import Trajectory


class Trainer:
    """The loop over a started run's parts (`RunParts`): the runner plays episodes into the
    buffer, the learner group trains on its batches, the publisher sends weights to the student
    engine, the engine supervisor keeps the engines serving, and the failure channel brings
    whatever they cannot handle to the loop. Restarts, the watchdog and the stop are its
    `Supervision`'s (supervision.py)."""

    def __init__(self, parts: RunParts) -> None:
        self.parts, self.cfg, self.progress = parts, parts.cfg, parts.progress
        # What the loop drives.
        self.runner, self.buffer, self.ledger = parts.runner, parts.buffer, parts.ledger
        self.learner, self.publisher, self.engines = parts.learner, parts.publisher, parts.engines
        self.failures, self.metrics = parts.failures, parts.metrics
        self.stop: asyncio.Event | None = None  # made inside the event loop
        self.producer: asyncio.Task | None = None
        self.episode_tasks: set[asyncio.Task] = set()
        self.eval_task: asyncio.Task | None = None
        self._dev_games: list[Any] | None = None  # drawn at the first dev eval (eval.every)
        self.failed_in_a_row = 0  # episodes failed since the last one that finished
        self.rollout_window: list[Trajectory] = []
        self.learn_s = 0.0  # wall seconds in learn_step: batching, the learner's step, publication
        self.supervision = Supervision(parts)  # restarts, the watchdog, the stop
        self.doing = self.supervision.doing  # what the loop does, for the watchdog's report

    @property
    def step(self) -> int:
        return self.progress.step

    async def run(self) -> dict[str, Any]:
        """Evals before, the loop under the run's supervision, the stop, the eval after."""
        self.stop = asyncio.Event()
        if threading.current_thread() is threading.main_thread():  # else run_coroutine forwards a Ctrl-C
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self._interrupt)
            loop.add_signal_handler(signal.SIGTERM, self._interrupt)
        cfg = self.cfg
        if not self.parts.resume:
            if cfg.eval.before:
                await self.log_eval(0, "student", await self.evaluate("student"))
            if cfg.eval.teacher:
                await self.log_eval(0, "teacher", await self.evaluate("teacher"))
            if cfg.eval.every:
                await self.log_eval(0, "dev", await self.evaluate("student", self.dev_games()))
            self.parts.start_state.history = copy.deepcopy(self.progress.history)  # a restart keeps them
        try:
            failure = await self.supervision.supervise(self.train_loop())  # beside the engines' monitor and the watchdog
        finally:
            self.stop.set()
            await self.stop_rollouts()
            self.metrics.end_progress()
        if self.eval_task is not None and not self.eval_task.done():
            self.eval_task.cancel()
        await self.supervision.wind_down(failure)  # the final checkpoint and model/; raises the failure
        if cfg.eval.every and self.step >= cfg.steps:
            await self.log_eval(self.step, "dev", await self.evaluate("student", self.dev_games()))
        if cfg.eval.after and self.step >= cfg.steps:
            await self.log_eval(self.step, "student", await self.evaluate("student"))
        return self.summary()

    async def train_loop(self) -> None:
        """Batches through the learner until `steps`, a stop, or a failure the loop cannot mend."""
        cfg = self.cfg
        self.start_rollouts()
        while self.step < cfg.steps and not self.stop.is_set():
            if cfg.mode == "sync":
                self.doing("playing a batch (mode sync)")
                await self.sync_rollout()
            try:
                self.doing("waiting for a batch")
                batch = await self.next_batch()  # raises what the parts reported meanwhile
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
                    await self.supervision.checkpoint()
            except LearnerLost as lost:
                # New ranks, back to the latest checkpoint; the steps after it are trained again
                # on the same games (RoleFailed past max_restarts).
                await self.stop_rollouts()
                if self.eval_task is not None and not self.eval_task.done():
                    self.eval_task.cancel()  # it plays weights that are about to roll back
                await self.supervision.restart_learner(lost)
                self.start_rollouts()
        pending = self.failures.take()  # reported after the last batch; a lost learner is the stop's to meet
        if pending is not None and not isinstance(pending, LearnerLost):
            raise pending

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

        parts, game = self.parts, draw.game
        # The decay policy's draws: the run's seed and the game's place in the (checkpointed)
        # game order, so a rerun or a resumed run decides the same, whatever the timing.
        handoff_seed = f"{self.cfg.seed}/{draw.epoch}/{draw.position}/{game.item_id}"

        async def episode(g, slot):
            return await run_episode(g, slot, parts.student, parts.teacher, parts.episode_cfg, parts.handoff,
                                     protocol=parts.protocol, learner_step=self.step,
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
                self.failures.report(RoleFailed(
                    f"{limit} episodes in a row failed, none finishing between them "
                    f"(reliability.max_failed_in_a_row={limit}); the last: {error}"))
            return
        self.failed_in_a_row = 0
        t.timing["finished_at"] = time.time()
        t.episode_id = draw.episode_id
        self.supervision.watchdog.progress()
        await self.buffer.add(t, self.learner.version)

    # ----------------------------------------------------------------- learning
    async def next_batch(self) -> list[Trajectory] | None:
        """The learner's next batch from the buffer; None when the run is told to stop first.
        A failure the parts reported is raised here, before a batch is taken or instead of one
        (a batch taken is always trained)."""
        failure = self.failures.take()
        if failure is not None:
            raise failure
        batch_task = asyncio.create_task(self.buffer.take_batch(self.learner.version))
        waits = {batch_task, asyncio.create_task(self.stop.wait()), asyncio.create_task(self.failures.reported.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                if not task.done():
                    task.cancel()
        if batch_task.done() and not batch_task.cancelled():
            return batch_task.result()
        failure = self.failures.take()
        if failure is not None:
            raise failure
        return None

    async def learn_step(self, batch: list[Trajectory]) -> dict[str, float]:
        from rose_ray.metrics import trained_scalars
        from rose_ray.tokens import loss_turns, make_batch, render, trained_tokens

        t0 = time.perf_counter()
        weights = self.parts.token_weights
        # Trajectories to tokens, each cut where its rollout cut it, with the recipe's weights.
        seqs = [render(t) for t in batch]
        made = make_batch(seqs, weights, self.cfg.learner.max_tokens, self.parts.pad_id)
        self.doing("train_step")
        metrics = await self.supervision.in_learner(self.learner.train_step, made)
        self.progress.step += 1
        self.supervision.watchdog.progress()
        flags = [loss_turns(seq, len(t.turns), weights) for t, seq in zip(batch, seqs)]
        metrics.update(trained_scalars(batch, flags, trained_tokens(seqs, weights)))
        with (self.parts.run_dir / "trajectories.jsonl").open("a") as f:  # what the learner trained on
            for t, loss in zip(batch, flags):  # `loss` per turn: did its tokens carry loss this step
                f.write(json.dumps({"step": self.step, **t.to_record(loss=loss)}) + "\n")
        for t in batch:
            self.ledger.record(t.episode_id, "trained", step=self.step)
        if self.step % self.cfg.publish_every == 0:
            self.doing("publishing weights")
            await self.publisher.publish()
        self.learn_s += time.perf_counter() - t0  # the learner's side of a step (bench/pipeline.py's L)
        return metrics

    async def log_step(self, metrics: dict[str, float], batch: list[Trajectory]) -> None:
        from rose_ray.metrics import batch_scalars, trajectory_markdown

        scalars = {**batch_scalars(batch, metrics), **await self.run_scalars(batch)}
        self.metrics.log(self.step, scalars)
        for t in batch:
            self.progress.replies["replies"] += t.rounds
            self.progress.replies["truncated"] += t.truncated_turns
            self.progress.replies["cut_before_action"] += t.cut_before_action
        if self.step == 1 or self.step % max(self.cfg.steps // 4, 1) == 0:
            for t in batch[: self.cfg.samples_to_log]:
                self.metrics.text(self.step, "samples/trajectory", trajectory_markdown(t.to_record()))
        self.metrics.progress(
            self.step, self.cfg.steps,
            f"loss {metrics.get('loss', math.nan):.3f} score {scalars['rollout/score']:.3f} "
            f"lag {scalars['async/policy_lag']:.2f} buffer {len(self.buffer.items)} "
            f"ep/s {scalars['rollout/episodes_per_s']:.2f} v{self.learner.version}"
        )

    async def run_scalars(self, batch: list[Trajectory]) -> dict[str, float]:
        """A step's numbers from the parts' counters: throughput, lag, env pools, weights, restarts."""
        now = time.time()
        self.rollout_window = [t for t in self.rollout_window + batch if now - t.timing["finished_at"] < 60]
        window_s = max(now - min(t.timing["finished_at"] for t in self.rollout_window), 1e-3)
        try:  # awaited, never blocking the loop; a hung pool costs its numbers, not the step
            health = [h for hs in await asyncio.wait_for(asyncio.gather(
                *(p.health.remote() for p in self.parts.pools)), 5) for h in hs]
        except Exception:  # noqa: BLE001
            health = []
        p50 = [h["step_ms_p50"] for h in health if h["step_ms_p50"] is not None]
        p95 = [h["step_ms_p95"] for h in health if h["step_ms_p95"] is not None]
        lags = self.buffer.lags[-len(batch):]
        restarts = self.parts.restarts()
        return {
            "rollout/episodes_per_s": len(self.rollout_window) / window_s,
            "async/policy_lag": sum(lags) / len(lags) if lags else 0.0,
            "async/buffer_size": float(len(self.buffer.items)),
            "async/dropped_stale": float(self.buffer.counters.dropped_stale),
            "env/step_ms_p50": sorted(p50)[len(p50) // 2] if p50 else 0.0,
            "env/step_ms_p95": max(p95) if p95 else 0.0,
            "env/restarts": float(self.runner.counters.restarts + sum(h["restarts"] for h in health)),
            "weights/sync_ms": self.publisher.weights_ms,
            "weights/version": float(self.learner.version),
            "publish/fallbacks": float(self.publisher.fallbacks),
            "reliability/engine_restarts": float(sum(n for role, n in restarts.items() if role != "learner")),
            "reliability/learner_restarts": float(restarts["learner"]),
        }

    # ----------------------------------------------------------------- evals
    def dev_games(self) -> list[Any]:
        """The dev games of the eval every `eval.every` steps: `eval.every_n` of the dev split,
        drawn as `rose-ray eval --split dev --n N --seed S` draws them."""
        if self._dev_games is None:
            self._dev_games = replace(self.parts.eval_job, split="dev", n=self.cfg.eval.every_n).games()
        return self._dev_games

    async def evaluate(self, who: str, games: list[Any] | None = None) -> dict[str, Any]:
        """The held-out games (or `games`) played by the student (or the teacher) alone on the
        eval runner, as `rose-ray eval --run` plays them (the same spec: evaluate.training_evals)."""
        from rose_ray.evaluate import game_record, summarise
        from rose_ray.rollout.play import Players, play

        agent = self.parts.teacher if who == "teacher" else self.parts.student
        games = self.parts.eval_games if games is None else games
        played = await play(self.parts.eval_spec, games, players=Players(self.parts.eval_runner(), agent, None),
                            protocols=self.parts.protocol, request_prefix="eval/")
        return summarise([game_record(t) for t in played])["overall"]

    async def log_eval(self, step: int, who: str, result: dict[str, Any]) -> None:
        self.progress.history["eval"].append({"step": step, "who": who, **result})
        if who == "student":
            self.metrics.log(step, {"eval/score": result["score"], "eval/success": result["success"],
                                    "eval/pass": result["pass"]})
        if who == "dev":
            self.metrics.log(step, {f"eval/dev_{k}": result[k] for k in
                                    ("score", "success", "pass", "invalid_action_rate", "cut_before_action_rate")})

    async def _eval_in_background(self, step: int) -> None:
        await self.log_eval(step, "dev", await self.evaluate("student", self.dev_games()))

    # ----------------------------------------------------------------- failures
    def _interrupt(self) -> None:
        if self.stop.is_set():  # a second Ctrl-C: stop waiting
            raise KeyboardInterrupt
        print("\ntrain: stopping after the current step (Ctrl-C again to force)", flush=True)
        self.stop.set()

    def summary(self) -> dict[str, Any]:
        evals = self.progress.history["eval"]
        student = [e for e in evals if e["who"] == "student"]
        teacher = [e for e in evals if e["who"] == "teacher"]
        return {
            "run_dir": str(self.parts.run_dir), "steps": self.step, "version": self.learner.version,
            "model": str(self.parts.model_dir),
            "before": student[0] if student and student[0]["step"] == 0 else None,
            "after": student[-1] if student and student[-1]["step"] == self.step and self.step else None,
            "teacher": teacher[0] if teacher else None,
            "dev": [e for e in evals if e["who"] == "dev"],  # the eval.every curve
            "buffer": self.buffer.counters.as_dict(), "runner": self.runner.counters.as_dict(),
            "replies": self.progress.replies,
            "accounting_holds": self.buffer.accounting_holds(),
            "restarts": self.parts.restarts(),
            "episodes": dict(self.ledger.outcomes),  # outcomes in episodes.jsonl
        }


# --------------------------------------------------------------------------- entry point
def train(config: str | Path | TrainConfig | None = None, overrides: list[str] | None = None,
          resume: str | Path | None = None) -> dict[str, Any]:
    """A training run, as `rose-ray train` makes one; returns its summary (summary.json).

    `config`: a YAML file (default: the embedded tiny config) or a TrainConfig, with `overrides`
    (KEY=VALUE) over it. A fresh run goes to a new `version_N` folder under the config's run_dir
    (or exactly to a `run_dir=` given as an override). `resume`: a run folder, a run_dir meaning
    its latest run, or `RUN_DIR/latest`, continued from its latest checkpoint with its own
    config.yaml (and `overrides`). Inside a running event loop (a notebook) the run's loop runs
    in a thread of its own (rose_ray/event_loop.py); an interrupt there stops it as Ctrl-C does."""
    from rose_ray.check import check_served_engines
    from rose_ray.event_loop import run_coroutine

    cfg, run_dir = train_config(config, overrides, resume)
    for line in check_served_engines(cfg):  # a served model that cannot do the job: exit 2, nothing written
        print(f"train: {line}", flush=True)
    if run_dir is None:
        run_dir = fresh_run_dir(cfg, named=any(o.partition("=")[0].strip() == "run_dir" for o in overrides or []))
        # The config as given: its run_dir is where runs go, so training from this file again
        # makes the next version.
        write_file(run_dir / "config.yaml", saved_config(cfg))  # no secrets (runs.SECRET_KEY)
        print(f"train: new run in {run_dir}", flush=True)
    parts = RunParts(cfg, run_dir, resume=bool(resume))
    try:
        parts.start()
        trainer = Trainer(parts)
        summary = run_coroutine(trainer.run, stop=trainer._interrupt)
    finally:
        parts.close()
    write_file(run_dir / "summary.json", json.dumps(summary, indent=1))
    if any(summary[k] is not None for k in ("before", "after", "teacher")):  # no evals asked: no table
        print(results_table(summary))
    print(f"train: {summary['steps']} steps; model in {summary['model']} (evaluate it as the run did: "
          f"rose-ray eval --run {run_dir})")
    print(f"train: run in {run_dir} (TensorBoard: tensorboard --logdir {run_dir}/tb)")
    return summary


def train_config(config: str | Path | TrainConfig | None = None, overrides: list[str] | None = None,
                 resume: str | Path | None = None) -> tuple[TrainConfig, Path | None]:
    """The validated config a run would start with, and the folder of the run `resume` names
    (None for a fresh run: its folder is made when it starts)."""
    if not resume:
        return load_config(config, overrides), None
    if config is not None:
        raise InputError("--resume continues a run with its own config.yaml; give KEY=VALUE to change a setting, "
                         "not --config")
    try:
        run_dir = Path(os.path.abspath(resolve_run(resume)))  # absolute, as a fresh run's (fresh_run_dir)
    except InputError as e:
        raise InputError(f"--resume {e}") from None
    return load_config(run_dir / "config.yaml", overrides), run_dir


def fresh_run_dir(cfg: TrainConfig, named: bool) -> Path:
    """Where a fresh run goes: a new version under the config's run_dir; with `named` (run_dir=
    on the command line) that folder itself. A run already there is refused, never overwritten."""
    # Absolute: the learner's ranks write checkpoints and model/ from their own working directory.
    where = Path(os.path.abspath(Path(cfg.run_dir).expanduser()))
    for folder in (where, *where.parents):
        if folder.exists() and not folder.is_dir():
            raise InputError(f"run_dir {cfg.run_dir}: {folder} is a file, not a folder; give a folder for runs")
    if named:
        if holds_run(where):
            raise InputError(f"run_dir {where} already holds a run: continue it with --resume {where}, or "
                             "give another run_dir= (without run_dir=, each run gets a new version_N folder "
                             "under the config's run_dir)")
        from rose_ray.learner.export import check_model_out

        check_model_out(where / "model", overwrite=True, flag="run_dir")  # the run ends by writing it
    elif (where / "config.yaml").is_file():  # one run, not a folder of versions (an older layout)
        raise InputError(f"run_dir {where} holds a run itself (its config.yaml): continue it with --resume "
                         f"{where}, or move it away (mv {where} {where}_old) so that runs go to "
                         f"{where}/version_N, or give another name=")
    try:
        if named:
            where.mkdir(parents=True, exist_ok=True)
            return where
        return new_version(where)
    except OSError as e:  # no permission, a read-only file system
        raise InputError(f"run_dir {where}: cannot make a run folder there ({e.strerror or e})") from None


def cli_main(args) -> int:
    if args.print_config:  # the config the run would start with, as config.yaml holds it (no secrets)
        print(saved_config(train_config(args.config, args.overrides, args.resume)[0]), end="")
        return 0
    try:
        train(args.config, args.overrides, args.resume)
    except RoleFailed as e:  # a role lost for good, or a stall: exit 1 with the reason
        print(f"rose-ray train: error: {e}", file=sys.stderr)
        return 1
    return 0


callable_module(__name__)  # `rose_ray.train(...)` is `train(...)` (rose_ray/__init__.py)
