"""Chaos: the tiny config for N learner steps while its actors are killed at seeded random times.

    python bench/chaos.py                  # 20 steps, seed 0
    python bench/chaos.py --steps 12 --seed 1
    python bench/chaos.py --backend vllm   # both engines on vLLM

Two runs of `rose-ray train` (the embedded tiny config without the teacher warm-up and the
evals, `steps=N`) on one private Ray cluster that this script starts and joins: a clean run,
then the chaos run. During the chaos run, each fault at its own seeded learner step plus a
seeded delay: SIGKILL of two ScienceWorld JVMs, of an EnvPool actor, of the student engine and
of the teacher engine (found in Ray's actor table by class and name, killed by pid), and once
SIGTERM of the whole run, which is then continued with `--resume`. A fault has recovered when
its own sign shows and a learner step follows: a JVM replaced (`env/restarts` went up), the
pool ALIVE again (Ray restarts it), a new engine ALIVE under the role's name, the resumed run
training past the stop.

At the end it reads the chaos run's `episodes.jsonl` and `trajectories.jsonl`: episodes lost
(a drawn game with no outcome) and trained twice (an episode trained twice, or a game with two
outcomes) must both be 0. The overhead is the chaos run's wall time (both processes, start-up
included) against the clean run's.

Prints a table and writes bench/results/chaos.json (the latest; each run keeps its own copy in
bench/results/chaos/version_N/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rose_ray.runs import keep_result

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

RESULTS = Path(__file__).resolve().parent / "results"
FAULTS = ["JVM", "JVM", "EnvPool actor", "student engine", "teacher engine", "whole run (SIGTERM, --resume)"]


def common_overrides(steps: int, backend: str | None = None) -> list[str]:
    engines = [f"{role}_engine.backend={backend}" for role in ("student", "teacher")] if backend else []
    return [f"steps={steps}", "teacher_warmup.enabled=false", "eval.before=false", "eval.after=false",
            "eval.teacher=false", "checkpoint_every=4", *engines]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete records only (a line still being written is left out)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def last_step(run_dir: Path) -> int:
    steps = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl") if "learner/loss" in m]
    return steps[-1] if steps else 0


def env_restarts(run_dir: Path) -> float:
    values = [m["env/restarts"] for m in read_jsonl(run_dir / "metrics.jsonl") if "env/restarts" in m]
    return values[-1] if values else 0.0


def alive(class_name: str, name_part: str = "") -> list[dict[str, Any]]:
    """ALIVE actors of this cluster by class (and a part of their name), from the GCS table."""
    from ray._private.state import actors

    return [a for a in actors().values()
            if a["State"] == "ALIVE" and a["ActorClassName"] == class_name and name_part in (a["Name"] or "")]


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rose_ray.cli", "train", *args]


# --------------------------------------------------------------------------- faults
class Fault:
    def __init__(self, kind: str, step: int, delay_s: float) -> None:
        self.kind, self.step, self.delay_s = kind, step, delay_s
        self.injected_at: float | None = None
        self.recovered_at: float | None = None
        self.detail = ""
        self.sign: Any = None  # what recovery looks like, captured at injection

    def row(self) -> dict[str, Any]:
        return {"fault": self.kind, "step": self.step, "detail": self.detail,
                "recovered": self.recovered_at is not None,
                "recovery_s": None if self.recovered_at is None else self.recovered_at - self.injected_at}


def jvms() -> list[Any]:
    import psutil

    return [c for p in alive("EnvPool") for c in psutil.Process(p["Pid"]).children(recursive=True)
            if "java" in c.name()]


def present(find: Any, what: str, timeout_s: float = 180.0) -> list[Any]:
    """`find()` once it is non-empty (a target may be restarting from an earlier fault)."""
    deadline = time.monotonic() + timeout_s
    while not (found := find()):
        if time.monotonic() > deadline:
            raise SystemExit(f"chaos: no {what} to kill after {timeout_s:g} s")
        time.sleep(0.5)
    return found


def inject(fault: Fault, run_dir: Path, rng: random.Random) -> None:
    """Kill the fault's target now (SIGKILL by pid; the whole run gets SIGTERM elsewhere)."""
    if fault.kind == "JVM":
        target = rng.choice(present(jvms, "JVM"))
        fault.injected_at, step_then = time.monotonic(), last_step(run_dir)
        fault.sign = ("env_restarts", env_restarts(run_dir), step_then)
        fault.detail = f"JVM pid {target.pid}"
        target.kill()
    elif fault.kind == "EnvPool actor":
        pool = rng.choice(present(lambda: alive("EnvPool"), "EnvPool actor"))
        fault.injected_at, step_then = time.monotonic(), last_step(run_dir)
        fault.sign = ("pool", pool["ActorID"], pool["NumRestarts"], step_then)
        fault.detail = f"EnvPool pid {pool['Pid']}"
        os.kill(pool["Pid"], signal.SIGKILL)
    else:  # an engine
        role = fault.kind
        engine = present(lambda: alive("EngineActorImpl", role), role)[0]
        fault.injected_at, step_then = time.monotonic(), last_step(run_dir)
        fault.sign = ("engine", role, engine["ActorID"], step_then)
        fault.detail = f"{engine['Name'].split(' ', 2)[-1]} pid {engine['Pid']}"
        os.kill(engine["Pid"], signal.SIGKILL)


