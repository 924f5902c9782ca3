"""Each command's settings are one typed config (rose_ray/commands.py): the same settings given as
flags, as a YAML file (--settings) or as KEY=VALUE make equal configs; KEY=VALUE > flag > YAML >
default; bad keys, types and missing settings exit 2 naming the key; `--config` is a training
config wherever it is taken; every --help says each default. Fast: nothing here plays or loads a
model."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import fields
from typing import Any

import pytest
import yaml

from rose_ray.cli import build_parser, main
from rose_ray.commands import COMMANDS, resolve
from rose_ray.inference.engine import EngineConfig
from rose_ray.learner.learner import LearnerConfig

# The flags each command had before its settings became a config (cli.py at 5aabbbc): every one
# must still be there, spelled the same.
FLAGS_BEFORE = {
    "eval": ["--backend", "--compare", "--concurrency", "--context-policy", "--context-tokens", "--enable-thinking",
             "--env-workers", "--handoff", "--history", "--instruction-from", "--judge", "--judge-max-new-tokens",
             "--judge-model", "--judge-thinking", "--knowledge-from", "--kv-cache-mb", "--mapping", "--max-new-tokens",
             "--max-turns", "--model", "--n", "--out", "--seed", "--served-model", "--split", "--tasks", "--teacher",
             "--temperature", "--tokenizer", "--world"],
    "collect": ["--backend", "--concurrency", "--context-policy", "--context-tokens", "--enable-thinking",
                "--history", "--instruction-from", "--kv-cache-mb", "--mapping", "--max-new-tokens", "--model", "--n",
                "--out", "--schema", "--seed", "--served-model", "--split", "--temperature", "--tokenizer", "--turns",
                "--world"],
    "continue": ["--backend", "--concurrency", "--context-policy", "--context-tokens", "--enable-thinking",
                 "--history", "--in", "--instruction-from", "--kv-cache-mb", "--mapping", "--max-new-tokens",
                 "--max-turns", "--out", "--schema", "--seed", "--served-model", "--student", "--teacher",
                 "--temperature", "--tokenizer", "--world"],
    "gold": ["--instruction-from", "--mapping", "--n", "--observe", "--out", "--schema", "--seed", "--split",
             "--workers", "--world"],
    "sft": ["--batch-size", "--data", "--dtype", "--epochs", "--history", "--lr", "--max-tokens", "--model", "--out",
            "--owners", "--ranks", "--schedule", "--seed", "--threads", "--warmup-steps", "--zero-stage"],
    # --kv-cache-mb went with serve's vllm backend (vLLM serves with its own server)
    "serve": ["--api-key", "--backend", "--context-tokens", "--dtype", "--host", "--max-batch-size",
              "--max-concurrent", "--max-wait-ms", "--port", "--served-model-name", "--threads"],
}


# Per command: what it needs (as flags, or the positional MODEL), and settings given three ways
# below: (key, flag value, YAML/KEY=VALUE value, the typed value).
REQUIRED = {
    "eval": [],
    "collect": ["--model", "m", "--out", "o.jsonl"],
    "continue": ["--teacher", "t", "--in", "p.jsonl", "--out", "o.jsonl"],
    "gold": ["--out", "g.jsonl"],
    "sft": ["--data", "d.jsonl", "--model", "m", "--out", "o"],
    "serve": ["m"],
}


SETTINGS = {
    "eval": [("n", "3", 3), ("temperature", "0.5", 0.5), ("history", "sampled", "sampled"), ("tasks", "a,b", "a,b")],
    "collect": [("turns", "2", 2), ("seed", "7", 7), ("schema", "agentgym", "agentgym"), ("kv_cache_mb", "64.0", 64.0)],
    "continue": [("max_turns", "4", 4), ("context_policy", "drop_oldest", "drop_oldest"), ("student", "s", "s")],
    "gold": [("workers", "3", 3), ("split", "dev", "dev"), ("mapping", "agentgym_traj", "agentgym_traj")],
    "sft": [("epochs", "2", 2), ("lr", "0.001", 0.001), ("zero_stage", "2", 2), ("owners", "teacher", "teacher")],
    "serve": [("port", "9001", 9001), ("dtype", "float32", "float32"), ("max_wait_ms", "2.5", 2.5)],
}


BOOLS = {"eval": "enable_thinking", "collect": "enable_thinking", "continue": "enable_thinking", "gold": "observe"}


def settings_of(argv: list[str]):
    """What `rose-ray ARGV` hands its command (cli.main's parsing, then commands.resolve)."""
    args, extra = build_parser().parse_known_args(argv)
    args.overrides += extra  # KEY=VALUE after a flag, as cli.main takes them
    return resolve(args.settings, args, args.command)


def flag(key: str) -> str:
    return "--in" if key == "input" else "--" + key.replace("_", "-")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_flags_yaml_and_key_value_make_the_same_config(command, tmp_path):
    given = [(k, v) for k, v, _ in SETTINGS[command]]
    as_flags = settings_of([command, *REQUIRED[command], *(a for k, v in given for a in (flag(k), v))])
    as_pairs = settings_of([command, *REQUIRED[command], *(f"{k}={v}" for k, v in given)])
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump({k: typed for k, _, typed in SETTINGS[command]}))
    as_yaml = settings_of([command, *REQUIRED[command], "--settings", str(config)])
    assert as_flags == as_pairs == as_yaml
    for key, _, typed in SETTINGS[command]:
        assert getattr(as_flags, key) == typed
    if command in BOOLS:  # a store_true flag and `key=true` are the same setting
        key = BOOLS[command]
        assert getattr(settings_of([command, *REQUIRED[command], flag(key)]), key) is True
        assert settings_of([command, *REQUIRED[command], f"{key}=true"]) == settings_of(
            [command, *REQUIRED[command], flag(key)])


