"""Hours of `collect` (and `continue`, `gold`) or `eval` are not all-or-nothing: rows reach the
disk as games finish, a process killed with SIGKILL keeps them, a rerun resumes, and a line cut
by a kill never spoils what is appended after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rose_ray.cli import main
from rose_ray.rows import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


CUT = '{"item_id": "sciworld_'  # what a kill in the middle of a write leaves: no newline


def run_until_killed(args: list[str], partial: Path, lines: int, timeout_s: float = 600) -> subprocess.Popen:
    """Start `rose-ray ARGS` in a session of its own; once `partial` holds `lines` whole lines,
    SIGKILL the session (the command, its Ray cluster and game processes), as a preemption would."""
    proc = subprocess.Popen([sys.executable, "-m", "rose_ray.cli", *args], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if partial.exists() and partial.read_bytes().count(b"\n") >= lines:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, f"not killed while running (exit {proc.returncode}):\n{output[-3000:]}"
    return proc


@pytest.mark.slow
def test_a_killed_collect_keeps_its_rows_and_a_rerun_resumes(tiny_models, ray_cluster, tmp_path, capsys):
    out = tmp_path / "prefixes.jsonl"
    partial = tmp_path / "prefixes.jsonl.partial"
    args = ["collect", "--model", str(tiny_models["student"]), "--turns", "2", "--split", "train", "--n", "3",
            "--concurrency", "1", "--max-new-tokens", "8", "--context-tokens", "2048", "--backend", "hf",
            "--out", str(out)]
    run_until_killed(args, partial, lines=2)  # the header and one row
    assert not out.exists()
    *whole, cut = partial.read_bytes().split(b"\n")
    header, kept = json.loads(whole[0]), [json.loads(line) for line in whole[1:]]
    assert header["partial_of"]["command"] == "collect" and 1 <= len(kept) < 3
    # Mark the rows the killed run wrote (a rerun that played them again would lose the mark),
    # and leave a cut line at the end, as a kill in the middle of a write does.
    for k in kept:
        k["row"]["resumed"] = True
    partial.write_text("".join(json.dumps(r) + "\n" for r in [header, *kept]) + CUT)

    assert main(args) == 0
    assert f"resuming {partial}: {len(kept)} of 3 games already done" in capsys.readouterr().out
    rows = read_jsonl(out)
    assert len(rows) == 3 and len({r["item_id"] for r in rows}) == 3
    assert sum(bool(r.get("resumed")) for r in rows) == len(kept)
    assert {r["item_id"] for r in rows if r.get("resumed")} == {k["row"]["item_id"] for k in kept}
    assert not partial.exists()

    # The finished file is not replaced by running the command again.
    before = out.read_bytes()
    assert main(args) == 2
    assert f"--out {out}: already exists" in capsys.readouterr().err
    assert out.read_bytes() == before


@pytest.mark.slow
def test_an_eval_cut_mid_line_and_resumed_twice_stays_readable(tiny_models, ray_cluster, tmp_path):
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.evaluate import EvalCommand, resume_header, run_eval

    model = str(tiny_models["student"])
    cfg = EvalCommand(model=model, split="test", n=3, max_turns=2, max_new_tokens=8, concurrency=1,
                  context_tokens=2048, backend="hf", out=str(tmp_path / "r"))
    games = SciWorldCatalogue().sample("test", 3, 0)
    partial = tmp_path / "r.partial.jsonl"
    first = {"item_id": games[0].item_id, "task": games[0].task, "var": games[0].variation, "raw_score": 0,
             "score": 0.0, "success": False, "pass": False, "turns": 1, "invalid_actions": 0, "resumed": True}
    partial.write_text(json.dumps({"eval_config": resume_header(cfg)}) + "\n" + json.dumps(first) + "\n" + CUT)

    # Resume 1: a real eval, killed once it has appended a game after the cut line.
    run_until_killed(["eval", "--model", model, "--split", "test", "--n", "3", "--max-turns", "2",
                      "--max-new-tokens", "8", "--concurrency", "1", "--context-tokens", "2048",
                      "--backend", "hf", "--out", str(tmp_path / "r")], partial, lines=3)
    with partial.open("a") as f:  # killed in the middle of a line again
        f.write(CUT)

    # Resume 2 reads every line the two runs finished, and plays only the rest.
    result = run_eval(cfg)
    by_id = {g["item_id"]: g for g in result["games"]}
    assert set(by_id) == {g.item_id for g in games}
    assert by_id[games[0].item_id].get("resumed")
    assert not partial.exists() and (tmp_path / "r.json").exists()
