"""A coroutine run to its end from synchronous code, also inside a running event loop (a
notebook's cells), where `asyncio.run` refuses to start."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine
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
    ran: dict[str, Any] = {}
    started, finished = threading.Event(), threading.Event()

    async def main() -> T:
        ran["loop"], ran["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await make()

    def target() -> None:
        try:
            ran["value"] = asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread as it was
            ran["error"] = e
        finally:
            started.set()
            finished.set()

    # While this thread waits, a Ctrl-C is a KeyboardInterrupt here, whatever handler the host's
    # loop set (asyncio.run's own would only cancel the host's task, which is not awaiting).
    host_handler = signal.signal(signal.SIGINT, signal.default_int_handler) if \
        threading.current_thread() is threading.main_thread() else None
    thread = threading.Thread(target=target, name="rose_ray event loop", daemon=True)
    interrupted = begun = False
    try:
        while True:
            try:
                if not begun:  # start() waits for the thread: a Ctrl-C may land there too
                    begun = True
                    thread.start()
                # Not thread.join: a KeyboardInterrupt inside it can mark a live thread as ended
                # (CPython 3.11's _wait_for_tstate_lock).
                if finished.wait(0.1):
                    break
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted = True
                started.wait()
                try:
                    ran["loop"].call_soon_threadsafe(stop or ran["task"].cancel)
                except (KeyError, RuntimeError):  # it ended meanwhile (its loop closed)
                    pass
    finally:
        if host_handler is not None:
            signal.signal(signal.SIGINT, host_handler)
    if isinstance(ran.get("error"), asyncio.CancelledError) and interrupted:
        raise KeyboardInterrupt
    if "error" in ran:
        raise ran["error"]
    return ran["value"]
