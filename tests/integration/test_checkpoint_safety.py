"""Checkpoints and steps that can be trusted: a non-finite loss skips its step (no update, no
new version, counted) so no checkpoint holds NaN weights; a checkpoint is marked whole only once
its files are on disk, so `export` and `--resume` pass over a save cut short; a corrupt shard
is an error naming the checkpoint and the one before it; the RNG state loads with
`torch.load(weights_only=True)`. One real 1-rank DeepSpeed learner group on the tiny student."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rose_ray.chat import ChatFormat
from rose_ray.checkpoint import (
    Checkpoint,
    EvalState,
    LearningState,
    RolloutState,
    kept_steps,
    latest_tag,
    write_checkpoint,
)
from rose_ray.cli import main
from rose_ray.config import load_config, to_yaml
from rose_ray.learner.learner import LearnerGroup
from rose_ray.learner.worker import (
    CheckpointUnreadable,
    NonFiniteWeights,
    _restore_rng_state,
    _rng_state,
)
from rose_ray.rows import row_to_trajectory
from rose_ray.run import Run
from rose_ray.tokens import make_batch, render
from tests.unit.learner.test_learner import WEIGHTS, config, conversations


@pytest.fixture(scope="module")
def group(ray_cluster, tiny_models):
    g = LearnerGroup(config(tiny_models["student"], ranks=1, zero_stage=0))
    yield g
    g.shutdown()


def batch(tiny_models, teacher_logprob: float = -1.0):
    """Two rendered conversations; every teacher logprob (what OPD compares the student's
    tokens with) is `teacher_logprob`: +inf is what a served teacher answering garbage gave."""
    from rose_ray.models import load_tokenizer

    fmt = ChatFormat(load_tokenizer(tiny_models["student"]))
    seqs = []
    for row in conversations(2):
        seq = render(row_to_trajectory(row), fmt)
        seq.teacher_logprobs = [float("nan")] + [teacher_logprob] * (len(seq.input_ids) - 1)
        seqs.append(seq)
    return make_batch(seqs, WEIGHTS, 256, 0)


def probe_logits(group) -> np.ndarray:
    return group.logits(np.arange(12)[None] % 50)


@pytest.mark.parametrize("zero_stage,dtype", [(0, "float32"), (2, "float32"), (0, "bfloat16"), (2, "bfloat16"),
                                             (3, "bfloat16")])
def test_a_nonfinite_loss_skips_its_step(group, tiny_models, zero_stage, dtype):
    """ZeRO 0 in fp32 (the plain optimizer: checked here), DeepSpeed's own optimizers otherwise
    (ZeRO 2 in bf16 is the seed's learner): DeepSpeed 0.19.7 skips none of those in ZeRO 2 fp32
    or ZeRO 3 (pyproject.toml's floor is 0.19.8)."""
    group.setup(zero_stage=zero_stage, dtype=dtype)
    before = probe_logits(group)
    metrics = group.train_step(batch(tiny_models, teacher_logprob=math.inf))
    assert not math.isfinite(metrics["loss"])
    assert metrics["skipped_nonfinite"] == 1.0
    assert (group.step, group.version) == (1, 0)  # a step taken, no new weights to publish
    np.testing.assert_array_equal(probe_logits(group), before)  # no update at all
    good = group.train_step(batch(tiny_models))  # the next batch trains as usual
    assert math.isfinite(good["loss"]) and good["skipped_nonfinite"] == 1.0 and group.version == 1
    after = probe_logits(group)
    assert np.isfinite(after).all() and not np.array_equal(after, before)


def run_folder(tmp_path: Path, tiny_models, group) -> Run:
    """A run folder (its config.yaml) whose checkpoints `write_checkpoint` writes from the real
    learner group, as a run does."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(None, [f"student_engine.model={tiny_models['student']}", "keep_checkpoints=2",
                             "learner.threads=1", "learner.max_tokens=2048"])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    run = Run(cfg, run_dir, resume=False)
    run.learning.learner = group
    return run


def save(parts: Run) -> None:
    group = parts.learning.learner
    record = Checkpoint(LearningState(group.step, group.version, {}), RolloutState({"sampler": {}}, {}, {}),
                        EvalState({}))
    write_checkpoint(parts.run_dir, record, group, parts.cfg.keep_checkpoints)


def test_no_checkpoint_is_written_from_nonfinite_weights(group, tiny_models, tmp_path):
    group.setup(zero_stage=0, dtype="float32")  # as run_folder's config (the tests before may leave bf16)
    parts = run_folder(tmp_path, tiny_models, group)
    group.train_step(batch(tiny_models))
    save(parts)
    # Weights gone bad by any road: the save is refused, the good checkpoint stays the latest.
    group.train_step(batch(tiny_models))
    import ray

    ray.get(group.workers[0].__ray_call__.remote(
        lambda w: next(w.engine.module.parameters()).data.fill_(float("nan"))))
    with pytest.raises(NonFiniteWeights, match="step 2"):
        save(parts)
    assert kept_steps(parts.run_dir) == [1] and latest_tag(parts.run_dir) == "step_1"
    assert not any((parts.ckpt_dir / "step_2").glob("*.pt"))


def stopped(pid: int, timeout_s: float = 120) -> None:
    """Wait until process `pid` has stopped itself at a crash point (rose_ray/files.py)."""
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "tT":
        assert time.monotonic() < deadline, f"process {pid} did not reach its crash point"
        time.sleep(0.02)


@pytest.mark.slow
def test_export_and_resume_pass_over_a_save_killed_midway(group, tiny_models, tmp_path, monkeypatch, capsys):
    """The learner rank is SIGKILLed in the middle of step 2's save (stopped at a crash point
    between its RNG file and DeepSpeed's files): step 2 is not whole, `export` (with a relative
    --out, meaning the driver's working directory, not the rank's) and the learner's side of a
    resume go to step 1. Then a whole step 2 whose record is corrupt: export goes back to step 1
    and says so."""
    import ray

    from rose_ray.export import MODEL_INFO, check_request
    from rose_ray.files import CRASH_ENV, TEMP_TAG

    group.setup(zero_stage=0, dtype="float32")  # as run_folder's config (the tests before may leave bf16)
    parts = run_folder(tmp_path, tiny_models, group)
    group.train_step(batch(tiny_models))
    save(parts)
    group.train_step(batch(tiny_models))
    pid = ray.get(group.workers[0].__ray_call__.remote(lambda w: os.environ.__setitem__(CRASH_ENV, "checkpoint-write")
                                                       or os.getpid()))
    failed: list[BaseException] = []
    saving = threading.Thread(target=lambda: _save_or_fail(parts, failed))
    saving.start()
    stopped(pid)
    os.kill(pid, signal.SIGKILL)
    saving.join(timeout=120)
    assert failed and "learner rank 0 lost" in str(failed[0])
    assert kept_steps(parts.run_dir) == [1] and latest_tag(parts.run_dir) == "step_1"
    # The driver lived: it removed the half-written temp folder (a whole job killed leaves it to
    # the next save or run: tests/e2e/test_run_survives_failures.py).
    assert sorted(p.name for p in parts.ckpt_dir.iterdir()) == ["latest", "step_1", "trainer_step_1.json"]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["export", str(parts.run_dir), "--out", "exported"]) == 0
    assert json.loads((work / "exported" / MODEL_INFO).read_text())["step"] == 1
    group.restart()
    assert group.load_checkpoint(parts.ckpt_dir)["tag"] == "step_1"
    group.train_step(batch(tiny_models))
    save(parts)  # step 2 again, whole this time
    assert kept_steps(parts.run_dir) == [1, 2] and not [p for p in parts.ckpt_dir.iterdir() if TEMP_TAG in p.name]
    (parts.ckpt_dir / "trainer_step_2.json").write_text('{"step": 2, "vers')  # a record cut short
    capsys.readouterr()
    assert check_request(parts.run_dir, tmp_path / "again", None)[1].tag == "step_1"  # what export takes
    err = capsys.readouterr().err
    assert f"checkpoint step_2 of {parts.run_dir}: its record cannot be read" in err and "going back to step_1" in err


def _save_or_fail(parts: Run, failed: list[BaseException]) -> None:
    try:
        save(parts)
    except BaseException as e:  # noqa: BLE001 - the save's failure is what the test checks
        failed.append(e)


@pytest.mark.slow
def test_a_corrupt_shard_names_the_checkpoint_before_it(group, tiny_models, tmp_path, capsys):
    group.setup(zero_stage=0, dtype="float32")  # as run_folder's config (the tests before may leave bf16)
    parts = run_folder(tmp_path, tiny_models, group)
    for _ in range(2):
        group.train_step(batch(tiny_models))
        save(parts)
    assert kept_steps(parts.run_dir) == [1, 2]
    shard = parts.ckpt_dir / "step_2" / "mp_rank_00_model_states.pt"
    shard.write_bytes(shard.read_bytes()[:1000])  # cut short on disk
    capsys.readouterr()
    assert main(["export", str(parts.run_dir), "--out", str(tmp_path / "exported")]) == 2
    err = capsys.readouterr().err
    assert "step_2" in err and "--step 1" in err and "Traceback" not in err


def test_the_rng_state_loads_with_weights_only(group, tiny_models, tmp_path):
    group.setup(zero_stage=0, dtype="float32")  # as run_folder's config (the tests before may leave bf16)
    group.train_step(batch(tiny_models))
    group.save_checkpoint(tmp_path)
    state = torch.load(tmp_path / "step_1" / "rng_rank0.pt", weights_only=True)
    assert set(state) >= {"python", "numpy", "torch"}
    # and it puts every generator back exactly
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = _rng_state()
    torch.save(saved, tmp_path / "rng.pt")
    drawn = (random.random(), np.random.rand(), torch.rand(1).item())
    _restore_rng_state(tmp_path / "rng.pt")
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == drawn
    # A file of numpy arrays (written before they were stored as tensors) or one that would run code
    # is refused, naming the file and what it holds.
    old = tmp_path / "old.pt"
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               old)
    with pytest.raises(CheckpointUnreadable, match=f"{old}: cannot be read \\(it holds numpy"):
        _restore_rng_state(old)
    torch.save({"python": RunsCode()}, tmp_path / "code.pt")
    with pytest.raises(CheckpointUnreadable, match="code.pt: cannot be read \\(it holds .*getcwd"):
        _restore_rng_state(tmp_path / "code.pt")


class RunsCode:
    def __reduce__(self):
        return os.getcwd, ()  # harmless here; a real payload would not be

