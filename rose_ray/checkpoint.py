"""A run's checkpoint (docs/configuration.md#checkpoints): one typed record of each component's
state (`Checkpoint`), read by `read_checkpoint` and written by `write_checkpoint`, nowhere else.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, get_type_hints

from rose_ray.errors import InputError
from rose_ray.files import (
    clear_leftovers,
    crash_point,
    fsync_dir,
    json_line,
    write_file,
    writing_folder,
)

FORMAT = 3  # the record's layout (`Checkpoint`); formats 1 and 2 (one flat record) are not read


class UnreadableRecord(InputError):
    """A checkpoint's record that cannot be read (cut short, corrupt, not a record)."""


@dataclass
class LearningState:
    """`Learning`'s (run.py), beside the learner's own DeepSpeed folder."""

    step: int  # the loop's learner steps
    version: int  # the learner's policy version
    replies: dict[str, int]  # trained episodes' replies: how many, how many truncated or cut before an action


@dataclass
class RolloutState:
    """`Rollouts`' (run.py): each part's `state_dict()`, without the episodes open then."""

    ledger: dict[str, Any]  # EpisodeLedger: the game order, the episodes open then, the file's length
    buffer: dict[str, int]  # TrajectoryBuffer's counters
    runner: dict[str, int]  # EpisodeRunner's counters


@dataclass
class EvalState:
    history: dict[str, Any]  # the evals so far (run.py's `Evals`)


@dataclass
class Checkpoint:
    """The loop's side of a checkpoint, `{component: state}`, beside the learner's folder `tag`."""

    learning: LearningState
    rollouts: RolloutState
    evals: EvalState
    # Replacements per role over the whole run: the run's own, put back by a resume only (a
    # learner group going back to a checkpoint keeps counting on).
    restarts: dict[str, int] = field(default_factory=dict)
    tag: str = ""  # the learner's folder under checkpoints/ ("" for a run's start: none)
    format: int = FORMAT

    @property
    def step(self) -> int:
        return self.learning.step

    @classmethod
    def parts(cls) -> dict[str, type]:
        """Each component's name and the dataclass of its state."""
        hints = get_type_hints(cls)
        return {f.name: hints[f.name] for f in fields(cls) if is_dataclass(hints[f.name])}

    @classmethod
    def from_dict(cls, record: dict[str, Any], where: Path) -> Checkpoint:
        """A record as read from `where`; an InputError naming it when it cannot be read."""
        version = record.get("format", 1)  # 1: before the record named its format
        if not isinstance(version, int) or version != FORMAT:
            newer = " (a newer rose_ray wrote it?)" if isinstance(version, int) and version > FORMAT else ""
            raise InputError(f"{where}: checkpoint format {version!r}; this rose_ray reads format "
                             f"{FORMAT}{newer}")
        parts = cls.parts()
        given = {name: record.get(name) if isinstance(record.get(name), dict) else {} for name in parts}
        missing = sorted(f.name for name, part in parts.items() for f in fields(part)
                         if f.name not in given[name])
        if missing:
            raise UnreadableRecord(f"{where}: checkpoint format {version} without {', '.join(missing)}")
        state = {name: part(**{f.name: given[name][f.name] for f in fields(part)})
                 for name, part in parts.items()}
        rest = {f.name: record[f.name] for f in fields(cls) if f.name not in parts and f.name in record}
        return cls(**{**rest, **state})


def kept_steps(run_dir: str | Path) -> list[int]:
    """Learner steps with a whole checkpoint: the learner's folder and its record (written only
    once the folder is whole)."""
    ckpt = Path(run_dir) / "checkpoints"
    return sorted(int(d.name[5:]) for d in ckpt.glob("step_*")
                  if d.name[5:].isdigit() and d.is_dir() and (ckpt / f"trainer_{d.name}.json").is_file())


def _read_record(run: Path, step: int) -> Checkpoint:
    path = run / "checkpoints" / f"trainer_step_{step}.json"
    try:
        record = json_line(path.read_bytes(), str(path), UnreadableRecord)
    except OSError as e:
        raise UnreadableRecord(f"{path}: {e}") from None
    if not isinstance(record, dict):
        raise UnreadableRecord(f"{path}: expected a JSON object, got {type(record).__name__}")
    return Checkpoint.from_dict(record, path)  # a whole record of a newer format: an InputError, no going back


