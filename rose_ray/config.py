"""The training config: OmegaConf structured dataclasses, YAML + dotlist overrides, validation
(OmegaConf names an unknown key or a wrong type; each section's `__post_init__` an impossible
value). Every key: docs/reference.md, generated from the comments here (docs_reference.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rose_ray.envs.config import EnvConfig
from rose_ray.errors import ConfigError, InputError, at_least, first_line
from rose_ray.inference.engine import EngineConfig
from rose_ray.learner.learner import LearnerConfig
from rose_ray.publish.route import PublishConfig
from rose_ray.recipes import Recipe, get_recipe
from rose_ray.tagged import over_layers, tagged
from rose_ray.types import REPORT_MODES, SamplingParams

__all__ = ["ConfigError", "TrainConfig", "load_config", "to_dict", "to_yaml"]

@dataclass
class RolloutConfig:
    batch_episodes: int = 8  # episodes per learner step
    max_lag: int = 1  # policy versions a trained sample may lag behind
    max_turns: int = 10  # turns per training episode (the student's and the teacher's together)
    split: str = "train"  # the games trained on: a split name or an id-list file
    student_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(1.0, 1.0, 512))
    teacher_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(0.0, 1.0, 512))
    max_retries: int = 5  # times an episode cut off by a lost game or engine is played again from its first turn
    # The world's report question at each episode's end (DiscoveryWorld only): "ask" records
    # the answer in trajectories.jsonl without training on it, "train" trains on it, "off".
    report: str = "ask"

    def __post_init__(self) -> None:
        at_least(self, "rollout.", 1, "batch_episodes", "max_turns")
        if self.report in (False, "False", "false"):  # YAML reads a bare `off` as false
            self.report = "off"
        if self.report not in REPORT_MODES:
            raise ConfigError(f"rollout.report: must be ask, train or off, got {self.report!r}")
        at_least(self, "rollout.", 0, "max_lag")


@dataclass
class EvalConfig:
    # Every `every` learner steps (0: never), the student plays `every_n` games of the dev split
    # greedily (eval/dev_*: a curve that shows when a run starts to degrade; nothing is tuned on
    # the test games); also before the first step and after the last.
    every: int = 0
    every_n: int = 8  # dev games of each `every` eval
    split: str = "test"  # the held-out games of the before/after evals: a split name or an id-list file
    n: int = 200  # games, a seeded sample balanced over tasks (the same games as `rose-ray eval --n N --seed S`)
    max_turns: int = 20  # turns per eval game
    max_new_tokens: int = 512  # tokens per reply (greedy)
    before: bool = True  # evaluate the student before the first step
    after: bool = True  # and after the last
    teacher: bool = True  # also evaluate the teacher once, for the before/after table
    seed: int = 0  # the seed of the sample of games

    def __post_init__(self) -> None:
        at_least(self, "eval.", 1, "n", "max_turns", "max_new_tokens", "every_n")
        at_least(self, "eval.", 0, "every")


@dataclass
class TeacherWarmupConfig:
    """SFT of the teacher on gold demonstrations before training (for tiny teachers)."""

    KEY = "teacher_warmup"  # its key in the config, for errors (a class attribute, not a field)
    enabled: bool = False  # warm the model before training (cached under tiny_dir by its settings)
    gold_games: int = 40  # training games whose gold demonstrations it trains on
    max_turns: int = 8  # the opening of each gold path: what short episodes need most
    # gold paths that look before they choose (ScienceWorld: `envs/sciworld/gold.py`), checked by replay
    observe: bool = False
    # the share of demonstrations opening with one or two student-owned replies that change
    # nothing (a harmless action, a reply with no action) before the gold path: a teacher that
    # carries on from a small student's first turns (`provision.gold.detour_replies`)
    detours: float = 0.0
    # the share of demonstrations opening with 1 to `opening_turns` of the base student's own turns,
    # played live at `rollout.student_sampling`: what ROSE's teacher meets after a handoff (kept
    # where the gold path after them still wins). Teacher only.
    student_openings: float = 0.0
    opening_turns: int = 2  # the most base-student turns an opening has (`student_openings`)
    opening_temperature: float | None = None  # None: the student's sampling temperature of the run
    # what plays after a demonstration's opening: the gold path (`gold`), or the world's expert
    # teacher from the state the opening left (`expert`: recoveries from real moves). Teacher only.
    continuation: str = "gold"
    epochs: int = 10  # passes over the demonstrations
    lr: float = 1e-3  # learning rate
    schedule: str = "constant"  # constant | linear | cosine (over the warm-up's steps)
    batch_episodes: int = 8  # demonstrations per optimizer step
    threads: int = 2  # torch threads: nothing else runs during the warm-up
    seed: int = 0  # its own seed: runs with other seeds share one warmed teacher

    def __post_init__(self) -> None:
        at_least(self, f"{self.KEY}.", 1, "gold_games", "max_turns", "epochs", "batch_episodes", "threads",
                 "opening_turns")
        at_least(self, f"{self.KEY}.", 0, "lr", above=True)
        for key in ("detours", "student_openings"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"{self.KEY}.{key}: a share of demonstrations, from 0 to 1; "
                                  f"got {getattr(self, key)!r}")
        if self.opening_temperature is not None and self.opening_temperature < 0:
            raise ConfigError(f"{self.KEY}.opening_temperature: must be >= 0 (or null), got {self.opening_temperature!r}")
        from rose_ray.envs.worlds import CONTINUATIONS

        if self.continuation not in CONTINUATIONS:
            raise ConfigError(f"{self.KEY}.continuation: must be one of {CONTINUATIONS}, got {self.continuation!r}")
        for key, what in (("continuation", "are continued by the expert"),
                          ("student_openings", "open with the base student's turns")):
            if self.KEY != "teacher_warmup" and getattr(self, key) != getattr(TeacherWarmupConfig, key):
                raise ConfigError(f"{self.KEY}.{key}: only the teacher's demonstrations {what}; "
                                  f"set teacher_warmup.{key}")
        if self.schedule not in ("constant", "linear", "cosine"):
            raise ConfigError(f"{self.KEY}.schedule: must be constant, linear or cosine, got {self.schedule!r}")

    def check(self, cfg: TrainConfig) -> None:
        """Against the run: a local model to warm; the expert that continues the demonstrations
        plays the run's tasks."""
        if not self.enabled:
            return
        role = self.KEY.removesuffix("_warmup")
        engine = getattr(cfg, f"{role}_engine")
        if engine.spec.served:
            raise ConfigError(f"{self.KEY}.enabled: the warm-up trains a local {role} folder, but {role}_engine.backend "
                              f"is {engine.backend.name} (a served model, used as it is); set {self.KEY}.enabled=false "
                              "(or warm a folder with `rose-ray sft` and serve that)")
        if self.continuation == "expert":
            check_expert_plays(cfg, f"{self.KEY}.continuation")


