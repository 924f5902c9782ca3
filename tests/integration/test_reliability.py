"""The half of tests/unit/test_reliability.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from rose_ray.inference.engine import EngineConfig
from rose_ray.reliability import RoleFailed
from tests.unit.test_reliability import until


# --------------------------------------------------------------------------- engines alone
def test_the_supervisor_replaces_a_killed_engine_then_gives_up_past_max_restarts(tiny_models, ray_cluster):
    from rose_ray.inference.engine import GenerationRequest
    from rose_ray.rollout.actors import start_agents, stop_agents
    from rose_ray.rollout.supervisor import EngineSupervisor
    from rose_ray.types import SamplingParams

    config = EngineConfig(model=str(tiny_models["student"]), dtype="float32", threads=1, context_tokens=512)
    agent, _ = start_agents(config, None, student_cpus=0.25)
    started, failed = [], []

    async def on_start(role, handle):
        started.append((role, handle))

    sup = EngineSupervisor(max_restarts=1, health_every_s=0.5, health_timeout_s=10, start_timeout_s=120,
                           on_start=on_start, on_failed=failed.append)
    sup.watch("student engine", agent)
    prompt = agent.chat.opening_ids([("user", "hello"), ("assistant", "OK")]) + agent.chat.user_ids("a door")
    request = GenerationRequest(prompt, SamplingParams(0.0, 1.0, 4))

    async def main():
        monitor = asyncio.create_task(sup.monitor())
        first = agent.engine
        pid = (await first.health.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        await until("a replacement", lambda: agent.engine is not first, 120)
        assert started == [("student engine", agent.engine)]  # on_start ran before it served
        assert (await agent.engine.generate.remote(request)).token_ids
        assert sup.role_of(await_error(first)) == "student engine"  # the old actor's errors are known
        second = agent.engine
        os.kill((await second.health.remote())["pid"], signal.SIGKILL)
        await until("giving up", lambda: sup.failed is not None, 120)
        monitor.cancel()
        with pytest.raises(RoleFailed, match="student engine: lost 2 times, more than reliability.max_restarts=1"):
            await sup.recover("student engine", handle=second)

    def await_error(handle):
        import ray

        try:
            ray.get(handle.health.remote(), timeout=30)
        except ray.exceptions.RayActorError as e:
            return e
        raise AssertionError("a killed engine answered")

    try:
        asyncio.run(main())
    finally:
        stop_agents(agent)
    assert failed == [sup.failed]
