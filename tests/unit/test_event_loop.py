"""A coroutine run to its end from synchronous code (rose_ray/event_loop.py: run_coroutine), which
`rose_ray.train` and `rose_ray.evaluate` use: outside an event loop it is asyncio.run; inside a
running one (a notebook's cell) asyncio.run refuses, so it runs on a loop of its own in a thread,
and a Ctrl-C (the notebook's interrupt, simulated with _thread.interrupt_main) stops it there.
The whole run and eval called from a running loop: tests/e2e/test_train.py."""

from __future__ import annotations

import _thread
import asyncio
import threading

import pytest

from rose_ray.event_loop import run_coroutine


def test_outside_an_event_loop_it_is_asyncio_run():
    async def job():
        return threading.current_thread() is threading.main_thread()

    assert run_coroutine(job) is True


def test_inside_a_running_loop_it_runs_on_a_loop_of_its_own():
    async def job():
        await asyncio.sleep(0.01)
        return threading.current_thread().name, asyncio.get_running_loop()

    async def notebook_cell():
        refused = job()
        with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
            asyncio.run(refused)  # what train and eval did
        refused.close()
        return asyncio.get_running_loop(), run_coroutine(job)

    outer, (thread, inner) = asyncio.run(notebook_cell())
    assert thread == "rose_ray event loop" and inner is not outer


def test_an_error_in_it_reaches_the_caller():
    async def job():
        raise ValueError("turn 3 has 2 logprobs for 5 token ids")

    async def notebook_cell():
        return run_coroutine(job)

    with pytest.raises(ValueError, match="turn 3 has 2 logprobs"):
        asyncio.run(notebook_cell())


def test_an_interrupt_in_a_notebook_calls_stop_in_its_loop():
    """train passes its graceful stop (Ctrl-C's: the step in progress, a checkpoint, then the end)."""
    box = {}

    async def job():
        box["stop"] = asyncio.Event()
        _thread.interrupt_main()  # the notebook's interrupt lands on the waiting (main) thread
        await asyncio.wait_for(box["stop"].wait(), 60)
        return "stopped after the step"

    async def notebook_cell():
        return run_coroutine(job, stop=lambda: box["stop"].set())

    assert asyncio.run(notebook_cell()) == "stopped after the step"


def test_an_interrupt_without_a_stop_cancels_it_and_raises():
    ended = threading.Event()

    async def job():
        try:
            _thread.interrupt_main()
            await asyncio.sleep(60)  # cancelled long before
        finally:
            ended.set()

    async def notebook_cell():
        run_coroutine(job)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(notebook_cell())
    assert ended.is_set()  # cancelled and finished before the interrupt was raised
