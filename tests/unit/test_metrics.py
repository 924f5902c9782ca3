"""Progress lines (rose_ray/metrics.py: `progress`, `LineProgress`, `MetricsLogger.progress`):
in logs that are not a terminal, plain lines with the time elapsed and left, not tqdm's
carriage-return updates; on a terminal, tqdm's bar with its ETA, the training loop's too. W&B
(`logging.wandb`): every scalar TensorBoard gets, read back from W&B's offline files. The
per-step scalars a run logs are checked through an episode in test_episode.py, and a whole
run's in W&B in tests/e2e/test_train.py."""

from __future__ import annotations

import io
import re
import sys

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


def test_the_episode_rate_counts_the_last_minute_and_is_zero_after_a_step_longer_than_that():
    import time
    from types import SimpleNamespace

    from rose_ray.metrics import episodes_per_s

    def finished(seconds_ago: float) -> SimpleNamespace:
        return SimpleNamespace(timing={"finished_at": time.time() - seconds_ago})

    window: list[float] = []
    assert 0.9 < episodes_per_s(window, [finished(10.0) for _ in range(10)]) <= 1.0  # 10 over the last 10 s
    # A learner step of over a minute: every episode of the batch finished more than 60 s ago.
    assert 0.9 < episodes_per_s(window, [finished(90.0), finished(75.0)]) <= 1.0  # the ten earlier count
    assert len(window) == 10  # only the last minute's are kept
    assert episodes_per_s([], [finished(90.0), finished(75.0)]) == 0.0
