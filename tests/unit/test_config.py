"""The run's configuration (rose_ray/config.py): the `algorithm` section chosen by name with its
recipe's and turn policy's keys (tagged.py), old keys refused naming where they live now and a
run's old config.yaml rewritten once by `rose-ray migrate` (migrate.py), a YAML file or override
that does not parse named with its line, and YAML's bare `off` read as the string. Per-backend
engine sections: test_backends.py; shipped and seed configs: test_launch_files.py; the command
settings beside a config: test_commands.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

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
    assert load_config(saved).algorithm == load_config(None, ["algorithm.handoff=on_failure",
                                                                           "algorithm.lam=0.5"]).algorithm


def test_an_old_key_is_refused_naming_where_it_lives_now():
    for key, says in (("rollout.handoff.k=1", "key 'rollout.handoff': removed; moved to algorithm.handoff"),
                      ("learner.lam=0.5", "key 'learner.lam': removed; moved to algorithm.lam"),
                      ("learner.sft_owners=[teacher]", "key 'learner.sft_owners': removed; moved to algorithm.owners"),
                      ("student_engine.vllm.kv_cache_mb=64", "key 'student_engine.vllm': the vllm backend's settings "
                                                             "live in student_engine.backend now: {name: vllm, ...}"),
                      ("teacher_engine.base_url=http://h:1/v1", "key 'teacher_engine.base_url': the openai backend's "
                                                                "settings live in teacher_engine.backend now")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [key])
        assert says in str(e.value) and "migrate" not in str(e.value)  # an override is no run's config.yaml


OLD_RUN = Path(__file__).parent / "data" / "config_before_backend_section.yaml"


def flat(mapping: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in mapping.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {prefix + key: value}
    return out


def test_migrate_rewrites_an_old_runs_config_once(tmp_path, capsys):
    """A run folder written before the tagged backend section (a real one: tests/unit/data) is
    refused by key with the command that fixes it; `rose-ray migrate` rewrites it whole in
    today's keys, keeps every value it had, keeps the old file, and has nothing to do again."""
    from rose_ray.cli import main
    from rose_ray.inference.registry import VLLMSettings

    run = tmp_path / "runs" / "seed" / "version_0"
    run.mkdir(parents=True)
    shutil.copy(OLD_RUN, run / "config.yaml")
    (run.parent / "latest").write_text("version_0\n")
    before = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=f"key 'learner.gradient_checkpointing': removed; .* this run's config.yaml "
                                          f"is from an earlier version: `rose-ray migrate {run}` rewrites it"):
        load_config(run / "config.yaml")
    assert main(["migrate", str(run.parent)]) == 0  # a run_dir names its latest run, as --resume reads it
    assert (run / "config.yaml.old").read_text() == before
    cfg = load_config(run / "config.yaml")
    assert cfg.student_engine.backend == VLLMSettings(kv_cache_mb=64.0)
    assert cfg.teacher_engine.backend == VLLMSettings(kv_cache_mb=64.0, tensor_parallel_size=4)
    assert cfg.learner.activation_checkpointing == "full"  # gradient_checkpointing: true was full
    old, new = flat(yaml.safe_load(before)), flat(yaml.safe_load((run / "config.yaml").read_text()))
    moved = ("learner.gradient_checkpointing", "publish.object_store_bucket_mb", "student_engine.", "teacher_engine.")
    kept = {k: v for k, v in old.items() if not k.startswith(moved)}
    assert kept and {k: new.get(k) for k in kept} == kept
    def shared(settings: dict, role: str) -> dict:  # an engine's settings every backend shares
        return {k: v for k, v in settings.items()
                if k.startswith(role) and k.split(".")[1] not in ("backend", "hf", "vllm", "openai")}

    for role in ("student_engine", "teacher_engine"):
        assert len(shared(old, role)) == 9 and shared(new, role) == shared(old, role)
    capsys.readouterr()
    assert main(["migrate", str(run)]) == 0 and "nothing to do" in capsys.readouterr().out
    assert (run / "config.yaml.old").read_text() == before


def test_migrate_carries_every_older_spelling_and_writes_nothing_it_cannot_load(tmp_path, capsys):
    """Older still: each backend's settings flat on the engine (another backend's dropped, as they
    were unused), handoff, lam and owners outside `algorithm`. A config that does not load is
    left as it was, the key named; KEY=VALUE gives what it needs now."""
    from rose_ray.cli import main
    from rose_ray.inference.registry import HFSettings, VLLMSettings

    config = tmp_path / "config.yaml"
    config.write_text("algorithm: rose\nrollout:\n  handoff: {policy: decay, p0: 0.25}\nlearner:\n  lam: 0.5\n"
                      "  sft_owners: [student, teacher]\nstudent_engine:\n  backend: vllm\n  kv_cache_mb: 64\n"
                      "  prefix_cache_mb: 0\n  base_url: http://h:1/v1\nteacher_engine:\n  backend: hf\n"
                      "  prefix_cache_mb: 0\n  kv_cache_mb: 32\n")
    assert main(["migrate", str(tmp_path)]) == 0
    cfg = load_config(config)
    assert cfg.algorithm == load_config(None, ["algorithm={name: rose, handoff: {policy: decay, p0: 0.25}, lam: 0.5}"]
                                        ).algorithm
    assert (cfg.student_engine.backend, cfg.teacher_engine.backend) == (VLLMSettings(kv_cache_mb=64),
                                                                        HFSettings(prefix_cache_mb=0))
    config.write_text("algorithm: teacher_sft\nrollout:\n  handoff: {policy: fixed, k: 5}\nlearner:\n"
                      "  sft_owners: [teacher]\nsteps: 0\n")
    (tmp_path / "config.yaml.old").unlink()
    assert main(["migrate", str(tmp_path)]) == 2
    assert "steps: must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "config.yaml.old").exists() and "sft_owners" in config.read_text()
    assert main(["migrate", str(tmp_path), "steps=5"]) == 0
    assert load_config(config).algorithm.owners == ["teacher"] and load_config(config).steps == 5


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


def test_an_error_s_first_line_is_its_type_when_it_has_no_message():
    from rose_ray.errors import first_line

    assert first_line(ValueError("bad value\nmore")) == "bad value"
    assert first_line(ValueError("  ")) == "ValueError"  # an empty message: no IndexError
    assert first_line(OSError("x" * 300), named=True) == "OSError: " + "x" * 200
    assert first_line(RuntimeError(), named=True) == "RuntimeError"