def recovered(fault: Fault, run_dir: Path) -> bool:
    """Its sign shows, and a learner step came after it."""
    kind = fault.sign[0]
    if kind == "env_restarts":
        _, before, step_then = fault.sign
        return env_restarts(run_dir) > before and last_step(run_dir) > step_then
    if kind == "pool":
        _, actor, restarts, step_then = fault.sign
        back = [a for a in alive("EnvPool") if a["ActorID"] == actor and a["NumRestarts"] > restarts]
        return bool(back) and last_step(run_dir) > step_then
    if kind == "engine":
        _, role, old, step_then = fault.sign
        return any(a["ActorID"] != old for a in alive("EngineActorImpl", role)) and last_step(run_dir) > step_then
    if kind == "resume":
        return last_step(run_dir) > fault.sign[1]
    raise AssertionError(kind)


# --------------------------------------------------------------------------- runs
def clean_run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    run_dir = work / "clean"
    t0 = time.monotonic()
    with (work / "clean.log").open("w") as log:
        code = subprocess.call(train_cmd(*common_overrides(args.steps, args.backend), "name=chaos_clean", f"run_dir={run_dir}"),
                               stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"chaos: the clean run failed (exit {code}); see {work / 'clean.log'}")
    return {"wall_s": wall, "summary": json.loads((run_dir / "summary.json").read_text())}


def chaos_run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    run_dir = work / "chaos"
    steps = sorted(rng.sample(range(2, args.steps - 1), len(FAULTS)))
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    faults = [Fault(k, s, round(rng.uniform(0.0, 2.0), 2)) for k, s in zip(kinds, steps)]
    log = (work / "chaos.log").open("w")
    wall = 0.0
    t0 = time.monotonic()
    proc = subprocess.Popen(train_cmd(*common_overrides(args.steps, args.backend), "name=chaos", f"run_dir={run_dir}"),
                            stdout=log, stderr=subprocess.STDOUT)
    pending = list(faults)
    exits = []
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            for f in faults:
                if f.injected_at is not None and f.recovered_at is None and recovered(f, run_dir):
                    f.recovered_at = time.monotonic()
                    print(f"chaos: {f.kind} at step {f.step}: recovered in {f.recovered_at - f.injected_at:.1f} s",
                          flush=True)
            code = proc.poll()
            if code is not None:  # the run ended (a SIGTERM is waited for where it is sent)
                wall += time.monotonic() - t0
                exits.append(code)
                break
            if pending and last_step(run_dir) >= pending[0].step:
                f = pending.pop(0)
                time.sleep(f.delay_s)
                if f.kind.startswith("whole run"):
                    f.injected_at = time.monotonic()
                    f.detail = f"SIGTERM at step {last_step(run_dir)}, then --resume"
                    proc.send_signal(signal.SIGTERM)
                    exits.append(proc.wait(timeout=600))
                    wall += time.monotonic() - t0
                    stopped = last_step(run_dir)
                    f.sign = ("resume", stopped)
                    print(f"chaos: the run stopped at step {stopped} (exit {exits[-1]}); resuming", flush=True)
                    t0 = time.monotonic()
                    proc = subprocess.Popen(train_cmd("--resume", str(run_dir)), stdout=log, stderr=subprocess.STDOUT)
                else:
                    inject(f, run_dir, rng)
                    print(f"chaos: step {last_step(run_dir)}: killed the {f.kind} ({f.detail})", flush=True)
            time.sleep(0.2)
        else:
            proc.kill()
            raise SystemExit(f"chaos: the run did not finish in {args.timeout} s; see {work / 'chaos.log'}")
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    for f in faults:  # a last look: the end of the run may have come first
        if f.injected_at is not None and f.recovered_at is None and recovered(f, run_dir):
            f.recovered_at = time.monotonic()
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    return {"wall_s": wall, "exits": exits, "faults": [f.row() for f in faults], "summary": summary,
            **episode_audit(run_dir)}


