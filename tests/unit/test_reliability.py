"""Every role's loss, on a real local Ray cluster: engines killed (SIGKILL) or hung (SIGSTOP) are
replaced and their episodes replayed; a killed learner rank sends the group back to the latest
checkpoint; a hung env pool trips the watchdog (report, checkpoint, exit); a teacher server that
goes away for good stops the run naming the role; and a run killed between checkpoints, then resumed,
gives every sampled game exactly one outcome. Nothing here is faked: processes are stopped or
killed with signals, an absent server is a closed port."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from rose_ray.reliability import RoleFailed, Stalled, Watchdog


def read_jsonl(path: Path, partial_ok: bool = False) -> list[dict]:
    """Records of a JSONL file; with partial_ok, a last line still being written is left out."""
    lines = path.read_text().split("\n")
    if partial_ok:
        lines = lines[:-1]  # after the last newline: nothing, or a line not finished yet
    return [json.loads(line) for line in lines if line.strip()]


async def until(what: str, cond, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


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


