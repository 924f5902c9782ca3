"""One typed config for each command (COMMANDS), and for the tools with flags alone (TOOLS):
flags made from the fields (`add_flags`), layers merged by OmegaConf (`resolve`), errors naming
the key (docs/configuration.md#commands). Importing this module loads no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from rose_ray.chat import HISTORIES
from rose_ray.config import load_config, override_layer, yaml_layers
from rose_ray.envs.worlds import DEFAULT_WORLD, WORLDS, get_world
from rose_ray.errors import ConfigError, InputError, first_line
from rose_ray.inference.engine import CONTEXT_POLICIES, DTYPES, EngineConfig
from rose_ray.inference.protocol import MAX_CONCURRENT
from rose_ray.inference.registry import COMMAND_BACKENDS, DEFAULT_COMMAND_BACKEND
from rose_ray.learner.learner import LEARNER_DTYPES, SCHEDULES, LearnerConfig
from rose_ray.runs import resolve_run
from rose_ray.types import SCHEMAS, GameId, SamplingParams

if typing.TYPE_CHECKING:
    from rose_ray.rollout.play import PlaySpec

__all__ = ["COMMANDS", "add_flags", "from_keywords", "resolve"]

MAPPINGS = tuple(get_world(DEFAULT_WORLD).mappings)


def setting(default: Any = MISSING, help: str = "", choices: tuple[Any, ...] | None = None,
            flag: str | None = None, metavar: str | None = None, nargs: str | None = None,
            positional: bool = False) -> Any:
    """A command's setting: its default (none: required) and what its flag shows and accepts."""
    meta = dict(help=help, choices=choices, flag=flag, metavar=metavar, nargs=nargs, positional=positional)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- shared groups
@dataclass
class WorldSettings:
    world: str | None = setting(None, f"default: the world an item id names, else {DEFAULT_WORLD}",
                                choices=tuple(sorted(WORLDS)))
    mapping: str | None = setting(None, f"ScienceWorld's item-id mapping (default {MAPPINGS[0]})", choices=MAPPINGS)


@dataclass
class ContextTokens:
    context_tokens: int = setting(EngineConfig.context_tokens,
                                  f"prompt + reply tokens (the card's {EngineConfig.context_tokens:,})")


@dataclass
class HistorySetting:
    history: str = setting("template", "earlier turns in each prompt (or each SFT row): as the chat template "
                                       "renders the conversation, as a chat API does (the card's; default), "
                                       "or as their ids were sampled (chat.history)", choices=HISTORIES)


@dataclass
class InstructionSetting:
    instruction_from: str | None = setting(None, "take the instruction and acknowledgement from a dataset's "
                                                 "first row (default: rose_ray's own wording; `continue`: "
                                                 "each row's own)", metavar="JSONL")


@dataclass
class RowsOutput:
    """A dataset command's rows and --out: they stream into `<out>.partial`, `<out>` is written at the end."""

    out: str = setting(help="the JSONL file to write (rows stream into OUT.partial meanwhile)")
    overwrite: bool = setting(False, "replace --out if it exists (default: refuse), and start over from a "
                                     "partial file of other settings")
    schema: str = setting("card", "rows as the dataset card writes them (role/content) or as AgentGym does "
                                  "(from/value)", choices=SCHEMAS)


