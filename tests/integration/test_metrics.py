"""The half of tests/unit/test_metrics.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest


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
