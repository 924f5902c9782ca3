"""Progress lines (rose_ray/metrics.py: `progress`, `LineProgress`, `MetricsLogger.progress`):
in logs that are not a terminal, plain lines with the time elapsed and left, not tqdm's
carriage-return updates; on a terminal, tqdm's bar with its ETA, the training loop's too. W&B
(`logging.wandb`): every scalar TensorBoard gets, read back from W&B's offline files. The
per-step scalars a run logs are checked through an episode in test_episode.py, and a whole
run's in W&B in tests/e2e/test_train.py."""

from __future__ import annotations

import io
import json
import re
import sys
import time
from pathlib import Path

import pytest

from rose_ray.metrics import LineProgress, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_a_terminal_prints_about_ten_plain_lines():
    out = io.StringIO()  # not a tty, like a Ray job's log
    bar = progress(48, "eval", "game", file=out)
    assert isinstance(bar, LineProgress)
    for i in range(48):
        bar.set_postfix(score=f"{i / 48:.3f}")
        bar.update(1)
    bar.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text
    assert 8 <= len(lines) <= 13, lines
    assert re.fullmatch(r"eval: 48/48 games, score=0\.979 \[00:00<00:00\]", lines[-1]), lines[-1]
    assert [int(line.split()[1].split("/")[0]) for line in lines] == sorted(
        int(line.split()[1].split("/")[0]) for line in lines)


def test_a_small_job_reports_every_game():
    out = io.StringIO()
    bar = LineProgress(3, "gold", "game", out)
    for _ in range(3):
        bar.update(1)
    assert [line.split(" [")[0] for line in out.getvalue().splitlines()] == [
        "gold: 1/3 games", "gold: 2/3 games", "gold: 3/3 games"]


def test_a_terminal_gets_tqdms_bar():
    out = Terminal()
    bar = progress(4, "eval", "game", file=out)
    assert not isinstance(bar, LineProgress)
    bar.update(4)
    bar.close()
    assert "\r" in out.getvalue() and "4/4" in out.getvalue()


def test_a_runs_step_line_off_a_terminal_is_one_plain_line_per_step(tmp_path, capsys):
    """train's per-step progress (MetricsLogger.progress): a plain line per step with the time
    elapsed and left, off a terminal (pytest's captured stdout, like a Ray job's log, is not one);
    a resumed run counts from its step."""
    from rose_ray.metrics import MetricsLogger

    metrics = MetricsLogger(tmp_path)
    for step in (4, 5, 6):  # resumed at step 3
        metrics.progress(step, 6, "loss 0.500")
    metrics.close()
    out = capsys.readouterr().out
    assert "\r" not in out and "\033" not in out
    assert [line.split(" [")[0] for line in out.splitlines()] == [
        "train: 4/6 steps, loss 0.500", "train: 5/6 steps, loss 0.500", "train: 6/6 steps, loss 0.500"]
    assert all(re.search(r" \[\d\d:\d\d<\d\d:\d\d\]$", line) for line in out.splitlines())


def test_a_run_on_a_terminal_gets_a_bar_with_its_eta(tmp_path, monkeypatch):
    from rose_ray.metrics import MetricsLogger

    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    metrics = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        metrics.progress(step, 48, "loss 0.500")
    metrics.close()
    text = out.getvalue()
    assert "\r" in text and "3/48" in text and "loss 0.500" in text
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", text)  # elapsed < the time left


