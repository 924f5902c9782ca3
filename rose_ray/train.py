"""The online loop (`rose-ray train`, `rose_ray.train(...)`): episodes keep arriving while the
learner trains on them. A failure the run's components (run.py) cannot handle reaches the loop
through the run's failure channel (docs/reliability.md). Ctrl-C stops after the step.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rose_ray import callable_module
from rose_ray.checkpoint import latest_tag
from rose_ray.config import TrainConfig
from rose_ray.files import write_file
from rose_ray.learner.learner import LearnerLost
from rose_ray.metrics import episodes_per_s, step_scalars, trajectory_markdown
from rose_ray.reliability import RoleFailed, Watchdog
from rose_ray.run import Run, results_table
from rose_ray.runs import fresh_run_dir, saved_config, train_config
from rose_ray.types import Trajectory


class Trainer:
    """The loop over a started run's components (run.py), and what keeps it going or ends it well
    (docs/reliability.md): the engines' monitor and the watchdog beside it, a lost learner group
    restarted (`restart_learner`), the stop (`wind_down`)."""

    def __init__(self, run: Run) -> None:
        self.run, self.cfg = run, run.cfg
        self.rollouts, self.learning, self.evals = run.rollouts, run.learning, run.evals
        self.failures, self.metrics = run.failures, run.metrics
        self.stop: asyncio.Event | None = None  # made inside the event loop
        self.eval_task: asyncio.Task | None = None
        self.finished_at: list[float] = []  # episodes' finish times over the last minute
        self.learn_s = 0.0  # wall seconds in learn_step: batching, the learner's step, publication
        # A learner call cut short (its thread goes on) or a restart not finished: the learner's
        # state is unknown, so the stop writes no checkpoint and no model/ over the latest good ones.
        self.learner_unsure = False
        self.restarting_learner = False
        # A role being replaced is not a stall (each replacement has its own time limit).
        self.watchdog = Watchdog(self.cfg.reliability.watchdog_s, self.waiting_report,
                                 busy=lambda: self.restarting_learner or self.rollouts.engines.replacing())
        self.rollouts.finished = self.watchdog.progress
        self.doing("starting")

    @property
    def step(self) -> int:
        return self.learning.step

    async def train(self) -> dict[str, Any]:
        """Evals before; the loop beside the engines' monitor and the watchdog until the first of
        them ends (RoleFailed: a role lost for good, a stall); the stop; the evals after."""
        self.stop = asyncio.Event()
        if threading.current_thread() is threading.main_thread():  # else run_coroutine forwards a Ctrl-C
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, self._interrupt)
        cfg = self.cfg
        if not self.run.resume:
            await self.evaluate(0, student=cfg.eval.before, teacher=cfg.eval.teacher, dev=cfg.eval.every)
            self.run.start_state.evals = self.evals.state_dict()  # a restart keeps them
        monitor = asyncio.create_task(self.rollouts.engines.monitor())
        self.watchdog.progress()
        waits = {asyncio.create_task(self.train_loop())}
        if cfg.reliability.watchdog_s:
            waits.add(asyncio.create_task(self.watchdog.run()))
        try:
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            failure = next((task.exception() for task in done if task.exception() is not None), None)
        finally:
            monitor.cancel()
            self.stop.set()
            await self.stop_rollouts()
            self.metrics.end_progress()
        await self.wind_down(failure)  # the final checkpoint and model/; raises the failure
        if self.step >= cfg.steps:
            await self.evaluate(self.step, dev=cfg.eval.every, student=cfg.eval.after)
        return self.run.summary()

    async def train_loop(self) -> None:
        """Batches through the learner until `steps`, a stop, or a failure the loop cannot mend."""
        cfg = self.cfg
        self.start_rollouts()
        while self.step < cfg.steps and not self.stop.is_set():
            if cfg.mode == "sync":  # play one batch, then train on it
                self.doing("playing a batch (mode sync)")
                await self.rollouts.play_batch(self.learning)
            try:
                self.doing("waiting for a batch")
                batch = await self.next_batch()  # raises what the components reported meanwhile
                if batch is None:
                    break
                await self.learn_step(batch)
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
                    if self.eval_task is None or self.eval_task.done():
                        self.eval_task = asyncio.create_task(self.evaluate(self.step, dev=True))
                if self.step % cfg.checkpoint_every == 0:
                    self.doing("checkpointing")
                    await self.in_learner(self.run.save_checkpoint, self.run.checkpoint_state())
            except LearnerLost as lost:
                # New ranks, back to the latest checkpoint; the steps after it are trained again
                # on the same games (RoleFailed past max_restarts).
                await self.stop_rollouts()
                await self.restart_learner(lost)
                self.start_rollouts()
        pending = self.failures.take()  # reported after the last batch; a lost learner is the stop's to meet
        if pending is not None and not isinstance(pending, LearnerLost):
            raise pending

    def start_rollouts(self) -> None:
        if self.cfg.mode == "async":  # episodes keep coming while there is room in the buffer
            self.rollouts.start_playing(self.learning, self.stop)

    async def stop_rollouts(self) -> None:
        """Every episode in flight cancelled (they stay open in the ledger), and a dev eval (it
        plays weights that may be about to roll back)."""
        await self.rollouts.stop_playing()
        if self.eval_task is not None and not self.eval_task.done():
            self.eval_task.cancel()

    async def next_batch(self) -> list[Trajectory] | None:
        """The learner's next batch; None when the run is told to stop first. A reported failure
        is raised before a batch is taken or instead of one (a batch taken is always trained)."""
        self.failures.raise_taken()
        batch_task = asyncio.create_task(self.rollouts.buffer.take_batch(self.learning.learner.version))
        waits = {batch_task, asyncio.create_task(self.stop.wait()), asyncio.create_task(self.failures.reported.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                if not task.done():
                    task.cancel()
        if batch_task.done() and not batch_task.cancelled():
            return batch_task.result()
        self.failures.raise_taken()
        return None

    async def learn_step(self, batch: list[Trajectory]) -> None:
        """One optimizer step on `batch`, its episodes marked trained, the weights published, the
        step's numbers logged."""
        t0 = time.perf_counter()
        self.doing("train_step")
        metrics = await self.learning.train(batch, self.in_learner)
        self.watchdog.progress()
        for t in batch:
            self.rollouts.ledger.record(t.episode_id, "trained", step=self.step)
        if self.step % self.cfg.publish_every == 0:
            self.doing("publishing weights")
            await self.learning.publish()
        self.learn_s += time.perf_counter() - t0  # the learner's side of a step (bench/pipeline.py's L)
        self.doing("logging the step")
        scalars = step_scalars(batch, metrics, self.rollouts, self.learning, self.run.restarts(),
                               await self.rollouts.env_health(), episodes_per_s(self.finished_at, batch))
        self.metrics.log(self.step, scalars)
        if self.step == 1 or self.step % max(self.cfg.steps // 4, 1) == 0:
            for t in batch[: self.cfg.samples_to_log]:
                self.metrics.tb.add_text("samples/trajectory", trajectory_markdown(t.to_record()), self.step)
        self.metrics.progress(
            self.step, self.cfg.steps,
            f"loss {metrics.get('loss', math.nan):.3f} score {scalars['rollout/score']:.3f} "
            f"lag {scalars['async/policy_lag']:.2f} buffer {scalars['async/buffer_size']:.0f} "
            f"ep/s {scalars['rollout/episodes_per_s']:.2f} v{self.learning.learner.version}"
        )

    async def evaluate(self, step: int, **wanted: Any) -> None:
        """The evals asked for (`who=setting`; `Evals.play`: "student", "teacher", or "dev"), in
        order, into the history and the metrics."""
        for who in [who for who, want in wanted.items() if want]:
            if scalars := await self.evals.play(step, who):
                self.metrics.log(step, scalars)

    async def in_learner(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on the learner, in a thread. Cancelled meanwhile, the thread goes on, so
        the learner's state is unknown from then on."""
        try:
            return await asyncio.to_thread(fn, *args)
        except asyncio.CancelledError:
            self.learner_unsure = True
            raise

    async def restart_learner(self, lost: LearnerLost) -> None:
        """New ranks on the same placement, back to the latest checkpoint, its weights published;
        RoleFailed past `reliability.max_restarts`."""
        learning, limit = self.learning, self.cfg.reliability.max_restarts
        self.learner_unsure, self.restarting_learner = True, True
        while True:
            learning.restarts += 1
            if learning.restarts > limit:
                raise RoleFailed(f"learner: lost {learning.restarts} times, more than "
                                 f"reliability.max_restarts={limit}; the last time: {lost}") from lost
            print(f"\ntrain: {lost}; restarting the learner group from the latest checkpoint "
                  f"({learning.restarts}/{limit})", flush=True)
            self.doing("restarting the learner group")
            try:
                await asyncio.to_thread(learning.learner.restart)
                await asyncio.to_thread(self.run.load_checkpoint, False)
                await learning.publish()
                break
            except LearnerLost as again:
                lost = again
        self.learner_unsure, self.restarting_learner = False, False
        self.watchdog.progress()

    async def wind_down(self, failure: BaseException | None) -> None:
        """The stop: a final checkpoint and model/ (when the learner's state is known), the
        ledger's open episodes marked; then the failure raised (RoleFailed naming the checkpoint).
        A checkpoint that cannot be written ends the learner's ranks, freeing every thread waiting
        on them."""
        saved = False
        try:
            if self.learner_unsure:
                print("\ntrain: no checkpoint at the stop: a learner call was cut short, so its state is "
                      "unknown; the latest checkpoint stands", flush=True)
            else:
                try:
                    # After a failure the learner itself may hang: then it gets a bounded time to answer.
                    bound = max(self.cfg.reliability.watchdog_s, 120) if failure is not None else None
                    saving = self.in_learner(self.run.save_checkpoint, self.run.checkpoint_state())
                    await asyncio.wait_for(saving, bound)
                    saved = True
                except Exception as e:
                    if failure is None and not isinstance(e, LearnerLost):
                        raise
                    print(f"\ntrain: no checkpoint at the stop: {type(e).__name__}: {e}", flush=True)
                    self.learning.learner.shutdown()
            if saved:
                try:
                    await asyncio.to_thread(self.run.export_model)  # before the eval: a failing eval keeps it
                except Exception as e:
                    if failure is None:
                        raise
                    print(f"\ntrain: no model/ at the stop: {type(e).__name__}: {e}", flush=True)
        finally:
            self.rollouts.ledger.stop()  # after the checkpoint: a resume plays these again
        if failure is None:
            return
        if not isinstance(failure, RoleFailed):
            raise failure
        latest = latest_tag(self.run.run_dir)
        where = f"checkpoint {latest}" if latest else "no checkpoint"
        wrote = "the stop wrote" if saved else "the stop could not write one; the latest is"
        raise type(failure)(f"{failure}\n{wrote} {where} (rose-ray train --resume {self.run.run_dir} goes on "
                            "from it)")

    async def waiting_report(self) -> str:
        """Which role waits on what (the watchdog's report), one line each."""
        what, since = self.phase
        lines = [f"driver: {what} for {time.monotonic() - since:.0f} s (step {self.step}/{self.cfg.steps})"]
        return "\n  ".join(lines + await self.rollouts.waiting())

    def doing(self, what: str) -> None:
        self.phase = (what, time.monotonic())

    def _interrupt(self) -> None:
        if self.stop.is_set():  # a second Ctrl-C: stop waiting
            raise KeyboardInterrupt
        print("\ntrain: stopping after the current step (Ctrl-C again to force)", flush=True)
        self.stop.set()


# --------------------------------------------------------------------------- entry point
def train(config: str | Path | TrainConfig | None = None, overrides: list[str] | None = None,
          resume: str | Path | None = None) -> dict[str, Any]:
    """A training run, as `rose-ray train` makes one; returns its summary (summary.json).

    `config`: a YAML file (default: the embedded tiny config) or a TrainConfig, `overrides`
    (KEY=VALUE) over it; `resume`: a run to continue (`fresh_run_dir` says where a fresh one
    goes). Works inside a running event loop (event_loop.py)."""
    from rose_ray.check import check_served_engines
    from rose_ray.event_loop import run_coroutine

    cfg, run_dir = train_config(config, overrides, resume)
    for line in check_served_engines(cfg):  # a served model that cannot do the job: exit 2, nothing written
        print(f"train: {line}", flush=True)
    if run_dir is None:
        run_dir = fresh_run_dir(cfg, named=any(o.partition("=")[0].strip() == "run_dir" for o in overrides or []))
        # As given: its run_dir is where runs go, so training from it again makes the next version.
        write_file(run_dir / "config.yaml", saved_config(cfg))  # no secrets (runs.saved_config)
        print(f"train: new run in {run_dir}", flush=True)
    run = Run(cfg, run_dir, resume=bool(resume))
    try:
        run.start()
        trainer = Trainer(run)
        summary = run_coroutine(trainer.train, stop=trainer._interrupt)
    finally:
        run.close()
    write_file(run_dir / "summary.json", json.dumps(summary, indent=1))
    if any(summary[k] is not None for k in ("before", "after", "teacher")):  # no evals asked: no table
        print(results_table(summary))
    print(f"train: {summary['steps']} steps; model in {summary['model']} (evaluate it as the run did: "
          f"rose-ray eval --run {run_dir})")
    print(f"train: run in {run_dir} (TensorBoard: tensorboard --logdir {run_dir}/tb)")
    return summary


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
