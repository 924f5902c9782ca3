"""The command line (rose_ray/cli.py) itself: `games` lists the catalogue without a JVM, `play`
goes through the model protocol on stdin, and `main` exits 2 with one line for the project's
input errors only while any other error keeps its traceback. Each command's settings:
test_commands.py; the commands' own behaviour: the test file named after each command."""

from __future__ import annotations

import pytest


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


