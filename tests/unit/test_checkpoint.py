"""The checkpoint record (rose_ray/checkpoint.py): written whole, read by one function, its format
checked (formats 1 and 2, one flat record, are refused); a run's components (rose_ray/run.py)
go back to their state through it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rose_ray.checkpoint import (
    FORMAT,
    Checkpoint,
    EvalState,
    LearningState,
    RolloutState,
    kept_steps,
    latest_tag,
    read_checkpoint,
    write_checkpoint,
)
from rose_ray.errors import InputError
from rose_ray.types import GameId


class FakeLearner:
    """A learner group's side of a save: its folder (`step_N` or the one named), without DeepSpeed."""

    def __init__(self) -> None:
        self.step, self.version = 0, 0
        self.saves = 0

    def save_checkpoint(self, path: Path, mark_latest: bool = True, folder: str | None = None) -> str:
        self.saves += 1
        tag = folder or f"step_{self.step}"
        (Path(path) / tag).mkdir(exist_ok=True)
        (Path(path) / tag / "mp_rank_00_model_states.pt").write_text(f"weights of step {self.step}")
        return tag


def record(step: int) -> Checkpoint:
    return Checkpoint(learning=LearningState(step=step, version=step, replies={"replies": 3}),
                      rollouts=RolloutState(ledger={"next_n": 4, "offset": 10, "open": []}, buffer={"admitted": 4},
                                            runner={"started": 4}),
                      evals=EvalState(history={"eval": [{"step": 0, "who": "student", "score": 0.5}]}),
                      restarts={"learner": 1})


def test_a_record_is_written_whole_read_back_and_old_ones_go(tmp_path):
    learner = FakeLearner()
    for step in (1, 2, 3):
        learner.step = learner.version = step
        write_checkpoint(tmp_path, record(step), learner, keep=2)
    assert kept_steps(tmp_path) == [2, 3] and latest_tag(tmp_path) == "step_3"
    assert not (tmp_path / "checkpoints" / "step_1").exists()
    back = read_checkpoint(tmp_path)
    assert back == replace(record(3), tag="step_3") and back.format == FORMAT
    assert json.loads((tmp_path / "checkpoints" / "trainer_step_3.json").read_text())["learning"]["step"] == 3
    assert read_checkpoint(tmp_path, 2).step == 2
    with pytest.raises(InputError, match="no checkpoint of step 1; kept steps: 2, 3"):
        read_checkpoint(tmp_path, 1)
    with pytest.raises(InputError, match="no checkpoint kept"):
        read_checkpoint(tmp_path / "empty")


def write_record(run_dir: Path, fields: dict) -> Path:
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    path = run_dir / "checkpoints" / "trainer_step_2.json"
    path.write_text(json.dumps(fields))
    return path


FLAT = {"step": 2, "version": 2, "ledger": {"next_n": 4}, "buffer": {"admitted": 4}, "runner": {"started": 4},
        "replies": {"replies": 3}, "history": {"eval": []}, "restarts": {"learner": 1}, "tag": "step_2"}


@pytest.mark.parametrize("fmt", [None, 2])
def test_a_flat_record_of_an_old_format_is_refused_naming_it(tmp_path, fmt):
    """Formats 1 (before the record named its format: no `format`) and 2 were one flat record of
    the same fields; this rose_ray reads format 3 only, and says so before any state is loaded."""
    path = write_record(tmp_path, FLAT if fmt is None else {**FLAT, "format": fmt})
    with pytest.raises(InputError) as refused:
        read_checkpoint(tmp_path)
    assert str(refused.value) == f"{path}: checkpoint format {fmt or 1}; this rose_ray reads format {FORMAT}"


