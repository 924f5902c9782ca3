"""Benchmark: ScienceWorld stepping cost, JVM memory and EnvPool throughput.

    python bench/env_step.py [--quick]

1. Lean step (`SciWorldGame.step`) vs stock `ScienceWorldEnv.step`: ms per step on the same
   games and the same gold action paths (target: lean >= 5x faster at p50).
2. RSS of one JVM after N lean steps, heap capped (-Xmx256m, the default) vs uncapped
   (target: capped <= 350 MB after 1,000 steps).
3. EnvPool Ray actor vs a plain in-process loop over the same number of games, same games and
   actions (target: pool >= 0.85x direct steps/s).
4. DiscoveryWorld: our step (`DiscoveryWorldGame.step`, text in, compact text out, through its
   worker process) vs the package's stock performAgentAction + tick + getAgentObservation on
   the same scenarios and moves (target: ours >= 10x faster at p50), and the RSS of one game.

    python bench/env_step.py --only discoveryworld   # section 4 alone

Prints one table and writes bench/results/env_step.json (the latest; each run keeps its own
copy in bench/results/env_step/version_N/). Not a test. Every JVM started here is
closed (and killed if it lingers) before exit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from scienceworld import ScienceWorldEnv

from rose_ray.envs.config import DEFAULT_HEAP
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.game import SciWorldGame
from rose_ray.envs.sciworld.protocol import PROTOCOL
from rose_ray.runs import keep_result
from rose_ray.types import GameId

RESULTS = Path(__file__).resolve().parent / "results" / "env_step.json"
# One task per row, from every topic the AgentGym mapping keeps; the first ones are used by
# --quick and by section 1.
TASKS = [
    "find-living-thing", "chemistry-mix", "use-thermometer", "test-conductivity",
    "lifespan-longest-lived", "identify-life-stages-1", "boil", "power-component",
    "freeze", "chemistry-mix-paint-secondary-color", "find-plant",
    "measure-melting-point-known-substance", "melt", "find-animal", "lifespan-shortest-lived",
    "test-conductivity-of-unknown-substances",
]
STARTED_PIDS: set[int] = set()  # every JVM this script started; killed at exit if still alive


# ---------------------------------------------------------------- helpers

def java_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "scienceworld.jar"], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants, in MiB (the unit of -Xmx256m)."""
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def new_game(heap: str | None = DEFAULT_HEAP) -> SciWorldGame:
    g = SciWorldGame(heap=heap, call_timeout_s=120.0)
    STARTED_PIDS.add(g.pid)
    return g


def new_stock() -> ScienceWorldEnv:
    env = ScienceWorldEnv(envStepLimit=10**9)
    STARTED_PIDS.add(env._gateway.java_process.pid)
    return env


def close_stock(env: ScienceWorldEnv) -> None:
    # The stock close() only asks the JVM to exit; wait for it, then stop __del__ closing again.
    proc = env._gateway.java_process
    try:
        env.close()
        proc.wait(timeout=10)
    except Exception:
        proc.kill()
        proc.wait(timeout=5)
    env.close = lambda: None  # type: ignore[method-assign]


def kill_leftovers() -> list[int]:
    """Kill any JVM this script started that is still alive (by pid); returns those pids."""
    left = []
    for pid in sorted(STARTED_PIDS):
        try:
            p = psutil.Process(pid)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
                p.kill()
        except psutil.NoSuchProcess:
            pass
    return left


def _real(r) -> int:
    """1 if the step reached the JVM; a step after the episode ended is answered locally."""
    return int(r.end_reason != "ended")


def gold_paths(games: list[GameId]) -> list[dict]:
    """Each game's gold path, cut where a fresh (non-gold) replay ends the episode.

    After the episode ends the lean step answers without calling the JVM, so trailing gold
    actions would time nothing. Games are not fully deterministic (a replay may finish a step
    later or earlier), so sections 2 and 3 count only steps that reached the JVM.
    """
    out = []
    g = new_game()
    try:
        for game in games:
            g.load(game, gold=True)
            actions = g.gold_actions()
            g.load(game)
            score = 0
            for k, action in enumerate(actions):
                r = g.step(action)
                score = r.raw_score
                if r.done:
                    actions = actions[: k + 1]
                    break
            out.append({"game": game, "actions": actions, "score": score})
    finally:
        g.close()
    return out


# ---------------------------------------------------------------- 1. lean vs stock

