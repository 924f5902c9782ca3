"""Benchmark: more env workers play more episodes per second (a simulated two-node cluster).

    python bench/env_scaling.py [--rounds 3] [--games 8]

A Ray cluster made with `ray.cluster_utils.Cluster` on this machine: a head node and two CPU
nodes carrying the `env_node` resource env workers ask for, one EnvPool on each (2 games per
pool). Episodes are scripted (fixed actions and a fixed think time standing in for the model's
turn), so they are bound by env slots, as in training. Each round times the same games played
through one pool, then through both, interleaved so a noisy machine hurts both alike.

The bound: both pools have twice the slots of one, so at most 2x one pool's rate; the table
gives the ratio measured, that bound and the fraction of it reached (target: ratio >= 1.3).
Prints a table and writes bench/results/env_scaling.json (the latest; each run keeps its own
copy in bench/results/env_scaling/version_N/). Not a test: tests/integration/test_cluster_envs.py
checks that both pools share the games and each is played once.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

from rose_ray.envs.config import EnvConfig
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.rollout.actors import close_pools, start_env_pools
from rose_ray.rollout.episode import EnvSlot, EpisodeInterrupted
from rose_ray.rollout.runner import EpisodeRunner
from rose_ray.runs import keep_result
from rose_ray.types import GameId, Trajectory

RESULTS = Path(__file__).resolve().parent / "results" / "env_scaling.json"
ACTIONS = ["look around", "inventory", "look around", "inventory"]
THINK_S = 0.15  # stands in for the model's turn
GAMES_PER_POOL = 2
TARGET = 1.3


async def scripted(game: GameId, slot: EnvSlot) -> Trajectory:
    """Reset, then fixed actions with a fixed think time; an interrupted step restarts it."""
    await slot.call("reset", game)
    result = None
    for action in ACTIONS:
        await asyncio.sleep(THINK_S)
        result = await slot.call("step", action)
        if result.interrupted:
            raise EpisodeInterrupted(f"episode on {game.item_id} interrupted: the game's JVM died")
        if result.done:
            break
    return Trajectory(game=game, turns=[], raw_score=result.raw_score, done=True)


def episodes_per_second(pools: list, todo: list[GameId]) -> float:
    runner = EpisodeRunner(pools, games_per_pool=GAMES_PER_POOL)

    async def play_all() -> list[Trajectory]:
        return await asyncio.gather(*(runner.play(g, scripted) for g in todo))

    start = time.perf_counter()
    done = asyncio.run(play_all())
    if sorted(t.game.item_id for t in done) != sorted(g.item_id for g in todo):
        raise RuntimeError("a game was lost or played twice")
    return len(done) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds, each one pool then both (default 3)")
    ap.add_argument("--games", type=int, default=8, help="episodes per timed pass (default 8)")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    t_start = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    pools = []
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2, resources={"env_node": 10})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        config = EnvConfig(workers=2, games_per_worker=GAMES_PER_POOL, cpus_per_worker=0.5,
                           resources={"env_node": 1}, call_timeout_s=30)
        pools = start_env_pools(config, max_turns=len(ACTIONS))
        ray.get([p.num_games.remote() for p in pools], timeout=120)
        todo = SciWorldCatalogue("agentgym").split("train")[:args.games]
        episodes_per_second(pools, todo)  # warm: the first load of each JVM is slow
        one, two = [], []
        for r in range(args.rounds):
            one.append(episodes_per_second(pools[:1], todo))
            two.append(episodes_per_second(pools, todo))
            print(f"round {r + 1}: 1 pool {one[-1]:.2f} episodes/s, 2 pools {two[-1]:.2f}", flush=True)
    finally:
        close_pools(pools)
        ray.shutdown()
        cluster.shutdown()
    ratio = statistics.median(two) / statistics.median(one)
    out = {
        "bench": "env_scaling",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": platform.machine(), "cpus_usable": len(os.sched_getaffinity(0)),
        "games_per_pass": args.games, "games_per_pool": GAMES_PER_POOL, "think_s": THINK_S,
        "one_pool_episodes_per_s": one, "two_pools_episodes_per_s": two,
        "ratio_of_medians": round(ratio, 3), "bound": 2.0, "fraction_of_bound": round(ratio / 2.0, 3),
        "target_ratio": TARGET, "meets_target": ratio >= TARGET,
        "load_average_at_end": [round(x, 1) for x in os.getloadavg()],  # the machine is shared
        "elapsed_s": round(time.perf_counter() - t_start, 1),
    }
    kept = keep_result(RESULTS, json.dumps(out, indent=2) + "\n")
    print(f"\n{'pools':>5} {'episodes/s (median)':>20}")
    print(f"{1:>5} {statistics.median(one):>20.2f}\n{2:>5} {statistics.median(two):>20.2f}")
    print(f"ratio {ratio:.2f} (bound 2.00: {ratio / 2:.0%} of it; target >= {TARGET}: "
          f"{'met' if ratio >= TARGET else 'NOT met'}); load average at end {out['load_average_at_end']}")
    print(f"wrote {RESULTS} (and {kept}); {out['elapsed_s']} s")


if __name__ == "__main__":
    main()
