"""The half of tests/unit/rollout/test_eval_seeds.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import asyncio

from rose_ray.types import SamplingParams


class _Seeds:
    """A real engine actor whose requests' (request id, seed) are kept on their way to it."""

    def __init__(self, actor, log: list) -> None:
        outer = self

        class _Generate:
            def remote(self, request):
                log.append((request.request_id, request.sampling.seed))
                return outer.actor.generate.remote(request)

        self.actor, self.generate = actor, _Generate()


def test_an_episode_sends_each_turn_its_own_seed(tiny_models, ray_cluster):
    """A real episode (tiny student, ScienceWorld) at temperature 1 with seed 3: each request
    carries the seed derived for its game and turn."""
    from dataclasses import replace

    from rose_ray.envs.config import EnvConfig
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.envs.sciworld.protocol import PROTOCOL
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.rollout.actors import close_pools, start_agents, start_env_pools, stop_agents
    from rose_ray.rollout.episode import EnvSlot, EpisodeConfig, run_episode
    from rose_ray.rollout.handoff import turn_policy

    pools = start_env_pools(EnvConfig(games_per_worker=1, cpus_per_worker=0.25), max_turns=3)
    student, _ = start_agents(EngineConfig(model=str(tiny_models["student"]), context_tokens=2048, dtype="float32"),
                              None, student_cpus=0.25)
    log: list = []
    game = SciWorldCatalogue().find("find-plant", 100)
    sampling = SamplingParams(1.0, 1.0, 8, seed=3)
    try:
        config = EpisodeConfig(max_turns=3, student_sampling=sampling, report="off")
        traj = asyncio.run(run_episode(game, EnvSlot(pools[0], 0), replace(student, engine=_Seeds(student.engine, log)),
                                       None, config, turn_policy("none"), protocol=PROTOCOL))
    finally:
        close_pools(pools)
        stop_agents(student)
    assert traj.rounds == len(log) >= 2
    assert [seed for _, seed in log] == [sampling.for_turn(game.item_id, t).seed for t in range(1, len(log) + 1)]
    assert len({seed for _, seed in log}) == len(log)