def bench_lean_vs_stock(paths: list[dict], warmup: int) -> dict:
    lean, stock = new_game(), new_stock()
    lean_ms: list[float] = []
    stock_ms: list[float] = []
    mismatches, temperatures, examples, scores = 0, 0, [], []
    try:
        # The first episodes run while the JIT compiles; time them in neither env.
        for i, p in enumerate(paths[:warmup] + paths):
            timed = i >= warmup
            game, actions = p["game"], p["actions"]
            lean.load(game)
            stock.load(game.task, game.variation, "", False)
            stock.step("look around")  # the lean load also takes this first step
            lean_obs, lean_real, lean_score = [], [], 0
            for a in actions:
                t0 = time.perf_counter()
                r = lean.step(a)
                dt = (time.perf_counter() - t0) * 1e3
                lean_obs.append(r.observation)
                lean_real.append(_real(r))
                lean_score = r.raw_score
                if timed and _real(r):
                    lean_ms.append(dt)
            stock_score = 0
            for a, obs, real in zip(actions, lean_obs, lean_real):
                t0 = time.perf_counter()
                s_obs, _, _, info = stock.step(a)
                dt = (time.perf_counter() - t0) * 1e3
                stock_score = info["score"]
                if not real:  # lean ended early (see gold_paths); compare only real steps
                    continue
                if s_obs != obs:
                    mismatches += 1
                    # ScienceWorld's own run-to-run heat transfer order (envs/sciworld/game.py)
                    temperatures += PROTOCOL.same_observation(obs, s_obs)
                    if len(examples) < 3:
                        examples.append({"item": game.item_id, "action": a,
                                         "lean": obs[:300], "stock": s_obs[:300]})
                if timed:
                    stock_ms.append(dt)
            if timed:
                scores.append({"item": game.item_id, "task": game.task, "steps": len(actions),
                               "lean_score": lean_score, "stock_score": stock_score})
    finally:
        lean.close()
        close_stock(stock)
    lean_p50, stock_p50 = pct(lean_ms, 50), pct(stock_ms, 50)
    return {
        "steps": len(lean_ms),
        "games": scores,
        "lean_ms": {"p50": lean_p50, "p95": pct(lean_ms, 95), "mean": float(np.mean(lean_ms))},
        "stock_ms": {"p50": stock_p50, "p95": pct(stock_ms, 95), "mean": float(np.mean(stock_ms))},
        "speedup_p50": stock_p50 / lean_p50,
        "speedup_p95": pct(stock_ms, 95) / pct(lean_ms, 95),
        "speedup_mean": float(np.mean(stock_ms) / np.mean(lean_ms)),
        "observation_mismatches": int(mismatches),
        "temperature_only_mismatches": int(temperatures),  # explained by ScienceWorld itself
        "mismatch_examples": examples,
    }


# ---------------------------------------------------------------- 2. RSS capped vs uncapped

def bench_rss(paths: list[dict], steps: int, sample_every: int) -> dict:
    """Two JVMs replay the same episodes in turn until each has taken `steps` real steps."""
    jvms = {"capped": new_game(DEFAULT_HEAP), "uncapped": new_game(None)}
    curves: dict[str, list[tuple[int, float]]] = {k: [] for k in jvms}
    done = 0
    episodes = 0
    t_start = time.perf_counter()
    try:
        for k, g in jvms.items():
            curves[k].append((0, rss_mb(g.pid)))
        while done < steps:
            p = paths[episodes % len(paths)]
            episodes += 1
            actions = p["actions"][: steps - done]
            real = []
            for g in jvms.values():
                g.load(p["game"])
                real.append(sum(_real(g.step(a)) for a in actions))
            before = done
            done += min(real)
            if done // sample_every > before // sample_every or done >= steps:
                for k, g in jvms.items():
                    curves[k].append((done, rss_mb(g.pid)))
        final = {k: rss_mb(g.pid) for k, g in jvms.items()}
    finally:
        for g in jvms.values():
            g.close()
    return {
        "steps": done,
        "episodes": episodes,
        "heap_cap": DEFAULT_HEAP,
        "unit": "MiB",
        "final_rss_mb": final,
        "peak_rss_mb": {k: max(v for _, v in c) for k, c in curves.items()},
        "curve_mb": {k: [[s, round(v, 1)] for s, v in c] for k, c in curves.items()},
        "wall_s": time.perf_counter() - t_start,
    }


# ---------------------------------------------------------------- 3. EnvPool vs direct

