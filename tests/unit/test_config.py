"""The run's configuration (rose_ray/config.py): the `algorithm` section chosen by name with its
recipe's and turn policy's keys, moved keys refused by name and carried from a saved run, a YAML
file or override that does not parse named with its line, and YAML's bare `off` read as the
string. Per-backend engine sections: test_backends.py; shipped and seed configs:
test_launch_files.py; the command settings beside a config: test_commands.py."""

from __future__ import annotations

import pytest

from rose_ray.config import ConfigError, load_config
from rose_ray.rollout.agent import EpisodeConfig
from rose_ray.rollout.handoff import turn_policy


def test_the_algorithm_section_is_its_recipes_and_a_new_name_starts_it_afresh(tmp_path):
    """`algorithm` is one typed section chosen by name; a later layer that names another recipe
    or turn policy keeps none of the old kind's keys, a key the kind lacks is named."""
    from rose_ray.config import ConfigError, load_config, to_yaml

    rose = load_config(None).algorithm  # the tiny YAML: {name: rose, handoff: {policy: fixed, k: 2}}
    assert (rose.name, rose.turn_policy(), rose.lam) == ("rose", turn_policy("fixed", k=2), 0.0)
    assert load_config(None, ["algorithm=opd"]).algorithm.turn_policy() == turn_policy("none")
    decay = load_config(None, ["algorithm.handoff.policy=decay", "algorithm.handoff.p0=0.3"]).algorithm
    assert decay.turn_policy() == turn_policy("decay", p0=0.3) and decay.lam == 0.0
    sft = load_config(None, ["algorithm=teacher_sft", "algorithm.owners=[teacher]"]).algorithm
    assert (sft.turn_policy(), sft.token_weights().terms["ce"]) == (turn_policy("teacher_only"), {"teacher": 1.0})
    # One line in logs and `rose-ray check`, as the YAML writes the section.
    assert decay.describe().startswith("rose handoff={policy: decay, p0: 0.3, ") and decay.describe().endswith("} lam=0.0")
    assert sft.describe() == "teacher_sft owners=[teacher]"
    for overrides, says in ((["algorithm.handoff.p0=0.3"], "algorithm.handoff.p0: fixed has no such key"),
                            (["algorithm=opd", "algorithm.lam=0.5"], "algorithm.lam: opd has no such key"),
                            (["algorithm.handoff.policy=sometimes"], "algorithm.handoff.policy: must be one of"),
                            (["algorithm.lam=x"], "algorithm.lam: Value 'x'")):
        with pytest.raises(ConfigError, match=says):
            load_config(None, overrides)
    # The section is written out whole, and a run's config.yaml reads back the same.
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(load_config(None, ["algorithm.handoff=on_failure", "algorithm.lam=0.5"])))
    assert load_config(saved, saved=True).algorithm == load_config(None, ["algorithm.handoff=on_failure",
                                                                           "algorithm.lam=0.5"]).algorithm


def test_moved_keys_are_refused_by_name_and_carried_in_a_saved_run(tmp_path):
    from rose_ray.config import ConfigError, load_config

    for key, place in (("rollout.handoff.k=1", "algorithm.handoff"), ("learner.lam=0.5", "algorithm.lam"),
                       ("learner.sft_owners=[teacher]", "algorithm.owners")):
        with pytest.raises(ConfigError, match=f"key '{key.split('=')[0].replace('.k', '')}': removed; moved to {place}"):
            load_config(None, [key])
    # A run saved before the move resumes with its settings where they live now.
    old = tmp_path / "config.yaml"
    old.write_text("algorithm: rose\nrollout:\n  handoff: {policy: decay, p0: 0.25}\nlearner:\n  lam: 0.5\n"
                   "  sft_owners: [student, teacher]\n")
    assert load_config(old, saved=True).algorithm == load_config(
        None, ["algorithm={name: rose, handoff: {policy: decay, p0: 0.25}, lam: 0.5}"]).algorithm
    old.write_text("algorithm: teacher_sft\nrollout:\n  handoff: {policy: fixed, k: 5}\nlearner:\n"
                   "  sft_owners: [teacher]\n")
    assert load_config(old, saved=True).algorithm.owners == ["teacher"]


def test_a_file_that_is_not_yaml_is_named_with_its_line(tmp_path, capsys):
    from rose_ray.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\nmode: sync\n")
    assert main(["check", str(bad)]) == 2
    assert f"{bad}: not valid YAML at line 3, column 1" in capsys.readouterr().err
    ok = tmp_path / "ok.yaml"
    ok.write_text("steps: 1\n")
    assert main(["check", str(ok), "algorithm={name"]) == 2
    assert "override 'algorithm={name': its value is not valid YAML" in capsys.readouterr().err


def test_report_off_is_read_from_yaml_and_the_command_line(tmp_path):
    """YAML reads a bare `off` as false: `rollout.report: off` still means off."""
    config = tmp_path / "c.yaml"
    config.write_text("rollout:\n  report: off\n")
    assert load_config(str(config)).rollout.report == "off"
    assert load_config(None, ["rollout.report=off"]).rollout.report == "off"
    assert load_config(None, ["rollout.report=train"]).rollout.report == "train"
    with pytest.raises(ConfigError, match="rollout.report: must be ask, train or off, got 'maybe'"):
        load_config(None, ["rollout.report=maybe"])
    with pytest.raises(ValueError, match="report: must be one of"):
        EpisodeConfig(report="maybe")


def test_an_expert_teacher_is_checked_against_the_world_the_tasks_and_the_algorithm():
    """teacher.kind=expert: a world with an expert, tasks it plays, no OPD term (it has no
    logprobs), nothing to warm; each refusal names its key. The tiny default stays a model teacher."""
    assert load_config(None).teacher.kind == "model"
    small = "configs/small.yaml"
    expert = ["teacher.kind=expert", "teacher_warmup.enabled=false"]
    cfg = load_config(small, expert)
    assert cfg.teacher.expert and [role for role, _ in cfg.engines()] == ["student"]
    refusals = {
        "teacher.kind": ["teacher.kind=oracle"],
        "teacher_warmup.enabled": ["teacher.kind=expert"],
        "algorithm.lam": [*expert, "algorithm.lam=0.5"],
        "algorithm: opd": [*expert, "algorithm=opd"],
        "tasks": [*expert, "tasks=[boil]"],
        "teacher_warmup.continuation": ["teacher_warmup.continuation=oracle"],
        "student_warmup.continuation": ["student_warmup.continuation=expert"],
    }
    for key, overrides in refusals.items():
        with pytest.raises(ConfigError, match=key):
            load_config(small, overrides)
    with pytest.raises(ConfigError, match="tasks: the expert teacher .teacher_warmup.continuation"):
        load_config(small, ["teacher_warmup.continuation=expert", "tasks=[boil]"])
    assert load_config(small, ["teacher_warmup.continuation=expert"]).teacher_warmup.continuation == "expert"
