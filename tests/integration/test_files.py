"""The half of tests/unit/test_files.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import rose_ray.files as files
from rose_ray.files import (
    TEMP_TAG,
    clear_leftovers,
    temp_name,
    write_file,
    writing_folder,
)
from tests.unit.test_files import names

ROOT = Path(__file__).resolve().parents[2]


def gone_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def stopped_at(point: str, code: str, timeout_s: float = 60) -> None:
    """Run `code` in a Python process of its own with ROSE_RAY_CRASH_AT=`point`; once it has
    stopped there, SIGKILL it, as a lost machine would. Fails if it never reaches the point."""
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT),
                                                               files.CRASH_ENV: point},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in "tT":
                break
            time.sleep(0.01)
    finally:
        stopped = proc.poll() is None
        proc.kill()
        output = proc.communicate()[0].decode(errors="replace")
    assert stopped, f"the process did not stop at crash point {point!r} (exit {proc.returncode}):\n{output[-2000:]}"


def test_leftovers_of_gone_writers_are_cleared_and_nothing_else(tmp_path):
    host, dead = files._host(), gone_pid()
    (tmp_path / "model").mkdir()
    stale = tmp_path / f".model{TEMP_TAG}tmp.{host}.{dead}.0001"  # a killed writer's half-built folder
    live = tmp_path / f".model{TEMP_TAG}tmp.{host}.{os.getpid()}.0002"  # a writer still at work
    remote = tmp_path / f".model{TEMP_TAG}tmp.otherhost.{dead}.0003"  # another machine's: unknown
    mine = tmp_path / ".model.backup"  # the user's
    for p in (stale, live, remote, mine):
        p.mkdir()
        (p / "weights").write_text("x")
    (tmp_path / f".metrics.jsonl{TEMP_TAG}tmp.{host}.{dead}.0004").write_text("{}\n")
    assert len(clear_leftovers(tmp_path)) == 2
    assert names(tmp_path) == sorted([".model.backup", live.name, remote.name, "model"])
    assert len(clear_leftovers(tmp_path, "model", owned=True)) == 2  # a run in its own folder: all of them
    assert names(tmp_path) == [".model.backup", "model"]


def exchanges(folder: Path) -> bool:
    """Whether this file system swaps two folders atomically (renameat2 RENAME_EXCHANGE)."""
    a, b = temp_name(folder / "probe"), temp_name(folder / "probe")
    a.mkdir(), b.mkdir()
    try:
        return files._exchange(a, b)
    finally:
        a.rmdir(), b.rmdir()


def test_a_swap_killed_midway_leaves_a_whole_copy(tmp_path):
    """With the exchange (Linux: ext4, xfs, tmpfs...) a kill mid-swap leaves the new folder in
    place and the old one under a temp name, removed by the next writer. Without it the old
    folder is renamed aside first: a kill before the new one is renamed in leaves no `model/`,
    until the next writer (or the run's start) puts the old copy back."""
    target = tmp_path / "model"

    def swap(exchange: bool) -> str:
        return ("import rose_ray.files as f\n" + ("" if exchange else "f._exchange = lambda a, b: False\n")
                + f"with f.writing_folder({str(target)!r}) as tmp:\n    (tmp / 'weights').write_text('new')\n")

    with writing_folder(target) as tmp:
        (tmp / "weights").write_text("old")
    stopped_at("swap", swap(exchange=False))
    assert not target.exists()  # between the two renames
    done = clear_leftovers(tmp_path)
    assert done[0] == f"{target}: put back (a swap was cut between its two renames)" and len(done) == 2
    assert names(tmp_path) == ["model"] and (target / "weights").read_text() == "old"  # the new one's temp went

    if exchanges(tmp_path):
        stopped_at("swap", swap(exchange=True))
        assert (target / "weights").read_text() == "new" and len(names(tmp_path)) == 2  # never a moment without it
        with writing_folder(target) as tmp:  # the next writer clears the old copy the kill left
            (tmp / "weights").write_text("next")
        assert names(tmp_path) == ["model"] and (target / "weights").read_text() == "next"


def test_a_prune_killed_midway_leaves_no_half_deleted_step_counted_whole(tmp_path):
    """Pruning takes a step's mark away before its files: a kill in between leaves a folder
    that is not whole (export and --resume pass over it) and is deleted next time. (Before,
    the files went first: a kill midway left a half-deleted step still marked whole.)"""
    from rose_ray.checkpoint import kept_steps, prune

    ckpt = tmp_path / "checkpoints"
    for n in (1, 2, 3):
        (ckpt / f"step_{n}").mkdir(parents=True)
        (ckpt / f"step_{n}" / "mp_rank_00_model_states.pt").write_bytes(b"x" * 1000)
        (ckpt / f"trainer_step_{n}.json").write_text("{}")
    stopped_at("prune", f"from pathlib import Path; from rose_ray.checkpoint import prune; prune(Path({str(ckpt)!r}), 1)")
    assert kept_steps(tmp_path) == [2, 3] and (ckpt / "step_1" / "mp_rank_00_model_states.pt").exists()
    prune(ckpt)  # a run's start: folders without their mark go, whole ones stay
    assert kept_steps(tmp_path) == [2, 3] and names(ckpt) == ["step_2", "step_3", "trainer_step_2.json",
                                                              "trainer_step_3.json"]


def test_a_resume_rewrite_killed_midway_leaves_the_log_as_it_was(tmp_path, capsys):
    """A resume cuts metrics.jsonl and trajectories.jsonl back to the checkpoint's step by
    streaming the kept lines into a temp file renamed over the log: a kill meanwhile leaves
    the log whole (before, it was rewritten in place). Bad lines are named and left out."""
    from rose_ray.rollout.ledger import keep_steps

    log = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 6)]
    log.write_text("".join(lines[:2]) + "[1, 2]\n" + '{"step": "x"}\n' + "".join(lines[2:]) + '{"step": 6, "lo')
    log.write_bytes(log.read_bytes().replace(b'"loss": 0.5}', b'"loss": 0.5\xff}'))  # not UTF-8: line 2
    before = log.read_bytes()
    stopped_at("rewrite", f"from rose_ray.rollout.ledger import keep_steps; keep_steps({str(log)!r}, 3)")
    assert log.read_bytes() == before and len(names(tmp_path)) == 2  # the log, and the killed rewrite's temp
    keep_steps(log, 3)  # the resume again
    assert log.read_text() == lines[0] + lines[2]
    assert names(tmp_path) == ["metrics.jsonl"]
    err = capsys.readouterr().err
    for problem in (f"{log}:2: not UTF-8 text", f"{log}:3: expected a JSON object, got list",
                    f"{log}:4: its step is 'x', not an integer"):
        assert problem in err
    assert "Traceback" not in err


def test_write_file_is_whole_and_clears_a_killed_writers_temp(tmp_path):
    path = tmp_path / "summary.json"
    (tmp_path / f".summary.json{TEMP_TAG}tmp.{files._host()}.{gone_pid()}.0001").write_text('{"cut')
    write_file(path, '{"a": 1}')
    write_file(path, b'{"a": 2}')
    assert path.read_text() == '{"a": 2}' and names(tmp_path) == ["summary.json"]


def test_a_crash_point_can_wait_for_its_nth_time(tmp_path):
    code = ("from rose_ray.files import crash_point\n"
            f"for n in range(5):\n    open({str(tmp_path / 'n')!r}, 'w').write(str(n)); crash_point('here')\n")
    stopped_at("here#3", code)
    assert (tmp_path / "n").read_text() == "2"
