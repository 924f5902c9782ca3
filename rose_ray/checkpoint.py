"""A run's checkpoint, one typed record: `Checkpoint`, read by `read_checkpoint` (`train --resume`,
a learner group going back after a rank's loss, `export`, the tests) and written by
`write_checkpoint`, nowhere else.

On disk, under `<run_dir>/checkpoints/`: the learner's DeepSpeed folder `step_N` (per rank:
model, optimizer, scheduler, RNG), the record beside it as `trainer_step_N.json`, and `latest`
naming the newest. The record is written only once the learner's files are on disk, so it is
the mark that a checkpoint is whole (`kept_steps`); the run's config is its `config.yaml`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from rose_ray.errors import InputError

# The record's layout. 1: written before the record named its format (the same fields).
FORMAT = 2


@dataclass
class Checkpoint:
    """The loop's side of a checkpoint, each part's `state_dict()`, beside the learner's folder `tag`."""

    step: int
    version: int  # the learner's policy version
    ledger: dict[str, Any]  # EpisodeLedger: the game order, the episodes open then, the file's length
    buffer: dict[str, int]  # TrajectoryBuffer's counters, without the open episodes
    runner: dict[str, int]  # EpisodeRunner's counters, likewise
    replies: dict[str, int]  # Progress: trained episodes' replies
    history: dict[str, Any]  # Progress: the evals so far
    restarts: dict[str, int]  # replacements per role over the whole run
    tag: str = ""  # the learner's folder under checkpoints/ ("" for a run's start: none)
    format: int = FORMAT

    @property
    def progress(self) -> dict[str, Any]:
        """What `Progress.load_state_dict` takes."""
        return {"step": self.step, "history": self.history, "replies": self.replies}

    @classmethod
    def from_dict(cls, record: dict[str, Any], where: Path) -> Checkpoint:
        """A record as read from `where`; an InputError naming it when this code cannot read it."""
        version = record.get("format", 1)
        if not isinstance(version, int) or not 1 <= version <= FORMAT:
            raise InputError(f"{where}: checkpoint format {version!r}; this rose_ray reads formats 1 to {FORMAT} "
                             "(a newer rose_ray wrote it?)")
        # Records from before these were kept: no replies counted, no restarts.
        record = {"replies": {"replies": 0, "truncated": 0, "cut_before_action": 0}, "restarts": {}, **record}
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(record) - {"format"})
        if missing:
            raise InputError(f"{where}: checkpoint format {version} without {', '.join(missing)}")
        return cls(**{**{k: v for k, v in record.items() if k in names}, "format": version})


def kept_steps(run_dir: str | Path) -> list[int]:
    """Learner steps with a whole checkpoint: the learner's folder and the record, which is
    written only once every file of the folder is on disk (`write_checkpoint`), so a checkpoint
    whose save was cut short is not listed."""
    ckpt = Path(run_dir) / "checkpoints"
    steps = []
    for d in ckpt.glob("step_*"):
        n = d.name.split("_", 1)[1]
        if d.is_dir() and n.isdigit() and (ckpt / f"trainer_{d.name}.json").is_file():
            steps.append(int(n))
    return sorted(steps)


def read_checkpoint(run_dir: str | Path, step: int | None = None) -> Checkpoint:
    """The record of a run's whole checkpoint of `step` (default: the latest); an InputError
    naming the run when there is none."""
    run = Path(run_dir)
    steps = kept_steps(run)
    if not steps:
        raise InputError(f"{run}: no checkpoint kept under {run / 'checkpoints'}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise InputError(f"{run}: no checkpoint of step {step}; kept steps: {', '.join(map(str, steps))}")
    path = run / "checkpoints" / f"trainer_step_{step}.json"
    return Checkpoint.from_dict(json.loads(path.read_text()), path)


def write_checkpoint(run_dir: Path, record: Checkpoint, learner: Any, keep: int) -> None:
    """Complete before marked: the learner's files (`learner`: a LearnerGroup), then the record
    (the mark that the checkpoint is whole), then `latest`, each on disk before the next; a
    save cut short anywhere leaves the previous checkpoint the latest whole one. Then the
    oldest whole ones past `keep` go, with any left unfinished."""
    from rose_ray.learner.learner import write_latest
    from rose_ray.learner.worker import fsync_dir

    ckpt_dir, tag = run_dir / "checkpoints", f"step_{learner.step}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    marker = ckpt_dir / f"trainer_{tag}.json"
    if marker.exists():  # one of an earlier save of this step must not vouch for this one
        marker.unlink()
        fsync_dir(ckpt_dir)
    learner.save_checkpoint(ckpt_dir, mark_latest=False)
    tmp = marker.with_name(marker.name + ".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(asdict(replace(record, tag=tag, format=FORMAT))))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)
    fsync_dir(ckpt_dir)
    write_latest(ckpt_dir, tag)
    kept = {f"step_{n}" for n in kept_steps(run_dir)[-keep:]}
    for folder in ckpt_dir.glob("step_*"):
        if folder.is_dir() and folder.name not in kept:
            shutil.rmtree(folder, ignore_errors=True)
            (ckpt_dir / f"trainer_{folder.name}.json").unlink(missing_ok=True)


def latest_tag(run_dir: Path) -> str | None:
    """The checkpoint `latest` names (the newest whole one), if any."""
    latest = run_dir / "checkpoints" / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def unreadable_checkpoint(error: Exception, run_dir: str | Path, step: int, kept: list[int],
                          command: str) -> InputError:
    """The error for a kept checkpoint whose files cannot be read (a corrupt shard): it names
    the checkpoint and the whole one before it to use instead."""
    earlier = [n for n in kept if n < step]
    if not earlier:
        instead = "no earlier checkpoint is kept"
    elif command == "export":
        instead = f"export the one before it with --step {earlier[-1]}"
    else:
        instead = (f"move {Path(run_dir) / 'checkpoints' / f'step_{step}'} and trainer_step_{step}.json aside to "
                   f"{command} from step {earlier[-1]}, the one before it")
    return InputError(f"checkpoint step_{step} of {run_dir}: {error}; {instead}")