@dataclass
class PlaySettings(WorldSettings, ContextTokens, HistorySetting, InstructionSetting):
    """Episodes played by models: `eval`, `collect` and `continue`. The engine is a local model's, or a
    served one's (`openai:URL`): its tokenizer here and its name there."""

    tokenizer: str | None = setting(None, "tokenizer folder of the openai:URL models (prompts go as token ids)")
    served_model: str = setting("", "the model name the openai: server expects (default: the server's own)")
    backend: str = setting(DEFAULT_COMMAND_BACKEND,
                           "the engine of a local model: vllm (vLLM's engine), hf (transformers), or auto: "
                           f"vllm where it is installed, else hf (default {DEFAULT_COMMAND_BACKEND})",
                           choices=COMMAND_BACKENDS)
    kv_cache_mb: float | None = setting(None, "vllm on CPU: the KV cache's size (default: the backend's own; "
                                              "with --run or --config, that config's)", metavar="MB")
    enable_thinking: bool = setting(False, "turn the chat template's thinking mode on (Qwen3); off by "
                                           "default")
    context_policy: str = setting(
        "end_episode", "a prompt that no longer fits: end the episode there (AgentGym's rule, the default; "
        "its end reason is `context`) or drop the oldest action/observation pairs", choices=CONTEXT_POLICIES)
    seed: int = setting(0, "the games drawn; at temperature > 0 also each turn's draw "
                           "(its own seed, from seed, game and turn)")
    temperature: float = setting(0.0, "0 = greedy")
    max_new_tokens: int = setting(SamplingParams.max_new_tokens, "reply tokens per turn")
    concurrency: int = setting(8, "episodes at once")

    def engine(self, model: str, flag: str, dtype: str = EngineConfig.dtype) -> EngineConfig:
        """The engine of `model` (`flag` names it in errors) with these settings."""
        from rose_ray.inference.backends import command_engine

        return command_engine(model, flag, self.backend, self.tokenizer, self.served_model, dtype=dtype,
                              context_tokens=self.context_tokens, context_policy=self.context_policy,
                              max_batch_size=self.concurrency, kv_cache_mb=self.kv_cache_mb)

    def as_spec(self, student: EngineConfig, **job: Any) -> PlaySpec:
        """These settings as a PlaySpec (rollout/play.py); `job`: what the command adds."""
        from rose_ray.rollout.play import PlaySpec

        sampling = SamplingParams(self.temperature, max_new_tokens=self.max_new_tokens,
                                  seed=self.seed if self.temperature > 0 else None)
        return PlaySpec(**{"student": student, "student_sampling": sampling, "teacher_sampling": sampling,
                           "enable_thinking": self.enable_thinking, "history": self.history,
                           "world": self.world or DEFAULT_WORLD, "mapping": self.mapping,
                           "instruction_from": self.instruction_from, "concurrency": self.concurrency, **job})


