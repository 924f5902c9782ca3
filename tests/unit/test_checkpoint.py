"""The checkpoint record (rose_ray/checkpoint.py): written whole, read by one function, its format
checked; records written before it named its format still load."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from rose_ray.checkpoint import (
    FORMAT,
    Checkpoint,
    kept_steps,
    latest_tag,
    read_checkpoint,
    write_checkpoint,
)
from rose_ray.errors import InputError


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
    return Checkpoint(step=step, version=step, ledger={"next_n": 4, "offset": 10, "open": []},
                      buffer={"admitted": 4}, runner={"started": 4}, replies={"replies": 3},
                      history={"eval": [{"step": 0, "who": "student", "score": 0.5}]},
                      restarts={"learner": 1})


def test_a_record_is_written_whole_read_back_and_old_ones_go(tmp_path):
    learner = FakeLearner()
    for step in (1, 2, 3):
        learner.step = learner.version = step
        write_checkpoint(tmp_path, record(step), learner, keep=2)
    assert kept_steps(tmp_path) == [2, 3] and latest_tag(tmp_path) == "step_3"
    assert not (tmp_path / "checkpoints" / "step_1").exists()
    back = read_checkpoint(tmp_path)
    assert back == Checkpoint(**{**asdict(record(3)), "tag": "step_3"}) and back.format == FORMAT
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


def test_a_record_without_a_format_reads_as_format_1(tmp_path):
    """As the run wrote it before the record named its format: the same fields, no `format`."""
    old = {"step": 2, "version": 2, "ledger": {"next_n": 4}, "buffer": {"admitted": 4}, "runner": {"started": 4},
           "replies": {"replies": 3}, "history": {"eval": []}, "restarts": {"learner": 0}, "tag": "step_2"}
    write_record(tmp_path, old)
    back = read_checkpoint(tmp_path)
    assert back.format == 1 and asdict(back) == {**old, "format": 1}
    assert back.progress == {"step": 2, "history": {"eval": []}, "replies": {"replies": 3}}


def test_a_record_this_code_cannot_read_is_named_with_its_format(tmp_path):
    path = write_record(tmp_path, {**asdict(record(2)), "tag": "step_2", "format": FORMAT + 1})
    with pytest.raises(InputError, match=f"{path}: checkpoint format {FORMAT + 1}; this rose_ray reads formats 1 to"):
        read_checkpoint(tmp_path)
    path.write_text(json.dumps({"step": 2, "version": 2, "tag": "step_2"}))
    with pytest.raises(InputError, match=f"{path}: checkpoint format 1 without buffer, history, ledger, runner"):
        read_checkpoint(tmp_path)


def test_every_part_goes_back_to_its_state_dict_through_the_record(tmp_path):
    """Progress, ledger (with its sampler), buffer and runner: each part's `state_dict()` into a
    record, written and read back, then `load_state_dict` into fresh parts gives the same state."""
    import asyncio

    from rose_ray.rollout.buffer import TrajectoryBuffer
    from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
    from rose_ray.rollout.runner import EpisodeRunner
    from rose_ray.run import Progress
    from rose_ray.types import GameId

    games = [GameId("boil", i, f"sciworld_{i}") for i in range(5)]
    progress = Progress(step=3, history={"eval": [{"step": 0, "who": "dev", "score": 0.25}]})
    progress.replies["replies"] = 7
    ledger = EpisodeLedger(tmp_path / "episodes.jsonl", GameSampler(games, seed=3))
    drawn = [ledger.draw() for _ in range(6)]
    ledger.record(drawn[0].episode_id, "trained", step=1)
    buffer, runner = TrajectoryBuffer(batch_episodes=2, max_lag=1), EpisodeRunner([], 1)

    async def admit() -> None:
        for _ in range(3):
            await buffer.admit()
    asyncio.run(admit())
    runner.counters.started, runner.counters.finished = 5, 2
    runner.in_flight = 1
    learner = FakeLearner()
    learner.step = learner.version = 3
    saved = Checkpoint(version=3, ledger=ledger.state_dict(), buffer=buffer.state_dict(),
                       runner=runner.state_dict(buffered=1), restarts={}, **progress.state_dict())
    write_checkpoint(tmp_path, saved, learner, keep=1)
    back = read_checkpoint(tmp_path)
    assert back == Checkpoint(**{**asdict(saved), "tag": "step_3"})

    progress2, buffer2, runner2 = Progress(), TrajectoryBuffer(2, 1), EpisodeRunner([], 1)
    ledger2 = EpisodeLedger(tmp_path / "episodes.jsonl", GameSampler(games, seed=0), fresh=False)
    for part, state in ((progress2, back.progress), (ledger2, back.ledger), (buffer2, back.buffer),
                        (runner2, back.runner)):
        part.load_state_dict(state)
    assert progress2.state_dict() == progress.state_dict()
    assert buffer2.state_dict() == buffer.state_dict() == {"admitted": 0, "accepted": 0, "dropped_stale": 0,
                                                           "failed": 0, "trained": 0}
    assert runner2.state_dict() == {"started": 3, "finished": 1, "restarts": 0, "failed": 0}
    assert ledger2.state_dict() == ledger.state_dict()
    assert [d.n for d in (ledger2.draw() for _ in range(6))] == [1, 2, 3, 4, 5, 6]  # the open ones first
    ledger.close(), ledger2.close()


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
    later = Checkpoint(**{**asdict(record(2)), "history": {"eval": [{"step": 2, "who": "dev", "score": 0.75}]}})
    assert write_checkpoint(tmp_path, later, learner, keep=1, same_state=True) is False
    assert learner.saves == 1 and (shard.stat().st_ino, shard.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert read_checkpoint(tmp_path).history == later.history and kept_steps(tmp_path) == [2]
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
