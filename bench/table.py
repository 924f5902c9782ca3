"""The seed's table at tiny scale: the base student, SFT on teacher trajectories, online ROSE
(fixed K, curriculum, decay), OPD and the teacher, on the same held-out games and the same
number of learner steps per arm.

Every arm starts from the tiny config (rose_ray/configs/tiny.yaml: the four "find" tasks, the
warmed tiny teacher, 16 held-out test games at 8 turns) and trains the same base student for
`--steps` learner steps of `rollout.batch_episodes` episodes:

- `sft`: the teacher plays steps x batch training games once, offline (greedy, whole
  episodes), then `sft` trains the student on them: one epoch, the same batch and lr;
- `rose_fixed`: online ROSE, the student plays K=2 turns, then the teacher (the tiny default);
- `rose_curriculum`: K grows from 1 to 4 over the run;
- `rose_decay`: at each student turn the teacher takes over with p falling from 0.5 to 0;
- `opd`: the student plays whole episodes, the teacher scores every student token.

The base student and the teacher are evaluated once (greedy decoding of fixed weights gives
the same numbers every time); each training arm runs under `--seeds` seeds (game order,
learner seed, decay draws; the student's sampling is not seeded) and the table shows the mean
and the spread (max - min) over them.

    python bench/table.py              # 2 seeds x the tiny config's steps (~40 min on 2 cores, teacher cached)
    python bench/table.py --quick      # smoke run: 1 seed x 2 steps, 4 games

Prints the table and writes each run into a new folder, bench/results/table/version_N/ (its
table.json and every arm's run, curves included; `latest` names it), and the latest table to
bench/results/table.json. Every run's curves side by side: tensorboard --logdir bench/results/table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from rose_ray.runs import keep_result, new_version

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RESULTS = Path(__file__).resolve().parent / "results"
ONLINE_ARMS = {
    "rose_fixed": [],
    "rose_curriculum": ["rollout.handoff.policy=curriculum", "rollout.handoff.k_start=1", "rollout.handoff.k_max=4"],
    "rose_decay": ["rollout.handoff.policy=decay", "rollout.handoff.p0=0.5"],
    "opd": ["algorithm=opd"],
}
ARMS = ("student", "sft", *ONLINE_ARMS, "teacher")
METRICS = ("score", "success", "pass")


def arm_overrides(arm: str, steps: int) -> list[str]:
    extra = list(ONLINE_ARMS[arm])
    if arm == "rose_curriculum":
        extra.append(f"rollout.handoff.grow_every={max(steps // 4, 1)}")  # K: 1, 2, 3, 4 over the run
    if arm == "rose_decay":
        extra.append(f"rollout.handoff.decay_steps={steps}")
    return extra


def run_online(arm: str, seed: int, steps: int, common: list[str], run_root: Path) -> dict[str, Any]:
    """One online run through `train` (its eval after is the arm's result)."""
    from rose_ray.train import train

    run_dir = run_root / f"{arm}_seed{seed}"
    t0 = time.time()
    summary = train(None, [*common, *arm_overrides(arm, steps), f"seed={seed}", f"steps={steps}",
                           f"run_dir={run_dir}", "eval.before=false", "eval.teacher=false"])
    return {"after": summary["after"], "wall_s": time.time() - t0}


def eval_model(model: str, cfg: Any, out: Path) -> dict[str, Any]:
    """Greedy eval on the config's held-out games, as `train` evaluates (same games, turns, tokens)."""
    from rose_ray.envs.worlds import get_world
    from rose_ray.evaluate import EvalJob, run_eval

    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    games = catalogue.sample(cfg.eval.split, cfg.eval.n, cfg.eval.seed, tasks=cfg.tasks)
    out.mkdir(parents=True, exist_ok=True)
    ids = out / "eval_games.json"
    ids.write_text(json.dumps([g.item_id for g in games]))
    result = run_eval(EvalJob(
        model=model, split=str(ids), n=None, max_turns=cfg.eval.max_turns, max_new_tokens=cfg.eval.max_new_tokens,
        temperature=0.0, world=cfg.env.world, mapping=cfg.env.mapping, concurrency=cfg.env.games_per_worker,
        context_tokens=cfg.student_engine.context_tokens, dtype=cfg.student_engine.dtype,
        instruction_from=cfg.env.instruction_from, enable_thinking=cfg.chat.enable_thinking, out=str(out / "eval")))
    return result["summary"]["overall"]


def run_reference(who: str, common: list[str], run_root: Path) -> dict[str, Any]:
    """The base student or the (warmed) teacher, evaluated once."""
    from rose_ray.config import load_config
    from rose_ray.recipes.warmup import resolve_models

    t0 = time.time()
    cfg = load_config(None, common)
    student, teacher = resolve_models(cfg)
    after = eval_model(student if who == "student" else teacher, cfg, run_root / who)
    return {"after": after, "wall_s": time.time() - t0}


def run_sft(seed: int, steps: int, common: list[str], run_root: Path) -> dict[str, Any]:
    """The teacher plays steps x batch training games offline; `sft` trains the student on them."""
    from rose_ray.collect import PlayConfig, _play
    from rose_ray.config import load_config
    from rose_ray.envs.worlds import get_world
    from rose_ray.metrics import MetricsLogger
    from rose_ray.recipes.sft import train_sft
    from rose_ray.recipes.warmup import resolve_models
    from rose_ray.rollout.ledger import GameSampler
    from rose_ray.rows import write_jsonl

    t0 = time.time()
    cfg = load_config(None, [*common, f"seed={seed}", f"steps={steps}"])
    run_dir = run_root / f"sft_seed{seed}"
    run_dir.mkdir(parents=True)
    student, teacher = resolve_models(cfg)
    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    # The games an online run of this seed starts with, in its order.
    sampler = GameSampler(catalogue.sample(cfg.rollout.split, None, cfg.seed, tasks=cfg.tasks), seed=cfg.seed)
    games = [sampler.next() for _ in range(steps * cfg.rollout.batch_episodes)]
    s = cfg.rollout.teacher_sampling
    play = PlayConfig(model=teacher, teacher=None, max_turns=cfg.rollout.max_turns,
                      handoff="none", temperature=s.temperature, max_new_tokens=s.max_new_tokens,
                      concurrency=cfg.env.games_per_worker, world=cfg.env.world, mapping=cfg.env.mapping,
                      context_tokens=cfg.teacher_engine.context_tokens, enable_thinking=cfg.chat.enable_thinking)
    played, _ = _play(play, games, [cfg.env.protocol()] * len(games))
    rows = []
    for t in played:
        if t is None:
            continue
        for turn in t.turns:  # the teacher played in the student's seat: its turns are the teacher's
            if turn.owner == "student":
                turn.owner = "teacher"
        rows.append(t.to_record())
    data = run_dir / "teacher_trajectories.jsonl"
    write_jsonl(data, rows)
    t_play = time.time() - t0
    result = train_sft(data, student, run_dir / "model", epochs=1, batch_size=cfg.rollout.batch_episodes,
                       lr=cfg.learner.lr, max_tokens=cfg.learner.max_tokens, seed=seed,
                       sft_owners=["teacher"], threads=cfg.learner.threads, log=lambda line: None)
    after = eval_model(str(run_dir / "model"), cfg, run_dir)
    metrics = MetricsLogger(run_dir, console=False)  # the tags online runs use, so the curves overlay
    for m in result["history"]:
        metrics.log(int(m["step"]), {"learner/loss": m["loss"], "learner/loss_teacher_ce": m.get("loss_ce", m["loss"]),
                                     "learner/lr": m["lr"], "learner/grad_norm": m["grad_norm"]})
    metrics.log(steps, {"eval/score": after["score"], "eval/success": after["success"], "eval/pass": after["pass"]})
    metrics.close()
    return {"after": after, "wall_s": time.time() - t0, "play_s": t_play, "rows": len(rows),
            "steps": result["steps"]}


def spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed x 2 steps, 4 eval games, 2 turns")
    p.add_argument("--steps", type=int, default=None, help="learner steps per arm (default: the tiny config's)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per training arm (default 2)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for every arm")
    p.add_argument("--out", default=str(RESULTS / "table.json"), help="the latest table (each run keeps its own)")
    p.add_argument("--tb", default=str(RESULTS / "table"),
                   help="where each run gets a new version_N folder: its table and every arm's run and curves")
    args = p.parse_args()
    from rose_ray.config import load_config

    steps = args.steps or (2 if args.quick else load_config(None).steps)
    seeds = args.seeds or (1 if args.quick else 2)
    quick = ["eval.n=4", "eval.max_turns=2", "rollout.max_turns=3"] if args.quick else []
    common = ["checkpoint_every=1000000", *quick, *args.set]
    run_root = new_version(args.tb)  # this run's; earlier runs' arms stay beside it
    print(f"table: this run goes to {run_root}", flush=True)

    from rose_ray.rollout.actors import init_ray

    init_ray()  # one private cluster for every arm
    t_start, load_start = time.time(), os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for who in ("student", "teacher"):
        if who in args.arms:
            print(f"\n=== table: {who} ===", flush=True)
            runs[who].append(run_reference(who, common, run_root))
    for seed in range(seeds):
        for arm in (a for a in ONLINE_ARMS if a in args.arms):
            print(f"\n=== table: {arm}, seed {seed} ===", flush=True)
            runs[arm].append(run_online(arm, seed, steps, common, run_root))
        if "sft" in args.arms:
            print(f"\n=== table: sft, seed {seed} ===", flush=True)
            runs["sft"].append(run_sft(seed, steps, common, run_root))

    rows = []
    for arm in (a for a in ARMS if runs[a]):
        afters = [r["after"] for r in runs[arm] if r.get("after")]
        row = {"arm": arm, "seeds": len(afters), "games": afters[0]["games"] if afters else 0,
               "wall_s": sum(r["wall_s"] for r in runs[arm])}
        for m in METRICS:
            values = [a[m] for a in afters]
            row[m] = sum(values) / len(values) if values else float("nan")
            row[f"{m}_spread"] = spread(values)
            row[f"{m}_values"] = values
        rows.append(row)

    print(f"\nThe seed's table at tiny scale: {steps} learner steps per arm, {seeds} seed(s), "
          f"{rows[0]['games'] if rows else 0} held-out games (mean over seeds; ± = max - min)")
    print("| model | seeds | Score | Success | Pass |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = " | ".join(f"{r[m]:.4f} ± {r[m + '_spread']:.4f}" if m == "score" else f"{r[m]:.3f} ± {r[m + '_spread']:.3f}"
                           for m in METRICS)
        print(f"| {r['arm']} | {r['seeds']} | {cells} |")
    total = time.time() - t_start
    print(f"total {total / 60:.1f} min; load average (1/5/15 min) start {load_start}, end {os.getloadavg()} "
          f"on {os.cpu_count()} cores")
    print("student and teacher: one greedy eval of fixed weights (no spread); the others: trained per seed")
    kept = keep_result(args.out, json.dumps({
        "bench": "table", "quick": args.quick, "steps": steps, "seeds": seeds, "overrides": common,
        "rows": rows, "runs": {a: rs for a, rs in runs.items() if rs},
        "total_s": total, "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=1, default=str), version=run_root)
    print(f"wrote {args.out} and {kept}; curves: tensorboard --logdir {run_root} (this run) "
          f"or {args.tb} (every run)")


if __name__ == "__main__":
    main()