def test_a_record_this_code_cannot_read_is_named_with_its_format(tmp_path):
    path = write_record(tmp_path, {**asdict(record(2)), "tag": "step_2", "format": FORMAT + 1})
    newer = rf"{path}: checkpoint format 4; this rose_ray reads format 3 \(a newer rose_ray wrote it\?\)"
    with pytest.raises(InputError, match=newer):
        read_checkpoint(tmp_path)
    path.write_text(json.dumps({**asdict(record(2)), "tag": "step_2", "format": "3"}))
    with pytest.raises(InputError, match=f"{path}: checkpoint format '3'; this rose_ray reads format 3$"):
        read_checkpoint(tmp_path)
    path.write_text(json.dumps({"format": FORMAT, "learning": {"step": 2}, "rollouts": [], "tag": "step_2"}))
    with pytest.raises(InputError, match=f"{path}: checkpoint format {FORMAT} without buffer, history, ledger, "
                                         "replies, runner, version"):
        read_checkpoint(tmp_path)


class StandInLearner(FakeLearner):
    """The learner group's side of going back (its DeepSpeed state is its own folder: the e2e
    runs carry that): its step and version are the folder's."""

    def load_checkpoint(self, path: Path, tag: str) -> dict:
        self.step = self.version = int((Path(path) / tag / "mp_rank_00_model_states.pt").read_text().split()[-1])
        return {"tag": tag, "step": self.step, "version": self.version}


GAMES = [GameId("boil", i, f"sciworld_{i}") for i in range(5)]


def run_of(run_dir: Path, resume: bool):
    """A run's own components (rose_ray/run.py), with their parts as `Run.start` makes them but
    no actors (env pools, engines, DeepSpeed ranks): a ledger, a buffer, a runner, an engine
    supervisor watching nothing, the evals' history, and the stand-in learner."""
    from rose_ray.config import load_config
    from rose_ray.rollout.buffer import TrajectoryBuffer
    from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
    from rose_ray.rollout.runner import EpisodeRunner
    from rose_ray.rollout.supervisor import EngineSupervisor
    from rose_ray.run import Run

    run = Run(load_config(None, []), run_dir, resume=resume)
    rollouts = run.rollouts
    rollouts.ledger = EpisodeLedger(run_dir / "episodes.jsonl", GameSampler(GAMES, seed=3 if not resume else 0),
                                    fresh=not resume)
    rollouts.buffer, rollouts.runner, rollouts.engines = TrajectoryBuffer(2, 1), EpisodeRunner([], 1), EngineSupervisor()
    run.learning.learner = StandInLearner()
    return run


def fields_of(record: Checkpoint) -> dict:
    """Each component's state field by field (`learning.step`, ...), and the run's restarts."""
    return {"restarts": record.restarts, **{f"{name}.{key}": value for name in Checkpoint.parts()
                                            for key, value in asdict(getattr(record, name)).items()}}


def test_a_runs_components_go_back_to_their_state_through_the_checkpoint(tmp_path):
    """The round trip through the run's own components: a run driven away from its start (games
    drawn, episodes trained, failed and open, steps and replies counted, evals, restarts) saves
    `Run.checkpoint_state()` with `write_checkpoint`; a fresh run resumed from it
    (`Run.resume_from_latest`, as `train --resume`) holds the same state, every field of every
    component. Each field is first checked to differ from a fresh run's, so a field that a
    component does not carry (left out of its `state_dict`, or not put back by its
    `load_state_dict`) fails here, named."""
    run = run_of(tmp_path, resume=False)
    rollouts, learning = run.rollouts, run.learning
    drawn = [rollouts.ledger.draw() for _ in range(6)]
    rollouts.ledger.record(drawn[0].episode_id, "trained", step=1)
    rollouts.ledger.record(drawn[1].episode_id, "failed", error="a test")

    async def play() -> None:
        for _ in range(3):
            await rollouts.buffer.admit()
        await rollouts.buffer.fail()
    asyncio.run(play())
    rollouts.runner.counters.started, rollouts.runner.counters.finished = 5, 2
    rollouts.runner.in_flight = 1
    learning.learner.step = learning.learner.version = learning.step = 3
    learning.replies.update(replies=7, truncated=1)
    learning.restarts = 1
    run.evals.history["eval"].append({"step": 0, "who": "dev", "score": 0.25})
    run.restarts_before = {"student engine": 2}
    saved = run.checkpoint_state()
    write_checkpoint(tmp_path, saved, learning.learner, keep=1)
    run.rollouts.ledger.close()

    resumed = run_of(tmp_path, resume=True)
    fresh = fields_of(resumed.checkpoint_state())
    for key, value in fields_of(saved).items():
        assert value != fresh[key], (f"{key}: a fresh run has the value this run saved; drive it away from its "
                                     "start here, or this test cannot see whether it is carried")
    resumed.resume_from_latest(publish=False)
    back = fields_of(resumed.checkpoint_state())
    for key, value in fields_of(saved).items():
        assert back[key] == value, f"{key}: not carried through the checkpoint"
    # What it goes on with: the episodes open at the save first, then the game order's next.
    assert [resumed.rollouts.ledger.draw().n for _ in range(6)] == [2, 3, 4, 5, 6, 7]
    resumed.rollouts.ledger.close()


