"""Does the expert teacher finish the games the base student hands it? Stitched play, no training.

The base student of a config (its warm-up, as `rose-ray warmup` builds it) plays the first K
turns of each game at each `--temperatures` value (0: greedy; its sampling otherwise the
config's), then the world's expert teacher (`teacher.kind: expert`, envs/sciworld/expert.py)
plays on, with `--extra-turns` turns of room so that the turn limit does not hide what it can
do; K=0 is the expert alone. A game the student's turns ended (a wrong focus loses it: -100)
cannot be won by anyone and is counted apart; of the others ("winnable": still on at the
handoff), the share the expert won is its finish rate, and the share it won within the config's
own `rollout.max_turns` is beside it, and the mean Score of all games. Also: the share of handoffs at which the student's turns
had changed the game's state (room, inventory, focus: what makes ROSE's data differ from SFT's),
the expert's planned / verified shares at the handoff and its games ended for want of a plan.

    python bench/expert.py --config small                      # 48 train games, K = 0..4, T = 0 and 1.0
    python bench/expert.py --config small --split dev --n 48 --k 0 2 --temperatures 0.7 1.0

Writes bench/results/expert[_CONFIG].json (rows per temperature and K, per task, and every game).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from table import RESULTS, config_path  # noqa: E402

from rose_ray.runs import keep_result  # noqa: E402


def play(cfg: Any, student: str, games: list[Any], plays: list[tuple[int, float]],
         extra_turns: int) -> list[dict[str, Any]]:
    """Every game once per (K, temperature) of `plays`: the student's first K turns at that
    temperature, then the expert (K=0: the expert alone), up to K + `extra_turns` turns; one set
    of actors for all. Per game and play: how it went (see `game_row`)."""
    from rose_ray.commands import training_play
    from rose_ray.rollout.agent import EXPERT
    from rose_ray.rollout.handoff import turn_policy
    from rose_ray.rollout.play import local_players
    from rose_ray.rollout.play import play as play_games

    longest = max(k for k, _ in plays) + extra_turns
    spec = replace(training_play(cfg, student, None), teacher=EXPERT, max_turns=longest, report="off")

    async def every_play(players: Any) -> list[dict[str, Any]]:
        rows = []  # one event loop for all: the runner's slots belong to it
        for k, temperature in plays:
            played = await play_games(
                replace(spec, max_turns=k + extra_turns, handoff=turn_policy("fixed", k=k),
                        student_sampling=replace(spec.student_sampling, temperature=temperature)),
                games, players=players, request_prefix=f"expert-T{temperature}-K{k}-")
            out = [{**game_row(g, traj, k, cfg.rollout.max_turns), "temperature": None if k == 0 else temperature}
                   for g, traj in zip(games, played)]
            s = summary(out)
            print(f"T={temperature:g} K={k}: {s['won']}/{s['winnable']} winnable won ({s['ended_before_handoff']} "
                  f"ended before the handoff), state changed at {s['state_changed_rate']}", flush=True)
            rows += out
        return rows

    with local_players(spec, len(games)) as players:  # pools sized for the longest play
        return asyncio.run(every_play(players))


def game_row(game: Any, t: Any, k: int, turn_limit: int) -> dict[str, Any]:
    """One game: whether the student's turns ended it (`ended_before_handoff`), whether the
    expert won it (`won`) and within the config's turns (`won_in_limit`), the expert's record at
    the handoff, and which parts of the state the student's turns changed."""
    student_turns = sum(1 for x in t.turns if x.role == "assistant" and x.owner == "student")
    ended = student_turns < k or (k > 0 and t.done and student_turns == t.rounds)
    expert = t.expert or {}
    return {"item_id": game.item_id, "task": game.task, "k": k, "raw_score": t.raw_score, "rounds": t.rounds,
            "ended_before_handoff": ended, "lost_before_handoff": ended and t.raw_score < 0,
            "won": bool(t.success) and not ended, "won_in_limit": bool(t.success) and not ended and t.rounds <= turn_limit,
            "planned": expert.get("planned"), "verified": expert.get("verified"), "status": expert.get("status"),
            "replans": expert.get("replans", 0), "plan_s": expert.get("plan_s", 0.0), "end_reason": t.end_reason,
            "handoff_state": t.handoff_state,
            "actions": [x.text.split("Action:")[-1].strip() for x in t.turns
                        if x.role == "assistant" and x.owner in ("student", "teacher")]}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and shares over games: winnable (still on at the handoff), won, won within the
    turn limit, planned / verified at the handoff, the state changed at the handoff."""
    winnable = [r for r in rows if not r["ended_before_handoff"]]
    handed = [r for r in winnable if r["handoff_state"] is not None]
    asked = [r for r in winnable if r["planned"] is not None]

    def share(part: list[Any], whole: list[Any]) -> float | None:
        return len(part) / len(whole) if whole else None

    return {
        "games": len(rows), "score": sum(max(r["raw_score"], 0) for r in rows) / 100 / len(rows) if rows else None,
        "ended_before_handoff": len(rows) - len(winnable),
        "lost_before_handoff": sum(r["lost_before_handoff"] for r in rows), "winnable": len(winnable),
        "won": sum(r["won"] for r in winnable), "finish_rate": share([r for r in winnable if r["won"]], winnable),
        "won_in_limit": sum(r["won_in_limit"] for r in winnable),
        "finish_rate_in_limit": share([r for r in winnable if r["won_in_limit"]], winnable),
        "planned_rate": share([r for r in asked if r["planned"]], asked),
        "verified_rate": share([r for r in asked if r["verified"]], asked),
        "no_plan": sum(r["end_reason"] == "no_plan" for r in winnable),
        "replans": sum(r["replans"] for r in winnable),
        "state_changed_rate": share([r for r in handed if r["handoff_state"]["changed"]], handed),
        "plan_s_mean": sum(r["plan_s"] for r in asked) / len(asked) if asked else None,
    }


def markdown(rows: list[tuple[str, dict[str, Any]]], label: str) -> str:
    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines = [f"| {label} | games | Score | ended before handoff (lost) | winnable | won | finish rate "
             "| won in turn limit | planned | verified | no plan | state changed at handoff |",
             "| --- |" + " ---: |" * 11]
    for name, s in rows:
        lines.append(f"| {name} | {s['games']} | {s['score']:.3f} | {s['ended_before_handoff']} ({s['lost_before_handoff']}) | "
                     f"{s['winnable']} | {s['won']} | {rate(s['finish_rate'])} | {rate(s['finish_rate_in_limit'])} | "
                     f"{rate(s['planned_rate'])} | {rate(s['verified_rate'])} | {s['no_plan']} | "
                     f"{rate(s['state_changed_rate'])} |")
    return "\n".join(lines)


def grouped(rows: list[dict[str, Any]], key: Any) -> list[tuple[str, dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return [(name, summary(rs)) for name, rs in sorted(groups.items())]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="small", help="small (configs/small.yaml), tiny or a YAML path")
    p.add_argument("--split", default="train", help="the games' split (train: the states training meets)")
    p.add_argument("--n", type=int, default=48, help="games (a task-stratified sample of the config's tasks)")
    p.add_argument("--k", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="student turns before the expert")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="the student's (0: greedy)")
    p.add_argument("--extra-turns", type=int, default=30, help="turns the expert may play after the student's")
    p.add_argument("--seed", type=int, default=0, help="the games drawn")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from rose_ray.config import load_config
    from rose_ray.envs.worlds import get_world
    from rose_ray.provision.warmup import resolve_models, weights_digest
    from rose_ray.rollout.actors import init_ray

    config = config_path(args.config)
    # The expert plays; no model teacher is built (its warm-up is off).
    cfg = load_config(config, ["teacher.kind=expert", "teacher_warmup.enabled=false", *args.set])
    games = get_world(cfg.env.world).catalogue(cfg.env.mapping).sample(args.split, args.n, args.seed, tasks=cfg.tasks)
    init_ray()
    t0 = time.time()
    student, _ = resolve_models(cfg)
    print(f"expert: {len(games)} {args.split} games, student {weights_digest(Path(student))[:12]} for K turns, then "
          f"the expert (up to K+{args.extra_turns} turns; the config's limit {cfg.rollout.max_turns})", flush=True)
    plays = [(k, t) for t in args.temperatures for k in args.k if k or t == args.temperatures[0]]  # K=0: once
    rows = play(cfg, student, games, plays, args.extra_turns)
    total = time.time() - t0
    handed = [r for r in rows if r["k"] > 0]

    def temp(r: dict[str, Any]) -> str:
        return "-" if r["temperature"] is None else f"{r['temperature']:g}"

    tables = {
        "by temperature and K": markdown(grouped(rows, lambda r: f"T={temp(r)} K={r['k']}"), "play"),
        "K >= 1, by temperature": markdown(grouped(handed, lambda r: f"T={temp(r)}"), "student T"),
        "K >= 1, by task": markdown(grouped(handed, lambda r: r["task"]), "task"),
        "K >= 1, all": markdown([("all", summary(handed))], "play"),
    }
    for title, table in tables.items():
        print(f"\n{title}:\n{table}")
    print(f"\ntotal {total / 60:.1f} min; load average {os.getloadavg()} on {os.cpu_count()} cores")
    stem = "expert" if args.config == "tiny" else f"expert_{Path(args.config).stem}"
    out = args.out or str(RESULTS / f"{stem}.json")
    kept = keep_result(out, json.dumps({
        "bench": "expert", "config": args.config, "split": args.split, "n": len(games), "ks": args.k,
        "temperatures": args.temperatures, "extra_turns": args.extra_turns, "turn_limit": cfg.rollout.max_turns,
        "overrides": args.set, "student": student, "summary_k_ge_1": summary(handed), "markdown": tables,
        "by": {title: dict(grouped(handed if title.startswith("K >=") else rows, key)) for title, key in (
            ("by temperature and K", lambda r: f"T={temp(r)} K={r['k']}"), ("K >= 1, by temperature", temp),
            ("K >= 1, by task", lambda r: r["task"]))},
        "games": rows, "total_s": total, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1, default=str))
    print(f"wrote {out} ({kept})")


if __name__ == "__main__":
    main()
