"""Held-out evaluation throughput: episodes/s of the tiny student at 1, 4, 8 concurrent episodes.

The same games are played greedily at every concurrency level, through rose_ray's own
pieces in one Ray session: `start_env_pools` (one pool, `games_per_worker` = concurrency),
`start_agents` (one student EngineActor, shared by all levels), `EpisodeRunner`, and `play`
on them (rose_ray/rollout/play.py, as `rose-ray eval` plays; each episode keeps its timing).

Only the episodes are timed. Before the clock starts: actor and JVM start-up, one engine
call, and a JVM warm-up in which every env slot plays `--warmup-games` scripted train games.
A held-out eval of 200 games runs on JVMs that compiled their hot paths after their first
few games; without the warm-up a 16-game level at 8 concurrent would time mostly the JIT
compilers of 8 fresh JVMs (`--warmup-games 0` measures that cold start). Each level is run
`--repeat` times on its warm pool and reported by its median run; `cores busy` is the
whole machine's CPU use during the run, so a level that saturates the machine shows it.

    python bench/eval.py            # 16 test games, 6 turns, 32 new tokens, 1/4/8 concurrent,
                                    # batcher max_wait_ms 5 (the default) and 50, 3 runs each
    python bench/eval.py --quick    # a short smoke run

Prints a table and writes bench/results/eval.json (the latest; each run keeps its own copy in
bench/results/eval/version_N/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from rose_ray.runs import keep_result

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results"


def engine_counters(engine: Any) -> dict[str, float]:
    import ray

    stats = ray.get(engine.stats.remote())
    keys = ("requests", "batches", "generated_tokens", "prompt_tokens", "prompt_tokens_fed", "prefix_hits",
            "busy_s", "queue_wait_s")
    return {k: stats.get(k, 0) for k in keys}


def cpu_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (from /proc/stat), so a
    level's busy cores = the difference over its wall time."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_level(concurrency: int, games: list, student: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Play `games` with `concurrency` episodes at once, `args.repeat` times on the same warm
    pool; only the episodes are timed. The row is the median run's, with every run's rate."""
    import ray

    from rose_ray.envs.config import EnvConfig
    from rose_ray.rollout.actors import close_pools, start_env_pools
    from rose_ray.rollout.runner import EpisodeRunner

    env_cfg = EnvConfig(workers=1, games_per_worker=concurrency, cpus_per_worker=args.env_cpus)
    pools = start_env_pools(env_cfg, max_turns=args.max_turns)
    try:
        # Warm-up, untimed: the pool's JVMs are up once it answers; then every slot plays
        # scripted games so its JVM has compiled its hot paths.
        ray.get([p.num_games.remote() for p in pools])
        ray.get([p.reset.remote(s, games[s % len(games)]) for p in pools for s in range(concurrency)])
        warm_up_jvms(pools, concurrency, args.warmup_games, args.max_turns)
        # One runner per run: its slot queue belongs to that run's event loop.
        runs = [timed_run(EpisodeRunner(pools, env_cfg.games_per_worker), games, student, args)
                for _ in range(args.repeat)]
    finally:
        close_pools(pools)
    runs.sort(key=lambda r: r["episodes_per_s"])
    return {"concurrency": concurrency, **runs[len(runs) // 2],
            "runs": [{k: v for k, v in r.items() if k != "item_turns"} for r in runs]}


def timed_run(runner: Any, games: list, student: Any, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from rose_ray.evaluate import game_record
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.rollout.play import Players, PlaySpec, play
    from rose_ray.types import SamplingParams

    # As `rose-ray eval` plays (greedy, no report question); the players are this bench's own.
    spec = PlaySpec(student=EngineConfig(model=student.name), max_turns=args.max_turns,
                    student_sampling=SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens))
    # Every run starts cold: the same games in the last run left their prefixes cached.
    ray.get(student.engine.__ray_call__.remote(lambda self: self.engine.clear_prefix_cache()))
    before = engine_counters(student.engine)
    busy0, t0 = cpu_busy_seconds(), time.perf_counter()
    trajectories = asyncio.run(play(spec, games, players=Players(runner, student, None), request_prefix="eval/"))
    seconds = time.perf_counter() - t0
    busy = cpu_busy_seconds() - busy0
    after = engine_counters(student.engine)
    delta = {k: after[k] - before[k] for k in after}
    records = [game_record(t) for t in trajectories]
    turns = sum(r["turns"] for r in records)
    return {
        "episodes": len(records), "seconds": seconds,
        "episodes_per_s": len(records) / seconds,
        "cores_busy": busy / seconds,  # the whole machine's, other work included
        "turns": turns,
        # Per turn, as the episodes saw it: awaiting the engine (queue + batch) and the env step.
        "generate_ms_per_turn": 1000 * sum(t.timing["student_s"] for t in trajectories) / turns,
        "env_ms_per_turn": 1000 * sum(t.timing["env_s"] for t in trajectories) / turns,
        "engine_requests": int(delta["requests"]), "engine_batches": int(delta["batches"]),
        "mean_engine_batch": delta["requests"] / max(delta["batches"], 1),
        "generated_tokens": int(delta["generated_tokens"]),
        "prompt_tokens": int(delta["prompt_tokens"]), "prompt_tokens_fed": int(delta["prompt_tokens_fed"]),
        "prefix_hits": int(delta["prefix_hits"]),
        "engine_busy_s": delta["busy_s"], "queue_wait_s": delta["queue_wait_s"],
        "score": sum(r["score"] for r in records) / len(records),
        "restarts": runner.counters.restarts,
        "item_turns": {r["item_id"]: r["turns"] for r in records},
    }


WARMUP_ACTIONS = ("look around", "inventory", "open door to kitchen", "go to kitchen", "focus on banana",
                  "Thought: I should look. Action: look around", "xyzzy")


def warm_up_jvms(pools: list, slots: int, games_per_slot: int, max_turns: int) -> None:
    """Untimed: each slot plays `games_per_slot` train games with scripted actions, so every JVM
    has JIT-compiled its load and step paths before the clock starts (a long eval's JVMs are
    warm after their first few games; a 16-game level would otherwise time mostly JIT work)."""
    import ray

    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue

    warm = SciWorldCatalogue("agentgym").sample("train", max(1, games_per_slot * slots), seed=1)
    for n in range(games_per_slot):
        ray.get([p.reset.remote(s, warm[(n * slots + s) % len(warm)]) for p in pools for s in range(slots)])
        for a in range(max_turns):
            ray.get([p.step.remote(s, WARMUP_ACTIONS[a % len(WARMUP_ACTIONS)]) for p in pools for s in range(slots)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 4 games, 3 turns, 1 and 4 concurrent")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help="levels (default 1 4 8)")
    p.add_argument("--games", type=int, default=None, help="held-out games (default 16)")
    p.add_argument("--split", default="test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-turns", type=int, default=None, help="default 6")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--engine-cpus", type=float, default=1.0,
                   help="Ray CPUs of the student engine (torch threads = max(1, int(cpus)))")
    p.add_argument("--env-cpus", type=float, default=0.5)
    p.add_argument("--max-wait-ms", type=float, nargs="+", default=None,
                   help="engine batcher: how long a batch waits to fill (EngineConfig.max_wait_ms); "
                        "several values: one engine and one set of levels each (default 5 50; --quick 5)")
    p.add_argument("--prefix-cache-mb", type=float, default=1024.0,
                   help="engine prefix KV cache budget (the hf engine's prefix_cache_mb; 0 disables)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="engine batch cap (EngineConfig.max_batch_size; default: the highest level)")
    p.add_argument("--warmup-games", type=int, default=None,
                   help="untimed scripted games per env slot before each level (default 16; --quick 2; "
                        "0: cold JVMs)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per level, median reported "
                   "(default 3; --quick 1)")
    p.add_argument("--models", default="~/.cache/rose_ray/tiny", help="where init_tiny builds/reuses")
    p.add_argument("--out", default=str(RESULTS / "eval.json"))
    args = p.parse_args()
    levels = args.concurrency or ([1, 4] if args.quick else [1, 4, 8])
    n_games = args.games or (4 if args.quick else 16)
    args.max_turns = args.max_turns or (3 if args.quick else 6)
    args.max_wait_ms = args.max_wait_ms or ([5.0] if args.quick else [5.0, 50.0])
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.warmup_games is None:
        args.warmup_games = 2 if args.quick else 16
    if min(levels) < 1 or n_games < 1 or args.max_turns < 1 or args.repeat < 1 or args.warmup_games < 0:
        p.error("--concurrency, --games, --max-turns and --repeat must be >= 1, --warmup-games >= 0")

    import ray

    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.inference.engine import EngineConfig, GenerationRequest
    from rose_ray.provision.tiny import init_tiny
    from rose_ray.rollout.actors import init_ray, start_agents
    from rose_ray.types import SamplingParams

    load_start = os.getloadavg()
    model = init_tiny(Path(args.models).expanduser())["student"]
    games = SciWorldCatalogue("agentgym").sample(args.split, n_games, args.seed)
    init_ray()
    rows = []
    for wait_ms in args.max_wait_ms:
        engine_cfg = EngineConfig.of("hf", model=str(model), dtype=args.dtype, context_tokens=2048,
                                  max_batch_size=args.max_batch_size or max(levels), max_wait_ms=wait_ms,
                                  prefix_cache_mb=args.prefix_cache_mb)
        student, _ = start_agents(engine_cfg, None, student_cpus=args.engine_cpus)
        # Engine warm-up, untimed: model load and the first forward's allocations.
        warm = GenerationRequest(student.chat.opening_ids([("user", "warm up"), ("assistant", "OK")]),
                                 SamplingParams(temperature=0.0, max_new_tokens=4))
        ray.get(student.engine.generate.remote(warm))
        threads = ray.get(student.engine.__ray_call__.remote(
            lambda self: __import__("torch").get_num_threads()))
        group = []
        for c in levels:
            row = {"max_wait_ms": wait_ms, **run_level(c, games, student, args)}
            group.append(row)
            print(f"  max_wait_ms {wait_ms:g}, concurrency {c}: {row['episodes']} episodes, runs at "
                  + ", ".join(f"{x['episodes_per_s']:.3f}" for x in row["runs"]) + " episodes/s", flush=True)
        ray.kill(student.engine)
        base = next((r for r in group if r["concurrency"] == 1), group[0])
        for r in group:
            r["speedup_vs_1"] = r["episodes_per_s"] / base["episodes_per_s"]
            r["same_turns_as_1"] = r["item_turns"] == base["item_turns"]
        rows += group
    load_end = os.getloadavg()
    ray.shutdown()

    print(f"\nheld-out eval of the tiny student ({args.dtype}, engine {threads} torch thread(s)): "
          f"{n_games} {args.split} games, max_turns {args.max_turns}, max_new_tokens "
          f"{args.max_new_tokens}, greedy, prefix cache {args.prefix_cache_mb:g} MB, "
          f"{args.warmup_games} warm-up games per env slot, median of {args.repeat} run(s)")
    head = (f"{'max_wait_ms':>11} {'concurrency':>11} {'episodes':>8} {'seconds':>8} {'episodes/s':>10} {'speedup vs 1':>12} "
            f"{'cores busy':>10} {'mean engine batch':>17} {'turns':>6} {'same turns':>10} {'prompt fed/all':>15} "
            f"{'engine busy s':>13} {'ms/turn gen':>11} {'ms/turn env':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['max_wait_ms']:>11g} {r['concurrency']:>11} {r['episodes']:>8} {r['seconds']:>8.1f} {r['episodes_per_s']:>10.3f} "
              f"{r['speedup_vs_1']:>11.2f}x {r['cores_busy']:>10.2f} {r['mean_engine_batch']:>17.2f} {r['turns']:>6} "
              f"{'yes' if r['same_turns_as_1'] else 'no':>10} "
              f"{r['prompt_tokens_fed']:>7}/{r['prompt_tokens']:<7} {r['engine_busy_s']:>13.1f} "
              f"{r['generate_ms_per_turn']:>11.0f} {r['env_ms_per_turn']:>11.0f}")
    # A level-1 baseline slowed by a long batching wait flatters the others: also compare
    # each level's best rate with the best level-1 rate over every max_wait_ms.
    best_1 = max((r["episodes_per_s"] for r in rows if r["concurrency"] == 1), default=None)
    best = {}
    for r in rows:
        best[r["concurrency"]] = max(best.get(r["concurrency"], 0.0), r["episodes_per_s"])
    if best_1:
        print("best rate vs the best 1-concurrent rate: "
              + ", ".join(f"{c} concurrent {v / best_1:.2f}x" for c, v in sorted(best.items())))
    print(f"load average (1/5/15 min): start {fmt_load(load_start)}, end {fmt_load(load_end)} "
          f"on {os.cpu_count()} cores (shared with other work)")

    kept = keep_result(args.out, json.dumps({
        "bench": "eval", "quick": args.quick, "model": str(model), "dtype": args.dtype,
        "engine_threads": threads, "max_batch_size": args.max_batch_size or max(levels), "prefix_cache_mb": args.prefix_cache_mb, "engine_cpus": args.engine_cpus, "max_wait_ms": args.max_wait_ms, "env_cpus": args.env_cpus,
        "split": args.split, "games": [g.item_id for g in games], "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens, "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "warmup_games": args.warmup_games, "repeat": args.repeat,
        "best_vs_best_1": {c: v / best_1 for c, v in best.items()} if best_1 else None,
        "loadavg_start": load_start, "loadavg_end": load_end,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows,
    }, indent=1))
    print(f"wrote {args.out} (and {kept})")


def fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    main()
