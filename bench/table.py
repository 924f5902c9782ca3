"""The seed's table on this machine: the base student, SFT on teacher trajectories, online ROSE
(fixed K, curriculum, decay), OPD and the teacher, on the same held-out games, with the same
number of learner steps and episodes per arm, several seeds and 95% bootstrap intervals.

Every arm starts from one config (`--config`: `small`, the tier built to tell the arms apart,
configs/small.yaml; or `tiny`, the embedded default) and trains its base student for `--steps`
learner steps of `rollout.batch_episodes` episodes, on the same training games in the same
order for a seed:

- `sft`: the teacher plays steps x batch training games once, offline (whole episodes, with
  the online teacher's engine dtype, chat history and sampling), then `sft` trains the student
  on them: one epoch, the same batch and every learner.* setting the online arms get;
- `rose_fixed`: online ROSE, the student plays K turns (the config's), then the teacher;
- `rose_curriculum`: K grows from 1 to 4 over the run;
- `rose_decay`: at each student turn the teacher takes over with p falling from 0.5 to 0;
- `opd`: the student plays whole episodes, the teacher scores every student token;
- `rose_k0`: ROSE with K=0 (the teacher plays every turn, online): a control that must match SFT;
- `rose_on_failure`: the teacher takes over after the student's first invalid or repeated action.

Beside them the references, evaluated once: the base student, the config's teacher (a model, or
the world's expert where `teacher.kind: expert`), and `expert`, the world's expert teacher alone
(any ScienceWorld config). With `--config small_expert` (configs/small_expert.yaml) every arm's
teacher is the expert: `sft` trains on the expert's whole games, the online arms on its turns after
the handoff. The held-out games can be a file of item ids: `--set eval.split=FILE eval.n=1000`
(eval.n at least the file's length: all of them, in its order).

The budget held equal is learner steps x episodes per step (the same games, in the same
order): what each method makes of one episode is the comparison. Trained tokens then differ by
design (ROSE trains on the teacher's turns after the handoff, SFT on all of them, OPD on the
student's), so each arm's trained tokens are reported beside it.

The base student and the teacher are evaluated once (greedy decoding of fixed weights gives
the same numbers every time); each training arm runs under `--seeds` seeds (game order,
learner seed, decay draws; the student's sampling is not seeded). Every cell is the mean over
seeds and held-out games with a 95% bootstrap interval: games resampled (the same games for
every seed and arm) and seeds resampled. `ROSE - SFT` rows give the paired difference.

    python bench/table.py --config small   # 3 seeds, 48 test games (82 min on 2 cores at 32 steps; 128 now)
    python bench/table.py                  # the tiny default, 3 seeds (~50 min, teacher cached)
    python bench/table.py --quick          # smoke run: 1 seed x 2 steps, 4 games
    python bench/table.py --config small --resume   # finish the latest run's missing arms

Build the small tier first (cached; the table builds it otherwise): rose-ray warmup --config configs/small.yaml

Beside each arm's Score: the share of its held-out turns the game did not accept and of replies
cut before their action line (arms whose Scores tie may play very differently); below the
table, per training arm, what it played and trained on (rose_ray/metrics.py's diagnostics,
means over its steps). The training arms play `eval.every_n` dev games every `--dev-every`
steps (a curve that shows when an arm degrades); table.png shows Score and Pass with their
intervals and those curves.

Prints the table and writes each run into a new folder, bench/results/table[_small]/version_N/
(its table.json, table.png and every arm's run, curves and eval games; `latest` names it), and
the latest table to bench/results/table[_small].json and .png. Curves side by side: tensorboard --logdir bench/results/table_small
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from rose_ray.files import write_file
from rose_ray.runs import keep_result, new_version

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ONLINE_ARMS = {
    "rose_fixed": [],
    "rose_curriculum": ["algorithm.handoff.policy=curriculum", "algorithm.handoff.k_start=1", "algorithm.handoff.k_max=4"],
    "rose_decay": ["algorithm.handoff.policy=decay", "algorithm.handoff.p0=0.5"],
    "opd": ["algorithm=opd"],
    "rose_k0": ["algorithm.handoff.policy=fixed", "algorithm.handoff.k=0"],
    "rose_on_failure": ["algorithm.handoff.policy=on_failure"],
}
REFERENCES = ("student", "teacher", "expert")  # evaluated once, no training
ARMS = ("student", "sft", *ONLINE_ARMS, "teacher", "expert")
DEFAULT_ARMS = ("student", "sft", "rose_fixed", "rose_curriculum", "rose_decay", "opd", "teacher")  # the seed's table
METRICS = ("score", "success", "pass")
# Beside each cell: how the arm's student plays the held-out games (evaluate.summarise).
PLAY_RATES = ("invalid_action_rate", "cut_before_action_rate")
# Per training arm, means over its learner steps (rose_ray/metrics.py; docs/results.md, per-step diagnostics).
DIAGNOSTICS = ("rollout/student_valid_rate", "rollout/teacher_valid_rate", "learner/trained_tokens_student",
               "learner/trained_tokens_teacher", "learner/trained_truncated_rate", "learner/trained_repeated_rate",
               "learner/trained_invalid_rate", "rollout/handoff_state_changed_rate", "rollout/expert_planned_rate",
               "rollout/expert_verified_rate")
BY_TURN = "rollout/teacher_valid_by_turn/"  # + tNN: the teacher's valid share at turn NN of the game
DEV_KEYS = ("score", "success", "pass", *PLAY_RATES)


def config_path(name: str) -> str | None:
    """`tiny` (the embedded default: None), a name under configs/ (`small`), or a YAML path."""
    if name == "tiny":
        return None
    if Path(name).is_file():
        return name
    if (CONFIGS / f"{name}.yaml").is_file():
        return str(CONFIGS / f"{name}.yaml")
    raise SystemExit(f"table: --config {name!r}: neither a file nor a config in {CONFIGS} (small, tiny)")


def arm_overrides(arm: str, steps: int, seed: int = 0) -> list[str]:
    """What a training arm's config adds to the common overrides: the bench seed (game order,
    decay draws and the learner's seed), the steps, and the arm's algorithm. Every learner.*
    setting comes from the common overrides alone, so it reaches every arm the same way."""
    extra = [f"seed={seed}", f"learner.seed={seed}", f"steps={steps}"]
    if arm == "sft":
        return extra
    extra += ONLINE_ARMS[arm]
    if arm == "rose_curriculum":
        extra.append(f"algorithm.handoff.grow_every={max(steps // 4, 1)}")  # K: 1, 2, 3, 4 over the run
    if arm == "rose_decay":
        extra.append(f"algorithm.handoff.decay_steps={steps}")
    return extra


def arm_sets(values: list[str]) -> dict[str, list[str]]:
    """`--arm-set ARM:KEY=VALUE ...` as each training arm's own overrides."""
    out: dict[str, list[str]] = {}
    for value in values:
        arm, sep, override = value.partition(":")
        if not sep or "=" not in override or arm not in ("sft", *ONLINE_ARMS):
            raise SystemExit(f"table: --arm-set {value!r}: expected ARM:KEY=VALUE with ARM one of "
                             f"sft, {', '.join(ONLINE_ARMS)}")
        out.setdefault(arm, []).append(override)
    return out


