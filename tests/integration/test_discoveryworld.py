"""The half of tests/unit/envs/test_discoveryworld.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rose_ray.envs.base import GameError
from rose_ray.envs.discoveryworld.game import DiscoveryWorldGame, NoGoldPath
from rose_ray.envs.discoveryworld.protocol import PROTOCOL
from rose_ray.envs.pool import EnvPool
from rose_ray.envs.worlds import get_world
from tests.unit.envs.test_discoveryworld import CATALOGUE

CHEMISTRY = CATALOGUE.find("combinatorial-chemistry-easy", 1)


@pytest.fixture(scope="module")
def game():
    g = DiscoveryWorldGame(max_turns=30)
    yield g
    g.close()


def test_seed_0_loads_and_gives_the_same_game_in_two_processes():
    a, b = DiscoveryWorldGame(), DiscoveryWorldGame()
    try:
        assert a.pid != b.pid
        for task in CATALOGUE.task_names():  # every scenario, seed 0 (a benchmark seed; 0 is falsy)
            g = CATALOGUE.find(task, 0)
            assert a.load(g).observation == b.load(g).observation, task
            for action in ("move east", "face north", "read feed"):
                assert a.step(action).observation == b.step(action).observation, (task, action)
    finally:
        a.close()
        b.close()


def test_scripted_actions_raise_an_easy_scenarios_score(game):
    first = game.load(CHEMISTRY)
    assert first.observation.startswith("Task: ") and "jar #" in first.observation
    r = game.step("teleport to jar")  # a bare name, unique in sight
    assert "teleported" in r.observation and not PROTOCOL.is_invalid(r.observation)
    r = game.step("pick up jar")
    assert r.score > 0 and r.raw_score > 0 and not r.done
    assert "Inventory: jar #" in r.observation


@pytest.mark.parametrize("action, says", [
    ("look around", "unknown command"),
    ("teleport to table", "could mean"),  # several tables in sight: ambiguous without an id
    ("pick up #1", "no object #1"),
    ("", "empty action"),
    ("x" * 100_000, "unknown command"),
    ("pick up " + "jar " * 25_000, "no '"),
    ("choose 2", "not in a conversation"),
    ("move up", "needs one of north"),
])
def test_bad_actions_come_back_as_observations(game, action, says):
    game.load(CHEMISTRY)
    r = game.step(action)
    assert r.observation.startswith("Invalid action") and says in r.observation
    assert PROTOCOL.is_invalid(r.observation) and r.info["invalid"] and not r.done
    assert game.alive() and "Result:" in game.step("face west").observation  # the game goes on


def test_no_png_or_history_file_is_written(game, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = set(Path(game.workdir).rglob("*"))
    game.load(CATALOGUE.find("small-skills-pick-and-place-test-normal", 1))
    for action in ("move north", "move east", "read feed", "face south", "teleport to initial location"):
        game.step(action)
    assert set(Path(game.workdir).rglob("*")) == before == set()  # the worker's own folder stays empty
    assert list(tmp_path.rglob("*")) == []


def test_gold_says_plainly_that_there_is_none(game, tmp_path):
    from rose_ray.provision.gold import gold_rows

    assert not get_world("discoveryworld").has_gold
    with pytest.raises(NoGoldPath):
        game.load(CHEMISTRY, gold=True)
    with pytest.raises(ValueError, match="no gold action paths"):
        gold_rows([CHEMISTRY])
    out = tmp_path / "gold.jsonl"
    run = subprocess.run([sys.executable, "-m", "rose_ray.cli", "gold", "--world", "discoveryworld",
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "discoveryworld has no gold action paths" in run.stderr
    assert not out.exists()
    # Refused before the rows' files are touched: --overwrite does not clear them for nothing.
    out.write_text("kept\n")
    partial = tmp_path / "gold.jsonl.partial"
    partial.write_text("{}\n")
    run = subprocess.run([sys.executable, "-m", "rose_ray.cli", "gold", "--world", "discoveryworld",
                          "--out", str(out), "--overwrite"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "discoveryworld has no gold action paths" in run.stderr
    assert out.read_text() == "kept\n" and partial.read_text() == "{}\n"


def test_check_data_knows_discoveryworld_ids(tmp_path):
    from rose_ray.rows import write_jsonl

    row = {"item_id": "discoveryworld_11", "task": "combinatorial-chemistry-easy", "var": 1, "score": 0.0,
           "success": False, "rounds": 0,
           "conversations": [{"from": "human", "value": "instr", "owner": "prompt"},
                             {"from": "gpt", "value": "ok", "owner": "prompt"},
                             {"from": "human", "value": "Task: ...", "owner": "env"}]}
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_jsonl(good, [row])
    write_jsonl(bad, [row, {**row, "item_id": "discoveryworld_0"}])  # 0 is the tutorial
    cmd = [sys.executable, "-m", "rose_ray.cli", "check-data"]
    ok = subprocess.run([*cmd, str(good)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "discoveryworld" in ok.stdout
    wrong = subprocess.run([*cmd, str(bad)], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "row 2: discoveryworld_0 is 'tutorial-normal'" in wrong.stderr


def test_env_pool_hosts_discoveryworld_and_replaces_a_killed_worker():
    pool = EnvPool(num_games=2, world="discoveryworld", max_turns=10)
    try:
        assert pool.reset(0, "discoveryworld_11").observation.startswith("Task: ")
        pool.reset(1, "discoveryworld_12")
        results = pool.step_many({0: "teleport to jar", 1: "face north"})
        assert not results[0].interrupted and not results[1].interrupted
        old = pool.health()[0]["pid"]
        os.kill(old, signal.SIGKILL)
        r = pool.step(0, "pick up jar")
        assert r.interrupted and r.done and r.game == CATALOGUE.game("discoveryworld_11")
        health = pool.health()
        assert health[0]["restarts"] == 1 and health[0]["alive"] and pool.health()[0]["pid"] != old
        assert health[1]["restarts"] == 0 and health[1]["world"] == "discoveryworld"
        assert pool.reset(0, "discoveryworld_11").observation.startswith("Task: ")
        assert not pool.step(0, "teleport to jar").interrupted
        # A slot asked for a game of the other world swaps its process for that world's.
        from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue

        dw_pid = pool.health()[1]["pid"]
        first = pool.reset(1, SciWorldCatalogue().game("sciworld_0"))
        assert first.observation.startswith("Your task is to boil water.")
        assert pool.health()[1]["world"] == "sciworld" and pool.health()[1]["restarts"] == 0
        assert not Path(f"/proc/{dw_pid}").exists() or "Z" in Path(f"/proc/{dw_pid}/stat").read_text().split()[2]
        assert pool.step(1, "look around").score == 0.0
    finally:
        pool.close()


def test_a_hung_worker_times_out_and_is_killed(stop_process):
    g = DiscoveryWorldGame(call_timeout_s=2.0)
    try:
        g.load(CHEMISTRY)
        stop_process(g.pid)  # the game stops answering, as in an endless tick
        with pytest.raises(GameError, match="timed out after 2 s"):
            g.step("move east")
        assert not g.alive() and not Path(g.workdir).exists()
    finally:
        g.close()


def test_a_reply_cut_short_is_a_game_error_not_a_crash():
    g = DiscoveryWorldGame()
    g.kill()
    # Stands in for a worker killed halfway through writing its reply (cannot be timed on
    # demand with the real one): a process that answers half a JSON line, then exits.
    g._proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); "
                                "sys.stdout.write('{\"ok\": tr'); sys.stdout.flush()"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    g.closed, g._buffer = False, b""
    with pytest.raises(GameError):
        g.load(CHEMISTRY)
    assert g.closed and g._proc.poll() is not None


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    code = ("from rose_ray.envs.discoveryworld.game import DiscoveryWorldGame; import time; "
            "g = DiscoveryWorldGame(); print(g.pid, g.workdir, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid, workdir = parent.stdout.readline().split()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    # The closed stdin ends an idle worker at once; one busy in a tick would notice within 2 s.
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.2)
    else:
        os.kill(int(pid), signal.SIGKILL)
        pytest.fail("the worker outlived its parent by 10 s")
    assert not Path(workdir).exists()


def test_cli_takes_the_world_from_the_item_id(capsys):
    from rose_ray.cli import main

    assert main(["games", "--show", "discoveryworld_340"]) == 0
    assert capsys.readouterr().out.startswith("discoveryworld_340  task=small-skills-moving-agents-test-normal")
    assert main(["games", "--world", "discoveryworld", "--show", "sciworld_3"]) == 2
    assert "is a sciworld game, not discoveryworld; pass --world sciworld" in capsys.readouterr().err