@dataclass
class StudentWarmupConfig(TeacherWarmupConfig):
    """The same SFT for the base student (off by default): a short one on fewer or shorter
    demonstrations gives a partly competent base student, as a real base model is."""

    KEY = "student_warmup"


@dataclass
class TeacherConfig:
    """Who the teacher is: `model`, the model `teacher_engine` serves (the default), or `expert`,
    the world's expert teacher (ScienceWorld: envs/sciworld/expert.py), which plays from the game
    itself: no engine is started for it, it has no logprobs (so no OPD term), and it plays only
    the tasks it knows (`World.expert_tasks`)."""

    kind: str = "model"  # model | expert

    def __post_init__(self) -> None:
        if self.kind not in ("model", "expert"):
            raise ConfigError(f"teacher.kind: must be one of ('model', 'expert'), got {self.kind!r}")

    @property
    def expert(self) -> bool:
        return self.kind == "expert"

    def check(self, cfg: TrainConfig) -> None:
        """The expert teacher: a world that has one, tasks it plays, no OPD, no model to warm."""
        if not self.expert:
            return
        check_expert_plays(cfg, "teacher.kind")
        recipe = cfg.algorithm
        if recipe.teacher_scores_student():
            raise ConfigError(f"{recipe.scoring_key}: {recipe.scoring_value()} asks the teacher to score the student's "
                              "tokens (OPD), but the expert teacher has no logprobs; use teacher.kind=model, or ROSE "
                              "without its OPD term (algorithm.lam=0) or teacher_sft")
        if cfg.teacher_warmup.enabled:
            raise ConfigError("teacher_warmup.enabled: the expert teacher is no model to warm; set "
                              "teacher_warmup.enabled=false (or teacher.kind=model)")


