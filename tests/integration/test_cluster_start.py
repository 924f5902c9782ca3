"""A run's start on a cluster: storage every node sees (a marker the driver writes, read on
each node), no loopback served-model URL on more than one node, engines ready before any
eval, and workers' output in the job's log. The multi-node cluster is simulated
(`env_node_cluster`: three raylets on this host)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_shared_storage_is_checked_on_every_node(env_node_cluster, tmp_path):
    """Each probe writes a marker file of its own and removes it: runs starting at once on one
    run_dir (or tiny_dir) never read each other's token (before, one fixed file: a run could
    read another's token and stop with a false "not shared storage")."""
    from rose_ray.placement import check_shared_storage

    lines = check_shared_storage({"run_dir": tmp_path / "runs"})
    assert lines == [f"train: run_dir {tmp_path / 'runs'}: seen by all 3 nodes"]
    results: list[object] = []

    def probe() -> None:
        try:
            results.append(check_shared_storage({"tiny_dir": tmp_path / "runs"}))
        except Exception as e:  # noqa: BLE001 - a probe's failure is what this test looks for
            results.append(e)

    probes = [threading.Thread(target=probe) for _ in range(4)]
    for t in probes:
        t.start()
    for t in probes:
        t.join(timeout=120)
    assert results == [[f"train: tiny_dir {tmp_path / 'runs'}: seen by all 3 nodes"]] * 4
    assert list((tmp_path / "runs").iterdir()) == []  # no marker left behind


def test_a_loopback_served_teacher_is_refused_on_a_cluster(env_node_cluster, tiny_models, tmp_path, capsys):
    from rose_ray.cli import main

    assert main(["train", f"run_dir={tmp_path}/r", "teacher_engine.backend=openai", "teacher_warmup.enabled=false",
                 "teacher_engine.backend.base_url=http://127.0.0.1:8000/v1", "teacher_engine.model=tiny-teacher",
                 f"teacher_engine.tokenizer={tiny_models['teacher']}", f"tiny_dir={tiny_models['student'].parent}"]) == 2
    err = capsys.readouterr().err
    assert "teacher_engine.backend.base_url: http://127.0.0.1:8000/v1 is a loopback address, but this cluster has 3 nodes" in err


def test_a_teacher_that_cannot_start_fails_the_run_before_any_eval(tiny_models, ray_cluster, tmp_path):
    """The tiny teacher has 16,384 positions: asking for more context fails its engine's start.
    The run stops there, naming it, before the eval before training plays any game."""
    from rose_ray.train import train

    with pytest.raises(RuntimeError, match="the teacher engine failed to start"):
        train(None, [f"tiny_dir={tiny_models['student'].parent}", f"run_dir={tmp_path}/r", "steps=1",
                     "teacher_warmup.enabled=false", "teacher_engine.context_tokens=20000",
                     "env.games_per_worker=1",  # its JVMs boot beside the engines: 1, not the tiny config's 8
                     "eval.before=true", "eval.n=2", "eval.max_turns=2", "eval.max_new_tokens=8"])
    assert not any("eval" in line for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) \
        if (tmp_path / "r" / "metrics.jsonl").exists() else True


def test_workers_output_reaches_the_drivers_log(tmp_path):
    """Ray forwards a worker's output to the driver asynchronously (its log monitor tails the
    worker's file), so the driver stays up until the test has read the line or 120 s passed."""
    code = ("from rose_ray.rollout.actors import init_ray; import ray, sys; init_ray(); "
            "ray.get(ray.remote(lambda: print('hello from a worker', flush=True)).remote()); "
            "sys.stdin.read(); ray.shutdown()")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            seen.append(line)
            if "hello from a worker" in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=120)
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0, "".join(seen)
    assert any("hello from a worker" in line for line in seen), "".join(seen)


def test_the_hf_cache_is_checked_on_every_node_before_a_hub_model_is_downloaded(env_node_cluster, hub_endpoint,
                                                                               tiny_models, tmp_path, capsys):
    """A hub-id student: the driver checks that every node sees the Hugging Face cache (the
    marker goes into its `.locks` folder), then downloads the model there, once, before any actor
    starts. The run then stops at the placement check (the simulated cluster has 2 fake GPUs, the
    config asks for 4): nothing else of it is needed here."""
    from rose_ray.cli import main

    assert main(["train", f"run_dir={tmp_path}/r", "student_engine.model=org/tiny-student",
                 f"tiny_dir={tiny_models['student'].parent}", "resources.student_gpus=4"]) == 2
    captured = capsys.readouterr()
    hub = Path(os.environ["HF_HOME"]) / "hub"
    lines = captured.out.splitlines()
    seen = lines.index(f"train: HF_HOME (the Hugging Face cache) {hub / '.locks'}: seen by all 3 nodes")
    assert lines[seen + 1].startswith(f"train: org/tiny-student: downloading from {hub_endpoint.url}"), lines
    assert len(hub_endpoint.file_downloads()) == len(list(tiny_models["student"].iterdir()))
    assert "student" in captured.err and "GPU" in captured.err, captured.err  # the placement check, after
