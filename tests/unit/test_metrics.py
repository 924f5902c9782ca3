"""Progress lines (rose_ray/metrics.py: `progress`, `LineProgress`, `MetricsLogger.progress`):
in logs that are not a terminal, plain lines, not tqdm's carriage-return updates; on a terminal,
tqdm's bar. The per-step scalars a run logs are checked through an episode in test_episode.py."""

from __future__ import annotations

import io

from rose_ray.metrics import LineProgress, progress


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
    assert lines[-1] == "eval: 48/48 games, score=0.979"
    assert [int(line.split()[1].split("/")[0]) for line in lines] == sorted(
        int(line.split()[1].split("/")[0]) for line in lines)


def test_a_small_job_reports_every_game():
    out = io.StringIO()
    bar = LineProgress(3, "gold", "game", out)
    for _ in range(3):
        bar.update(1)
    assert out.getvalue().splitlines() == ["gold: 1/3 games", "gold: 2/3 games", "gold: 3/3 games"]


def test_a_terminal_gets_tqdms_bar():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    bar = progress(4, "eval", "game", file=out)
    assert not isinstance(bar, LineProgress)
    bar.update(4)
    bar.close()
    assert "\r" in out.getvalue() and "4/4" in out.getvalue()


def test_a_runs_step_line_off_a_terminal_is_one_plain_line_per_step(tmp_path, capsys):
    """train's per-step line (MetricsLogger.progress): `\\r` rewrites on a terminal only; pytest's
    captured stdout, like a Ray job's log, is not one."""
    from rose_ray.metrics import MetricsLogger

    metrics = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        metrics.progress(f"step {step}/3 loss=0.5")
    metrics.end_progress()
    metrics.close()
    out = capsys.readouterr().out
    assert "\r" not in out and "\033" not in out
    assert out.splitlines() == ["step 1/3 loss=0.5", "step 2/3 loss=0.5", "step 3/3 loss=0.5"]


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
