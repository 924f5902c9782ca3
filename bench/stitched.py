"""Does the teacher recover from the student's openings? Stitched play with no training.

ROSE assumes a teacher that, handed a game after the student's first K turns, still plays it
well. This bench measures that on a config's games of one split (dev: settings are chosen
there, never on the test games): the base student plays K turns at each `--temperatures` value
(its sampling otherwise the config's), then the teacher plays the rest at the config's teacher
sampling, as a ROSE episode of that run would; beside it, the teacher alone from the first turn.
Nothing trains. Per temperature: the stitched Score/Pass with 95% bootstrap intervals over
games, the ratio to teacher-only (the goal ROSE needs: >= 0.8), the paired difference, and the
share of the student's turns the game accepted (what the teacher is handed).

    python bench/stitched.py --config small                       # dev, 48 games, T = 0.3 0.7 1.0
    python bench/stitched.py --config small --temperatures 1.0 --k 2 --draws 2
    python bench/stitched.py --config small_expert        # the expert teacher (gate E1's stitched/alone ratio)

Writes bench/results/stitched[_CONFIG].json (rows carry `temperature` and `ratio_to_teacher`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from table import RESULTS, bootstrap_difference, bootstrap_mean, config_path  # noqa: E402

from rose_ray.runs import keep_result  # noqa: E402

METRICS = ("score", "pass")


def play(cfg: Any, student: str, teacher: str, games: list[Any], k: int, temperature: float,
         draw: int) -> list[dict[str, Any]]:
    """Every game once: the student's first `k` turns at `temperature`, then the teacher (k=0:
    the teacher alone). Per game: its Score, Pass and the owners' valid-action shares."""
    from rose_ray.commands import training_play
    from rose_ray.rollout.handoff import turn_policy
    from rose_ray.rollout.play import play as play_games

    spec = training_play(cfg, student, teacher)
    spec = replace(spec, max_turns=cfg.eval.max_turns, report="off",
                   handoff=turn_policy("fixed", k=k) if k else turn_policy("teacher_only"),
                   student_sampling=replace(spec.student_sampling, temperature=temperature))
    played = asyncio.run(play_games(spec, games, request_prefix=f"stitched-T{temperature}-d{draw}-"))
    out = []
    for g, traj in zip(games, played):
        row = {"item_id": g.item_id, "score": float(traj.score), "pass": float(traj.score > 0)}
        for owner in ("student", "teacher"):
            turns = [i for i, x in enumerate(traj.turns) if x.role == "assistant" and x.owner == owner]
            row[f"{owner}_turns"] = len(turns)
            row[f"{owner}_valid"] = sum(i not in set(traj.invalid_turns) for i in turns)
        out.append(row)
    return out


def summary(name: str, temperature: float | None, draws: list[list[dict[str, Any]]],
            teacher: list[list[dict[str, Any]]] | None) -> dict[str, Any]:
    """One row: means over draws and games with intervals, and the paired difference to teacher-only."""
    row: dict[str, Any] = {"play": name, "temperature": temperature, "draws": len(draws)}
    for m in METRICS:
        values = np.array([[g[m] for g in d] for d in draws])
        row[m] = bootstrap_mean(values)
        if teacher is not None:
            base = np.array([[g[m] for g in d] for d in teacher])
            row[f"{m}_minus_teacher"] = bootstrap_difference(values, base)
            row[f"{m}_ratio_to_teacher"] = float(values.mean() / base.mean()) if base.mean() else None
    for owner in ("student", "teacher"):
        turns = sum(g[f"{owner}_turns"] for d in draws for g in d)
        row[f"{owner}_valid_rate"] = sum(g[f"{owner}_valid"] for d in draws for g in d) / turns if turns else None
    row["ratio_to_teacher"] = row.get("score_ratio_to_teacher")
    # Games the student's own turns ended (a wrong `focus on` loses a lifespan game): nothing
    # left for any teacher to recover.
    games = [g for d in draws for g in d]
    row["ended_before_handoff"] = sum(g["teacher_turns"] == 0 for g in games) / len(games)
    row["games"] = draws
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v[0]:.4f} [{v[1]:.4f}, {v[2]:.4f}]"

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    lines = ["| play | T | Score [95%] | Pass [95%] | Score / teacher-only | Score - teacher-only [95%] "
             "| student turns valid | teacher turns valid | ended before handoff |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        diff = f"{r['score_minus_teacher'][0]:+.4f} [{r['score_minus_teacher'][1]:+.4f}, " \
               f"{r['score_minus_teacher'][2]:+.4f}]" if "score_minus_teacher" in r else "-"
        t = "-" if r["temperature"] is None else f"{r['temperature']:g}"
        lines.append(f"| {r['play']} | {t} | {cell(r['score'])} | {cell(r['pass'])} | {rate(r.get('ratio_to_teacher'))} "
                     f"| {diff} | {rate(r['student_valid_rate'])} | {rate(r['teacher_valid_rate'])} "
                     f"| {rate(r['ended_before_handoff'])} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small", help="small (configs/small.yaml), tiny or a YAML path")
    p.add_argument("--split", default="dev", help="the games' split (dev: choose settings there)")
    p.add_argument("--n", type=int, default=None, help="games (default the config's eval.n)")
    p.add_argument("--k", type=int, default=None, help="student turns before the teacher (default the config's fixed K)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0])
    p.add_argument("--draws", type=int, default=1, help="plays of each game per temperature (the student samples)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from rose_ray.config import load_config
    from rose_ray.envs.worlds import get_world
    from rose_ray.provision.warmup import resolve_models, weights_digest
    from rose_ray.rollout.actors import init_ray

    config = config_path(args.config)
    cfg = load_config(config, args.set)
    k = args.k if args.k is not None else getattr(cfg.algorithm.handoff, "k", 2)
    games = get_world(cfg.env.world).catalogue(cfg.env.mapping).sample(args.split, args.n or cfg.eval.n, cfg.eval.seed,
                                                                       tasks=cfg.tasks)
    init_ray()
    t0 = time.time()
    student, teacher = resolve_models(cfg)
    who = "the expert (teacher.kind=expert)" if teacher is None else weights_digest(Path(teacher))[:12]
    print(f"stitched: {len(games)} {args.split} games, {cfg.eval.max_turns} turns, student K={k} then the teacher; "
          f"student {weights_digest(Path(student))[:12]}, teacher {who}", flush=True)
    alone = [play(cfg, student, teacher, games, 0, 0.0, 0)]  # greedy teacher: one draw is every draw
    rows = [summary("teacher only", None, alone, None)]
    for temperature in args.temperatures:
        draws = [play(cfg, student, teacher, games, k, temperature, d) for d in range(args.draws)]
        rows.append(summary(f"student K={k}, then teacher", temperature, draws, alone))
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    total = time.time() - t0
    print(f"\n{markdown(rows)}\n\ntotal {total / 60:.1f} min; load average {os.getloadavg()} on {os.cpu_count()} cores")
    stem = "stitched" if args.config == "tiny" else f"stitched_{Path(args.config).stem}"
    out = args.out or str(RESULTS / f"{stem}.json")
    kept = keep_result(out, json.dumps({
        "bench": "stitched", "config": args.config, "split": args.split, "games": len(games), "k": k,
        "overrides": args.set, "student": student, "teacher": teacher, "rows": rows, "markdown": markdown(rows),
        "total_s": total, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1, default=str))
    print(f"wrote {out} ({kept})")


if __name__ == "__main__":
    main()
