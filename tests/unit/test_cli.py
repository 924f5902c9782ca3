"""The command line (rose_ray/cli.py) itself: `games` lists the catalogue without a JVM, `play`
goes through the model protocol on stdin, and `main` exits 2 with one line for the project's
input errors only while any other error keeps its traceback. Each command's settings:
test_commands.py; the commands' own behaviour: the test file named after each command."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rose_ray.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_games_lists_the_catalogue_without_a_jvm():
    out = run_cli("games")
    assert out.returncode == 0
    assert "mapping agentgym: 4639 games, 23 tasks" in out.stdout
    assert "2312" in out.stdout and "1156" in out.stdout and "1171" in out.stdout
    assert "4339" in run_cli("games", "--mapping", "agentgym_traj").stdout
    bad = run_cli("games", "--show", "sciworld_99999")
    assert bad.returncode == 2 and "outside the 'agentgym' mapping" in bad.stderr


def test_play_goes_through_the_model_protocol():
    out = run_cli("play", "sciworld_0", stdin="open door to kitchen\nThought: hm\\nAction: focus on orange\n")
    assert out.returncode == 0, out.stderr
    assert "Your task is to boil water." in out.stdout and "Thought:" in out.stdout  # the instruction
    assert "The door is now open." in out.stdout
    assert "Episode over: score -100 (0.00), turns 2, failed" in out.stdout


def test_bad_input_is_an_input_error_and_a_bug_is_not(monkeypatch, capsys):
    """The CLI exits 2 with one line for the project's input errors only; anything else keeps
    its traceback. (A bug cannot be produced on purpose, so the command's body is replaced by
    one that raises what a contract check deep in the code raises.)"""
    import rose_ray.check
    from rose_ray.chat import ChatTemplateError
    from rose_ray.cli import UsageError, main
    from rose_ray.errors import ConfigError, InputError, UnknownItem
    from rose_ray.placement import PlacementError
    from rose_ray.rows import DataError

    for cls in (ConfigError, UnknownItem, DataError, ChatTemplateError, PlacementError, UsageError):
        assert issubclass(cls, InputError)
    assert issubclass(UnknownItem, KeyError)  # catalogue lookups are caught as KeyError too
    from rose_ray.config import default_config_path

    assert main(["check", str(default_config_path()), "env.world=nowhere"]) == 2
    assert "env.world: must be one of" in capsys.readouterr().err

    def contract_check(args):
        raise ValueError("turn 3 has 2 logprobs for 5 token ids")

    monkeypatch.setattr(rose_ray.check, "check_main", contract_check)
    with pytest.raises(ValueError, match="turn 3 has 2 logprobs"):
        main(["check"])