def eval_model(model: str, cfg: Any, out: Path, backend: str, expert: bool = False) -> dict[str, Any]:
    """Greedy eval on the config's held-out games, as `train` evaluates: the summary and every game.
    `expert`: the world's expert plays every turn instead (`model` lends its tokenizer)."""
    from dataclasses import replace

    from rose_ray.evaluate import run_eval, train_eval_job
    from rose_ray.rollout.agent import EXPERT

    job = train_eval_job(cfg, model, str(out / "eval"), backend=backend)
    result = run_eval(replace(job, teacher=EXPERT, handoff=0) if expert else job)
    return {"after": result["summary"]["overall"], "games": [
        {"item_id": g["item_id"], "task": g["task"], **{m: float(g[m]) for m in METRICS}} for g in result["games"]]}


def eval_dev(model: str, cfg: Any, out: Path, backend: str) -> dict[str, float]:
    """The dev eval `train` runs every `eval.every` steps (eval.every_n dev games), of one model."""
    from dataclasses import replace

    from rose_ray.evaluate import run_eval, train_eval_job

    job = replace(train_eval_job(cfg, model, str(out / "eval_dev"), split="dev", backend=backend), n=cfg.eval.every_n)
    overall = run_eval(job)["summary"]["overall"]
    return {k: float(overall[k]) for k in DEV_KEYS}


