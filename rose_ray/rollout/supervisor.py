"""The engine supervisor: a dead or hung student or teacher engine is replaced on its placement
(engines have no Ray restarts: a replacement must get the learner's weights before it serves).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rose_ray.reliability import RoleFailed, describe_error
from rose_ray.rollout.agent import Agent


@dataclass
class _Watched:
    role: str
    agent: Agent
    restarts: int = 0
    ready: Any = None  # the handle known to have loaded its model
    ids: set[str] = field(default_factory=set)  # actor ids of this role's engines, past and present
    restarting: asyncio.Task | None = None


def actor_id(handle: Any) -> str:
    return handle._actor_id.hex()


class EngineSupervisor:
    """Keeps the engine actors serving. An engine is lost when a call fails because its actor
    died (or its server stayed away), or when a health ping fails, goes unanswered for
    `health_timeout_s`, or finds calls waiting that long with none finishing. Then `agent.spawn`
    starts a replacement on the same placement and `on_start(role, handle)` runs before episodes
    see it (the student gets the learner's weights). A role lost more than `max_restarts` times
    has failed: `failed` holds a RoleFailed and `on_failed` is called once."""

    def __init__(self, max_restarts: int = 3, health_every_s: float = 10.0, health_timeout_s: float = 120.0,
                 start_timeout_s: float = 1800.0,
                 on_start: Callable[[str, Any], Awaitable[None]] | None = None,
                 on_failed: Callable[[RoleFailed], None] | None = None) -> None:
        self.max_restarts, self.health_every_s = max_restarts, health_every_s
        self.health_timeout_s, self.start_timeout_s = health_timeout_s, start_timeout_s
        self.on_start, self.on_failed = on_start, on_failed
        self.watched: dict[str, _Watched] = {}
        self.failed: RoleFailed | None = None

    def watch(self, role: str, agent: Agent | None) -> None:
        """Supervise `agent`'s engine as `role` (an agent serving two roles is watched once)."""
        if agent is None or any(w.agent is agent for w in self.watched.values()):
            return
        self.watched[role] = _Watched(role, agent, ids={actor_id(agent.engine)})

    def restarts(self) -> dict[str, int]:
        return {role: w.restarts for role, w in self.watched.items()}

    def replacing(self) -> bool:
        return any(w.restarting is not None for w in self.watched.values())

    def role_of(self, error: BaseException) -> str | None:
        """The role whose engine (present or past) this error reports lost, else None."""
        import ray

        from rose_ray.inference.openai import OpenAIServerGone

        return self.whose(error) if isinstance(error, (ray.exceptions.RayActorError, OpenAIServerGone)) else None

    def whose(self, error: BaseException) -> str | None:
        """The role whose engine (present or past) raised `error`, when it names its actor."""
        actor = getattr(error, "actor_id", None)
        return next((w.role for w in self.watched.values() if actor is not None and actor in w.ids), None)

    async def recover(self, role: str, error: BaseException | None = None, handle: Any = None) -> None:
        """Return once `role` has an engine serving that is not the lost one (named by `error`,
        or `handle`), starting its replacement if nobody has. Raises RoleFailed."""
        w = self.watched[role]
        if self.failed is not None:
            raise self.failed
        lost = actor_id(handle) if handle is not None else getattr(error, "actor_id", None)
        if w.restarting is None and lost == actor_id(w.agent.engine):
            w.restarting = asyncio.get_running_loop().create_task(self._replace(w, error))
        if w.restarting is not None:
            await asyncio.shield(w.restarting)

    async def lost(self, role: str, handle: Any) -> bool:
        """Whether `role`'s engine `handle` is gone (then it is replaced before this returns)."""
        try:
            await asyncio.wait_for(handle.health.remote(), self.health_timeout_s)
            return False
        except Exception as e:  # noqa: BLE001 - dead, or no answer: either way not serving
            await self.recover(role, e, handle)
            return True

    async def _replace(self, w: _Watched, cause: BaseException | None) -> None:
        import ray

        try:
            while True:
                w.restarts += 1
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(w.agent.engine)  # a hung engine goes too, whatever comes next
                if w.restarts > self.max_restarts:
                    if self.failed is None:
                        self.failed = RoleFailed(
                            f"{w.role}: lost {w.restarts} times, more than reliability.max_restarts="
                            f"{self.max_restarts}; the last time: {describe_error(cause)}")
                        if self.on_failed is not None:
                            self.on_failed(self.failed)
                    raise self.failed
                print(f"\ntrain: {w.role} lost ({describe_error(cause)}); starting a replacement "
                      f"({w.restarts}/{self.max_restarts})", flush=True)
                t0 = time.monotonic()
                new = w.agent.spawn(w.restarts)
                w.ids.add(actor_id(new))
                try:
                    await asyncio.wait_for(new.ready.remote(), self.start_timeout_s)
                    if self.on_start is not None:  # bounded: a replacement that hangs here is lost too
                        await asyncio.wait_for(self.on_start(w.role, new), self.start_timeout_s)
                except asyncio.CancelledError:  # the run is ending: leave no engine behind
                    ray.kill(new)
                    raise
                except Exception as e:  # noqa: BLE001 - a replacement that cannot start is lost too
                    w.agent.engine, cause = new, e
                    continue
                w.agent.engine, w.ready = new, new
                print(f"train: {w.role} replaced in {time.monotonic() - t0:.1f} s", flush=True)
                return
        finally:
            w.restarting = None

    async def monitor(self) -> None:
        """Ping every engine every `health_every_s` (a task for the run's life)."""
        async def watch(w: _Watched) -> None:
            while self.failed is None:
                if w.restarting is None:
                    await self._check(w)
                await asyncio.sleep(self.health_every_s)

        await asyncio.gather(*(watch(w) for w in self.watched.values()))

    async def _check(self, w: _Watched) -> None:
        handle = w.agent.engine
        try:
            if w.ready is not handle:  # a new engine first loads its model
                await asyncio.wait_for(handle.ready.remote(), self.start_timeout_s)
                w.ready = handle
            h = await asyncio.wait_for(handle.health.remote(), self.health_timeout_s)
        except asyncio.TimeoutError:
            cause: BaseException = TimeoutError(f"no answer to a health ping within {self.health_timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - a dead actor
            cause = e
        else:
            if h["stalled_s"] <= self.health_timeout_s:
                return
            cause = TimeoutError(f"{h['in_flight']} calls waiting, none finished for {h['stalled_s']:.0f} s")
        try:
            await self.recover(w.role, cause, handle)
        except RoleFailed:
            pass  # on_failed has told the run

    async def describe(self, timeout_s: float = 5.0) -> list[str]:
        """One line per engine: does it answer, what waits on it (for the watchdog)."""
        async def one(w: _Watched) -> str:
            if w.restarting is not None:
                return f"{w.role}: being replaced ({w.restarts}/{self.max_restarts})"
            try:
                h = await asyncio.wait_for(w.agent.engine.health.remote(), timeout_s)
            except Exception as e:  # noqa: BLE001
                return f"{w.role}: no answer to a ping within {timeout_s:g} s ({type(e).__name__})"
            waiting = (f"{h['in_flight']} calls in flight, none finished for {h['stalled_s']:.0f} s"
                       if h["in_flight"] else "no calls in flight")
            return f"{w.role}: answers (version {h['version']}, {waiting})"

        return list(await asyncio.gather(*(one(w) for w in self.watched.values())))
