"""A coroutine run to its end from synchronous code, also inside a running event loop (a
notebook's cells), where `asyncio.run` refuses to start."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(make: Callable[[], Coroutine[Any, Any, T]], stop: Callable[[], None] | None = None) -> T:
    """`asyncio.run(make())`; inside a running event loop, the same in a thread of its own.
    There the first Ctrl-C calls `stop` in the loop (default: cancel the coroutine, then raise
    KeyboardInterrupt), a second one raises KeyboardInterrupt at once."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    started, done = Future(), Future()  # (its loop, its task) once it runs; its result

    async def main() -> T:
        started.set_result((asyncio.get_running_loop(), asyncio.current_task()))
        return await make()

    def target() -> None:
        try:
            done.set_result(asyncio.run(main()))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread as it was
            done.set_exception(e)

    # While this thread waits, a Ctrl-C is a KeyboardInterrupt here, whatever handler the host's
    # loop set (asyncio.run's own would only cancel the host's task, which is not awaiting).
    host_handler = signal.signal(signal.SIGINT, signal.default_int_handler) if \
        threading.current_thread() is threading.main_thread() else None
    thread = threading.Thread(target=target, name="rose_ray event loop", daemon=True)
    interrupted = begun = False
    try:
        while not done.done():
            try:
                if not begun:  # start() waits for the thread: a Ctrl-C may land there too
                    begun = True
                    thread.start()
                # Not thread.join: a KeyboardInterrupt inside it can mark a live thread as ended
                # (CPython 3.11's _wait_for_tstate_lock).
                wait([done], 0.1)
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted = True
                wait([started, done], return_when=FIRST_COMPLETED)
                if started.done():
                    loop, task = started.result()
                    try:
                        loop.call_soon_threadsafe(stop or task.cancel)
                    except RuntimeError:  # it ended meanwhile (its loop closed)
                        pass
    finally:
        if host_handler is not None:
            signal.signal(signal.SIGINT, host_handler)
    if interrupted and isinstance(done.exception(), asyncio.CancelledError):
        raise KeyboardInterrupt
    return done.result()
