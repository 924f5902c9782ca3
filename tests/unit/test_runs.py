"""Versioned run folders (rose_ray/runs.py): each fresh run and each bench result gets a new
`version_N`, `latest` names the newest, a run_dir stands for its latest run, and what would
overwrite a run is refused before anything is written. The runs themselves are in
test_train.py (resume by run_dir) and test_run_outputs.py (the next version, export by run_dir)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.io_wrapper import GetLogdirSubdirectories
from torch.utils.tensorboard import SummaryWriter

from rose_ray.cli import main
from rose_ray.config import load_config
from rose_ray.inference.registry import SECRET_ENV
from rose_ray.runs import keep_result, new_version, resolve_run, saved_config


def test_each_new_run_is_the_next_version_and_latest_names_it(tmp_path):
    runs = tmp_path / "runs" / "tiny"
    assert [new_version(runs).name for _ in range(3)] == ["version_0", "version_1", "version_2"]
    assert (runs / "latest").read_text() == "version_2\n"
    (runs / "version_7").mkdir()  # copied in from elsewhere: numbering goes on past it
    (runs / "version_x").mkdir()  # not a version
    assert new_version(runs).name == "version_8"
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "version_0", "version_1", "version_2", "version_7",
                                                      "version_8", "version_x"]  # no temporary file left


def test_tensorboard_on_a_run_dir_shows_every_version_once(tmp_path):
    """`latest` is a file: a symlink would make TensorBoard list the newest run twice."""
    runs = tmp_path / "tiny"
    for _ in range(2):
        with SummaryWriter(str(new_version(runs) / "tb")) as w:
            w.add_scalar("learner/loss", 1.0, 1)
    assert sorted(Path(d).relative_to(runs).as_posix() for d in GetLogdirSubdirectories(str(runs))) == [
        "version_0/tb", "version_1/tb"]


def test_a_path_names_a_run_folder_or_a_run_dir_meaning_its_latest(tmp_path):
    old = tmp_path / "old"  # a run from before versioned folders: config.yaml in it
    old.mkdir()
    (old / "config.yaml").write_text("name: old\n")
    assert resolve_run(old) == old
    runs = tmp_path / "tiny"
    first, second = new_version(runs), new_version(runs)
    for run in (first, second):
        (run / "config.yaml").write_text("name: tiny\n")
    assert resolve_run(runs) == second and resolve_run(first) == first
    (runs / "latest").write_text("version_9\n")
    with pytest.raises(ValueError, match=r"tiny: its `latest` file names .*version_9, which holds no run"):
        resolve_run(runs)
    with pytest.raises(ValueError, match="nope: not a run directory"):
        resolve_run(tmp_path / "nope")


def test_the_latest_file_names_the_run_it_points_at(tmp_path):
    """`runs/tiny/latest` is taken wherever a run folder is (train --resume, export, eval --run: all
    read it with resolve_run), so no command needs `runs/tiny/$(cat runs/tiny/latest)`."""
    runs = tmp_path / "tiny"
    first, second = fake_run(runs), fake_run(runs)
    assert resolve_run(runs / "latest") == second == resolve_run(runs)
    (runs / "latest").write_text("version_0\n")
    assert resolve_run(runs / "latest") == first
    (tmp_path / "latest").mkdir()  # a folder named latest is a folder like any other
    with pytest.raises(ValueError, match="latest: not a run directory"):
        resolve_run(tmp_path / "latest")


def fake_run(runs: Path, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """A new run folder under `runs` as `rose-ray train` leaves one, without the training: its
    config.yaml (the tiny default with `overrides`) and an empty model/."""
    from rose_ray.config import load_config
    from rose_ray.runs import saved_config

    run = new_version(runs)
    (run / "config.yaml").write_text(saved_config(load_config(None, list(overrides))))
    (run / "model").mkdir()
    return run


def test_a_result_written_again_keeps_the_last(tmp_path):
    out = tmp_path / "results" / "chaos.json"
    first = keep_result(out, json.dumps({"seed": 0}))
    second = keep_result(out, json.dumps({"seed": 1}))
    assert json.loads(out.read_text()) == {"seed": 1}  # the documented name: the latest
    assert (first, second) == (tmp_path / "results/chaos/version_0/chaos.json",
                               tmp_path / "results/chaos/version_1/chaos.json")
    assert json.loads(first.read_text()) == {"seed": 0} and json.loads(second.read_text()) == {"seed": 1}


# --------------------------------------------------------------------------- refused by `rose-ray train`
def snapshot(folder: Path) -> dict[str, str | None]:
    """Every path under `folder`, with a file's text."""
    return {p.relative_to(folder).as_posix(): p.read_text() if p.is_file() else None for p in folder.rglob("*")}


