"""The run's supervision (rose_ray/supervision.py) on stand-in parts (no Ray, no learner, no
engines; `write_checkpoint` replaced by a recorder): a lost learner group is restarted, back to
the latest checkpoint and published, and past `reliability.max_restarts` the run fails naming
the count while the learner's state stays unknown; a learner call cancelled midway leaves it
unknown; the stop writes a final checkpoint and model/ only while the learner's state is known,
always marks the ledger, raises a lost role with the checkpoint a `--resume` goes on from and a
crash as it was, and shuts down a learner that cannot write one; `supervise` returns what ended
the loop (a crash, a stall from the watchdog) and cancels the rest. The whole path on real runs:
tests/e2e/test_reliability.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import rose_ray.supervision
from rose_ray.learner.learner import LearnerLost
from rose_ray.reliability import RoleFailed, Stalled
from rose_ray.supervision import Supervision


class Engines:
    def __init__(self) -> None:
        self.monitoring = False
        self.monitor_cancelled = False

    def replacing(self) -> bool:
        return False

    async def monitor(self) -> None:
        self.monitoring = True
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.monitor_cancelled = True
            raise

    async def describe(self) -> list[str]:
        return ["student engine: generating"]


class DeadPool:
    class num_games:  # noqa: N801 - an actor method's handle
        @staticmethod
        def remote():
            async def call():
                raise RuntimeError("actor died")
            return call()


class Learner:
    def __init__(self, losses: int = 0) -> None:
        self.losses, self.restarts, self.shut_down = losses, 0, False

    def restart(self) -> None:
        self.restarts += 1
        if self.restarts <= self.losses:
            raise LearnerLost(f"rank 1 gone again ({self.restarts})")

    def shutdown(self) -> None:
        self.shut_down = True


class Parts:
    """The RunParts a Supervision reads, each call recorded in `calls`."""

    def __init__(self, run_dir: Path, learner: Learner | None = None, max_restarts: int = 3,
                 watchdog_s: float = 0.0, export_error: Exception | None = None) -> None:
        self.cfg = SimpleNamespace(reliability=SimpleNamespace(watchdog_s=watchdog_s, max_restarts=max_restarts),
                                   keep_checkpoints=2, steps=10, rollout=SimpleNamespace(batch_episodes=4))
        self.run_dir, self.learner, self.engines = run_dir, learner or Learner(), Engines()
        self.progress = SimpleNamespace(learner_restarts=0, step=3)
        self.buffer = SimpleNamespace(items=[1], in_flight=2)
        self.runner = SimpleNamespace(waiting=lambda: ["episode sciworld_0: waiting on the student engine"])
        self.pools = [DeadPool()]
        self.calls: list[str] = []
        self.publisher = SimpleNamespace(publish=self.publish)
        self.ledger = SimpleNamespace(stop=lambda: self.calls.append("ledger.stop"))
        self.export_error = export_error

    async def publish(self) -> None:
        self.calls.append("publish")

    def load_checkpoint(self, weights_only: bool) -> None:
        self.calls.append(f"load_checkpoint({weights_only})")

    def checkpoint_state(self) -> str:
        return "the run's state"

    def export_model(self) -> None:
        self.calls.append("export_model")
        if self.export_error is not None:
            raise self.export_error


@pytest.fixture
def written(monkeypatch):
    """The checkpoints `Supervision.checkpoint` writes: (run_dir, record, learner, keep) each;
    `written.error`, when set, is raised instead."""
    record = SimpleNamespace(calls=[], error=None)

    def write_checkpoint(run_dir, state, learner, keep):
        if record.error is not None:
            raise record.error
        record.calls.append((run_dir, state, learner, keep))

    monkeypatch.setattr(rose_ray.supervision, "write_checkpoint", write_checkpoint)
    return record


def test_a_lost_learner_is_restarted_from_the_latest_checkpoint_until_max_restarts(tmp_path, capsys):
    parts = Parts(tmp_path, Learner(losses=1), max_restarts=3)
    supervision = Supervision(parts)
    asyncio.run(supervision.restart_learner(LearnerLost("rank 1 gone")))
    assert parts.learner.restarts == 2 and parts.progress.learner_restarts == 2  # lost again once
    assert parts.calls == ["load_checkpoint(False)", "publish"]
    assert not supervision.learner_unsure and not supervision.restarting_learner
    assert "restarting the learner group from the latest checkpoint (2/3)" in capsys.readouterr().out

    parts.learner.losses = 99
    with pytest.raises(RoleFailed, match=r"learner: lost 4 times, more than reliability.max_restarts=3; "
                                         r"the last time: rank 1 gone again \(3\)"):
        asyncio.run(supervision.restart_learner(LearnerLost("rank 0 gone")))
    assert supervision.learner_unsure  # so the stop writes nothing over the latest checkpoint


def test_a_learner_call_cancelled_midway_leaves_its_state_unknown(tmp_path):
    supervision = Supervision(Parts(tmp_path))

    async def calls() -> None:
        assert await supervision.in_learner(lambda x: x + 1, 41) == 42
        assert not supervision.learner_unsure
        call = asyncio.create_task(supervision.in_learner(time.sleep, 0.3))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(calls())
    assert supervision.learner_unsure


def test_a_clean_stop_writes_the_checkpoint_and_the_model_then_marks_the_ledger(tmp_path, written):
    parts = Parts(tmp_path)
    asyncio.run(Supervision(parts).wind_down(None))
    assert written.calls == [(tmp_path, "the run's state", parts.learner, 2)]
    assert parts.calls == ["export_model", "ledger.stop"]


def test_a_stop_with_the_learner_unknown_writes_nothing_and_names_the_checkpoint_to_resume_from(tmp_path, written):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_4\n")
    parts = Parts(tmp_path)
    supervision = Supervision(parts)
    supervision.learner_unsure = True
    with pytest.raises(RoleFailed) as raised:
        asyncio.run(supervision.wind_down(Stalled("no learner step for 600 s")))
    assert type(raised.value) is Stalled
    assert str(raised.value) == (f"no learner step for 600 s\nthe stop could not write one; the latest is "
                                 f"checkpoint step_4 (rose-ray train --resume {tmp_path} goes on from it)")
    assert written.calls == [] and parts.calls == ["ledger.stop"]


def test_a_crash_is_raised_as_it_was_after_the_checkpoint_even_when_the_export_fails(tmp_path, written, capsys):
    parts = Parts(tmp_path, export_error=OSError("disk full"))
    crash = KeyError("a bug")
    with pytest.raises(KeyError) as raised:
        asyncio.run(Supervision(parts).wind_down(crash))
    assert raised.value is crash and len(written.calls) == 1
    assert parts.calls == ["export_model", "ledger.stop"]
    assert "no model/ at the stop: OSError: disk full" in capsys.readouterr().out
    with pytest.raises(OSError, match="disk full"):  # without a failure, a failing export is the failure
        asyncio.run(Supervision(Parts(tmp_path, export_error=OSError("disk full"))).wind_down(None))


def test_a_learner_that_cannot_write_the_stops_checkpoint_is_shut_down(tmp_path, written):
    written.error = LearnerLost("rank 1 gone")
    parts = Parts(tmp_path)
    with pytest.raises(RoleFailed, match="the stop could not write one; the latest is no checkpoint"):
        asyncio.run(Supervision(parts).wind_down(RoleFailed("student engine: lost")))
    assert parts.learner.shut_down and parts.calls == ["ledger.stop"]
    written.error = ValueError("a bug in the record")  # no failure before it: this one is raised
    with pytest.raises(ValueError, match="a bug in the record"):
        asyncio.run(Supervision(Parts(tmp_path)).wind_down(None))


def test_supervise_returns_what_ended_the_loop_and_cancels_the_rest(tmp_path):
    parts = Parts(tmp_path)
    supervision = Supervision(parts)

    async def crashing() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("a bug")

    async def finishing() -> None:
        await asyncio.sleep(0.01)

    ended = asyncio.run(supervision.supervise(crashing()))
    assert isinstance(ended, KeyError) and parts.engines.monitoring and parts.engines.monitor_cancelled
    assert asyncio.run(supervision.supervise(finishing())) is None


def test_the_watchdog_ends_a_loop_that_makes_no_progress_with_a_report(tmp_path, capsys):
    parts = Parts(tmp_path, watchdog_s=0.2)
    supervision = Supervision(parts)
    cancelled = []

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    supervision.doing("waiting for episodes")
    ended = asyncio.run(supervision.supervise(stuck()))
    assert isinstance(ended, Stalled) and cancelled == [True]
    report = str(ended)
    assert "watchdog: no learner step and no finished episode" in capsys.readouterr().out  # warned first
    assert "driver: waiting for episodes for" in report and "(step 3/10; 1 of 4 episodes ready, 2 in flight)" in report
    for line in ("episode sciworld_0: waiting on the student engine", "student engine: generating",
                 "env pool 0: RuntimeError (dead or restarting)"):
        assert line in report