# --------------------------------------------------------------------------- the commands
@dataclass
class EvalCommand(PlaySettings):
    """`rose-ray eval` (evaluate.py), and a training run's evals (training_eval); checked as made."""

    model: str = setting("", "local model folder, or openai:URL of a served model")
    split: str = setting("test", "train, dev, test, all, agenteval_test, or an id-list file")
    n: int = setting(200, "games, a task-stratified sample (0 = the whole split)")
    tasks: str = setting("", "comma-separated task names: only their games (a training run's `tasks:`; with "
                             "the same --n and --seed, its eval games)")
    max_turns: int | None = setting(None, "turns per game (default: sciworld 20; discoveryworld the paper's "
                                          "limits, 100 for Easy and unit tests, 1,000 for Normal and Challenge, "
                                          "which this replaces)")
    judge: str | None = setting(None, "discoveryworld: score knowledge with this judge (a local folder, or "
                                      "openai:URL)", metavar="MODEL")
    judge_model: str = setting("", "the model name an openai: judge server expects", metavar="NAME")
    judge_max_new_tokens: int = setting(800, "the judge's answer budget (the paper's 800)")
    knowledge_from: str = setting("thoughts", "what the judge reads: the agent's thoughts while playing (the "
                                              "paper's scorer, default) or its answer to a question asked when "
                                              "the episode ends", choices=("thoughts", "report"))
    judge_thinking: str | None = setting(None, "the judge's chat-template thinking switch (default: off for a "
                                               "local folder, the server's own for openai:)", choices=("on", "off"))
    teacher: str | None = setting(None, "with --handoff K: the teacher plays from turn K+1 (a model, or `expert`: "
                                        "the world's expert teacher)")
    handoff: int | None = setting(None, "student turns before the teacher takes over")
    env_workers: int = setting(1, "game processes")
    dtype: str = setting(EngineConfig.dtype, "the engines' weights (auto: as the model folder declares)",
                         choices=DTYPES)
    run: str | None = setting(None, "a training run (its folder, a run_dir meaning its latest run, or RUN_DIR/latest): "
                                    "evaluate its model/ exactly as the run's own evals did (its games, turns, reply "
                                    "tokens, engine, chat; settings given here go over them) into "
                                    "RUN/eval_<split>.json and .md", metavar="RUN")
    config: str | None = setting(None, "a training config (as train --config takes): evaluate --model as that "
                                       "config's runs evaluate (settings given here go over it)", metavar="FILE.yaml")
    out: str | None = setting(None, "results prefix: writes OUT.json and OUT.md (default: RUN/eval_<split> with "
                                    "--run; else runs/eval/<model>_<split>, a run's model/ named after its run, "
                                    "e.g. runs/eval/tiny_version_0_model_test)")
    overwrite: bool = setting(False, "replace an existing OUT.json (default: refuse), and start over from a partial "
                                     "file of other settings")
    compare: list[str] = setting([], "print results side by side", metavar="RESULT.json", nargs="+")

    def __post_init__(self) -> None:
        self.world = self.world or DEFAULT_WORLD
        if self.run:
            self.run = str(resolve_run(self.run))
        split = Path(self.split).stem  # a split may be a file of item ids
        model = Path(self.model or "model")
        name = model.name  # a run's model/ after its run (`tiny_version_0_model`): no two runs share a file
        if (model.parent / "config.yaml").is_file():
            name = f"{model.parent.parent.name}_{model.parent.name}_{name}"
        self.out = self.out or (str(Path(self.run) / f"eval_{split}") if self.run
                                else f"runs/eval/{name}_{split}")
        world = get_world(self.world)
        if self.max_turns is None and not hasattr(world.catalogue, "turn_limit"):
            self.max_turns = 20  # worlds without limits of their own
        if self.judge_model and not self.judge:
            raise InputError("eval: --judge-model names the model of an openai: --judge; give --judge")
        if self.judge and not world.judged:
            raise InputError(f"eval: --judge scores DiscoveryWorld's critical questions; {self.world} has none")
        if (self.handoff is None) != (self.teacher is None):
            raise InputError("eval: --handoff and --teacher go together")
        for key, least in (("handoff", 0), ("n", 0), ("max_turns", 1), ("concurrency", 1), ("env_workers", 1),
                           ("max_new_tokens", 1), ("judge_max_new_tokens", 1)):
            if (value := getattr(self, key)) is not None and value < least:
                whole = " (0: the whole split)" if key == "n" else ""
                raise InputError(f"eval: --{key.replace('_', '-')} must be >= {least}{whole}, got {value}")

    @property
    def task_names(self) -> list[str]:
        return [t.strip() for t in self.tasks.split(",") if t.strip()]

    def games(self) -> list[GameId]:
        """The catalogue's task-stratified sample, as a training run's evals draw it."""
        return get_world(self.world).catalogue(self.mapping).sample(self.split, self.n or None, self.seed,
                                                                    tasks=self.task_names)

    def play_spec(self, base: EngineConfig | None = None) -> PlaySpec:
        """This eval as a PlaySpec: greedy teacher, the report question only when the judge reads
        it. `base`: the student engine of the training config it plays as (default: `config`'s),
        its settings kept under the eval's own (dtype, context, KV cache)."""
        from rose_ray.inference.backends import engine_like, resolve_backend
        from rose_ray.rollout.agent import EXPERT
        from rose_ray.rollout.handoff import turn_policy

        if base is None and self.config:
            base = load_config(self.config).student_engine
        if base is not None and base.spec.local and resolve_backend(self.backend) == base.backend.name:
            student = engine_like(base, self.model, dtype=self.dtype, context_tokens=self.context_tokens,
                                  context_policy=self.context_policy, kv_cache_mb=self.kv_cache_mb)
        else:
            student = self.engine(self.model, "--model", self.dtype)
        teacher = self.teacher if self.teacher in (None, EXPERT) else self.engine(self.teacher, "--teacher", self.dtype)
        return self.as_spec(student, teacher=teacher, max_turns=self.max_turns, env_workers=self.env_workers,
                         handoff=turn_policy("none") if self.handoff is None else turn_policy("fixed", k=self.handoff),
                         teacher_sampling=SamplingParams(0.0, max_new_tokens=self.max_new_tokens),
                         report="ask" if self.knowledge_from == "report" else "off")


