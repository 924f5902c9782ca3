"""The slow half of tests/unit/provision/test_warmup.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rose_ray.config import load_config
from rose_ray.provision.warmup import DEMONSTRATIONS, shipped_gold, warmup_cache
from rose_ray.rows import read_jsonl


@pytest.mark.slow
def test_the_warm_up_trains_on_the_shipped_rows_and_is_cached(tiny_dir, ray_cluster):
    """A one-step warm-up (all 128 shipped rows in one batch, cut to 1,024 tokens, which is not
    part of the gold key) through resolve_models, then the cache: no second warm-up."""
    from rose_ray.provision.warmup import resolve_models

    short = ["teacher_warmup.epochs=1", "teacher_warmup.batch_episodes=128", "learner.max_tokens=1024",
             "student_engine.context_tokens=1024"]
    cfg = load_config(None, [f"tiny_dir={tiny_dir}", *short])
    _, teacher = resolve_models(cfg)
    info = json.loads((tiny_dir / teacher.rsplit("/", 1)[1] / "rose_ray_warmup.json").read_text())
    assert info["gold"] == "shipped" and 0 < info["final_loss"] < 20 and len(info["weights_sha256"]) == 64
    # the rows it learnt from are kept beside the weights: the shipped ones, all of them
    kept = read_jsonl(tiny_dir / teacher.rsplit("/", 1)[1] / DEMONSTRATIONS)
    assert kept == shipped_gold(warmup_cache(cfg, "t")[0])
    stamp = (tiny_dir / teacher.rsplit("/", 1)[1]).stat().st_mtime_ns
    assert resolve_models(load_config(None, [f"tiny_dir={tiny_dir}", *short]))[1] == teacher
    assert (tiny_dir / teacher.rsplit("/", 1)[1]).stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_the_warm_up_sft_is_the_same_teacher_twice(tmp_path, ray_cluster, tiny_models):
    """The warm-up's SFT, seeded, run twice on 8 shipped rows: the same weights digest (what
    makes the tiny teacher the same on every machine)."""
    from rose_ray.provision.warmup import weights_digest
    from rose_ray.recipes.sft import train_sft
    from rose_ray.rows import write_jsonl

    cfg = load_config(None, [f"tiny_dir={tmp_path}"])
    rows = shipped_gold(warmup_cache(cfg, "t")[0])[:8]
    write_jsonl(tmp_path / "gold.jsonl", rows)
    w = cfg.teacher_warmup
    digests = []
    for run in ("a", "b"):
        train_sft(tmp_path / "gold.jsonl", tiny_models["teacher"], tmp_path / run, epochs=1, batch_size=4,
                  lr=w.lr, schedule=w.schedule, seed=w.seed, sft_owners=["teacher"], threads=w.threads,
                  log=lambda line: None)
        digests.append(weights_digest(tmp_path / run))
    assert digests[0] == digests[1]
    assert digests[0] != weights_digest(Path(tiny_models["teacher"]))  # it trained