def episode_audit(run_dir: Path) -> dict[str, int]:
    """Episodes lost (a drawn game with no outcome) and trained twice, from the run's own logs."""
    records = read_jsonl(run_dir / "episodes.jsonl")
    ns = Counter(r["n"] for r in records)
    drawn = max(ns) + 1 if ns else 0
    trained_ids = Counter(r["episode_id"] for r in read_jsonl(run_dir / "trajectories.jsonl"))
    outcomes = Counter(r["outcome"] for r in records)
    return {"episodes_drawn": drawn, "episodes_lost": sum(1 for n in range(drawn) if n not in ns),
            "trained_twice": sum(c - 1 for c in trained_ids.values() if c > 1) + sum(c - 1 for c in ns.values() if c > 1),
            "outcomes": dict(outcomes)}


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the chaos run may take")
    parser.add_argument("--backend", choices=["hf", "vllm"], help="both engines' backend (default: the config's)")
    parser.add_argument("--out", default=str(RESULTS / "chaos.json"))
    args = parser.parse_args()
    if args.steps < len(FAULTS) + 3:
        parser.error(f"--steps must be at least {len(FAULTS) + 3}: one step for each fault, apart")
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address  # the runs join this cluster
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="chaos_") as tmp:
            work = Path(tmp)
            print(f"chaos: clean run of {args.steps} steps ...", flush=True)
            clean = clean_run(args, work)
            print(f"chaos: clean run {clean['wall_s']:.0f} s; chaos run (seed {args.seed}) ...", flush=True)
            chaos = chaos_run(args, work)
    finally:
        ray.shutdown()
    steps_done = chaos["summary"].get("steps", 0)
    result = {
        "steps": args.steps, "seed": args.seed, "backend": args.backend or "config", "machine": f"{platform.node()} ({os.cpu_count()} cpus)",
        "clean_wall_s": clean["wall_s"], "chaos_wall_s": chaos["wall_s"],
        "overhead": chaos["wall_s"] / clean["wall_s"] - 1.0,
        "faults": chaos["faults"], "exits": chaos["exits"],
        "faults_injected": sum(1 for f in chaos["faults"] if f["detail"]),
        "recoveries": sum(1 for f in chaos["faults"] if f["recovered"]),
        "episodes_drawn": chaos["episodes_drawn"], "episodes_lost": chaos["episodes_lost"],
        "trained_twice": chaos["trained_twice"], "outcomes": chaos["outcomes"],
        "steps_completed": steps_done, "restarts": chaos["summary"].get("restarts"),
        "runner": chaos["summary"].get("runner"), "total_s": time.monotonic() - started,
    }
    kept = keep_result(args.out, json.dumps(result, indent=1))
    print()
    print("| fault | at step | what | recovered | recovery s |")
    print("| --- | ---: | --- | --- | ---: |")
    for f in chaos["faults"]:
        rs = f"{f['recovery_s']:.1f}" if f["recovery_s"] is not None else "-"
        print(f"| {f['fault']} | {f['step']} | {f['detail']} | {'yes' if f['recovered'] else 'NO'} | {rs} |")
    print()
    print("| faults injected | recoveries | episodes lost | trained twice | steps completed | "
          "clean run | chaos run | overhead |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {result['faults_injected']} | {result['recoveries']} | {result['episodes_lost']} | "
          f"{result['trained_twice']} | {steps_done}/{args.steps} | {result['clean_wall_s']:.0f} s | "
          f"{result['chaos_wall_s']:.0f} s | {100 * result['overhead']:+.0f}% |")
    print(f"\nepisodes drawn {result['episodes_drawn']}, outcomes {result['outcomes']}; "
          f"restarts {result['restarts']}; runner {result['runner']}; bench {result['total_s']:.0f} s; "
          f"written to {args.out} (and {kept})")
    # Every fault injected and recovered from, nothing lost or trained twice, every step done.
    ok = (result["episodes_lost"] == 0 and result["trained_twice"] == 0 and steps_done == args.steps
          and result["faults_injected"] == result["recoveries"] == len(chaos["faults"]) > 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
