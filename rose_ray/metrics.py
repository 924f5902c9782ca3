"""Run metrics: TensorBoard scalars and text under `<run_dir>/tb`, the same numbers as JSONL in
`<run_dir>/metrics.jsonl` and, with `logging.wandb`, in Weights & Biases; a progress display
(a tqdm bar with its ETA on a terminal, plain lines in logs)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

# W&B's x axis: the learner step, as TensorBoard's. Evals and a resume log steps out of order,
# which W&B's own step counter would refuse.
WANDB_STEP = "step"
WANDB_ID = "wandb_id"  # a run folder's W&B run id: --resume goes on in the same W&B run


class MetricsLogger:
    def __init__(self, run_dir: str | Path, wandb: Any = None, run_name: str = "",
                 config: dict[str, Any] | None = None) -> None:
        """`wandb`: a WandbConfig; when enabled, a W&B run named `run_name` gets every scalar."""
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.tb = SummaryWriter(str(self.run_dir / "tb"))
        # Opened at each write: a resume renames a rewritten file over it (ledger.keep_steps).
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.t0 = time.time()
        self.bar: Any = None  # the step bar, made at the first step (`progress`)
        self.wandb: Any = None
        if wandb is not None and wandb.enabled:  # the same W&B run again on a resume
            import wandb as wandb_sdk

            from rose_ray.files import write_file

            id_file = self.run_dir / WANDB_ID
            run_id = id_file.read_text().strip() if id_file.is_file() else None
            self.wandb = wandb_sdk.init(project=wandb.project, entity=wandb.entity,
                                        name=wandb.name or run_name, group=wandb.group,
                                        tags=list(wandb.tags) or None, config=config,
                                        dir=str(self.run_dir), id=run_id, resume="allow")
            if run_id is None:
                write_file(id_file, self.wandb.id + "\n")
            self.wandb.define_metric(WANDB_STEP)
            self.wandb.define_metric("*", step_metric=WANDB_STEP)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Scalars named `group/name` (e.g. `learner/loss`) at a learner step."""
        clean = {k: float(v) for k, v in scalars.items() if v is not None}
        for k, v in clean.items():
            self.tb.add_scalar(k, v, step)
        with self.jsonl.open("a") as f:
            f.write(json.dumps({"step": step, "time": round(time.time() - self.t0, 3), **clean}) + "\n")
        if self.wandb is not None:
            self.wandb.log({**clean, WANDB_STEP: step})

    def progress(self, step: int, total: int, text: str) -> None:
        """The run at learner step `step` of `total` (`progress`); `text` after the count."""
        if self.bar is None:
            self.bar = progress(total, "train", "step", file=sys.stdout, every=1, initial=step - 1)
        self.bar.set_postfix_str(text, refresh=False)
        self.bar.update(step - self.bar.n)  # back, after a learner restart to an earlier checkpoint

    def end_progress(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self.end_progress()
        self.tb.flush()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def read_scalars(tb_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in a TensorBoard folder, read back with tensorboard's event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def trajectory_markdown(record: dict[str, Any], max_chars: int = 600) -> str:
    """A trajectory record as readable text for TensorBoard (who wrote each turn)."""
    lines = [f"**{record['item_id']}** ({record['task']}) score {record['score']:.2f}, "
             f"handoff turn {record.get('handoff_turn')}", ""]
    from rose_ray.rows import message_text

    for m in record["conversations"][2:]:
        role, text = message_text(m)
        lines.append(f"- *{m.get('owner', role)}*: {text.replace(chr(10), ' ')[:max_chars]}")
    return "\n".join(lines)


def step_scalars(batch: list[Any], learner: dict[str, float], rollouts: Any, learning: Any,
                 restarts: dict[str, int], env_health: list[dict[str, Any]],
                 episodes_per_s: float) -> dict[str, float]:
    """A learner step's numbers: from its metrics (`learner`), its batch of trajectories, and the
    run's own counters (run.py's `Rollouts` and `Learning`)."""
    student_tokens = sum(len(x.token_ids) for t in batch for x in t.turns if x.owner == "student")
    handoffs = [t.handoff_turn for t in batch if t.handoff_turn is not None]
    actions = sum(t.rounds for t in batch) or 1
    scalars = {f"learner/{k}": learner.get(k, 0.0)
               for k in ("loss", "grad_norm", "lr", "tokens_per_s", "trained_tokens", "skipped_nonfinite")}
    # OPD: the mean importance ratio π_now/π_behaviour and the reverse-KL estimate.
    scalars.update({f"learner/{k}": learner[k] for k in ("opd_ratio", "opd_reverse_kl", "opd_clip_frac")
                    if k in learner})
    scalars.update({
        # The CE term trains teacher tokens (rose, teacher_sft); 0 = no such term this step.
        "learner/loss_teacher_ce": learner.get("loss_ce", 0.0),
        "learner/loss_opd": learner.get("loss_opd", 0.0),
        "rollout/score": sum(t.score for t in batch) / len(batch),
        "rollout/tokens_per_s": student_tokens / max(sum(t.timing.get("student_s", 0) for t in batch), 1e-6),
        "rollout/handoff_turn": sum(handoffs) / len(handoffs) if handoffs else 0.0,
        "rollout/invalid_action_rate": sum(t.invalid_actions for t in batch) / actions,
        # Replies cut at max_new_tokens, and those cut before an `Action:` line.
        "rollout/truncated_rate": sum(t.truncated_turns for t in batch) / actions,
        "rollout/cut_before_action_rate": sum(t.cut_before_action for t in batch) / actions,
    })
    read = sum(t.timing.get("teacher_scored_tokens", 0.0) for t in batch)
    if read:  # OPD: tokens the teacher read to score the student's, per student token scored
        scored = sum(len(x.teacher_logprobs) for t in batch for x in t.turns if x.teacher_logprobs is not None)
        scalars["rollout/teacher_read_per_scored_token"] = read / max(scored, 1)
    scalars.update(episode_scalars(batch))
    # What the step trained on (`trained_scalars`).
    scalars.update({k: v for k, v in learner.items() if k.startswith("learner/")})
    ps = [t.handoff_p for t in batch if t.handoff_p is not None]
    if ps:  # decay: the takeover probability this batch's episodes played under
        scalars["rollout/handoff_p"] = sum(ps) / len(ps)
    p50 = [h["step_ms_p50"] for h in env_health if h["step_ms_p50"] is not None]
    p95 = [h["step_ms_p95"] for h in env_health if h["step_ms_p95"] is not None]
    buffer, lags = rollouts.buffer, rollouts.buffer.lags[-len(batch):]
    scalars.update({
        "rollout/episodes_per_s": episodes_per_s,
        "async/policy_lag": sum(lags) / len(lags) if lags else 0.0,
        "async/buffer_size": float(len(buffer.items)),
        "async/dropped_stale": float(buffer.counters.dropped_stale),
        "env/step_ms_p50": sorted(p50)[len(p50) // 2] if p50 else 0.0,
        "env/step_ms_p95": max(p95) if p95 else 0.0,
        "env/restarts": float(rollouts.runner.counters.restarts + sum(h["restarts"] for h in env_health)),
        "weights/sync_ms": learning.weights_ms,
        "weights/version": float(learning.learner.version),
        "publish/fallbacks": float(learning.fallbacks),
        "reliability/engine_restarts": float(sum(n for role, n in restarts.items() if role != "learner")),
        "reliability/learner_restarts": float(restarts["learner"]),
    })
    return scalars


def episode_scalars(batch: list[Any]) -> dict[str, float]:
    """What a batch's episodes played: each owner's share of replies the game took as actions (the
    teacher's also by turn from the first reply), the share of handoffs whose game state (or a part
    of it) differed from its state at load, and an expert teacher's plan and failure shares."""
    valid: dict[str, list[bool]] = {}
    by_turn: dict[int, list[bool]] = {}
    for t in batch:
        invalid, at = set(t.invalid_turns), 0
        for i, x in enumerate(t.turns):
            if x.role == "assistant" and x.owner != "prompt":
                at += 1
                valid.setdefault(x.owner, []).append(i not in invalid)
                if x.owner == "teacher":
                    by_turn.setdefault(at, []).append(i not in invalid)
    out = {f"rollout/{o}_valid_rate": sum(v) / len(v) for o in ("student", "teacher") if (v := valid.get(o))}
    out.update({f"rollout/teacher_valid_by_turn/t{n:02d}": sum(v) / len(v) for n, v in sorted(by_turn.items())})
    states = [t.handoff_state for t in batch if t.handoff_state]
    for part in dict.fromkeys(k for s in states for k in s):
        name = "state" if part == "changed" else part
        out[f"rollout/handoff_{name}_changed_rate"] = sum(bool(s.get(part)) for s in states) / len(states)
    experts = [t.expert for t in batch if t.expert is not None]
    if experts:
        asked = [e for e in experts if e.get("status") != "unwinnable"]
        if asked:
            out["rollout/expert_planned_rate"] = sum(bool(e["planned"]) for e in asked) / len(asked)
            out["rollout/expert_verified_rate"] = sum(bool(e["verified"]) for e in asked) / len(asked)
        out["rollout/expert_no_plan_rate"] = sum(t.end_reason == "no_plan" for t in batch) / len(batch)
        out["rollout/expert_unwinnable_rate"] = (len(experts) - len(asked)) / len(batch)
    return out


def trained_scalars(batch: list[Any], loss_flags: list[list[bool]], tokens: dict[str, int]) -> dict[str, float]:
    """What a learner step trained on: tokens per owner; of the replies that carried loss
    (`loss_flags`: tokens.loss_turns) the share truncated, repeated and invalid; and the share of
    student tokens sampled on an older policy version than their reply's end (in-flight updates)."""
    trained = [(t, i) for t, flags in zip(batch, loss_flags) for i, f in enumerate(flags)
               if f and t.turns[i].role == "assistant"]
    n = len(trained)
    out = {f"learner/trained_tokens_{o}": float(tokens.get(o, 0)) for o in ("student", "teacher")}
    if tokens.get("student"):
        older = sum(min(x.tokens_on_version, len(x.token_ids) - x.frame - x.close)
                    for x in (t.turns[i] for t, i in trained)
                    if x.owner == "student" and x.policy_version_end is not None and x.tokens_on_version)
        out["learner/trained_student_older_version_share"] = older / tokens["student"]
    out["learner/trained_replies"] = float(n)
    if n:
        out["learner/trained_truncated_rate"] = sum(t.turns[i].truncated for t, i in trained) / n
        out["learner/trained_repeated_rate"] = sum(i in set(t.repeated_turns) for t, i in trained) / n
        out["learner/trained_invalid_rate"] = sum(i in set(t.invalid_turns) for t, i in trained) / n
    return out


def episodes_per_s(finished_at: list[float], batch: list[Any]) -> float:
    """Finished episodes per second over the last minute (`rollout/episodes_per_s`): `batch`'s
    finish times join `finished_at` (the run's list), which keeps the last minute's."""
    now = time.time()
    finished_at[:] = [s for s in finished_at + [t.timing["finished_at"] for t in batch] if now - s < 60]
    if not finished_at:  # none finished in the last minute (a learner step longer than that)
        return 0.0
    return len(finished_at) / max(now - min(finished_at), 1e-3)


class LineProgress(tqdm):
    """tqdm's progress as plain lines ("eval: 12/48 games, score=0.125 [00:30<01:30]") about every
    tenth of the work (or every `every`), for logs where tqdm's `\\r` updates would pile into one line."""

    def __init__(self, total: int, desc: str, unit: str, file: Any = None, every: int | None = None,
                 initial: int = 0) -> None:
        self.every, self.printed = every or max(1, total // 10), initial
        super().__init__(total=total, desc=desc, unit=unit, file=file or sys.stderr, initial=initial,
                         mininterval=0, miniters=1, leave=False,
                         bar_format="{desc}: {n_fmt}/{total_fmt} {unit}s{postfix} [{elapsed}<{remaining}]")

    def update(self, n: float | None = 1) -> None:
        super().update(n)
        self.refresh()  # tqdm's own skips a step back (a learner restart to an earlier checkpoint)

    def display(self, msg: Any = None, pos: Any = None) -> None:
        n, before = self.n, self.printed
        if n != before and (n // self.every != before // self.every or n == self.total):
            self.printed = n
            print(self.__str__(), file=self.fp, flush=True)


def progress(total: int, desc: str, unit: str, file: Any = None, every: int | None = None, initial: int = 0) -> Any:
    """A tqdm bar on a terminal, plain progress lines elsewhere (LineProgress)."""
    out = file or sys.stderr
    if out.isatty():
        return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=out, initial=initial)
    return LineProgress(total, desc, unit, out, every, initial)