def bench_pool(paths: list[dict], slots: int, rounds: int) -> dict:
    """Rounds of `slots` episodes each; loads are untimed, only the stepping is timed."""
    import ray

    from rose_ray.envs.pool import env_pool_actor

    schedule = [
        [paths[(r * slots + i) % len(paths)] for i in range(slots)] for r in range(rounds + 1)
    ]  # round 0 warms up every JVM and is not counted
    stats = {m: {"steps": 0, "s": 0.0} for m in ("direct", "pool_step_many", "pool_concurrent")}

    def run_direct(games: list[SciWorldGame], eps: list[dict]) -> tuple[int, float]:
        for g, p in zip(games, eps):
            g.load(p["game"])
        n, t0 = 0, time.perf_counter()
        for k in range(max(len(p["actions"]) for p in eps)):
            for g, p in zip(games, eps):
                if k < len(p["actions"]):
                    n += _real(g.step(p["actions"][k]))
        return n, time.perf_counter() - t0

    def reset_pool(pool, eps: list[dict]) -> None:
        ray.get([pool.reset.remote(i, p["game"]) for i, p in enumerate(eps)])

    def run_step_many(pool, eps: list[dict]) -> tuple[int, float]:
        reset_pool(pool, eps)
        n, t0 = 0, time.perf_counter()
        for k in range(max(len(p["actions"]) for p in eps)):
            acts = {i: p["actions"][k] for i, p in enumerate(eps) if k < len(p["actions"])}
            res = ray.get(pool.step_many.remote(acts))
            assert not any(r.interrupted for r in res.values()), "a pool JVM died"
            n += sum(_real(r) for r in res.values())
        return n, time.perf_counter() - t0

    def run_concurrent(pool, eps: list[dict]) -> tuple[int, float]:
        # One driver thread per slot, as independent episodes would call the pool.
        reset_pool(pool, eps)

        real = [0] * len(eps)

        def episode(i: int, actions: list[str]) -> None:
            for a in actions:
                r = ray.get(pool.step.remote(i, a))
                assert not r.interrupted, "a pool JVM died"
                real[i] += _real(r)

        threads = [threading.Thread(target=episode, args=(i, p["actions"]))
                   for i, p in enumerate(eps)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(real), time.perf_counter() - t0

    os.environ["RAY_AUTH_MODE"] = "disabled"
    t_init = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    games: list[SciWorldGame] = []
    pool = None
    try:
        pool = env_pool_actor(num_games=slots, num_cpus=1)
        STARTED_PIDS.update(s["pid"] for s in ray.get(pool.health.remote()) if s["pid"])
        ray_start_s = time.perf_counter() - t_init
        games = [new_game() for _ in range(slots)]
        # Interleave the three ways round by round so load on the shared cores hits all alike.
        for r, eps in enumerate(schedule):
            for name, fn in (("direct", lambda e: run_direct(games, e)),
                             ("pool_step_many", lambda e: run_step_many(pool, e)),
                             ("pool_concurrent", lambda e: run_concurrent(pool, e))):
                n, s = fn(eps)
                if r > 0:
                    stats[name]["steps"] += n
                    stats[name]["s"] += s
        health = ray.get(pool.health.remote())
        STARTED_PIDS.update(s["pid"] for s in health if s["pid"])  # replacements, if any
    finally:
        for g in games:
            g.close()
        if pool is not None:
            try:
                ray.get(pool.close.remote(), timeout=30)
            except Exception:
                pass
            ray.kill(pool)
        ray.shutdown()
    rate = {k: v["steps"] / v["s"] for k, v in stats.items()}
    return {
        "slots": slots,
        "rounds": rounds,
        "steps_per_method": stats["direct"]["steps"],
        "steps_per_s": rate,
        "ratio_step_many": rate["pool_step_many"] / rate["direct"],
        "ratio_concurrent": rate["pool_concurrent"] / rate["direct"],
        "ray_and_pool_start_s": ray_start_s,
        "pool_health": health,
    }


# ---------------------------------------------------------------- main

DW_SCENARIOS = ("combinatorial-chemistry-easy", "reactor-lab-normal", "space-sick-challenge",
                "small-skills-search-test-normal")
DW_MOVES = ("east", "west", "north", "south")


def bench_discoveryworld(steps: int) -> dict:
    """Ours vs stock on the same scenarios and the same moves; RSS of one game's worker."""
    import contextlib
    import io
    import random
    import tempfile

    from rose_ray.envs.discoveryworld.catalogue import DiscoveryWorldCatalogue
    from rose_ray.envs.discoveryworld.game import DiscoveryWorldGame

    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    catalogue = DiscoveryWorldCatalogue()
    games = [catalogue.find(t, 1) for t in DW_SCENARIOS]
    ours, world_ms, rss = [], [], {}
    game = DiscoveryWorldGame(max_turns=10**6)
    try:
        for g in games:
            game.load(g)
            rss.setdefault("after_load_mib", rss_mb(game.pid))
            for i in range(steps):
                r = game.step(f"move {DW_MOVES[i % 4]}")
                ours.append(r.latency_ms)
                world_ms.append(r.info["world_step_ms"])
        rss[f"after_{len(games) * steps}_steps_mib"] = rss_mb(game.pid)
    finally:
        game.close()

    stock = []
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        os.chdir(tmp)  # the stock API writes its PNG frames under ./video
        try:
            from discoveryworld.DiscoveryWorldAPI import DiscoveryWorldAPI

            for g in games:
                sc = catalogue.scenario(g)
                random.seed(sc.seed)
                api = DiscoveryWorldAPI(threadID=1)
                api.loadScenario(sc.name, sc.difficulty, sc.seed)
                api.getAgentObservation(0)
                for i in range(steps):
                    t0 = time.perf_counter()
                    api.performAgentAction(0, {"action": "MOVE_DIRECTION", "arg1": DW_MOVES[i % 4]})
                    api.tick()
                    api.getAgentObservation(0)
                    stock.append((time.perf_counter() - t0) * 1e3)
            pngs = len(list(Path(tmp).rglob("*.png")))
        finally:
            os.chdir(cwd)
    return {
        "scenarios": list(DW_SCENARIOS), "steps_per_scenario": steps,
        "ours_ms": {"p50": pct(ours, 50), "p95": pct(ours, 95)},
        "ours_world_ms": {"p50": pct(world_ms, 50), "p95": pct(world_ms, 95)},
        "stock_ms": {"p50": pct(stock, 50), "p95": pct(stock, 95)},
        "speedup_p50": pct(stock, 50) / pct(ours, 50),
        "rss_mib": rss, "stock_pngs_written": pngs,
    }


def machine_info() -> dict:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    import scienceworld

    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": platform.processor() or platform.machine(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg_start": os.getloadavg(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "java": java.splitlines()[0] if java else "",
        "scienceworld": getattr(scienceworld, "__version__", "?"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="reduced sizes, for a smoke test")
    ap.add_argument("--only", choices=["all", "sciworld", "discoveryworld"], default="all")
    args = ap.parse_args()
    cfg = (
        {"gold_games": 4, "stock_games": 4, "warmup": 1, "rss_steps": 200, "slots": 4, "rounds": 1,
         "dw_steps": 20}
        if args.quick
        else {"gold_games": 16, "stock_games": 8, "warmup": 1, "rss_steps": 1000, "slots": 4,
              "rounds": 4, "dw_steps": 100}
    )
    t_start = time.perf_counter()
    info = machine_info()
    before = java_pids()
    catalogue = SciWorldCatalogue()
    games = [catalogue.find(t, 1) for t in TASKS[: cfg["gold_games"]]]
    out: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "mode": "quick" if args.quick else "full", "config": cfg, "machine": info}
    rows: list = []
    try:
        timings = out["section_s"] = {}
        if args.only in ("all", "discoveryworld"):
            print("4/4 DiscoveryWorld: ours vs stock ...", flush=True)
            t0 = time.perf_counter()
            dw = out["discoveryworld"] = bench_discoveryworld(cfg["dw_steps"])
            timings["discoveryworld"] = round(time.perf_counter() - t0, 1)
            n_steps = len(DW_SCENARIOS) * cfg["dw_steps"]
            rows += [
                ("DiscoveryWorld our step p50 ms (in-worker p50 ms)",
                 f"{dw['ours_ms']['p50']:.2f} ({dw['ours_world_ms']['p50']:.2f})", "", None),
                ("DiscoveryWorld stock observe+tick p50 ms", f"{dw['stock_ms']['p50']:.2f}", "", None),
                (f"DiscoveryWorld speedup vs stock, p50 ({n_steps} steps)", f"{dw['speedup_p50']:.1f}x",
                 ">= 10x", dw["speedup_p50"] >= 10),
                ("DiscoveryWorld RSS per game, after load",
                 f"{dw['rss_mib']['after_load_mib']:.0f} MiB", "(info)", None),
                (f"DiscoveryWorld RSS per game, after {n_steps} steps",
                 f"{dw['rss_mib'][f'after_{n_steps}_steps_mib']:.0f} MiB", "(info)", None),
            ]
        if args.only in ("all", "sciworld"):
            t0 = time.perf_counter()
            print(f"gold paths for {len(games)} games ...", flush=True)
            paths = gold_paths(games)
            timings["gold"] = round(time.perf_counter() - t0, 1)
            out["gold"] = [{"item": p["game"].item_id, "task": p["game"].task,
                            "steps": len(p["actions"]), "score": p["score"]} for p in paths]
            print("1/3 lean vs stock step ...", flush=True)
            t0 = time.perf_counter()
            out["lean_vs_stock"] = bench_lean_vs_stock(paths[: cfg["stock_games"]], cfg["warmup"])
            timings["lean_vs_stock"] = round(time.perf_counter() - t0, 1)
            print(f"2/3 RSS after {cfg['rss_steps']} steps ...", flush=True)
            t0 = time.perf_counter()
            out["rss"] = bench_rss(paths, cfg["rss_steps"], sample_every=100)
            timings["rss"] = round(time.perf_counter() - t0, 1)
            print("3/3 EnvPool vs direct ...", flush=True)
            t0 = time.perf_counter()
            out["pool"] = bench_pool(paths, cfg["slots"], cfg["rounds"])
            timings["pool"] = round(time.perf_counter() - t0, 1)
    finally:
        time.sleep(1.0)  # let closed JVMs exit before looking
        out["leftover_jvms_killed"] = kill_leftovers()
        after = java_pids()
        out["java_pids_before"], out["java_pids_after"] = sorted(before), sorted(after)
    out["machine"]["loadavg_end"] = os.getloadavg()
    out["runtime_s"] = round(time.perf_counter() - t_start, 1)

    if "pool" in out:
        rows = sciworld_rows(out) + rows
    rows.append(("JVMs left behind", str(len(out["leftover_jvms_killed"])), "0",
                 not out["leftover_jvms_killed"]))
    out["rows"] = [{"metric": m, "value": v, "target": t, "pass": ok} for m, v, t, ok in rows]
    kept = keep_result(RESULTS, json.dumps(out, indent=2, default=str) + "\n")

    width = max(len(r[0]) for r in rows)
    print(f"\nenv_step ({out['mode']}, {info['cpus_usable']} cores, {out['date']}, "
          f"{out['runtime_s']} s)")
    print(f"{'metric':<{width}}  {'value':>18}  {'target':>10}  result")
    print("-" * (width + 41))
    for m, v, t, ok in rows:
        print(f"{m:<{width}}  {v:>18}  {t:>10}  {'' if ok is None else 'PASS' if ok else 'FAIL'}")
    if "lean_vs_stock" in out:
        ls = out["lean_vs_stock"]
        print(f"observation mismatches lean vs stock: {ls['observation_mismatches']} "
              f"({ls['temperature_only_mismatches']} only in a temperature reading: ScienceWorld's own "
              "heat transfer order, allenai/ScienceWorld#33)")
    print(f"load average {info['loadavg_start'][0]:.1f} -> {out['machine']['loadavg_end'][0]:.1f}; "
          f"section seconds {out['section_s']}")
    print(f"results: {RESULTS} (and {kept})")


def sciworld_rows(out: dict) -> list:
    ls, rss, pool = out["lean_vs_stock"], out["rss"], out["pool"]
    capped, uncapped = rss["final_rss_mb"]["capped"], rss["final_rss_mb"]["uncapped"]
    return [
        ("lean step p50 ms (stock p50 ms)",
         f"{ls['lean_ms']['p50']:.2f} ({ls['stock_ms']['p50']:.2f})", "", None),
        ("lean step p95 ms (stock p95 ms)",
         f"{ls['lean_ms']['p95']:.2f} ({ls['stock_ms']['p95']:.2f})", "", None),
        (f"lean speedup vs stock, p50 ({ls['steps']} steps)", f"{ls['speedup_p50']:.1f}x",
         ">= 5x", ls["speedup_p50"] >= 5),
        (f"JVM RSS after {rss['steps']} steps, -Xmx{DEFAULT_HEAP}",
         f"{capped:.0f} MiB ({capped * 2**20 / 1e6:.0f} MB)", "<= 350 MiB", capped <= 350),
        (f"JVM RSS after {rss['steps']} steps, uncapped",
         f"{uncapped:.0f} MiB ({uncapped * 2**20 / 1e6:.0f} MB)", "(info)", None),
        ("direct steps/s (4 games, one loop)", f"{pool['steps_per_s']['direct']:.0f}", "", None),
        ("EnvPool step_many steps/s", f"{pool['steps_per_s']['pool_step_many']:.0f}", "", None),
        ("EnvPool step_many / direct", f"{pool['ratio_step_many']:.2f}x", ">= 0.85x",
         pool["ratio_step_many"] >= 0.85),
        ("EnvPool per-slot concurrent / direct", f"{pool['ratio_concurrent']:.2f}x", "(info)",
         None),
    ]


if __name__ == "__main__":
    main()