def test_a_whole_checkpoint_is_not_written_again_at_the_same_step(tmp_path):
    """The stop right after a periodic checkpoint (every shipped config's last step, or SIGTERM
    then): the learner's files are not saved again (before, the step's mark was taken away and
    DeepSpeed rewrote them in place: a kill or a full disk then lost the newest whole step, and
    with keep_checkpoints 1 every one). Only the record is replaced, whole."""
    learner = FakeLearner()
    learner.step = learner.version = 2
    assert write_checkpoint(tmp_path, record(2), learner, keep=1) is True
    shard = tmp_path / "checkpoints" / "step_2" / "mp_rank_00_model_states.pt"
    before = shard.stat()
    later = replace(record(2), evals=EvalState(history={"eval": [{"step": 2, "who": "dev", "score": 0.75}]}))
    assert write_checkpoint(tmp_path, later, learner, keep=1, same_state=True) is False
    assert learner.saves == 1 and (shard.stat().st_ino, shard.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert read_checkpoint(tmp_path).evals == later.evals and kept_steps(tmp_path) == [2]
    # The same step number from another state (a run gone back past an unreadable record to
    # step 1 and trained to step 2 again): written again, through a temp folder.
    assert write_checkpoint(tmp_path, record(2), learner, keep=1) is True and learner.saves == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest", "step_2", "trainer_step_2.json"]


def test_an_unreadable_record_goes_back_to_the_step_before_it_and_says_so(tmp_path, capsys):
    learner = FakeLearner()
    for step in (1, 2, 3):
        learner.step = learner.version = step
        write_checkpoint(tmp_path, record(step), learner, keep=3)
    ckpt = tmp_path / "checkpoints"
    (ckpt / "trainer_step_3.json").write_bytes(b'{"step": 3, "vers')  # cut short (a disk that lost its tail)
    (ckpt / "trainer_step_2.json").write_bytes(b"\xff\xfe garbage")
    back = read_checkpoint(tmp_path)
    assert (back.step, back.tag) == (1, "step_1")
    err = capsys.readouterr().err
    assert f"checkpoint step_3 of {tmp_path}: its record cannot be read ({ckpt / 'trainer_step_3.json'}: not valid JSON" in err
    assert "going back to step_2" in err and "going back to step_1" in err and "not UTF-8 text" in err
    with pytest.raises(InputError, match=f"{ckpt / 'trainer_step_3.json'}: not valid JSON"):  # asked for by number
        read_checkpoint(tmp_path, 3)
    (ckpt / "trainer_step_1.json").write_text("[]")
    with pytest.raises(InputError, match="expected a JSON object, got list; no whole checkpoint before step_1"):
        read_checkpoint(tmp_path)