def learner_settings(cfg: Any) -> dict[str, Any]:
    """The SFT arm's learner: every learner.* setting of the config, as the online arms' learner
    gets it (rose_ray/recipes/sft.train_sft takes LearnerConfig fields)."""
    from dataclasses import asdict

    return {k: v for k, v in asdict(cfg.learner).items() if k != "model"}


def teacher_play(cfg: Any, teacher: str | None, student: str) -> Any:
    """How the SFT arm's teacher plays its whole games: as the online arms' teacher plays its
    turns (commands.training_play: its engine, the run's chat history and thinking switch, its
    sampling); `teacher` None: the world's expert (`teacher.kind: expert`), every turn, in the
    student's tokenizer. A PlaySpec (rose_ray/rollout/play.py)."""
    from dataclasses import replace

    from rose_ray.commands import training_play
    from rose_ray.rollout.handoff import turn_policy

    spec = replace(training_play(cfg, student, teacher), report="off")
    if teacher is None:
        return replace(spec, handoff=turn_policy("teacher_only"))
    return replace(spec, student=spec.teacher, teacher=None, handoff=turn_policy("none"),
                   student_sampling=spec.teacher_sampling)


def step_means(history: list[dict[str, Any]], keys: tuple[str, ...] = DIAGNOSTICS) -> dict[str, float]:
    """Each key's mean over the learner steps that logged it (metrics.jsonl lines), the
    teacher's validity at each turn (BY_TURN keys) included."""
    out = {}
    turns = sorted({k for m in history for k in m if k.startswith(BY_TURN)})
    for k in (*keys, *turns):
        values = [m[k] for m in history if k in m and "learner/loss" in m]
        if values:
            out[k] = float(np.mean(values))
    return out


def trained_tokens(history: list[dict[str, Any]]) -> float:
    return float(sum(m.get("trained_tokens", m.get("learner/trained_tokens", 0.0)) for m in history))


def run_online(arm: str, seed: int, steps: int, config: str | None, common: list[str], run_dir: Path,
               backend: str) -> dict[str, Any]:
    """One online run through `train` (no test evals inside; the dev curve when `eval.every`),
    then the held-out eval of its model."""
    from rose_ray.config import load_config
    from rose_ray.train import train

    t0 = time.time()
    summary = train(config, [*common, *arm_overrides(arm, steps, seed), f"run_dir={run_dir}",
                             "eval.before=false", "eval.after=false", "eval.teacher=false"])
    history = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    cfg = load_config(config, common)
    dev = [{"step": e["step"], **{k: float(e[k]) for k in DEV_KEYS}} for e in summary.get("dev") or []]
    return {**eval_model(summary["model"], cfg, run_dir, backend), "wall_s": time.time() - t0,
            "steps": summary["steps"], "trained_tokens": trained_tokens(history),
            "diagnostics": step_means(history), "dev": dev}


def run_reference(who: str, config: str | None, common: list[str], run_dir: Path, backend: str) -> dict[str, Any]:
    """The base student, the (warmed) teacher, or the world's expert alone, evaluated once."""
    from rose_ray.config import load_config
    from rose_ray.provision.warmup import resolve_models

    t0 = time.time()
    cfg = load_config(config, common)
    student, teacher = resolve_models(cfg)
    if who == "student" or (who == "teacher" and teacher is not None):
        return {**eval_model(student if who == "student" else teacher, cfg, run_dir, backend), "wall_s": time.time() - t0}
    return {**eval_model(student, cfg, run_dir, backend, expert=True), "wall_s": time.time() - t0}


