"""The rehearsal's Python side (launch/rehearse.sh runs it; see there).

    python launch/rehearse.py models WORK        # tiny Qwen3 stand-ins in WORK/tiny; prints REPO_ID=DIR lines
    python launch/rehearse.py train WORK CONFIG [KEY=VALUE ...]   # on the cluster RAY_ADDRESS names

`models` builds the stand-ins that launch/hub_server.py then serves under hub-style names.
`train` runs `rose-ray train` in this process, notes which node each actor of the run is on
while it runs, and prints that, the learner's step times and what the hub sent (WORK/hub.log);
exit 0 when the run reached its last step with the weights published.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from hub_server import file_downloads  # launch/hub_server.py, beside this file

STAND_INS = {"student": "rose-ray-rehearsal/tiny-qwen3-student", "teacher": "rose-ray-rehearsal/tiny-qwen3-teacher"}


def models(work: Path) -> None:
    from rose_ray.provision.tiny import init_tiny

    tiny = init_tiny(work / "tiny", seed=0, style="qwen3")
    for role, repo_id in STAND_INS.items():
        print(f"{repo_id}={tiny[role]}", flush=True)


def watch_actors(seen: dict[str, tuple[str, str, str]], stop: threading.Event) -> None:
    """actor id -> (class, name, node id) of every actor alive while the run runs."""
    import ray

    while not stop.wait(2.0):
        try:
            for actor_id, a in ray._private.state.actors().items():
                if a.get("State") == "ALIVE":
                    seen[actor_id] = (a.get("ActorClassName", "?"), a.get("Name", ""), a["Address"]["NodeID"])
        except Exception:  # noqa: BLE001 - the cluster going down at the end
            pass


def train(work: Path, config: str, overrides: list[str]) -> int:
    import ray

    from rose_ray.rollout.actors import init_ray
    from rose_ray.train import train as run_train

    init_ray(None)  # RAY_ADDRESS: the rehearsal's cluster
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    for n in nodes.values():
        print(f"rehearse: node {n['NodeID'][:8]} {n['NodeManagerAddress']} resources "
              f"{ {k: v for k, v in n['Resources'].items() if k in ('CPU', 'GPU')} }", flush=True)
    seen: dict[str, tuple[str, str, str]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_actors, args=(seen, stop), daemon=True)
    watcher.start()
    t0 = time.time()
    try:
        summary = run_train(config, overrides)
    finally:
        stop.set()
        watcher.join()
        head = next(n["NodeID"] for n in nodes.values() if n["Resources"].get("GPU", 0) == 0)
        print("rehearse: where each actor went", flush=True)
        for cls, name, node in sorted(seen.values(), key=lambda a: (a[0], a[1])):
            where = "head" if node == head else "GPU node"
            print(f"rehearse:   {cls:<16} {name or '-':<52} {where} ({node[:8]})", flush=True)
    run_dir = Path(summary["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    before = 0.0
    for r in (r for r in rows if "learner/loss" in r):
        print(f"rehearse: step {r['step']}: {r['time'] - before:.1f} s (at {r['time']:.1f} s), loss "
              f"{r['learner/loss']:.4f}, {r['learner/trained_tokens']:.0f} tokens trained at "
              f"{r['learner/tokens_per_s']:.0f}/s, weights v{r['weights/version']:.0f} published in "
              f"{r['weights/sync_ms']:.0f} ms", flush=True)
        before = r["time"]
    print(f"rehearse: {summary['steps']} steps, policy version {summary['version']}, {time.time() - t0:.0f} s "
          f"from the driver's start (run {run_dir})", flush=True)
    log = work / "hub.log"
    requests = [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()] if log.is_file() else []
    sent = file_downloads(requests, STAND_INS.values())
    print(f"rehearse: the hub sent {sum(sent.values())} files ({len(sent)} distinct) in {len(requests)} "
          f"requests: {', '.join(f'{r}/{f} x{n}' for (r, f), n in sorted(sent.items()))}", flush=True)
    ok = summary["steps"] == summary["version"] and summary["steps"] >= 3
    return 0 if ok else 1


if __name__ == "__main__":
    what, work = sys.argv[1], Path(sys.argv[2])
    if what == "models":
        models(work)
    else:
        sys.exit(train(work, sys.argv[3], sys.argv[4:]))
