"""Pipeline throughput: learner steps and episodes per minute, `mode: async` vs `mode: sync`,
and the fraction of the overlap bound async reaches.

Each mode runs the embedded tiny config (rose_ray/configs/tiny.yaml) with the same
overrides — no before/after/teacher evals, no checkpoints inside the budget, `steps` too
large to reach — for the same wall-clock budget after start-up. The bench drives the `Trainer`
itself: `start()` (actors, untimed), then `run()` under asyncio with a timer that snapshots
the counters at the budget and sets `trainer.stop`.

Rollout and learner get one core each: every thread of the learner rank(s) is pinned to
`--learner-core`; every thread of the student and teacher engines, the env pools (and
their JVMs) and this driver (which runs the episodes' event loop) to `--rollout-core`.
Actors report their pids through `__ray_call__`; JVMs are found as the pools' children.
Ray's own daemons (gcs, raylet) are not pinned. Torch runs 1 thread in every engine
and learner rank (tiny.yaml's learner.threads=1; engines get 1 thread per CPU granted).

Async can at most overlap rollout and learning: with R seconds of rollout and L seconds of
learner work per step (measured in the sync run, which does one then the other: L is the
time in `learn_step`, R the rest), its speed-up over sync is at most (R + L) / max(R, L).
The table reports that bound and the fraction of it async reached.

    python bench/pipeline.py                      # 150 s per mode, the config's engines (hf)
    python bench/pipeline.py --backend vllm       # both engines on vLLM
    python bench/pipeline.py --quick              # 30 s per mode (smoke run)

Prints a table and writes bench/results/pipeline.json (the latest; each run keeps its own copy
in bench/results/pipeline/version_N/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from rose_ray.runs import keep_result

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results"
BASE_OVERRIDES = [
    "steps=1000000", "checkpoint_every=1000000",
    "eval.before=false", "eval.after=false", "eval.teacher=false", "eval.every=0",
]


# --------------------------------------------------------------------------- pinning
def actor_info(handle: Any) -> dict[str, Any]:
    """The actor's pid and torch thread count, asked inside the actor."""
    import ray

    def probe(self: Any) -> dict[str, Any]:
        import os as _os
        import sys

        torch = sys.modules.get("torch")
        return {"pid": _os.getpid(), "torch_threads": torch.get_num_threads() if torch else None}

    return ray.get(handle.__ray_call__.remote(probe), timeout=60)


def role_processes(parts: Any) -> dict[str, dict[str, Any]]:
    """Process ids of every role of a started run (run.Run): {name: {pid, torch_threads, role}}."""
    import psutil

    out: dict[str, dict[str, Any]] = {}
    rollouts = parts.rollouts
    for n, w in enumerate(parts.learning.learner.workers):
        out[f"learner rank {n}"] = {"role": "learner", **actor_info(w)}
    out["student engine"] = {"role": "rollout", **actor_info(rollouts.student.engine)}
    if rollouts.teacher is not None and rollouts.teacher.engine is not rollouts.student.engine:
        out["teacher engine"] = {"role": "rollout", **actor_info(rollouts.teacher.engine)}
    for kind, pools in (("env pool", rollouts.pools), ("eval env pool", parts.evals.pools)):
        for n, pool in enumerate(pools):
            info = actor_info(pool)
            out[f"{kind} {n}"] = {"role": "rollout", **info}
            for m, child in enumerate(psutil.Process(info["pid"]).children(recursive=True)):
                out[f"{kind} {n} jvm {m}"] = {"role": "rollout", "pid": child.pid, "torch_threads": None}
    out["driver"] = {"role": "rollout", "pid": os.getpid(), "torch_threads": None}
    return out


def pin(pid: int, cores: set[int]) -> int:
    """Pin every thread of `pid` to `cores`; returns the threads pinned.

    sched_setaffinity on a pid moves only that one thread; threads started later inherit
    their creator's mask, so pinning all current threads pins the whole process.
    """
    pinned = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
            pinned += 1
        except (ProcessLookupError, FileNotFoundError):
            pass  # a thread that ended meanwhile
    return pinned


