"""What stops a run that cannot go on (`RoleFailed`: `rose-ray train` exits 1 with it), and the
watchdog that makes sure none hangs silently."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from rose_ray.errors import first_line


class RoleFailed(RuntimeError):
    """A role of the run (student or teacher engine, learner) failed for good; names it."""


class Stalled(RoleFailed):
    """No learner step and no finished episode for two watchdog periods."""


class Watchdog:
    """Progress is a learner step or a finished episode (`progress()`). After `period_s` without
    any, `run()` prints `report()`; after a second period it raises Stalled with the report.
    While `busy()` (a role being replaced) the clock does not run."""

    def __init__(self, period_s: float, report: Callable[[], Awaitable[str]],
                 busy: Callable[[], bool]) -> None:
        self.period_s, self.report, self.busy = period_s, report, busy
        self.last = time.monotonic()

    def progress(self) -> None:
        self.last = time.monotonic()

    async def run(self) -> None:
        warned_at: float | None = None  # the progress mark the warning was about
        while True:
            await asyncio.sleep(min(self.period_s / 4, 5.0))
            if self.busy():
                self.progress()
            idle = time.monotonic() - self.last
            if idle < self.period_s:
                warned_at = None
                continue
            if warned_at != self.last:
                warned_at = self.last
                print(f"\ntrain: watchdog: no learner step and no finished episode for {idle:.0f} s "
                      f"(reliability.watchdog_s {self.period_s:g}); waiting:\n  {await self.report()}",
                      flush=True)
            elif idle >= 2 * self.period_s:
                raise Stalled(f"no learner step and no finished episode for {idle:.0f} s "
                              f"(2 x reliability.watchdog_s {self.period_s:g}); waiting:\n  {await self.report()}")


def describe_error(error: BaseException | None) -> str:
    """`Type: first line` of what went wrong: a Ray task error's cause (what the actor raised)."""
    if error is None:
        return "unknown cause"
    return first_line(getattr(error, "cause", None) or error, named=True)