def training_eval(cfg: Any, model: str, split: str | None = None, backend: str | None = None) -> dict[str, Any]:
    """The held-out eval a training run of `cfg` (a TrainConfig) does, as EvalCommand fields;
    greedy. `split`, `backend`: another split's games (the warm-ups tune on dev), another engine."""
    engine = cfg.student_engine
    return dict(
        model=model, split=split or cfg.eval.split, n=cfg.eval.n, seed=cfg.eval.seed, tasks=",".join(cfg.tasks),
        max_turns=cfg.eval.max_turns, max_new_tokens=cfg.eval.max_new_tokens, temperature=0.0,
        world=cfg.env.world, mapping=cfg.env.mapping, concurrency=cfg.env.games_per_worker,
        context_tokens=engine.context_tokens, context_policy=engine.context_policy, dtype=engine.dtype,
        instruction_from=cfg.env.instruction_from, enable_thinking=cfg.chat.enable_thinking,
        history=cfg.chat.history,
        backend=backend or (engine.backend.name if engine.backend.name in COMMAND_BACKENDS else DEFAULT_COMMAND_BACKEND))


def training_play(cfg: Any, student: str, teacher: str | None) -> PlaySpec:
    """How a training run of `cfg` (a TrainConfig) plays its episodes, as a PlaySpec, with these
    models (`teacher` None: the world's expert where the config's teacher is, else none)."""
    from rose_ray.rollout.agent import EXPERT
    from rose_ray.rollout.play import PlaySpec

    r, expert = cfg.rollout, EXPERT if cfg.teacher.expert else None
    return PlaySpec(student=dataclasses.replace(cfg.student_engine, model=student),
                    teacher=expert if teacher is None else dataclasses.replace(cfg.teacher_engine, model=teacher),
                    handoff=cfg.algorithm.turn_policy(), max_turns=r.max_turns, student_sampling=r.student_sampling,
                    teacher_sampling=r.teacher_sampling, report=r.report, enable_thinking=cfg.chat.enable_thinking,
                    history=cfg.chat.history, world=cfg.env.world, mapping=cfg.env.mapping,
                    instruction_from=cfg.env.instruction_from, concurrency=cfg.env.games_per_worker)