def cpu_seconds(procs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """CPU seconds (user + system) used so far, per process name."""
    import psutil

    used: dict[str, float] = {}
    for name, info in procs.items():
        try:
            t = psutil.Process(info["pid"]).cpu_times()
        except psutil.NoSuchProcess:
            continue
        used[name] = t.user + t.system
    return used


# --------------------------------------------------------------------------- one mode
def engine_steps(parts: Any) -> dict[str, list[float]]:
    """Per engine: [decode steps, sequences summed over those steps] so far (vllm engines count
    both; the hf engine counts neither)."""
    import ray

    out = {}
    for role, agent in (("student", parts.rollouts.student), ("teacher", parts.rollouts.teacher)):
        stats = ray.get(agent.engine.stats.remote(), timeout=60)
        out[role] = [float(stats.get("steps", 0)), float(stats.get("sequence_steps", 0))]
    return out


def counters(trainer: Any) -> dict[str, Any]:
    buffer, runner = trainer.rollouts.buffer, trainer.rollouts.runner
    lags = buffer.lags
    return {
        "steps": trainer.step, "version": trainer.learning.learner.version,
        "episodes_finished": runner.counters.finished,
        "buffer": buffer.counters.as_dict(), "runner": runner.counters.as_dict(),
        "mean_policy_lag": sum(lags) / len(lags) if lags else 0.0, "learn_s": trainer.learn_s,
    }


async def drive(trainer: Any, budget_s: float, procs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Run the trainer for `budget_s` seconds of its loop; counters as they stood at the budget."""
    run = asyncio.create_task(trainer.train())
    while trainer.stop is None and not run.done():  # train() makes its stop event first thing
        await asyncio.sleep(0.01)
    cpu0, t0, learn0 = cpu_seconds(procs), time.perf_counter(), trainer.learn_s
    steps0 = await asyncio.to_thread(engine_steps, trainer.run)
    done, _ = await asyncio.wait({run}, timeout=budget_s)
    if done:  # the loop ended early: an error (raise it) or an unexpected finish
        run.result()
        raise RuntimeError("the trainer stopped before the budget ran out")
    seconds = time.perf_counter() - t0
    snap = counters(trainer)
    snap["learn_s"] -= learn0
    steps1 = await asyncio.to_thread(engine_steps, trainer.run)
    snap["engine_mean_batch"] = {role: (steps1[role][1] - steps0[role][1]) / (steps1[role][0] - steps0[role][0])
                                 for role in steps1 if steps1[role][0] > steps0[role][0]}
    cpu1 = cpu_seconds(procs)
    trainer.stop.set()
    await run  # the step in progress finishes; then a final checkpoint (not timed)
    per_process = {name: cpu1[name] - cpu0.get(name, 0.0) for name in cpu1}
    per_role: dict[str, float] = {}
    for name, used in per_process.items():
        per_role[procs[name]["role"]] = per_role.get(procs[name]["role"], 0.0) + used
    return {"seconds": seconds, **snap, "cpu_s": per_role, "cpu_s_per_process": per_process}


def run_mode(mode: str, args: argparse.Namespace, overrides: list[str], work: Path) -> dict[str, Any]:
    import ray

    from rose_ray.config import load_config
    from rose_ray.rollout.actors import init_ray
    from rose_ray.run import Run
    from rose_ray.train import Trainer

    run_dir = work / mode
    cfg = load_config(None, [*overrides, f"mode={mode}", f"name=bench_{mode}", f"run_dir={run_dir}"])
    run_dir.mkdir(parents=True, exist_ok=True)
    init_ray()
    parts = Run(cfg, run_dir, resume=False)
    try:
        t0 = time.perf_counter()
        parts.start()
        startup_s = time.perf_counter() - t0
        procs = role_processes(parts)
        pinned = {}
        if not args.no_pin:
            for name, info in procs.items():
                core = args.learner_core if info["role"] == "learner" else args.rollout_core
                pinned[name] = pin(info["pid"], {core})
        print(f"pipeline[{mode}]: started in {startup_s:.0f}s; running {args.budget:g}s ...", flush=True)
        result = asyncio.run(drive(Trainer(parts), args.budget, procs))
        for info in procs.values():
            try:
                info["affinity"] = sorted(os.sched_getaffinity(info["pid"]))
            except ProcessLookupError:
                info["affinity"] = None
    finally:
        agents = (parts.rollouts.student, parts.rollouts.teacher)
        engines = {id(a.engine): a.engine for a in agents if a is not None}.values()
        parts.close()
        for engine in engines:  # Run.close leaves the engine actors to the Ray session
            ray.kill(engine)
        pin(os.getpid(), set(range(os.cpu_count() or 1)))  # unpin the driver for the next mode
        ray.shutdown()
    minutes = result["seconds"] / 60
    return {
        "mode": mode, "startup_s": startup_s, **result,
        "steps_per_min": result["steps"] / minutes,
        "episodes_per_min": result["episodes_finished"] / minutes,
        "trained_episodes_per_min": result["buffer"]["trained"] / minutes,
        "processes": procs, "threads_pinned": pinned,
    }


def warm_teacher_cached(overrides: list[str]) -> bool:
    """Whether the tiny config's warmed teacher is already cached (then using it costs nothing)."""
    from rose_ray.config import load_config
    from rose_ray.provision.tiny import init_tiny
    from rose_ray.provision.warmup import warmup_cache  # the cache warm_model uses

    cfg = load_config(None, overrides)
    teacher = str(init_tiny(Path(cfg.tiny_dir).expanduser(), seed=0)["teacher"])
    return (warmup_cache(cfg, teacher)[1] / "rose_ray_warmup.json").is_file()


# --------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 30 s per mode")
    p.add_argument("--budget", type=float, default=None, help="seconds of training per mode (default 150)")
    p.add_argument("--modes", nargs="+", default=["async", "sync"], choices=["async", "sync"])
    p.add_argument("--rollout-core", type=int, default=0)
    p.add_argument("--learner-core", type=int, default=1)
    p.add_argument("--no-pin", action="store_true", help="leave CPU affinity alone")
    p.add_argument("--teacher-warmup", choices=["cached", "off"], default="cached",
                   help="cached: use the warmed tiny teacher if it is cached, else the cold one")
    p.add_argument("--backend", choices=["hf", "vllm"], help="both engines' backend (default: the config's)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides")
    p.add_argument("--out", default=str(RESULTS / "pipeline.json"))
    args = p.parse_args()
    args.budget = args.budget or (30.0 if args.quick else 150.0)
    cores = os.cpu_count() or 1
    if not args.no_pin and max(args.rollout_core, args.learner_core) >= cores:
        p.error(f"--rollout-core/--learner-core must be < {cores} (this machine's cores)")

    backend = [f"{role}_engine.backend={args.backend}" for role in ("student", "teacher")] if args.backend else []
    overrides = [*BASE_OVERRIDES, *backend, *args.set]
    warm = args.teacher_warmup == "cached" and warm_teacher_cached(overrides)
    if not warm:
        overrides.append("teacher_warmup.enabled=false")
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rose_ray_pipeline_") as work:
        for mode in args.modes:
            rows.append(run_mode(mode, args, overrides, Path(work)))
    load_end = os.getloadavg()
    sync = next((r for r in rows if r["mode"] == "sync"), None)
    for r in rows:
        r["steps_vs_sync"] = r["steps_per_min"] / sync["steps_per_min"] if sync and sync["steps_per_min"] else None
    bound = overlap_bound(sync)
    for r in rows:
        r["overlap_bound"] = bound["bound"] if bound else None
        r["fraction_of_bound"] = r["steps_vs_sync"] / bound["bound"] if bound and r["steps_vs_sync"] else None

    pinning = ("not pinned" if args.no_pin else
               f"rollout pinned to core {args.rollout_core}, learner to core {args.learner_core}")
    engines = args.backend or "the config's"
    print(f"\npipeline of the tiny config ({'warmed' if warm else 'cold'} teacher, {engines} engines), "
          f"{args.budget:g}s of training per mode, {pinning}")
    head = (f"{'mode':>5} {'seconds':>7} {'steps':>5} {'steps/min':>9} {'vs sync':>7} {'episodes':>8} "
            f"{'episodes/min':>12} {'trained ep/min':>14} {'stale drops':>11} {'mean lag':>8} "
            f"{'rollout cpu':>11} {'learner cpu':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        vs = f"{r['steps_vs_sync']:.2f}x" if r["steps_vs_sync"] is not None else "-"
        util = {k: v / r["seconds"] for k, v in r["cpu_s"].items()}
        print(f"{r['mode']:>5} {r['seconds']:>7.1f} {r['steps']:>5} {r['steps_per_min']:>9.2f} {vs:>7} "
              f"{r['episodes_finished']:>8} {r['episodes_per_min']:>12.2f} {r['trained_episodes_per_min']:>14.2f} "
              f"{r['buffer']['dropped_stale']:>11} {r['mean_policy_lag']:>8.2f} "
              f"{util.get('rollout', 0):>10.0%} {util.get('learner', 0):>10.0%}")
    print("(rollout/learner cpu: CPU seconds used by that role's processes per wall second; 100% = one core)")
    for r in rows:
        if r["engine_mean_batch"]:
            print(f"{r['mode']}: sequences per decode step, " + ", ".join(
                f"{role} engine {b:.2f}" for role, b in r["engine_mean_batch"].items()))
    if bound:
        reached = next((r["fraction_of_bound"] for r in rows if r["mode"] == "async"), None)
        print(f"sync: R = {bound['rollout_s']:.2f} s of rollout and L = {bound['learn_s']:.2f} s of learner work per "
              f"step; async can be at most (R + L) / max(R, L) = {bound['bound']:.2f}x sync"
              + (f"; it reached {reached:.0%} of that bound" if reached is not None else ""))
    print(f"load average (1/5/15 min): start {fmt_load(load_start)}, end {fmt_load(load_end)} "
          f"on {cores} cores (shared with other work)")

    kept = keep_result(args.out, json.dumps({
        "bench": "pipeline", "backend": args.backend or "config", "quick": args.quick, "budget_s": args.budget, "overrides": overrides,
        "warm_teacher": warm, "pinning": pinning, "cpu_count": cores, "machine": platform.machine(),
        "loadavg_start": load_start, "loadavg_end": load_end,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows,
    }, indent=1))
    print(f"wrote {args.out} (and {kept})")


def overlap_bound(sync: dict[str, Any] | None) -> dict[str, float] | None:
    """From a sync run: rollout (R) and learner (L) seconds per step, and (R + L) / max(R, L)."""
    if not sync or not sync["steps"]:
        return None
    learn = sync["learn_s"] / sync["steps"]
    rollout = max(sync["seconds"] / sync["steps"] - learn, 0.0)
    return {"rollout_s": rollout, "learn_s": learn, "bound": (rollout + learn) / max(rollout, learn, 1e-9)}


def fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    main()