def wandb_records(run_dir: Path) -> list:
    """Every record of the W&B offline runs under `run_dir/wandb` (their `.wandb` transaction
    logs: LevelDB's log format, 32 KiB blocks of 7-byte-headed chunks, after a 7-byte file header
    that starts `:W&B`), as W&B's own protobuf Records, in the order written."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B", path
        pos, pending = 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:  # a block's tail too short for a header: padding
                pos += left
                continue
            length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
            pending += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or a record's last chunk
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                records.append(record)
                pending = b""
    return records


def wandb_history(run_dir: Path, runs: int = 1, timeout_s: float = 60.0) -> list[dict]:
    """What each W&B log call of the run folder's W&B runs held, without W&B's own keys. W&B's
    service process may still be writing (or not yet have made) a run's file when `finish` has
    returned (seen here: the last run's history missing): read once `runs` runs' files are there,
    each with its exit record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(run_dir)
        started = sum(r.WhichOneof("record_type") == "run" for r in records)
        if started >= runs and sum(r.WhichOneof("record_type") == "exit" for r in records) == started:
            break
        assert time.monotonic() < deadline, f"a W&B run's file in {run_dir} has no exit record after {timeout_s} s"
        time.sleep(0.2)
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item
             if not (item.key or item.nested_key[0]).startswith("_")}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_wandb_gets_every_scalar_tensorboard_gets_and_the_config(tmp_path, monkeypatch):
    """logging.wandb: the same scalars at the same steps as TensorBoard and metrics.jsonl (steps
    out of order too: evals log late, a resume logs again), the run's name and config; a second
    logger on the folder (a --resume) goes on in the same W&B run. Offline: files only."""
    pytest.importorskip("wandb")
    from rose_ray.config import WandbConfig
    from rose_ray.metrics import MetricsLogger, read_scalars

    for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = WandbConfig(enabled=True, project="rose_tests", tags=["unit"])
    logged = [(0, {"eval/score": 0.25}), (1, {"learner/loss": 7.5, "rollout/score": 0.125}),
              (2, {"learner/loss": 6.5, "rollout/score": 0.375}), (1, {"eval/dev_score": 0.5})]  # float32 exact, as TensorBoard keeps
    metrics = MetricsLogger(tmp_path, settings, "tiny/version_0", {"steps": 2, "learner": {"lr": 0.003}})
    for step, scalars in logged[:3]:
        metrics.log(step, scalars)
    metrics.close()
    time.sleep(1.1)  # W&B names an offline run's folder by the second it starts (a resume takes longer)
    resumed = MetricsLogger(tmp_path, settings, "tiny/version_0", {"steps": 4})
    resumed.log(*logged[3])
    resumed.close()

    assert wandb_history(tmp_path, runs=2) == [{"step": step, **scalars} for step, scalars in logged]
    jsonl = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in m.items() if k != "time"} for m in jsonl] == wandb_history(tmp_path)
    tensorboard = read_scalars(tmp_path / "tb")
    assert {(tag, s, v) for tag, points in tensorboard.items() for s, v in points} == {
        (tag, step, v) for step, scalars in logged for tag, v in scalars.items()}
    runs = [r.run for r in wandb_records(tmp_path) if r.WhichOneof("record_type") == "run"]
    run_id = (tmp_path / "wandb_id").read_text().strip()
    assert [(r.run_id, r.display_name, r.project, list(r.tags)) for r in runs] == [
        (run_id, "tiny/version_0", "rose_tests", ["unit"])] * 2
    config = {item.key: json.loads(item.value_json) for item in runs[0].config.update}
    assert config["steps"] == 2 and config["learner"] == {"lr": 0.003}


def test_a_batch_reports_its_handoffs_state_the_teachers_validity_by_turn_and_the_experts_plans():
    """episode_scalars: counted from the trajectories' own records."""
    from rose_ray.metrics import episode_scalars
    from rose_ray.types import GameId, Trajectory, Turn

    def episode(owners: list[str], invalid: list[int], state: dict | None, expert: dict | None,
                end: str = "turn_limit") -> Trajectory:
        turns = [Turn("user", "i", "prompt"), Turn("assistant", "a", "prompt"), Turn("user", "o", "env")]
        for owner in owners:
            turns += [Turn("assistant", "r", owner), Turn("user", "o", "env")]
        replies = [i for i, t in enumerate(turns) if t.role == "assistant" and t.owner != "prompt"]
        return Trajectory(GameId("t", 0, "sciworld_0"), turns, rounds=len(owners), handoff_state=state,
                          invalid_turns=[replies[n] for n in invalid], expert=expert, end_reason=end)

    plan = {"planned": True, "verified": True, "status": "verified"}
    batch = [
        episode(["student", "student", "teacher", "teacher"], [1, 3], {"room": True, "focus": False, "changed": True},
                plan),
        episode(["student", "student", "teacher"], [], {"room": False, "focus": False, "changed": False},
                {"planned": True, "verified": False, "status": "partial"}),
        episode(["student", "student"], [], {"room": False, "focus": False, "changed": False},
                {"planned": False, "verified": False, "status": "no_plan"}, end="no_plan"),
        episode(["student"], [], None, {"planned": False, "verified": False, "status": "unwinnable"}),
    ]
    out = episode_scalars(batch)
    # turn 3: one teacher reply valid of two; turn 4: the first episode's, invalid
    assert out["rollout/teacher_valid_by_turn/t03"] == 1.0 and out["rollout/teacher_valid_by_turn/t04"] == 0.0
    assert not any(k.endswith(("t01", "t02")) for k in out)
    assert out["rollout/handoff_state_changed_rate"] == 1 / 3 and out["rollout/handoff_room_changed_rate"] == 1 / 3
    assert out["rollout/handoff_focus_changed_rate"] == 0.0
    assert out["rollout/expert_planned_rate"] == 2 / 3 and out["rollout/expert_verified_rate"] == 1 / 3
    assert out["rollout/expert_no_plan_rate"] == 1 / 4 and out["rollout/expert_unwinnable_rate"] == 1 / 4
    assert out["rollout/student_valid_rate"] == 6 / 7
    # A model teacher: no expert keys.
    assert not any("expert" in k for k in episode_scalars([episode(["teacher"], [], None, None)]))