def training_eval_layer(given: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """`eval --run RUN` or `--config F`: that eval (`training_eval`) as a layer under the settings
    given; None without either."""
    if given.get("run") and given.get("config"):
        raise ConfigError("eval: --run evaluates a run's model with its own config.yaml; to play another model as a "
                          "config's runs evaluate, give --config and --model")
    if given.get("run"):
        if given.get("model"):
            raise ConfigError(f"eval: --run evaluates the run's own model/; to play another model as the run "
                              f"evaluates, give --config {given.run}/config.yaml --model M")
        run = resolve_run(given.run)
        if not (run / "model").is_dir():
            raise InputError(f"eval: --run {run}: no model/ there yet (a run writes it when it stops); "
                             f"`rose-ray export {run} --out DIR` writes one from a checkpoint")
        layer = training_eval(load_config(run / "config.yaml"), str(run / "model"))
        return f"--run {run}", {**layer, "config": str(run / "config.yaml")}
    if given.get("config"):
        if not given.get("model"):
            raise ConfigError(f"eval: --config {given.config} evaluates a --model as that config's runs evaluate; "
                              "give --model (or --run RUN for a run's own model)")
        try:
            train_cfg = load_config(given.config)
        except ConfigError as e:
            keys = set(OmegaConf.load(given.config)) if Path(given.config).is_file() else set()
            if keys and keys <= {f.name for f in fields(EvalCommand)}:  # a file of eval's own settings
                raise ConfigError(f"eval: --config {given.config}: a training config is expected (as train --config "
                                  f"takes), and this file holds eval's own settings: give it as --settings "
                                  f"{given.config}") from None
            raise ConfigError(f"eval: --config {e}") from None
        return f"--config {given.config}", training_eval(train_cfg, given.model)
    return None


@dataclass
class CollectCommand(PlaySettings, RowsOutput):
    """`rose-ray collect` (collect.py): the student's first K turns of each game."""

    model: str = setting(help="local model folder, or openai:URL of a served model")
    turns: int = setting(5, "turns per game")
    split: str = setting("train")
    n: int = setting(0, "a task-stratified sample (0 = the whole split)")
    temperature: float = setting(SamplingParams.temperature, "0 = greedy")

    def play_spec(self) -> PlaySpec:
        """The student alone, for `turns` turns; no report question."""
        return self.as_spec(self.engine(self.model, "--model"), max_turns=self.turns)


@dataclass
class ContinueCommand(PlaySettings, RowsOutput):
    """`rose-ray continue` (collect.py): recorded prefixes replayed, then the teacher plays on."""

    teacher: str = setting(help="local model folder, or openai:URL of a served model")
    student: str | None = setting(None, "tokenizer owner of the output ids (default: the teacher's)")
    input: str = setting(help="the prefixes (JSONL) to continue", flag="--in")
    max_turns: int = setting(10, "turns in all, prefix included")

    def play_spec(self) -> PlaySpec:
        """The teacher after the replayed prefix; the student's engine only lends its tokenizer
        (without --student: the teacher's, one engine)."""
        from rose_ray.rollout.handoff import turn_policy

        teacher = self.engine(self.teacher, "--teacher")
        student = self.engine(self.student, "--student") if self.student not in (None, self.teacher) else teacher
        return self.as_spec(student, teacher=teacher, handoff=turn_policy("teacher_only"), max_turns=self.max_turns)


@dataclass
class GoldCommand(WorldSettings, InstructionSetting, RowsOutput):
    """`rose-ray gold` (collect.py): ScienceWorld's gold paths as demonstrations."""

    split: str = setting("train")
    n: int = setting(0, "a task-stratified sample (0 = the whole split)")
    seed: int = setting(0)
    workers: int = setting(2, "games at once")
    observe: bool = setting(False, "paths that look before they choose and name things as the game shows them, "
                                   "replayed to check they still succeed (the small tier's teacher warm-up)")


@dataclass
class SftCommand(HistorySetting):
    """`rose-ray sft` (recipes/sft.py); the learner's settings default as LearnerConfig's."""

    data: str = setting(help="the rows (JSONL) to train on")
    model: str = setting(help="the model folder to start from")
    out: str = setting(help="output Hugging Face folder: new or empty")
    overwrite: bool = setting(False, "replace --out when it is a model folder rose-ray wrote (never another folder)")
    epochs: int = setting(1)
    batch_size: int = setting(8, "rows per optimizer step")
    lr: float = setting(LearnerConfig.lr)
    schedule: str = setting(LearnerConfig.schedule, choices=SCHEDULES)
    warmup_steps: int = setting(LearnerConfig.warmup_steps)
    ranks: int = setting(LearnerConfig.ranks, "DeepSpeed data-parallel ranks")
    zero_stage: int = setting(LearnerConfig.zero_stage, choices=(0, 1, 2, 3))
    dtype: str = setting(LearnerConfig.dtype, choices=LEARNER_DTYPES)
    max_tokens: int = setting(LearnerConfig.max_tokens, "tokens per packed row, and per micro-batch (rows share "
                                                        "one while they fit)")
    owners: str = setting("student,teacher", "owners whose tokens are trained")
    seed: int = setting(LearnerConfig.seed)
    threads: int = setting(LearnerConfig.threads, "torch threads per rank")


@dataclass
class ServeCommand(ContextTokens):
    """`rose-ray serve MODEL` (cli.py, inference/server.py); settings default as EngineConfig's."""

    model: str = setting(help="local HF model folder", positional=True)
    backend: str = setting("hf", "the engine: hf (transformers); for vllm, run vLLM's own OpenAI server (the "
                                 "command says how)", choices=("hf", "vllm"))
    port: int = setting(8000)
    host: str = setting("127.0.0.1", "bind address (default: localhost only)")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' (default: $ROSE_RAY_API_KEY)")
    served_model_name: str | None = setting(None, "the 'model' clients send (default: MODEL)")
    dtype: str = setting(EngineConfig.dtype, choices=DTYPES)
    max_batch_size: int = setting(EngineConfig.max_batch_size)
    max_wait_ms: float = setting(EngineConfig.max_wait_ms)
    threads: int = setting(EngineConfig.threads, "torch threads (0: torch's default)")
    max_concurrent: int = setting(MAX_CONCURRENT, "requests in flight at once; more get 429 (clients retry)")


COMMANDS: dict[str, type] = {"eval": EvalCommand, "collect": CollectCommand, "continue": ContinueCommand,
                             "gold": GoldCommand, "sft": SftCommand, "serve": ServeCommand}


# ------------------------------------------------------------------ tools: settings as flags alone
@dataclass
class TrainConfigSettings:
    """A command that reads a training config: its --config and KEY=VALUE are that config's."""

    config: str | None = setting(None, "a training config, as train --config takes (default: the embedded tiny "
                                       "config)", metavar="FILE.yaml")
    overrides: list[str] = setting([], "config overrides, e.g. env.workers=8", metavar="KEY=VALUE", nargs="*",
                                   positional=True)


@dataclass
class PlanCommand(TrainConfigSettings):
    """`rose-ray plan` (check.py: plan_main): where a config's actors would go, and the GPU memory
    plan's inputs (`check` takes them too)."""

    node: list[str] = setting([], "plan on described nodes instead of a cluster, e.g. --node 2xCPU=64,GPU=8 "
                                  "(repeatable)", metavar="[Nx]RES=N,...")
    address: str | None = setting(None, "Ray cluster to plan on (default: RAY_ADDRESS, else a local cluster)")
    total: bool = setting(False, "plan on total resources, not what is free now")
    gpu_memory: float | None = setting(None, "memory of each GPU in GiB (an H100 80GB: 79.6, an H200: 140.4); "
                                             "default: from the nodes' accelerator_type, else the plan prints "
                                             "each role's needs without checking them", metavar="GIB")
    model_config_for: list[str] = setting([], "a folder with the config.json of a model that is not on disk "
                                              "(repeatable; the Qwen3 sizes ship with rose_ray)", metavar="MODEL=DIR")


@dataclass
class CheckCommand(PlanCommand):
    """`rose-ray check [--config CONFIG]` (check.py; `check CONFIG`, the spelling before, still works)."""

    backends: bool = setting(False, "only say which engine backends (hf, vllm, openai) this machine can run, "
                                    "and why not")
    tokenizer_for: list[str] = setting([], "a local tokenizer folder standing in for a model not on disk "
                                           "(repeatable)", metavar="MODEL=DIR")


@dataclass
class WarmupCommand(TrainConfigSettings):
    """`rose-ray warmup` (provision/warmup.py)."""

    eval: str | None = setting(None, "then evaluate the base student and the teacher on the config's eval games "
                                     "of SPLIT", choices=("train", "dev", "test"), metavar="SPLIT")
    backend: str = setting("hf", "the engine of --eval", choices=COMMAND_BACKENDS)
    ship: bool = setting(False, "instead, write the demonstrations the config's warm-ups trained on (its cached "
                                "build, made first where missing) into rose_ray/envs/data for shipping; without "
                                "--config, replay the tiny default's teacher gold paths")


@dataclass
class ExportCommand:
    """`rose-ray export RUN` (export.py)."""

    run: str = setting(help="a run folder (holds config.yaml and checkpoints/), a run_dir meaning its latest run, "
                            "or RUN_DIR/latest",
                       metavar="RUN", positional=True)
    step: int | None = setting(None, "the learner step of a kept checkpoint (default: the latest)")
    out: str = setting(help="the new folder to write")


TOOLS: dict[str, type] = {"check": CheckCommand, "plan": PlanCommand, "warmup": WarmupCommand,
                          "export": ExportCommand}


# --------------------------------------------------------------------------- flags and layers
def add_flags(parser: argparse.ArgumentParser, command: type, layers: bool = True) -> None:
    """Each field of `command` as a flag of `parser`, with `layers` also --settings and KEY=VALUE.
    A flag not given is absent (argparse.SUPPRESS), so the layers under it show through."""
    hints = typing.get_type_hints(command)
    own = vars(command).get("__annotations__", {})
    for f in sorted(fields(command), key=lambda f: f.name not in own):  # the command's own first
        meta, hint = f.metadata, hints[f.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)]  # int | None, list[str]: their item
        kind = inner[0] if typing.get_origin(hint) is list or len(inner) == 1 else hint
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        said = default is None or default is False or default in ([], "") or "default" in meta["help"].lower()
        shown = f"(default: {default})".replace("%", "%%")
        end = "(required)" if default is MISSING else "" if said else shown
        about = " ".join(filter(None, [meta["help"], end]))
        # A positional KEY=VALUE list is there even when empty: more may follow the flags (cli.main).
        options: dict[str, Any] = {"help": about or None, "default": [] if meta["nargs"] == "*" else argparse.SUPPRESS}
        if kind is bool:
            options["action"] = "store_true"
        else:
            options.update(type=kind, choices=meta["choices"], metavar=meta["metavar"], nargs=meta["nargs"])
            if typing.get_origin(hint) is list and not meta["nargs"]:  # a repeatable flag
                options.update(action="append", nargs=None)
        if not meta["positional"]:
            options["dest"] = f.name  # `--in` sets `input`
        parser.add_argument(f.name if meta["positional"] else _flag(f), **options)
    if layers:
        name = parser.prog.split()[-1]
        parser.add_argument("--settings", dest="settings_file", metavar="FILE.yaml",
                            help=f"a YAML mapping of {name}'s settings (the flags' names with _), under the flags")
        if "config" not in hints:  # --config is a training config wherever it is taken: named, not misread
            parser.add_argument("--config", dest="misplaced_config", help=argparse.SUPPRESS)
        parser.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                            help="settings over the flags and the file, e.g. seed=1")
    parser.set_defaults(settings=command)


