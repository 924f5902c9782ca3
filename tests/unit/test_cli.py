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
    from rose_ray.cli import main
    from rose_ray.errors import ConfigError, InputError, UnknownItem
    from rose_ray.placement import PlacementError
    from rose_ray.rows import DataError

    for cls in (ConfigError, UnknownItem, DataError, ChatTemplateError, PlacementError):
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


def test_version_is_the_packages():
    from importlib.metadata import version

    import rose_ray

    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rose-ray {rose_ray.__version__}"
    assert version("rose_ray") == rose_ray.__version__  # pyproject takes it from rose_ray.__version__


def test_train_print_config_prints_the_checked_config_and_starts_nothing(tmp_path, monkeypatch, capsys):
    """The merged, checked config as the run's config.yaml would hold it (train --config takes it
    back), then exit 0; a bad key exits 2 naming it; nothing is made."""
    from rose_ray.cli import main
    from rose_ray.config import load_config
    from rose_ray.runs import saved_config
    from tests.unit.test_runs import fake_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROSE_RAY_RUNS", str(tmp_path / "runs"))
    served = ["teacher_engine.backend=openai", "teacher_engine.backend.base_url=http://127.0.0.1:9/v1",
              "teacher_engine.backend.api_key=s3cret", f"teacher_engine.tokenizer={tmp_path}", "teacher_warmup.enabled=false"]
    assert main(["train", "--print-config", "steps=7", "algorithm.handoff.k=3", *served]) == 0
    printed = capsys.readouterr().out
    assert "s3cret" not in printed and "api_key: ${oc.env:ROSE_RAY_API_KEY,null}" in printed  # as config.yaml keeps it
    (tmp_path / "printed.yaml").write_text(printed)
    monkeypatch.setenv("ROSE_RAY_API_KEY", "s3cret")  # where the printed config reads it, as --resume does
    cfg = load_config(tmp_path / "printed.yaml")
    assert cfg.teacher_engine.backend.api_key == "s3cret"
    assert (cfg.steps, cfg.algorithm.handoff.k) == (7, 3) and saved_config(cfg) == printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["printed.yaml"]  # no run folder, no runs/
    assert main(["train", "--print-config", "no_such_key=1"]) == 2
    assert "'no_such_key'" in capsys.readouterr().err
    # A run's config, as --resume would continue it (RUN_DIR/latest names the run), overrides over it.
    run = fake_run(tmp_path / "runs" / "tiny", ["steps=5"])
    assert main(["train", "--print-config", "--resume", str(run.parent / "latest"), "steps=9"]) == 0
    assert "steps: 9" in capsys.readouterr().out.splitlines()
    assert main(["train", "--resume", str(run), "--config", str(tmp_path / "printed.yaml")]) == 2
    assert "give KEY=VALUE to change a setting, not --config" in capsys.readouterr().err


def test_the_python_api_is_the_commands_and_import_stays_light():
    """`rose_ray.train(...)` and `rose_ray.evaluate(...)` call the commands' functions whether or not
    their modules were imported before (a submodule replaces a function of its name); `import
    rose_ray` loads no torch."""
    code = (
        "import sys, types, rose_ray\n"
        "assert 'torch' not in sys.modules\n"
        "import rose_ray.train, rose_ray.evaluate\n"
        "from rose_ray.train import train\n"
        "from rose_ray.evaluate import evaluate\n"
        "for module, function in ((rose_ray.train, train), (rose_ray.evaluate, evaluate)):\n"
        "    assert isinstance(module, types.ModuleType) and callable(module)\n"
        "    assert getattr(module, module.__name__.rsplit('.', 1)[1]) is function\n"
        "from rose_ray.errors import ConfigError\n"
        "try:\n"
        "    rose_ray.evaluate(no_such_setting=1)\n"
        "except ConfigError as e:\n"
        "    assert \"no setting 'no_such_setting'\" in str(e), e\n"
        "else:\n"
        "    raise AssertionError('evaluate took an unknown setting')\n"
        "try:\n"
        "    rose_ray.train(None, ['steps=0'])\n"
        "except ConfigError as e:\n"
        "    assert 'steps: must be >= 1' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('train took steps=0')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