@dataclass
class ChatConfig:
    """How conversations are rendered through the models' chat templates."""

    # Passed to the template as `enable_thinking` (Qwen3's switch; other templates ignore it).
    # False: the generation prompt holds an empty think block and the model answers at once.
    enable_thinking: bool = False
    # How earlier turns appear in each prompt and in what the learner trains on: `sampled`, the
    # ids as they were sampled (on-policy; OPD's term needs them), or `template`, the chat
    # template's own rendering of the conversation, as a chat API gives it (rose_ray/chat.py).
    history: str = "sampled"

    def __post_init__(self) -> None:
        from rose_ray.chat import HISTORIES

        if self.history not in HISTORIES:
            raise ConfigError(f"chat.history: must be one of {HISTORIES}, got {self.history!r}")


@dataclass
class ResourcesConfig:
    """Ray resources per role (CPU counts on a laptop; GPUs on a cluster)."""

    student_cpus: float = 1.0  # CPUs of each student engine actor
    student_gpus: float = 0.0  # GPUs of the student engine (its tensor_parallel_size, when vllm)
    teacher_cpus: float = 1.0  # CPUs of each teacher engine actor
    teacher_gpus: float = 0.0  # GPUs of the teacher engine (its tensor_parallel_size, when vllm)
    colocate: bool = False  # the student engine shares learner rank 0's GPU bundle (use fractions)
    placement_timeout_s: float = 600.0  # how long GPU placement groups may take to come up
    check_placement: bool = True  # off for autoscaling clusters that start with no workers


@dataclass
class ReliabilityConfig:
    """How a run outlives its actors (docs/reliability.md). Env workers restart on their own."""

    # Replacements per role (student engine, teacher engine, learner group) before the run
    # stops with an error naming the role, after a final checkpoint.
    max_restarts: int = 3
    health_every_s: float = 10.0  # seconds between health pings of each engine
    # An engine is hung when a ping goes unanswered this long, or when it has calls in flight
    # and finished none of them for this long (above the slowest honest batch).
    health_timeout_s: float = 120.0
    start_timeout_s: float = 1800.0  # a (re)started engine must load its model within this
    # No learner step and no finished episode for watchdog_s: print which role waits on
    # what; for a second watchdog_s: checkpoint and exit 1. 0 turns the watchdog off.
    watchdog_s: float = 600.0
    # This many episodes failing one after another, none finishing between them (every request
    # to a served teacher refused, say): checkpoint and exit 1 naming the last error. 0 = never.
    max_failed_in_a_row: int = 16

    def __post_init__(self) -> None:
        at_least(self, "reliability.", 0, "max_restarts", "max_failed_in_a_row", "watchdog_s")
        at_least(self, "reliability.", 0, "health_every_s", "health_timeout_s", "start_timeout_s", above=True)


@dataclass
class WandbConfig:
    """Weights & Biases beside TensorBoard (the `wandb` extra): every scalar TensorBoard gets and the
    run's config (secrets left out); `--resume` goes on in the same W&B run. Credentials are W&B's
    own (`wandb login` or WANDB_API_KEY); WANDB_MODE=offline writes under the run folder only."""

    enabled: bool = False
    project: str = "rose_ray"
    entity: str | None = None  # None: the W&B account's default
    name: str | None = None  # None: <name>/<run folder>, e.g. tiny/version_3
    group: str | None = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        import importlib.util

        if self.enabled and importlib.util.find_spec("wandb") is None:
            raise ConfigError("logging.wandb.enabled: wandb is not installed; pip install 'rose_ray[wandb]' "
                              "(or pip install wandb), or set logging.wandb.enabled=false")