def run_sft(seed: int, steps: int, config: str | None, common: list[str], run_dir: Path, backend: str) -> dict[str, Any]:
    """The teacher plays steps x batch training games offline; `sft` trains the student on them."""
    from rose_ray.config import load_config
    from rose_ray.envs.worlds import get_world
    from rose_ray.event_loop import run_coroutine
    from rose_ray.metrics import MetricsLogger, episode_scalars, trained_scalars
    from rose_ray.provision.warmup import resolve_models
    from rose_ray.recipes.sft import train_sft
    from rose_ray.rollout.ledger import GameSampler
    from rose_ray.rollout.play import play
    from rose_ray.rows import write_jsonl

    t0 = time.time()
    cfg = load_config(config, [*common, *arm_overrides("sft", steps, seed)])
    run_dir.mkdir(parents=True, exist_ok=True)
    student, teacher = resolve_models(cfg)
    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    # The games an online run of this seed starts with, in its order.
    sampler = GameSampler(catalogue.sample(cfg.rollout.split, None, cfg.seed, tasks=cfg.tasks), seed=cfg.seed)
    games = [sampler.next() for _ in range(steps * cfg.rollout.batch_episodes)]
    played = run_coroutine(lambda: play(teacher_play(cfg, teacher, student), games))
    rows = []
    for t in played:
        for turn in t.turns:  # the teacher played in the student's seat: its turns are the teacher's
            if turn.owner == "student":
                turn.owner = "teacher"
        rows.append(t.to_record())
    data = run_dir / "teacher_trajectories.jsonl"
    write_jsonl(data, rows)
    t_play = time.time() - t0
    result = train_sft(data, student, run_dir / "model", epochs=1, batch_size=cfg.rollout.batch_episodes,
                       history=cfg.chat.history, sft_owners=["teacher"], log=lambda line: None,
                       **learner_settings(cfg))
    evaluated = eval_model(str(run_dir / "model"), cfg, run_dir, backend)
    # Its diagnostics as an online step logs them, over the whole data: every teacher reply trains.
    teacher_replies = [[t.role == "assistant" and t.owner == "teacher" for t in traj.turns] for traj in played]
    tokens = {"teacher": trained_tokens(result["history"]) / max(len(result["history"]), 1)}
    diagnostics = {**episode_scalars(played), **trained_scalars(played, teacher_replies, tokens)}
    diagnostics = {k: v for k, v in diagnostics.items() if k in DIAGNOSTICS or k.startswith(BY_TURN)}
    dev = [{"step": result["steps"], **eval_dev(str(run_dir / "model"), cfg, run_dir, backend)}] if cfg.eval.every else []
    metrics = MetricsLogger(run_dir)  # the tags online runs use, so the curves overlay
    for m in result["history"]:
        metrics.log(int(m["step"]), {"learner/loss": m["loss"], "learner/loss_teacher_ce": m.get("loss_ce", m["loss"]),
                                     "learner/lr": m["lr"], "learner/grad_norm": m["grad_norm"],
                                     "learner/trained_tokens": m.get("trained_tokens", 0.0)})
    after = evaluated["after"]
    metrics.log(steps, {"eval/score": after["score"], "eval/success": after["success"], "eval/pass": after["pass"]})
    for point in dev:
        metrics.log(point["step"], {f"eval/dev_{k}": point[k] for k in DEV_KEYS})
    metrics.close()
    return {**evaluated, "wall_s": time.time() - t0, "play_s": t_play, "rows": len(rows),
            "steps": result["steps"], "trained_tokens": trained_tokens(result["history"]),
            "diagnostics": diagnostics, "dev": dev}


def game_matrix(runs: list[dict[str, Any]], metric: str) -> np.ndarray:
    """[seeds, games] of one metric, games in one order (by item id) for every run."""
    return np.array([[g[metric] for g in sorted(r["games"], key=lambda g: g["item_id"])] for r in runs])