def read_checkpoint(run_dir: str | Path, step: int | None = None) -> Checkpoint:
    """The record of a run's whole checkpoint of `step`, by default the newest whose record reads
    (an unreadable one is passed over, saying so); an InputError naming the run when none."""
    run = Path(run_dir)
    steps = kept_steps(run)
    if not steps:
        raise InputError(f"{run}: no checkpoint kept under {run / 'checkpoints'}")
    if step is not None:
        if step not in steps:
            raise InputError(f"{run}: no checkpoint of step {step}; kept steps: {', '.join(map(str, steps))}")
        return _read_record(run, step)
    for n in reversed(steps):
        try:
            return _read_record(run, n)
        except UnreadableRecord as e:
            earlier = [m for m in steps if m < n]
            if not earlier:
                raise InputError(f"{e}; no whole checkpoint before step_{n} is kept") from None
            print(f"checkpoint step_{n} of {run}: its record cannot be read ({e}); going back to step_{earlier[-1]}, "
                  "the one before it", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def write_checkpoint(run_dir: Path, record: Checkpoint, learner: Any, keep: int, same_state: bool = False) -> bool:
    """Complete before marked: the learner's (a LearnerGroup's) folder, then the record, then
    `latest`, each on disk before the next; then the oldest past `keep` go. `same_state`: the
    learner holds its step's whole checkpoint already, so only the record is replaced. Returns
    whether the learner's files were written."""
    from rose_ray.learner.learner import write_latest

    ckpt_dir, tag = run_dir / "checkpoints", f"step_{learner.step}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    clear_leftovers(ckpt_dir, owned=True)  # the run's own folder: a temp there is a save cut short
    marker = ckpt_dir / f"trainer_{tag}.json"
    save = not (same_state and learner.step in kept_steps(run_dir))
    if save:
        if marker.exists():  # another state's checkpoint of this step (one gone back past): not whole from here
            marker.unlink()
            fsync_dir(ckpt_dir)
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)  # no mark: a save or a prune cut short
        with writing_folder(ckpt_dir / tag, "checkpoint") as tmp:
            learner.save_checkpoint(ckpt_dir, mark_latest=False, folder=tmp.name)
    write_file(marker, json.dumps(asdict(replace(record, tag=tag, format=FORMAT))))
    write_latest(ckpt_dir, tag)
    prune(ckpt_dir, keep)
    return save


def prune(ckpt_dir: Path, keep: int | None = None) -> None:
    """Delete all but the newest `keep` whole checkpoints (None: all) and any step folder without
    its mark; the mark goes first, so a kill in between leaves a folder not counted as whole."""
    whole = kept_steps(ckpt_dir.parent)
    kept = {f"step_{n}" for n in (whole[-keep:] if keep is not None else whole)}
    for folder in sorted(ckpt_dir.glob("step_*")):
        if not folder.is_dir() or folder.name in kept:
            continue
        marker = ckpt_dir / f"trainer_{folder.name}.json"
        if marker.exists():
            marker.unlink()
            fsync_dir(ckpt_dir)
            crash_point("prune")  # the tests' kill in the middle of pruning
        shutil.rmtree(folder, ignore_errors=True)


def latest_tag(run_dir: Path) -> str | None:
    """The checkpoint `latest` names (the newest whole one), if any."""
    latest = run_dir / "checkpoints" / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def load_learner(learner: Any, run_dir: str | Path, tag: str, command: str) -> dict[str, Any]:
    """The learner (group) loaded from checkpoint `tag` of a run; files that cannot be read are an
    InputError naming the one to use instead."""
    from rose_ray.learner.worker import CheckpointUnreadable

    try:
        return learner.load_checkpoint(Path(run_dir) / "checkpoints", tag)
    except CheckpointUnreadable as e:
        step = int(tag.removeprefix("step_"))
        earlier = [n for n in kept_steps(run_dir) if n < step]
        if not earlier:
            instead = "no earlier checkpoint is kept"
        elif command == "export":
            instead = f"export the one before it with --step {earlier[-1]}"
        else:
            instead = (f"move {Path(run_dir) / 'checkpoints' / tag} and trainer_{tag}.json aside to "
                       f"{command} from step {earlier[-1]}, the one before it")
        raise InputError(f"checkpoint {tag} of {run_dir}: {e}; {instead}") from None
