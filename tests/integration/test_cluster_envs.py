"""Env workers on a simulated cluster: they land on the CPU nodes carrying the custom resource
and spread over them, two pools share the games (bench/env_scaling.py times them), and losing a
node brings its workers back on another node while the runner restarts the interrupted episodes
(none lost, none duplicated). Episodes are scripted (fixed actions, a fixed "model" delay): no model."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from rose_ray.envs.config import EnvConfig
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.rollout.actors import close_pools, start_env_pools
from rose_ray.rollout.episode import EnvSlot
from rose_ray.rollout.runner import EpisodeRunner
from rose_ray.types import GameId, Trajectory
from tests.conftest import launch_module

BENCH = launch_module("env_scaling", folder="bench")  # its scripted episode
ACTIONS, scripted = BENCH.ACTIONS, BENCH.scripted


@pytest.fixture(scope="module")
def cluster(env_node_cluster):
    """Two env pools on the cluster's env nodes (conftest.env_node_cluster)."""
    c, env_nodes = env_node_cluster
    import ray

    config = EnvConfig(workers=2, games_per_worker=2, cpus_per_worker=0.5, resources={"env_node": 1},
                       call_timeout_s=30)
    pools = start_env_pools(config, max_turns=len(ACTIONS))
    try:
        ray.get([p.num_games.remote() for p in pools], timeout=120)
        yield c, env_nodes, pools
    finally:
        close_pools(pools)


def actor_node(handle) -> str:
    from ray._private.state import actors  # the GCS actor table: no dashboard needed

    return actors(handle._actor_id.hex())["Address"]["NodeID"]


def games(n: int) -> list[GameId]:
    return SciWorldCatalogue("agentgym").split("train")[:n]


async def play_all(runner: EpisodeRunner, todo: list[GameId]) -> list[Trajectory]:
    return await asyncio.gather(*(runner.play(g, scripted) for g in todo))


def test_env_workers_land_on_the_env_nodes_and_spread(cluster):
    c, env_nodes, pools = cluster
    where = [actor_node(p) for p in pools]
    assert set(where) == {n.node_id for n in env_nodes}, "one pool on each env node"
    assert c.head_node.node_id not in where


def test_both_pools_share_the_games_and_each_is_played_once(cluster):
    """How many more episodes per second the second pool gives is measured by
    bench/env_scaling.py (a timing, not a test: on a loaded machine it is noise)."""
    _, _, pools = cluster
    todo = games(8)
    served: Counter[int] = Counter()

    async def counted(game: GameId, slot: EnvSlot) -> Trajectory:
        served[slot.pool_index] += 1
        return await scripted(game, slot)

    async def play_counted() -> list[Trajectory]:
        return await asyncio.gather(*(runner.play(g, counted) for g in todo))

    runner = EpisodeRunner(pools, games_per_pool=2)
    done = asyncio.run(play_counted())
    assert sorted(t.game.item_id for t in done) == sorted(g.item_id for g in todo)
    assert set(served) == {0, 1}, f"episodes per pool: {dict(served)}"
    assert runner.counters.finished == len(todo) == runner.counters.started


@pytest.mark.slow
def test_losing_a_node_restarts_its_workers_and_episodes(cluster):
    c, env_nodes, pools = cluster
    todo = games(12)
    runner = EpisodeRunner(pools, games_per_pool=2, max_retries=6)
    lost = next(n for n in env_nodes if n.node_id == actor_node(pools[1]))

    async def run() -> list[Trajectory]:
        task = asyncio.ensure_future(play_all(runner, todo))
        while runner.counters.finished < 2:  # mid-run: some done, four in flight
            await asyncio.sleep(0.05)
        await asyncio.to_thread(c.remove_node, lost)
        return await task

    done = asyncio.run(run())
    finished = Counter(t.game.item_id for t in done)
    assert finished == Counter(g.item_id for g in todo), "every game finished exactly once"
    assert runner.counters.restarts > 0 and runner.counters.failed == 0
    assert runner.counters.finished == len(todo) == runner.counters.started
    survivor = next(n for n in env_nodes if n is not lost).node_id
    assert [actor_node(p) for p in pools] == [survivor, survivor], "the lost node's pool came back elsewhere"