def test_train_refuses_a_named_run_dir_that_holds_a_run(tmp_path, capsys):
    run = tmp_path / "run"  # a run that checkpointed
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("name: mine\n")
    (run / "checkpoints" / "latest").write_text("step_4")
    runs = tmp_path / "tiny"  # a run_dir of versioned runs
    (new_version(runs) / "config.yaml").write_text("name: tiny\n")
    before = snapshot(tmp_path)
    for named in (run, runs):
        assert main(["train", f"run_dir={named}", "steps=1"]) == 2
        err = capsys.readouterr().err
        assert f"run_dir {named} already holds a run: continue it with --resume {named}" in err
    assert snapshot(tmp_path) == before  # nothing written


def test_a_run_dir_that_names_a_file_exits_2(tmp_path, monkeypatch, capsys):
    """`run_dir=` (or ROSE_RAY_RUNS) naming a file, or a folder under one: exit 2 naming it,
    before anything starts (before: FileExistsError, a traceback)."""
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    for run_dir in (mine, mine / "run"):
        assert main(["train", f"run_dir={run_dir}", "steps=1"]) == 2
        assert f"run_dir {run_dir}: {mine} is a file, not a folder" in capsys.readouterr().err
    monkeypatch.setenv("ROSE_RAY_RUNS", str(mine))
    assert main(["train", "steps=1"]) == 2
    assert f"{mine} is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"] and mine.read_text() == "mine"


def test_train_refuses_a_config_run_dir_that_is_itself_one_run(tmp_path, monkeypatch, capsys):
    """A run folder of the older layout, where the config's runs now go: it says how to go on."""
    monkeypatch.setenv("ROSE_RAY_RUNS", str(tmp_path))
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.yaml").write_text("name: tiny\n")
    assert main(["train", "steps=1"]) == 2
    err = capsys.readouterr().err
    assert f"run_dir {tmp_path / 'tiny'} holds a run itself (its config.yaml): continue it with --resume" in err
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == ["config.yaml"]  # no version_0 made


def test_resume_of_a_folder_without_a_run_names_it(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert f"--resume {tmp_path / 'nope'}: not a run directory" in capsys.readouterr().err


@dataclass
class _Vault:
    token: str | None = field(default=None, metadata={SECRET_ENV: "token_env"})
    token_env: str | None = None
    api_key: str = "plain"  # named like a secret, declared none: kept


@dataclass
class _WithSecrets:
    vault: _Vault = field(default_factory=_Vault)
    vaults: list[_Vault] = field(default_factory=list)


def test_the_saved_config_hides_the_secrets_their_settings_declare():
    """A field its settings mark secret (registry.SECRET_ENV) is saved as a read of the variable
    its companion field names (else $ROSE_RAY_API_KEY), wherever it sits; a field merely named
    api_key is not; an unset secret stays null. The openai backend's api_key is one such field."""
    config = _WithSecrets(_Vault(token="s3cret"), [_Vault(), _Vault("t", "VAULT_KEY")])
    saved = yaml.safe_load(saved_config(config))
    assert saved["vault"] == {"token": "${oc.env:ROSE_RAY_API_KEY,null}", "token_env": "ROSE_RAY_API_KEY",
                              "api_key": "plain"}
    assert saved["vaults"] == [
        {"token": None, "token_env": None, "api_key": "plain"},
        {"token": "${oc.env:VAULT_KEY,null}", "token_env": "VAULT_KEY", "api_key": "plain"}]
    served = ["teacher_warmup.enabled=false", "teacher_engine.backend=openai", "teacher_engine.model=t",
              "teacher_engine.backend.api_key=own", "teacher_engine.backend.api_key_env=TEACHER_KEY"]
    text = saved_config(load_config(None, served))
    assert "own" not in text and "api_key: ${oc.env:TEACHER_KEY,null}\n    api_key_env: TEACHER_KEY\n" in text