def bootstrap_mean(values: np.ndarray, resamples: int = 4000, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of `values[seed, game]`: games resampled with replacement (the same
    draw for every seed, as every seed plays the same games) and seeds resampled too."""
    rng = np.random.default_rng(seed)
    n_seeds, n_games = values.shape
    s = rng.integers(0, n_seeds, (resamples, n_seeds))
    g = rng.integers(0, n_games, (resamples, n_games))
    means = values[s[:, :, None], g[:, None, :]].mean(axis=(1, 2))
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(values.mean()), float(low), float(high)


def bootstrap_difference(a: np.ndarray, b: np.ndarray, resamples: int = 4000, level: float = 0.95,
                         seed: int = 0) -> tuple[float, float, float]:
    """(mean a - mean b, low, high): games resampled once for both arms (paired: the same held-out
    games), each arm's seeds resampled on their own."""
    rng = np.random.default_rng(seed)
    n_games = a.shape[1]
    if b.shape[1] != n_games:
        raise ValueError(f"bootstrap_difference: {a.shape[1]} games against {b.shape[1]}")
    g = rng.integers(0, n_games, (resamples, n_games))

    def means(v: np.ndarray) -> np.ndarray:
        s = rng.integers(0, v.shape[0], (resamples, v.shape[0]))
        return v[s[:, :, None], g[:, None, :]].mean(axis=(1, 2))

    diffs = means(a) - means(b)
    low, high = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return float(a.mean() - b.mean()), float(low), float(high)


def table_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for arm in (a for a in ARMS if runs.get(a)):
        rs = runs[arm]
        games = {len(r["games"]) for r in rs}
        if len(games) != 1:
            raise ValueError(f"table: arm {arm}: runs evaluated on different numbers of games {sorted(games)}")
        row = {"arm": arm, "seeds": len(rs), "games": games.pop(), "wall_s": sum(r["wall_s"] for r in rs),
               "trained_tokens": float(np.mean([r["trained_tokens"] for r in rs])) if "trained_tokens" in rs[0] else None}
        for m in METRICS:
            row[m], row[f"{m}_low"], row[f"{m}_high"] = bootstrap_mean(game_matrix(rs, m))
            row[f"{m}_seeds"] = [r["after"][m] for r in rs]
        for rate in PLAY_RATES:  # older results may lack one: None, shown as "-"
            values = [r["after"][rate] for r in rs if rate in r["after"]]
            row[rate] = float(np.mean(values)) if len(values) == len(rs) else None
        keys = (*DIAGNOSTICS, *sorted({k for r in rs for k in r.get("diagnostics", {}) if k.startswith(BY_TURN)}))
        row["diagnostics"] = {k: float(np.mean([r["diagnostics"][k] for r in rs]))
                              for k in keys if all(k in r.get("diagnostics", {}) for r in rs)}
        rows.append(row)
    return rows


def difference_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Paired over games, per metric: SFT minus the base student (the positive control), then each
    online arm minus SFT and minus the base student."""
    pairs = [("sft", "student")]
    for base in ("sft", "student"):
        pairs += [(arm, base) for arm in ONLINE_ARMS]
    out = []
    for arm, base in pairs:
        if not (runs.get(arm) and runs.get(base)):
            continue
        row: dict[str, Any] = {"arm": f"{arm} - {base}"}
        for m in METRICS:
            row[m], row[f"{m}_low"], row[f"{m}_high"] = bootstrap_difference(game_matrix(runs[arm], m),
                                                                             game_matrix(runs[base], m))
        out.append(row)
    return out


def markdown(rows: list[dict[str, Any]], diffs: list[dict[str, Any]]) -> str:
    def cell(r: dict[str, Any], m: str) -> str:
        digits = 4 if m == "score" else 3
        return f"{r[m]:+.{digits}f} [{r[m + '_low']:+.{digits}f}, {r[m + '_high']:+.{digits}f}]" if " - " in r["arm"] \
            else f"{r[m]:.{digits}f} [{r[m + '_low']:.{digits}f}, {r[m + '_high']:.{digits}f}]"

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["| model | seeds | trained tokens | Score [95%] | invalid | cut | Success [95%] | Pass [95%] |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tokens = f"{r['trained_tokens']:,.0f}" if r.get("trained_tokens") is not None else "-"
        lines.append(f"| {r['arm']} | {r['seeds']} | {tokens} | {cell(r, 'score')} | "
                     + " | ".join(rate(r.get(k)) for k in PLAY_RATES) + " | "
                     + " | ".join(cell(r, m) for m in METRICS[1:]) + " |")
    for r in diffs:
        lines.append(f"| {r['arm']} | | | {cell(r, 'score')} | | | " + " | ".join(cell(r, m) for m in METRICS[1:]) + " |")
    return "\n".join(lines)


def diagnostics_markdown(rows: list[dict[str, Any]]) -> str:
    """Per training arm, the means over its learner steps of what it played and trained on; then
    the teacher's valid share at each turn of the game (ROSE's teacher after the handoff beside
    SFT's, turn for turn)."""
    heads = ["student valid", "teacher valid", "trained tok. student", "trained tok. teacher",
             "trained cut", "trained repeated", "trained invalid", "state changed at handoff", "expert planned",
             "expert verified"]
    lines = ["| arm | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(heads)]
    for r in rows:
        if not r.get("diagnostics"):
            continue
        d = r["diagnostics"]
        cells = [("-" if k not in d else f"{d[k]:,.0f}" if "tokens" in k else f"{d[k]:.2f}") for k in DIAGNOSTICS]
        lines.append(f"| {r['arm']} | " + " | ".join(cells) + " |")
    turns = sorted({k for r in rows for k in r.get("diagnostics", {}) if k.startswith(BY_TURN)})
    if turns:
        lines += ["", "Teacher valid share by turn of the game:", "",
                  "| arm | " + " | ".join(k[len(BY_TURN):] for k in turns) + " |", "| --- |" + " ---: |" * len(turns)]
        for r in rows:
            d = r.get("diagnostics") or {}
            if any(k in d for k in turns):
                lines.append(f"| {r['arm']} | " + " | ".join("-" if k not in d else f"{d[k]:.2f}" for k in turns) + " |")
    return "\n".join(lines)


def write_figure(rows: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]], path: str | Path) -> Path:
    """A PNG: each arm's Score and Pass with their 95% intervals, and, where the runs evaluated
    on dev as they trained (eval.every), each one's dev Score over its learner steps (one line per
    seed, one color per arm); without dev points, the two panels alone."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    curved = [arm for arm in ARMS if any(r.get("dev") for r in runs.get(arm) or [])]
    fig, axes = plt.subplots(1, 3 if curved else 2, figsize=(15 if curved else 10, 4.5))
    arms = [r["arm"] for r in rows]
    colors = {arm: plt.get_cmap("tab10")(i % 10) for i, arm in enumerate(ARMS)}
    for ax, m in zip(axes[:2], ("score", "pass")):
        means = np.array([r[m] for r in rows])
        err = np.array([[r[m] - r[f"{m}_low"] for r in rows], [r[f"{m}_high"] - r[m] for r in rows]])
        ax.bar(range(len(rows)), means, yerr=err, capsize=4, color=[colors[a] for a in arms])
        ax.set_xticks(range(len(rows)), arms, rotation=30, ha="right")
        ax.set_title(f"{m.capitalize()} on the held-out games [95%]")
        ax.set_ylim(0, max(1e-3, float(max((r[f"{m}_high"] for r in rows), default=0))) * 1.1)
    for arm in curved:
        for i, r in enumerate(runs[arm]):
            points = sorted((p["step"], p["score"]) for p in r.get("dev") or [])
            if points:
                steps, scores = zip(*points)
                axes[2].plot(steps, scores, marker="o", color=colors[arm], alpha=0.8, label=arm if i == 0 else None)
    if curved:
        axes[2].set_title("dev Score over learner steps (eval.every)")
        axes[2].set_xlabel("learner step")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="tiny", help="small (configs/small.yaml), tiny (the embedded default) or a YAML path")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed x 2 steps, 4 eval games, 2 turns")
    p.add_argument("--steps", type=int, default=None, help="learner steps per arm (default: the config's)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per training arm (default 3)")
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS),
                   help=f"default: {' '.join(DEFAULT_ARMS)}")
    p.add_argument("--backend", choices=["hf", "vllm", "auto"], default="hf", help="the engine of the held-out evals")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for every arm")
    p.add_argument("--arm-set", nargs="*", default=[], metavar="ARM:KEY=VALUE",
                   help="an override for one training arm only (a setting chosen per arm on dev, e.g. "
                        "sft:learner.lr=1e-3); after --set")
    p.add_argument("--dev-every", type=int, default=None,
                   help="the training arms' dev eval every N learner steps (eval.every; eval.every_n dev games); "
                        "default a quarter of the steps, 0 = none")
    p.add_argument("--resume", action="store_true", help="continue the latest run of this config: keep its finished arms")
    p.add_argument("--out", default=None, help="the latest table (default bench/results/table[_CONFIG].json)")
    p.add_argument("--tb", default=None, help="where each run gets a new version_N folder "
                                             "(default bench/results/table[_CONFIG])")
    args = p.parse_args()
    from rose_ray.config import load_config

    config = config_path(args.config)
    stem = "table" if args.config == "tiny" else f"table_{Path(args.config).stem}"
    out, tb = args.out or str(RESULTS / f"{stem}.json"), Path(args.tb or RESULTS / stem)
    steps = args.steps or (2 if args.quick else load_config(config).steps)
    seeds = args.seeds or (1 if args.quick else 3)
    quick = ["eval.n=4", "eval.max_turns=2", "rollout.max_turns=3"] if args.quick else []
    dev_every = max(steps // 4, 1) if args.dev_every is None else args.dev_every
    common = ["checkpoint_every=1000000", f"eval.every={dev_every}", *quick, *args.set]
    own = arm_sets(args.arm_set)
    settings = {"config": args.config, "steps": steps, "overrides": common, "backend": args.backend}
    if own:
        settings["arm_overrides"] = own
    if args.resume and (tb / "latest").is_file():
        run_root = tb / (tb / "latest").read_text().strip()
        before = json.loads((run_root / "settings.json").read_text())
        if before != settings:
            raise SystemExit(f"table: --resume: {run_root} ran with {before}, not {settings}; run without --resume")
        print(f"table: resuming {run_root}", flush=True)
    else:
        run_root = new_version(tb)  # this run's; earlier runs' arms stay beside it
        print(f"table: this run goes to {run_root}", flush=True)
        (run_root / "settings.json").write_text(json.dumps(settings))

    from rose_ray.rollout.actors import init_ray

    init_ray()  # one private cluster for every arm
    t_start, load_start = time.time(), os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}

    def run_once(arm: str, seed: int | None, make: Any) -> None:
        """One arm (and seed): its result.json, or run it now and write that when it is done."""
        name = arm if seed is None else f"{arm}_seed{seed}"
        done = run_root / name / "result.json"
        if done.is_file():
            print(f"table: {name} done before, kept", flush=True)
        else:
            print(f"\n=== table: {name} ===", flush=True)
            if (run_root / name).exists():  # an arm interrupted before: run again from nothing
                shutil.rmtree(run_root / name)
            result = make(run_root / name)
            write_file(done, json.dumps(result, default=str))  # an interrupted arm is run again, a finished one never
        runs[arm].append(json.loads(done.read_text()))

    for who in REFERENCES:
        if who in args.arms:
            run_once(who, None, lambda d, w=who: run_reference(w, config, common, d, args.backend))
    for seed in range(seeds):
        for arm in (a for a in ONLINE_ARMS if a in args.arms):
            run_once(arm, seed, lambda d, a=arm, s=seed: run_online(a, s, steps, config, [*common, *own.get(a, [])], d,
                                                                    args.backend))
        if "sft" in args.arms:
            run_once("sft", seed, lambda d, s=seed: run_sft(s, steps, config, [*common, *own.get("sft", [])], d,
                                                            args.backend))

    rows, diffs = table_rows(runs), difference_rows(runs)
    total = time.time() - t_start
    games = rows[0]["games"] if rows else 0
    print(f"\nThe seed's table, {args.config} config: {steps} learner steps per arm, {seeds} seed(s), {games} held-out "
          "games; mean over seeds and games [95% bootstrap interval over games and seeds]")
    print(markdown(rows, diffs))
    print("invalid, cut: the share of the arm's held-out turns the game did not accept, and of replies cut "
          "at max_new_tokens before their action line\n")
    print("Per training arm, means over its learner steps (SFT: over its teacher games):")
    print(diagnostics_markdown(rows))
    print(f"total {total / 60:.1f} min; load average (1/5/15 min) start {load_start}, end {os.getloadavg()} "
          f"on {os.cpu_count()} cores")
    print("student and teacher: one greedy eval of fixed weights (an interval over games only); "
          "trained tokens: per seed, tokens carrying a loss term")
    figure = write_figure(rows, runs, run_root / "table.png")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(figure, Path(out).with_suffix(".png"))
    kept = keep_result(out, json.dumps({
        "bench": "table", "config": args.config, "quick": args.quick, "steps": steps, "seeds": seeds,
        "overrides": common, "arm_overrides": own, "rows": rows, "differences": diffs, "markdown": markdown(rows, diffs),
        "diagnostics_markdown": diagnostics_markdown(rows),
        "runs": {a: rs for a, rs in runs.items() if rs}, "total_s": total, "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=1, default=str), version=run_root)
    print(f"wrote {out} and {kept}, the figure {figure} (and {Path(out).with_suffix('.png')}); "
          f"curves: tensorboard --logdir {run_root} (this run) or {tb} (every run)")


if __name__ == "__main__":
    main()