def test_required_settings_can_come_from_the_yaml_file(tmp_path):
    config = tmp_path / "collect.yaml"
    config.write_text("model: m\nout: o.jsonl\nturns: 3\n")
    cfg = settings_of(["collect", "--settings", str(config)])
    assert (cfg.model, cfg.out, cfg.turns) == ("m", "o.jsonl", 3)
    config.write_text("teacher: t\ninput: p.jsonl\nout: o.jsonl\n")  # `--in` is the setting `input`
    assert settings_of(["continue", "--settings", str(config)]).input == "p.jsonl"


def test_key_value_beats_the_flag_beats_the_yaml_beats_the_default(tmp_path):
    config = tmp_path / "collect.yaml"
    config.write_text("turns: 3\nseed: 3\nsplit: dev\n")
    base = ["collect", "--model", "m", "--out", "o", "--settings", str(config)]
    cfg = settings_of([*base, "--turns", "4", "--seed", "4", "seed=5"])
    assert (cfg.seed, cfg.turns, cfg.split, cfg.n) == (5, 4, "dev", 0)  # n: the default
    assert settings_of(["collect", "--model", "m", "--out", "o"]).turns == 5


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_key_exits_2_naming_it_and_the_commands_keys(command, capsys, tmp_path):
    assert main([command, *REQUIRED[command], "no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert f"rose-ray {command}: error:" in err and "'no_such_key'" in err
    assert f"{command} has no such setting (its keys: " in err
    assert all(f.name in err for f in fields(COMMANDS[command]))
    config = tmp_path / "bad.yaml"
    config.write_text("also_not_a_key: 1\n")
    assert main([command, *REQUIRED[command], "--settings", str(config)]) == 2
    err = capsys.readouterr().err
    assert str(config) in err and "'also_not_a_key'" in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_wrong_type_exits_2_naming_the_key(command, capsys, tmp_path):
    key = next(k for k, _, typed in SETTINGS[command] if isinstance(typed, int | float))
    assert main([command, *REQUIRED[command], f"{key}=many"]) == 2
    err = capsys.readouterr().err
    assert f"'{key}'" in err and "many" in err
    config = tmp_path / "bad.yaml"
    config.write_text(f"{key}: [1, 2]\n")
    assert main([command, *REQUIRED[command], "--settings", str(config)]) == 2
    assert f"'{key}'" in capsys.readouterr().err


def test_a_value_outside_its_choices_exits_2_naming_the_key(capsys):
    assert main(["collect", "--model", "m", "--out", "o", "history=nowhere"]) == 2
    assert "key 'history': must be one of" in capsys.readouterr().err


def test_an_unquoted_on_in_yaml_is_named_with_the_fix(tmp_path, capsys):
    """YAML 1.1 reads `judge_thinking: on` as a boolean; the error says to quote it, and quoted it works."""
    config = tmp_path / "eval.yaml"
    config.write_text("judge_thinking: on\n")
    assert main(["eval", "--settings", str(config), "--model", "m"]) == 2
    assert "key 'judge_thinking'" in (err := capsys.readouterr().err) and "quote it" in err
    config.write_text('judge_thinking: "on"\n')
    args = build_parser().parse_args(["eval", "--settings", str(config)])
    assert resolve(COMMANDS["eval"], args, "eval").judge_thinking == "on"


@pytest.mark.parametrize("argv, key, flag_", [
    (["collect", "--model", "m"], "out", "--out"),
    (["collect", "--out", "o"], "model", "--model"),
    (["continue", "--teacher", "t", "--out", "o"], "input", "--in"),
    (["gold"], "out", "--out"),
    (["sft", "--data", "d", "--out", "o"], "model", "--model"),
])
def test_a_missing_required_setting_exits_2_naming_it(argv, key, flag_, capsys):
    assert main(argv) == 2
    assert f"error: {key} is required: give {flag_}" in capsys.readouterr().err


def test_a_yaml_file_that_is_not_a_mapping_or_not_yaml_is_named(tmp_path, capsys):
    listed = tmp_path / "list.yaml"
    listed.write_text("- model\n- out\n")
    assert main(["gold", "--settings", str(listed)]) == 2
    assert f"{listed}: not a mapping of gold's settings" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("out: [g.jsonl\n")
    assert main(["gold", "--settings", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML at line" in err


def other_values(command: type, keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """A value other than its default for each setting of `command` (less `keep`)."""
    hints = typing.get_type_hints(command)
    values: dict[str, Any] = {}
    for f in fields(command):
        kind = next(a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if a is not type(None))
        if f.metadata["choices"]:
            values[f.name] = next(c for c in f.metadata["choices"] if c != f.default)
        elif kind is bool:
            values[f.name] = not f.default
        elif kind in (int, float):
            values[f.name] = (f.default if isinstance(f.default, int | float) else 0) + 2
        else:
            values[f.name] = f"{f.name}_x"
    return {k: v for k, v in values.items() if k not in keep}


def as_flags(values: dict[str, Any]) -> list[str]:
    return [a for k, v in values.items() for a in ([flag(k)] if v is True else [flag(k), str(v)])]


def test_every_eval_setting_reaches_the_job(monkeypatch):
    """The job runs on the command's settings: each setting given on the command line is what
    run_eval sees, so a new setting is one field (a copy that forgot one would fail here)."""
    import rose_ray.evaluate as evaluate

    # --compare prints results, plays nothing; --run and --config name files (their own tests are below)
    values = other_values(COMMANDS["eval"], keep=("compare", "run", "config"))
    seen = []
    monkeypatch.setattr(evaluate, "run_eval", lambda cfg: seen.append(cfg) or {"summary": evaluate.summarise([])})
    assert main(["eval", *as_flags(values)]) == 0
    [job] = seen
    assert {k: getattr(job, k) for k in values} == values


# --------------------------------------------------------------------------- what `play` gets
# Eval settings that play nothing: where results go, the layers under the settings, the judge
# (it reads the played games' records afterwards).
NOT_PLAYED = {"out", "overwrite", "compare", "run", "config", "judge", "judge_model", "judge_max_new_tokens",
              "judge_thinking"}
SERVED = "openai:http://127.0.0.1:9/v1"  # a served model: where --tokenizer and --served-model count


def play_inputs(command: type, settings: dict[str, Any]) -> tuple[Any, list[str] | None]:
    """What `play` gets from a command of these settings: its PlaySpec, and its games (eval's)."""
    job = command(**settings)
    return job.play_spec(), [g.item_id for g in job.games()] if hasattr(job, "games") else None


def dropped_settings(command: type, base: dict[str, Any], values: dict[str, Any], skip: set[str],
                     model: str = "model") -> list[str]:
    """The settings of `command` that do not reach `play`: each in turn at a value other than its
    default (`values`; a served model's as `model`) leaves the spec and the games as they were."""
    dropped = []
    for f in fields(command):
        if f.name in skip:
            continue
        served = {model: SERVED, "tokenizer": "tok"} if f.name in ("tokenizer", "served_model") else {}
        under = {**base, **served}
        if play_inputs(command, {**under, f.name: values[f.name]}) == play_inputs(command, under):
            dropped.append(f.name)
    return dropped


def test_every_eval_setting_reaches_play():
    """The guard of "add an eval setting": each `rose-ray eval` setting that plays, changed alone,
    changes what `play` gets (EvalCommand.play_spec and its games); a setting dropped on the way,
    or a new one that nothing reads, fails here, named. A training run's evals play the same
    spec (test_a_runs_evals_are_eval_run_s)."""
    from rose_ray.commands import EvalCommand

    values = {**other_values(EvalCommand), "model": "m2", "split": "dev", "tasks": "find-plant", "teacher": "t",
              "instruction_from": "first_row.jsonl", "world": "discoveryworld", "backend": "hf"}
    base = {"model": "m", "n": 3, "backend": "vllm", "teacher": "expert", "handoff": 1}  # vllm: --kv-cache-mb counts
    assert dropped_settings(EvalCommand, base, values, NOT_PLAYED) == []


def test_every_play_setting_reaches_collect_and_continue_play():
    """`collect` and `continue` play with each of their play settings (PlaySettings and their own)."""
    from rose_ray.commands import CollectCommand, ContinueCommand

    values = {**other_values(CollectCommand), "model": "m2", "instruction_from": "first_row.jsonl", "backend": "hf",
              "world": "discoveryworld"}
    base = {"model": "m", "out": "o.jsonl", "backend": "vllm"}
    # split, n and the schema choose games and write rows; `play` gets the games collect_main draws.
    assert dropped_settings(CollectCommand, base, values, {"out", "overwrite", "schema", "split", "n"}) == []
    values = {**other_values(ContinueCommand), "teacher": "t2", "student": "s",
              "instruction_from": "first_row.jsonl", "backend": "hf", "world": "discoveryworld"}
    base = {"teacher": "t", "input": "p.jsonl", "out": "o.jsonl", "backend": "vllm", "temperature": 0.5}  # T > 0: the seed counts
    assert dropped_settings(ContinueCommand, base, values, {"out", "overwrite", "schema", "input"}, "teacher") == []
    spec = ContinueCommand(**base).play_spec()  # without --student the teacher's engine is the only one
    assert spec.student is spec.teacher and list(spec.engines("--teacher")) == ["--teacher"]


def test_collects_flags_are_what_it_plays(monkeypatch, tmp_path):
    """`rose-ray collect` with every play setting given as a flag plays the spec of those settings."""
    import rose_ray.collect as collect
    from rose_ray.commands import CollectCommand, PlaySettings

    values = {**other_values(PlaySettings), "world": "sciworld"}  # a world whose mappings these are
    seen = []
    monkeypatch.setattr(collect, "world_protocol", lambda *a: None)  # --instruction-from names no file
    monkeypatch.setattr(collect, "play_rows", lambda command, spec, *a, **k: seen.append(spec))
    out = str(tmp_path / "o.jsonl")
    assert main(["collect", "--model", "m", "--out", out, "--split", "dev", "--n", "2", *as_flags(values)]) == 0
    assert seen == [CollectCommand(model="m", out=out, split="dev", n=2, **values).play_spec()]


def test_every_eval_config_setting_reaches_a_runs_evals():
    """A training run's `eval.*` settings reach its evals' spec and games (evaluate.training_evals,
    what Trainer.evaluate plays), each changed alone; those that say when and whom a run evaluates
    are the loop's."""
    from rose_ray.config import EvalConfig, load_config
    from rose_ray.evaluate import training_evals

    def inputs(overrides: list[str]) -> tuple[Any, list[str]]:
        job, spec = training_evals(load_config(None, overrides), "m")
        return spec, [g.item_id for g in job.games()]

    values = {"split": "dev", "n": 3, "max_turns": 5, "max_new_tokens": 7, "seed": 1}
    when = {"every", "every_n", "before", "after", "teacher"}
    assert {f.name for f in fields(EvalConfig)} == set(values) | when  # a new eval.* setting: say which it is
    assert [k for k, v in values.items() if inputs([f"eval.{k}={v}"]) == inputs([])] == []


def test_a_runs_evals_are_eval_run_s(tmp_path):
    """A training run evaluates with what `rose-ray eval --run RUN` plays: the same spec (engine,
    turns, tokens, chat, world, opening) and games, from a config whose every eval-related setting
    differs from the default; so the two agree to the digit (tests/e2e/test_train.py plays both)."""
    from rose_ray.config import load_config
    from rose_ray.evaluate import training_evals
    from tests.unit.test_runs import fake_run

    run = fake_run(tmp_path / "runs", ["eval.n=5", "eval.max_turns=3", "eval.max_new_tokens=16", "eval.seed=4",
                                       "eval.split=dev", "tasks=[find-plant,boil]", "chat.history=template",
                                       "chat.enable_thinking=true", "env.games_per_worker=6", "env.mapping=agentgym_traj",
                                       "student_engine.max_batch_size=3", "student_engine.threads=2",
                                       "student_engine.context_tokens=1024", "student_engine.context_policy=end_episode",
                                       "student_engine.dtype=bfloat16"])
    job, spec = training_evals(load_config(run / "config.yaml"), str(run / "model"))
    cli = settings_of(["eval", "--run", str(run)])
    assert cli.play_spec() == spec and cli.games() == job.games()
    assert (spec.max_turns, spec.student_sampling.max_new_tokens, spec.history, spec.enable_thinking, spec.concurrency,
            spec.student.context_tokens, spec.student.dtype, spec.student.threads, spec.mapping) == (
        3, 16, "template", True, 6, 1024, "bfloat16", 2, "agentgym_traj")


def test_context_tokens_has_one_default():
    defaults = {name: settings_of([name, *REQUIRED[name]]).context_tokens
                for name, cls in COMMANDS.items() if "context_tokens" in {f.name for f in fields(cls)}}
    assert set(defaults) == {"eval", "collect", "continue", "serve"}
    assert set(defaults.values()) == {EngineConfig.context_tokens} == {16384}
    assert LearnerConfig.max_tokens >= EngineConfig.context_tokens  # a packed row holds a whole context
    assert settings_of(["sft", *REQUIRED["sft"]]).max_tokens == LearnerConfig.max_tokens


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_still_lists_every_flag_it_had(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    missing = [f for f in FLAGS_BEFORE[command] if f + " " not in out and f + "\n" not in out]
    assert not missing
    assert "--settings FILE.yaml" in out and "KEY=VALUE" in out


def test_a_training_configs_flags_and_overrides_reach_its_command_as_given():
    """check, plan and warmup have typed settings too; their --config and KEY=VALUE are the training
    config's, passed on as given (its ${...} are that config's to resolve); repeated flags add up."""
    plan = settings_of(["plan", "--node", "CPU=8", "--node", "2xGPU=8", "--config", "c.yaml", "run_dir=runs/${name}"])
    assert (plan.node, plan.config, plan.overrides) == (["CPU=8", "2xGPU=8"], "c.yaml", ["run_dir=runs/${name}"])
    check = settings_of(["check", "--config", "c.yaml", "--total", "steps=2"])
    assert (check.config, check.total, check.overrides, check.backends) == ("c.yaml", True, ["steps=2"], False)
    assert settings_of(["warmup", "--eval", "dev", "seed=1"]).overrides == ["seed=1"]
    assert settings_of(["warmup", "--ship", "--config", "c.yaml"]).ship and not settings_of(["warmup"]).ship


# --------------------------------------------------------------------------- --config, --run, defaults
@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"eval"}))
def test_config_is_a_training_config_and_a_commands_own_file_is_settings(command, tmp_path, capsys):
    """`--config` means one thing wherever it is taken (a training config: train, check, plan,
    warmup, eval); a command that takes none says so, naming --settings, and writes nothing."""
    own = tmp_path / "own.yaml"
    own.write_text("seed: 1\n")
    assert main([command, *REQUIRED[command], "--config", str(own)]) == 2
    assert f"--config {own}: --config names a training config" in (err := capsys.readouterr().err)
    assert f"a YAML file of {command}'s settings is --settings FILE.yaml" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.yaml"]


def test_eval_run_plays_as_the_runs_own_eval_did(tmp_path):
    """`eval --run RUN` (a run folder, its run_dir, or RUN_DIR/latest): the run's model/ with the
    settings of the run's own evals, its student engine's settings kept, into the run's folder;
    a setting given goes over the run's."""
    from dataclasses import replace

    from rose_ray.config import load_config
    from tests.unit.test_runs import fake_run

    runs = tmp_path / "tiny"
    run = fake_run(runs, ["eval.n=5", "eval.max_turns=3", "eval.max_new_tokens=16", "eval.seed=4", "tasks=[find-plant]",
                          "student_engine.max_batch_size=3", "student_engine.threads=2", "chat.history=template",
                          "env.games_per_worker=6"])
    cfg = load_config(run / "config.yaml")
    for given in (run, runs, runs / "latest"):
        job = settings_of(["eval", "--run", str(given)])
        assert (job.run, job.model, job.config, job.out) == (
            str(run), str(run / "model"), str(run / "config.yaml"), str(run / "eval_test"))
        assert (job.split, job.n, job.seed, job.tasks, job.max_turns, job.max_new_tokens, job.temperature) == (
            "test", 5, 4, "find-plant", 3, 16, 0.0)
        assert (job.history, job.enable_thinking, job.concurrency, job.context_tokens, job.context_policy,
                job.dtype, job.backend, job.world) == ("template", False, 6, 2048, "drop_oldest", "float32", "hf",
                                                       "sciworld")
    # The engine is the run's student engine (batch size, threads, ...), its model the run's model/.
    assert job.play_spec().student == replace(cfg.student_engine, model=str(run / "model"))
    job = settings_of(["eval", "--run", str(runs), "--split", "dev", "n=2"])
    assert (job.split, job.n, job.max_turns, job.out) == ("dev", 2, 3, str(run / "eval_dev"))
    from rose_ray.commands import EvalCommand, from_keywords

    assert from_keywords(EvalCommand, "eval", {"run": str(runs), "split": "dev", "n": 2}) == job  # the Python API


def test_eval_config_plays_a_model_as_a_configs_runs_evaluate(tmp_path, capsys):
    from rose_ray.commands import training_eval
    from rose_ray.config import default_config_path, load_config

    tiny = str(default_config_path())
    job = settings_of(["eval", "--config", tiny, "--model", "m", "--n", "3"])
    expected = {**training_eval(load_config(tiny), "m"), "n": 3}
    assert {k: getattr(job, k) for k in expected} == expected and job.out == "runs/eval/m_test"
    # A file of eval's own settings given as --config is named as such; a missing --model too.
    own = tmp_path / "eval.yaml"
    own.write_text("n: 4\nsplit: dev\n")
    assert main(["eval", "--config", str(own), "--model", "m"]) == 2
    assert f"this file holds eval's own settings: give it as --settings {own}" in capsys.readouterr().err
    assert main(["eval", "--config", tiny]) == 2
    assert "give --model (or --run RUN" in capsys.readouterr().err


def test_eval_run_refuses_what_it_cannot_mean(tmp_path, capsys):
    from tests.unit.test_runs import fake_run

    run = fake_run(tmp_path / "tiny")
    assert main(["eval", "--run", str(run), "--model", "m"]) == 2
    assert f"give --config {run}/config.yaml --model M" in capsys.readouterr().err
    assert main(["eval", "--run", str(run), "--config", str(run / "config.yaml")]) == 2
    assert "--run evaluates a run's model with its own config.yaml" in capsys.readouterr().err
    (run / "model").rmdir()
    assert main(["eval", "--run", str(run)]) == 2
    assert f"no model/ there yet (a run writes it when it stops); `rose-ray export {run}" in capsys.readouterr().err
    assert main(["eval", "--run", str(tmp_path / "nope")]) == 2
    assert "nope: not a run directory" in capsys.readouterr().err


def test_evals_of_two_runs_models_never_share_a_default_file(tmp_path):
    """Every run's model folder is named `model`: the default output names the run."""
    from tests.unit.test_runs import fake_run

    runs = tmp_path / "tiny"
    outs = [settings_of(["eval", "--model", str(fake_run(runs) / "model")]).out for _ in range(2)]
    assert outs == ["runs/eval/tiny_version_0_model_test", "runs/eval/tiny_version_1_model_test"]
    assert settings_of(["eval", "--model", str(tmp_path / "student"), "--split", "dev"]).out == "runs/eval/student_dev"


def test_eval_refuses_an_existing_result_unless_overwrite(tmp_path, capsys):
    """Like every other writer, before anything starts; --overwrite goes on (here to the model,
    which is not there)."""
    out = tmp_path / "ev"
    (tmp_path / "ev.json").write_text("{}")
    model = str(tmp_path / "no_model")
    assert main(["eval", "--model", model, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}.json already exists; give another --out, or --overwrite to replace it" in err
    assert (tmp_path / "ev.json").read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["ev.json"]
    assert main(["eval", "--model", model, "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "already exists" not in err and "no_model" in err


def help_blocks(text: str) -> dict[str, str]:
    """An argparse help's options: each option's first spelling -> its whole entry."""
    blocks: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("  -") and not line.startswith("   "):
            name = stripped.split()[0].rstrip(",")
            blocks[name] = stripped
        elif name and line.startswith("   "):
            blocks[name] += " " + stripped
        else:
            name = None
    return blocks


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_help_says_each_default(name, capsys):
    """Every option of every command that has a default (not an unset value, an off switch or an
    empty list) says it in --help."""
    parser = _subcommands()[name]
    typed = parser.get_default("settings")
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in (fields(typed) if typed else ())}
    with pytest.raises(SystemExit):
        main([name, "--help"])
    blocks = help_blocks(capsys.readouterr().out)
    shown = [a for a in parser._actions if a.option_strings and a.help is not argparse.SUPPRESS]
    assert shown and all(a.option_strings[0] in blocks for a in shown)  # the walk reads every option's entry
    for action in shown:
        default = defaults.get(action.dest, action.default) if action.default is argparse.SUPPRESS else action.default
        if action.dest == "help" or default is None or default is False or default in ([], "", "???"):
            continue
        entry = blocks[action.option_strings[0]]
        assert "default" in entry.lower(), f"rose-ray {name} --help: {entry}"


def test_help_shows_the_defaults_value():
    parser = _subcommands()["eval"]
    blocks = help_blocks(parser.format_help())
    assert "(default: 200)" in blocks["--n"] and "(default: test)" in blocks["--split"]
    assert "(default: 50)" in help_blocks(_subcommands()["play"].format_help())["--max-turns"]