def _flag(f: Any) -> str:
    """A field's flag: `--field-name`, or the one its metadata names (`--in`)."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def resolve(command: type, args: argparse.Namespace, name: str) -> Any:
    """The settings of command `name`: defaults < `args.settings_file` < flags < `args.overrides`;
    errors name the key. A TOOL (its `config` and `overrides` are fields) has the flags alone."""
    if getattr(args, "misplaced_config", None):
        raise ConfigError(f"--config {args.misplaced_config}: --config names a training config (train, check, plan, "
                          f"warmup and eval take one); a YAML file of {name}'s settings is --settings FILE.yaml")
    keys = [f.name for f in fields(command)]
    own_layers = "overrides" not in keys and hasattr(args, "overrides")
    layers: list[tuple[str, Any]] = []
    if own_layers and getattr(args, "settings_file", None):
        path = Path(args.settings_file)
        for layer in yaml_layers(path):
            if not isinstance(layer, DictConfig):
                raise ConfigError(f"{path}: not a mapping of {name}'s settings (its keys: {', '.join(keys)})")
            layers.append((str(path), layer))
    # A training config's file and KEY=VALUE go to it as given (their ${...} are that config's).
    as_given = {} if own_layers else {k: getattr(args, k) for k in ("config", "overrides") if k in keys and hasattr(args, k)}
    layers.append(("flags", {k: getattr(args, k) for k in keys if hasattr(args, k) and k not in as_given}))
    for item in args.overrides if own_layers else []:
        if "=" not in item:
            raise ConfigError(f"{item!r}: not a setting; settings after the flags are KEY=VALUE")
        layers.append((f"override {item!r}", override_layer(item)))
    merged = _merged(command, layers, name)
    if command is EvalCommand and (under := training_eval_layer(merged)) is not None:
        merged = _merged(command, [under, *layers], name)
    for f in fields(command):
        choices = f.metadata["choices"]
        value = None if OmegaConf.is_missing(merged, f.name) else merged[f.name]
        if choices is not None and value is not None and value not in choices:
            quote = " (YAML reads an unquoted on, off, yes or no as a boolean: quote it)" if value in ("True", "False") else ""
            raise ConfigError(f"key {f.name!r}: must be one of {', '.join(map(str, choices))}; got {value!r}{quote}")
    try:
        cfg = OmegaConf.to_object(merged)  # the command's __post_init__ checks what its fields cannot say
    except MissingMandatoryValue as e:
        f = next(f for f in fields(command) if f.name == e.full_key)
        flag = f.name.upper() if f.metadata["positional"] else _flag(f)
        also = f" (or {f.name}=..., or {f.name}: in --settings)" if own_layers else ""
        raise ConfigError(f"{f.name} is required: give {flag}{also}") from None
    for k, v in as_given.items():
        setattr(cfg, k, v)
    return cfg


def _merged(command: type, layers: list[tuple[str, Any]], name: str) -> DictConfig:
    """The command's defaults with `layers` (source, layer) merged over them in order."""
    merged = OmegaConf.structured(command)
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            keys = ", ".join(f.name for f in fields(command))
            why = (f"{name} has no such setting (its keys: {keys})" if isinstance(e, ConfigKeyError)
                   else first_line(e))
            raise ConfigError(f"{source}: key {key!r}: {why}") from None
    return merged


def from_keywords(command: type, name: str, given: dict[str, Any]) -> Any:
    """A command's settings from Python keywords (`rose_ray.evaluate(run=...)`), checked as flags are."""
    keys = {f.name for f in fields(command)}
    if unknown := sorted(set(given) - keys):
        raise ConfigError(f"{name}: no setting {unknown[0]!r} (its settings: {', '.join(sorted(keys))})")
    return resolve(command, argparse.Namespace(**given, overrides=[], settings_file=None), name)