@dataclass
class LoggingConfig:
    """Where a run's scalars go besides `metrics.jsonl` and TensorBoard (`tb/`, always written)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class TrainConfig:
    name: str = "run"  # the config's name: its runs go to runs/<name> (run_dir)
    # Where this config's runs go, each in a new version_N folder; under ROSE_RAY_RUNS when set
    # (shared storage for a Ray job), else ./runs.
    run_dir: str = "${oc.env:ROSE_RAY_RUNS,runs}/${name}"
    seed: int = 0  # the order of the training games and the decay policy's draws
    # The algorithm and its settings, a recipe chosen by name (rose_ray/recipes/): `rose`,
    # `{name: rose, handoff: {policy: fixed, k: 5}, lam: 0.0}`, `opd`, `{name: teacher_sft, owners: [...]}`
    algorithm: Any = tagged(Recipe, "rose")
    mode: str = "async"  # async | sync
    steps: int = 100  # learner steps
    publish_every: int = 1  # learner steps between weight publications
    # How the weights travel to the student engine: {method: auto | object_store | collective,
    # collective_backend: auto | gloo | nccl, bucket_mb, ...} (rose_ray/publish/route.py)
    publish: PublishConfig = field(default_factory=PublishConfig)
    checkpoint_every: int = 50  # learner steps between checkpoints (a run's stop writes one too)
    keep_checkpoints: int = 2  # whole checkpoints kept; older ones are deleted
    samples_to_log: int = 2  # sample trajectories written to TensorBoard per eval
    tasks: list[str] = field(default_factory=list)  # train and eval on these tasks only (empty = all)
    # Tiny models and warm-up caches: under ROSE_RAY_CACHE where set (on a cluster, a path
    # every node sees; checked at start), else the driver's ~/.cache/rose_ray.
    tiny_dir: str = field(default_factory=lambda: f"{os.environ.get('ROSE_RAY_CACHE', '~/.cache/rose_ray')}/tiny")
    ray_address: str | None = None  # None: RAY_ADDRESS or a private local cluster; "auto": join `ray start`
    env: EnvConfig = field(default_factory=EnvConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    student_engine: EngineConfig = field(default_factory=lambda: EngineConfig(model="tiny:student"))
    # who teaches: the model of teacher_engine (kind model), or the world's expert (kind expert;
    # then teacher_engine is not started)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    teacher_engine: EngineConfig = field(default_factory=lambda: EngineConfig(model="tiny:teacher"))
    learner: LearnerConfig = field(  # a schedule decays over the run's steps unless told otherwise
        default_factory=lambda: LearnerConfig(model="${student_engine.model}", total_steps="${steps}")
    )
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    teacher_warmup: TeacherWarmupConfig = field(default_factory=TeacherWarmupConfig)
    student_warmup: StudentWarmupConfig = field(default_factory=StudentWarmupConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        self.algorithm: Recipe = get_recipe(self.algorithm)  # an unknown name or key fails here, named
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"mode: must be one of ('async', 'sync'), got {self.mode!r}")
        at_least(self, "", 1, "steps", "publish_every", "checkpoint_every", "keep_checkpoints")
        # Checks across sections, each by the part that owns the key it names.
        self.learner.check_rows(self.student_engine.context_tokens)
        self.teacher_warmup.check(self)
        self.student_warmup.check(self)
        self.publish.check(self.student_engine, self.resources.colocate)
        self.algorithm.check(self)
        self.teacher.check(self)

    def engines(self) -> list[tuple[str, EngineConfig]]:
        """(role, engine config) of each engine the run starts: the student's, and the
        teacher's unless the teacher is the world's expert."""
        return [("student", self.student_engine)] + ([] if self.teacher.expert else [("teacher", self.teacher_engine)])


def check_expert_plays(cfg: TrainConfig, key: str) -> None:
    """The world has an expert teacher (`key` asks for it) and it plays every task of the run."""
    from rose_ray.envs.worlds import get_world

    world = get_world(cfg.env.world)
    if world.expert is None:
        raise ConfigError(f"{key}: expert: {world.name} has no expert teacher (env.world={world.name})")
    tasks = cfg.tasks or world.catalogue(cfg.env.mapping).task_names()
    unknown = [t for t in tasks if t not in world.expert_tasks]
    if unknown:
        raise ConfigError(f"tasks: the expert teacher ({key}) plays {list(world.expert_tasks)}, not {unknown}; "
                          "set tasks to those it plays" + ("" if cfg.tasks else " (empty tasks means every task)"))


def default_config_path() -> Path:
    return Path(str(resources.files("rose_ray").joinpath("configs/tiny.yaml")))


def load_config(path: str | Path | TrainConfig | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """YAML (default: the embedded tiny config) + `key=value` overrides -> a validated config.
    `path` may also be a TrainConfig (the Python API's), checked again with the overrides over it."""
    if isinstance(path, TrainConfig):
        return config_of([OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(path)))], overrides,
                         "the TrainConfig given")
    path = Path(path) if path else default_config_path()
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return config_of(path, overrides, path)


