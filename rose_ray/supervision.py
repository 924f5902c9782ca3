"""The supervision of a run's loop (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from rose_ray.checkpoint import latest_tag, write_checkpoint
from rose_ray.learner.learner import LearnerLost
from rose_ray.reliability import RoleFailed, Watchdog

if TYPE_CHECKING:
    from rose_ray.run import Run


class Supervision:
    """What keeps the loop going or ends it well: `supervise` runs it beside the engines' monitor
    and the watchdog; `restart_learner` brings a lost learner group back; `wind_down` is the stop.
    The loop says what it is doing (`doing`) and calls the learner through `in_learner`."""

    def __init__(self, run: Run) -> None:
        self.run, self.cfg = run, run.cfg
        # A learner call cut short (its thread goes on) or a restart not finished: the learner's
        # state is unknown, so the stop writes no checkpoint and no model/ over the latest good ones.
        self.learner_unsure = False
        self.restarting_learner = False
        # A role being replaced is not a stall (each replacement has its own time limit).
        self.watchdog = Watchdog(self.cfg.reliability.watchdog_s, self.waiting_report,
                                 busy=lambda: self.restarting_learner or run.rollouts.engines.replacing())
        self.doing("starting")

    async def in_learner(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on the learner, in a thread. Cancelled meanwhile, the thread goes on, so
        the learner's state is unknown from then on."""
        try:
            return await asyncio.to_thread(fn, *args)
        except asyncio.CancelledError:
            self.learner_unsure = True
            raise

    async def checkpoint(self) -> None:
        learning = self.run.learning
        same_state = learning.checkpointed_step == learning.learner.step  # saved or loaded: only its record again
        await self.in_learner(write_checkpoint, self.run.run_dir, self.run.checkpoint_state(), learning.learner,
                              self.cfg.keep_checkpoints, same_state)
        learning.checkpointed_step = learning.learner.step

    async def supervise(self, loop: Any) -> BaseException | None:
        """Run `loop` beside the engines' monitor and the watchdog. Returns what ended it, if not
        the loop's own end: RoleFailed (a role lost for good, a stall) or a crash."""
        monitor = asyncio.create_task(self.run.rollouts.engines.monitor())
        try:
            self.watchdog.progress()
            waits = {asyncio.create_task(loop)}
            if self.cfg.reliability.watchdog_s:
                waits.add(asyncio.create_task(self.watchdog.run()))
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return next((task.exception() for task in done if task.exception() is not None), None)
        finally:
            monitor.cancel()

    async def restart_learner(self, lost: LearnerLost) -> None:
        """New ranks on the same placement, back to the latest checkpoint, its weights published;
        RoleFailed past `reliability.max_restarts`."""
        learning, limit = self.run.learning, self.cfg.reliability.max_restarts
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
        ledger's open episodes marked; then the failure raised (RoleFailed naming the checkpoint)."""
        try:
            saved = await self.final_checkpoint(failure)
            if saved:
                try:
                    await asyncio.to_thread(self.run.export_model)  # before the eval: a failing eval keeps it
                except Exception as e:
                    if failure is None:
                        raise
                    print(f"\ntrain: no model/ at the stop: {type(e).__name__}: {e}", flush=True)
        finally:
            self.run.rollouts.ledger.stop()  # after the checkpoint: a resume plays these again
        if failure is None:
            return
        if not isinstance(failure, RoleFailed):
            raise failure
        latest = latest_tag(self.run.run_dir)
        where = f"checkpoint {latest}" if latest else "no checkpoint"
        raise type(failure)(f"{failure}\n{'the stop wrote' if saved else 'the stop could not write one; the latest is'} "
                            f"{where} (rose-ray train --resume {self.run.run_dir} goes on from it)")

    async def final_checkpoint(self, failure: BaseException | None) -> bool:
        """The stop's checkpoint; False when the learner's state is unknown, or when it cannot
        write one (then its ranks are ended, freeing every thread waiting on them)."""
        if self.learner_unsure:
            print("\ntrain: no checkpoint at the stop: a learner call was cut short, so its state is "
                  "unknown; the latest checkpoint stands", flush=True)
            return False
        try:
            # After a failure the learner itself may hang: then it gets a bounded time to answer.
            bound = max(self.cfg.reliability.watchdog_s, 120) if failure is not None else None
            await asyncio.wait_for(self.checkpoint(), bound)
            return True
        except Exception as e:
            if failure is None and not isinstance(e, LearnerLost):
                raise
            print(f"\ntrain: no checkpoint at the stop: {type(e).__name__}: {e}", flush=True)
            self.run.learning.learner.shutdown()
            return False

    async def waiting_report(self) -> str:
        """Which role waits on what (the watchdog's report), one line each."""
        from rose_ray.rollout.actors import ping_pools

        rollouts, (what, since) = self.run.rollouts, self.phase
        lines = [f"driver: {what} for {time.monotonic() - since:.0f} s (step {self.run.learning.step}/{self.cfg.steps}; "
                 f"{len(rollouts.buffer.items)} of {self.cfg.rollout.batch_episodes} episodes ready, "
                 f"{rollouts.buffer.in_flight} in flight)"]
        lines += rollouts.runner.waiting()
        lines += await rollouts.engines.describe()
        lines += await ping_pools(rollouts.pools) or [f"env pools: all {len(rollouts.pools)} answer a ping"]
        return "\n  ".join(lines)

    def doing(self, what: str) -> None:
        self.phase = (what, time.monotonic())
