"""Held-out evaluation (`rose-ray eval`, docs/configuration.md): Score (mean normalised score),
Success (the task is done: a score of 100 in ScienceWorld), Pass (score > 0); DiscoveryWorld also
as its paper scores it (judge.py). Finished games go to `<out>.partial.jsonl` (an interrupted eval
resumes there), the result to `<out>.json` and `<out>.md`. From Python: `rose_ray.evaluate(run=RUN)`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rose_ray import callable_module
from rose_ray.commands import EvalCommand, from_keywords, training_eval
from rose_ray.envs.worlds import get_world, knowledge_scorer, paper_tables, world_of_item
from rose_ray.errors import DataError, InputError
from rose_ray.files import write_file
from rose_ray.judge import JudgeConfig, VerdictCache, check_judge, judge_records, verdict_counts
from rose_ray.rows import PartialRows
from rose_ray.types import Trajectory

if TYPE_CHECKING:
    from rose_ray.rollout.play import PlaySpec


# --------------------------------------------------------------------------- metrics
def game_record(t: Trajectory) -> dict[str, Any]:
    """One finished game as a flat record (the partial file's rows, the JSON's `games`)."""
    return {
        "item_id": t.game.item_id, "task": t.game.task, "var": t.game.variation,
        "raw_score": t.raw_score, "score": t.score, "success": bool(t.success), "pass": t.score > 0,
        "turns": t.rounds, "invalid_actions": t.invalid_actions,
        "invalid_rate": t.invalid_actions / max(t.rounds, 1), "handoff_turn": t.handoff_turn,
        "truncated_turns": t.truncated_turns, "cut_before_action": t.cut_before_action,
        "end_reason": t.end_reason, "attempts": int(t.timing.get("attempts", 1)),
        **{k: getattr(t, k) for k in ("handoff_state", "expert", "report") if getattr(t, k) is not None},
        # DiscoveryWorld: the paper's process score and what the judge needs
        **{k: t.scoring[k] for k in ("process", "task_description", "critical_questions") if k in t.scoring},
        # what the judge reads by default: the agent's thoughts, numbered
        **({"thoughts": knowledge_scorer(world_of_item(t.game.item_id)).episode_thoughts(
            [u.text for u in t.turns if u.role == "assistant" and u.owner != "prompt"])}
           if "critical_questions" in t.scoring else {}),
    }


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals and a per-task table from game records."""
    def block(rows: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(rows)
        turns = sum(r["turns"] for r in rows)
        return {
            "games": n,
            "score": sum(r["score"] for r in rows) / n if n else 0.0,
            "success": sum(bool(r["success"]) for r in rows) / n if n else 0.0,
            "pass": sum(bool(r["pass"]) for r in rows) / n if n else 0.0,
            "mean_turns": turns / n if n else 0.0,
            "invalid_action_rate": sum(r["invalid_actions"] for r in rows) / turns if turns else 0.0,
            # replies that ran out of tokens before an `Action:` line (older partial files lack it)
            "cut_before_action_rate": sum(r.get("cut_before_action", 0) for r in rows) / turns if turns else 0.0,
            **(tables.cell(rows) if paper else {}),
        }

    paper = bool(records) and all("process" in r for r in records)  # DiscoveryWorld games
    tables = paper_tables() if paper else None  # the world's paper scoring, loaded only for its games
    by_task = {t: [r for r in records if r["task"] == t] for t in sorted({r["task"] for r in records})}
    out = {"overall": block(records), "per_task": {t: block(rs) for t, rs in by_task.items()}}
    if paper:
        out["paper"] = tables.paper_summary(records)
        verdicts = [v for r in records for v in r.get("verdicts") or []]
        counted = verdict_counts(verdicts)
        sources = sorted({r["knowledge_from"] for r in records if r.get("knowledge_from")})
        out["overall"].update(judged_questions=len(verdicts), unparsed_verdicts=counted["unparsed"],
                              judge_errors=counted["errors"], knowledge_from=" and ".join(sources) or None)
    return out


def markdown(summary: dict[str, Any], title: str) -> str:
    """Totals, then a per-task table."""
    head = "| {}games | Score | Success | Pass | mean turns | invalid actions | cut before action |"
    rule = "| {}---: | ---: | ---: | ---: | ---: | ---: | ---: |"

    def cells(b: dict[str, Any]) -> str:
        return (f"{b['games']} | {b['score']:.4f} | {b['success']:.3f} | {b['pass']:.3f} | "
                f"{b['mean_turns']:.1f} | {b['invalid_action_rate']:.3f} | "
                f"{b.get('cut_before_action_rate', 0.0):.3f} |")

    lines = [f"# {title}", "", head.format(""), rule.format(""), "| " + cells(summary["overall"]), "",
             head.format("task | "), rule.format("--- | ")]
    lines += [f"| {task} | " + cells(b) for task, b in summary["per_task"].items()]
    if "paper" in summary:
        o = summary["overall"]
        lines += ["", "## DiscoveryWorld, as its paper scores it", "",
                  f"Pooled over all {o['games']} games (themes, unit tests and Tutorial alike; the paper's "
                  f"Average rows are below): completion {o['completion']:.3f}, process {o['process']:.3f}; "
                  + ("knowledge – (no game judged: needs --judge, and games with critical questions)."
                     if o["knowledge"] is None else
                     f"knowledge {o['knowledge']:.3f} (judged on the agent's {o.get('knowledge_from') or 'report'}) "
                     f"over the {o['knowledge_games']} games with critical questions "
                     f"({o['judged_questions']} questions judged, {o['unparsed_verdicts']} unparsed verdicts and "
                     f"{o['judge_errors']} judge errors, which count 0)."), "",
                  paper_tables().paper_markdown(summary["paper"]).rstrip()]
    return "\n".join(lines) + "\n"


def compare(paths: list[str]) -> str:
    """Several results side by side (DiscoveryWorld's also with completion, process, knowledge)."""
    results = []
    for p in paths:
        try:
            result = json.loads(Path(p).read_text())
            result["summary"]["overall"]["score"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{p}: not an eval result ({type(e).__name__}: {e})") from None
        results.append((p, result))
    paper = any("paper" in r["summary"] for _, r in results)
    head = "| model | games | Score | Success | Pass |" + (" Completion | Process | Knowledge |" if paper else "")
    rows = [head, "| --- |" + " ---: |" * (head.count("|") - 2)]
    named = []
    for p, result in results:
        o = result["summary"]["overall"]
        name = result.get("config", {}).get("name") or result.get("config", {}).get("model") or p
        row = f"| {name} | {o['games']} | {o['score']:.4f} | {o['success']:.3f} | {o['pass']:.3f} |"
        if paper:
            row += "".join(" – |" if o.get(m) is None else f" {o[m]:.3f} |"
                           for m in ("completion", "process", "knowledge"))
        rows.append(row)
        if "paper" in result["summary"]:
            named.append((name, result["summary"]["paper"]))
    table = "\n".join(rows)
    if not named:
        return table
    return table + "\n\n" + paper_tables().compare_paper(named).rstrip()


# --------------------------------------------------------------------------- the job
def train_eval_job(cfg: Any, model: str, out: str | None = None, split: str | None = None,
                   backend: str | None = None) -> EvalCommand:
    """The held-out eval a training run of `cfg` does (commands.training_eval), of `model`, written
    to `out` (replaced)."""
    return EvalCommand(**{**training_eval(cfg, model, split, backend), "out": out, "overwrite": True})


def training_evals(cfg: Any, model: str) -> tuple[EvalCommand, PlaySpec]:
    """A training run's own evals and their spec, as `rose-ray eval --run` makes them, so the two
    agree to the digit."""
    job = train_eval_job(cfg, model)
    return job, job.play_spec(base=cfg.student_engine)


def run_eval(cfg: EvalCommand) -> dict[str, Any]:
    """Evaluate `cfg.model` on its games; resumes from `<out>.partial.jsonl` if present."""
    if not cfg.model:
        raise InputError("eval: give --model (or --run RUN for a training run's model)")
    out = Path(cfg.out.removesuffix(".json"))
    result_file = out.with_name(out.name + ".json")
    if result_file.exists() and not cfg.overwrite:  # nothing started, nothing written
        raise InputError(f"eval: {result_file} already exists; give another --out, or --overwrite to replace it")
    from rose_ray.inference.backends import check_command_engines

    spec = cfg.play_spec()  # --run, --config: as that config's runs evaluate
    protocol = spec.protocol()  # a bad file fails before any actor
    games = cfg.games()  # the same games as a training run's evals with these `tasks`, `eval.n` and `eval.seed`
    judge = None
    if cfg.judge:  # a judge that is not there fails now, not after every game is played
        judge = check_judge(JudgeConfig(
            model=cfg.judge, world=cfg.world, served_model=cfg.judge_model,
            max_new_tokens=cfg.judge_max_new_tokens, concurrency=cfg.concurrency, dtype=cfg.dtype,
            thinking=None if cfg.judge_thinking is None else cfg.judge_thinking == "on"))
    check_command_engines("eval", spec.engines())  # a served model that cannot do the job fails now
    with PartialGames(out, resume_header(cfg), cfg.overwrite) as partial:
        todo = [g for g in games if g.item_id not in partial.done]
        print(f"eval: {len(games)} games of {cfg.split!r} ({len(games) - len(todo)} already done, resuming)"
              if len(todo) < len(games) else f"eval: {len(games)} games of {cfg.split!r}")
        if todo:
            from rose_ray.event_loop import run_coroutine
            from rose_ray.metrics import progress
            from rose_ray.rollout.play import play

            bar = progress(len(todo), "eval", "game")

            def on_done(_: int, t: Trajectory) -> None:
                record = game_record(t)
                partial.add(record["item_id"], record)  # each finished game survives an interruption
                bar.update(1)
                # this eval's games only (a partial file of a longer eval holds more)
                done = [partial.done[g.item_id] for g in games if g.item_id in partial.done]
                bar.set_postfix(score=f"{sum(r['score'] for r in done) / len(done):.3f}")

            run_coroutine(lambda: play(spec, todo, protocols=protocol, on_done=on_done,
                                       request_prefix="eval/"))
            bar.close()
    records = [partial.done[g.item_id] for g in games]
    if judge is not None:
        # Kept: a rerun with this judge asks nothing twice.
        cache = VerdictCache(out.with_name(out.name + ".verdicts.jsonl"))
        counts = judge_records(records, judge, cache, cfg.knowledge_from)
        print(f"eval: judge {judge.name} on the agent's {cfg.knowledge_from}: {counts['questions']} critical "
              f"questions, {counts['asked']} asked, {counts['cached']} from the cache, {counts['unparsed']} "
              f"unparsed, {counts['errors']} errors, {counts['cut']} games' {cfg.knowledge_from} cut to fit")
    summary = summarise(records)
    result = {"config": asdict(cfg), "summary": summary, "games": records,
              "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_file(result_file, json.dumps(result, indent=1))
    write_file(out.with_name(out.name + ".md"), markdown(summary, f"eval of {cfg.model} on {cfg.world} {cfg.split}"))
    partial.path.unlink(missing_ok=True)
    return result


RESUME_KEYS = ("model", "teacher", "handoff", "max_turns", "temperature", "max_new_tokens",
               "world", "mapping", "seed", "context_tokens", "context_policy", "instruction_from",
               "enable_thinking", "history")


def resume_header(cfg: EvalCommand) -> dict[str, Any]:
    """The settings that tie a partial results file to an eval (the mapping resolved)."""
    world = get_world(cfg.world)
    return {**{k: getattr(cfg, k) for k in RESUME_KEYS}, "tasks": cfg.task_names,
            "mapping": world.catalogue(cfg.mapping).mapping,
            "report": world.protocol.report_question is not None and cfg.knowledge_from == "report"}


# A finished game's fields that a summary reads, and their types.
RECORD_FIELDS = {"item_id": str, "task": str, "score": (int, float), "success": (bool, int), "pass": (bool, int),
                 "turns": int, "invalid_actions": int}


class PartialGames(PartialRows):
    """An eval's finished games, resumed as `collect`'s rows are: `<out>.partial.jsonl` holds a
    `{"eval_config": resume_header}` line and then a game record a line, by item id."""

    suffix, header_key = ".partial.jsonl", "eval_config"
    header_name = "the header of the partial results"
    other_job = "partial results of an eval with other settings ({})"

    def _parse(self, record: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
        wrong = [k for k, kind in RECORD_FIELDS.items() if not isinstance(record.get(k), kind)]
        if wrong:
            raise DataError(f"{where}: not a finished game ({', '.join(wrong)} missing or of the wrong type)")
        return record["item_id"], record

    def _line(self, item_id: Any, record: dict[str, Any]) -> dict[str, Any]:
        return record


def evaluate(model: str | None = None, **settings: Any) -> dict[str, Any]:
    """`rose-ray eval` from Python, `settings` by name (commands.EvalCommand), checked as its flags
    are: `evaluate(run="runs/tiny")` is `rose-ray eval --run runs/tiny`. Returns the result written
    to OUT.json. Works inside a running event loop (event_loop.py)."""
    return run_eval(from_keywords(EvalCommand, "eval", {**settings, **({} if model is None else {"model": model})}))


def cli_main(cfg: EvalCommand) -> int:
    if cfg.compare:
        print(compare(cfg.compare))
        return 0
    if cfg.run:
        print(f"eval: {cfg.model}, as the run {cfg.run} evaluates it")
    result = run_eval(cfg)
    print(markdown(result["summary"], f"eval of {cfg.model} on {cfg.world} {cfg.split}"))
    print(f"wrote {cfg.out}.json and {cfg.out}.md")
    return 0


callable_module(__name__)  # `rose_ray.evaluate(...)` is `evaluate(...)` (rose_ray/__init__.py)