def config_of(files: Path | list[Any], overrides: list[str] | None, where: str | Path) -> TrainConfig:
    """The config of a YAML file (or its layers) and overrides; errors name `where`."""
    from rose_ray.migrate import old_keys

    try:
        files = yaml_layers(files) if isinstance(files, Path) else files
        # One layer per override, so that `algorithm=teacher_sft algorithm.owners=[teacher]`
        # reads as written: the name, then a key of that recipe (tagged.py).
        layers = [*files, *(override_layer(o) for o in overrides or [])]
        for n, layer in enumerate(layers):
            for key, why in old_keys(layer)[:1]:
                saved = n < len(files) and Path(where).name == "config.yaml"
                raise ConfigError(f"key {key!r}: {why}" + (f"; this run's config.yaml is from an earlier version: "
                                                            f"`rose-ray migrate {Path(where).parent}` rewrites it"
                                                            if saved else ""))
        schema = OmegaConf.structured(TrainConfig)
        sections = over_layers(layers, schema)
        merged = OmegaConf.merge(schema, *layers)
        for key, section in sections.items():
            OmegaConf.update(merged, key, section, merge=False)
        # A variable set to nothing (`ROSE_RAY_RUNS=$UNSET`) would put runs at /<name>.
        if os.environ.get("ROSE_RAY_RUNS") == "" and "ROSE_RAY_RUNS" in str(
                OmegaConf.to_container(merged, resolve=False)["run_dir"]):
            raise ConfigError("run_dir: ROSE_RAY_RUNS is set but empty; unset it (runs go to ./runs) or name a folder")
        return OmegaConf.to_object(merged)  # runs every section's __post_init__ checks
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{where}: {'key ' + repr(key) + ': ' if key else ''}{first_line(e)}") from None
    except InputError as e:  # a section's check, naming its key; anything else is a bug
        raise ConfigError(f"{where}: {e}") from None


def override_layer(item: str) -> Any:
    """One `key=value` as a config layer; a value that is not YAML is named, not a traceback."""
    try:
        return OmegaConf.from_dotlist([item])
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: its value is not valid YAML ({getattr(e, 'problem', None) or e})") from None


def yaml_layers(path: Path, seen: tuple[Path, ...] = ()) -> list[Any]:
    """A YAML file as config layers: those of its `base:` file (a path relative to it) first,
    then its own keys. The seed configs share one base and state only what differs."""
    path = Path(path).resolve()
    if path in seen:
        raise ConfigError(f"{path}: base: {' -> '.join(p.name for p in (*seen, path))} is a cycle")
    if not path.is_file():
        raise ConfigError(f"{seen[-1]}: base: {path} does not exist" if seen else f"config file {path} does not exist")
    try:
        layer = OmegaConf.load(path)
    except yaml.YAMLError as e:  # a file that is not YAML: its line, not a traceback
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        which = f"base {path}: " if seen else ""  # load_config names the top file
        raise ConfigError(f"{which}not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    base = layer.pop("base", None) if isinstance(layer, DictConfig) else None
    return [*(yaml_layers(path.parent / base, (*seen, path)) if base else []), layer]


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
