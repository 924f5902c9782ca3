"""The training config: OmegaConf structured dataclasses, YAML + dotlist overrides, validation.

    cfg = load_config("configs/tiny.yaml", ["rollout.batch_episodes=4", "steps=20"])

Unknown keys and wrong types are rejected by OmegaConf with the key named; impossible values
by each section's `__post_init__` (also with the key named). Model names `tiny:student` and
`tiny:teacher` stand for the tiny local models, built on first use under `tiny_dir`.
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
from rose_ray.errors import ConfigError, InputError
from rose_ray.inference.engine import EngineConfig
from rose_ray.inference.registry import BACKENDS, in_flight_backends, settings_owner
from rose_ray.learner.learner import LearnerConfig
from rose_ray.publish.route import PublishConfig
from rose_ray.recipes import Recipe, get_recipe
from rose_ray.types import REPORT_MODES, SamplingParams

__all__ = ["ConfigError", "TrainConfig", "load_config", "to_dict", "to_yaml"]

MODES = ("async", "sync")


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
        for key in ("batch_episodes", "max_turns"):
            if getattr(self, key) < 1:
                raise ConfigError(f"rollout.{key}: must be >= 1, got {getattr(self, key)!r}")
        if self.report in (False, "False", "false"):  # YAML reads a bare `off` as false
            self.report = "off"
        if self.report not in REPORT_MODES:
            raise ConfigError(f"rollout.report: must be ask, train or off, got {self.report!r}")
        if self.max_lag < 0:
            raise ConfigError(f"rollout.max_lag: must be >= 0, got {self.max_lag!r}")


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
        for key in ("n", "max_turns", "max_new_tokens", "every_n"):
            if getattr(self, key) < 1:
                raise ConfigError(f"eval.{key}: must be >= 1, got {getattr(self, key)!r}")
        if self.every < 0:
            raise ConfigError(f"eval.every: must be >= 0, got {self.every!r}")


@dataclass
class TeacherWarmupConfig:
    """SFT of the teacher on gold demonstrations before training (for tiny teachers)."""

    KEY = "teacher_warmup"  # its key in the config, for errors (a class attribute, not a field)
    enabled: bool = False  # warm the model before training (cached under tiny_dir by its settings)
    gold_games: int = 40  # training games whose gold demonstrations it trains on
    max_turns: int = 8  # the opening of each gold path: what short episodes need most
    # gold paths that look before they choose and name things as the game shows them
    # (ScienceWorld: `envs/sciworld/gold.py`), replayed to check they still succeed
    observe: bool = False
    # the share of demonstrations opening with one or two student-owned replies that change
    # nothing (a harmless action, a reply with no action) before the gold path: a teacher that
    # carries on from a small student's first turns (`collect.detour_replies`)
    detours: float = 0.0
    # the share of demonstrations opening with the base student's own turns, played live at
    # `rollout.student_sampling` (1 to `opening_turns` of them, drawn per game): what ROSE's
    # teacher meets after a handoff. Kept where the gold path replayed after them still wins;
    # elsewhere the game's demonstration opens as it would without them. Teacher only.
    student_openings: float = 0.0
    opening_turns: int = 2  # the most base-student turns an opening has (`student_openings`)
    opening_temperature: float | None = None  # None: the student's sampling temperature of the run
    # what plays after a demonstration's opening: ScienceWorld's gold path (`gold`), or the world's
    # expert teacher from the state the opening left (`expert`: every demonstration then shows
    # the expert's play, after the base student's real turns where `student_openings` draws
    # them, so a teacher warmed on them has seen recoveries from real moves). Teacher only.
    continuation: str = "gold"
    epochs: int = 10  # passes over the demonstrations
    lr: float = 1e-3  # learning rate
    schedule: str = "constant"  # constant | linear | cosine (over the warm-up's steps)
    batch_episodes: int = 8  # demonstrations per optimizer step
    threads: int = 2  # torch threads: nothing else runs during the warm-up
    seed: int = 0  # its own seed: runs with other seeds share one warmed teacher

    def __post_init__(self) -> None:
        for key in ("gold_games", "max_turns", "epochs", "batch_episodes", "threads", "opening_turns"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{self.KEY}.{key}: must be >= 1, got {getattr(self, key)!r}")
        if self.lr <= 0:
            raise ConfigError(f"{self.KEY}.lr: must be > 0, got {self.lr!r}")
        if not 0.0 <= self.detours <= 1.0:
            raise ConfigError(f"{self.KEY}.detours: a share of demonstrations, from 0 to 1; got {self.detours!r}")
        if not 0.0 <= self.student_openings <= 1.0:
            raise ConfigError(f"{self.KEY}.student_openings: a share of demonstrations, from 0 to 1; "
                              f"got {self.student_openings!r}")
        if self.opening_temperature is not None and self.opening_temperature < 0:
            raise ConfigError(f"{self.KEY}.opening_temperature: must be >= 0 (or null), got {self.opening_temperature!r}")
        from rose_ray.envs.worlds import CONTINUATIONS

        if self.continuation not in CONTINUATIONS:
            raise ConfigError(f"{self.KEY}.continuation: must be one of {CONTINUATIONS}, got {self.continuation!r}")
        if self.continuation != "gold" and self.KEY != "teacher_warmup":
            raise ConfigError(f"{self.KEY}.continuation: only the teacher's demonstrations are continued by the "
                              "expert; set teacher_warmup.continuation")
        if self.student_openings and self.KEY != "teacher_warmup":
            raise ConfigError(f"{self.KEY}.student_openings: only the teacher's demonstrations open with "
                              "the base student's turns; set teacher_warmup.student_openings")
        if self.schedule not in ("constant", "linear", "cosine"):
            raise ConfigError(f"{self.KEY}.schedule: must be constant, linear or cosine, got {self.schedule!r}")


@dataclass
class StudentWarmupConfig(TeacherWarmupConfig):
    """The same SFT for the base student (off by default): a short one on fewer or shorter
    demonstrations gives a partly competent base student, as a real base model is."""

    KEY = "student_warmup"



TEACHER_KINDS = ("model", "expert")


@dataclass
class TeacherConfig:
    """Who the teacher is: `model`, the model `teacher_engine` serves (the default), or `expert`,
    the world's expert teacher (ScienceWorld: envs/sciworld/expert.py), which plays from the game
    itself: no engine is started for it, it has no logprobs (so no OPD term), and it plays only
    the tasks it knows (`World.expert_tasks`)."""

    kind: str = "model"  # model | expert

    def __post_init__(self) -> None:
        if self.kind not in TEACHER_KINDS:
            raise ConfigError(f"teacher.kind: must be one of {TEACHER_KINDS}, got {self.kind!r}")

    @property
    def expert(self) -> bool:
        return self.kind == "expert"


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
        for key in ("max_restarts", "max_failed_in_a_row"):
            if getattr(self, key) < 0:
                raise ConfigError(f"reliability.{key}: must be >= 0, got {getattr(self, key)!r}")
        for key in ("health_every_s", "health_timeout_s", "start_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"reliability.{key}: must be > 0, got {getattr(self, key)!r}")
        if not self.watchdog_s >= 0:
            raise ConfigError(f"reliability.watchdog_s: must be >= 0 (0 = off), got {self.watchdog_s!r}")


@dataclass
class WandbConfig:
    """Weights & Biases beside TensorBoard (the `wandb` extra): every scalar TensorBoard gets, at
    the same learner step, and the run's config (its secrets left out, as in config.yaml). The run
    folder keeps the W&B run's id, so `--resume` goes on in the same W&B run. Credentials are
    W&B's own (`wandb login` or WANDB_API_KEY on the driver's machine); WANDB_MODE=offline writes
    the W&B files under the run folder only (`wandb sync` uploads them later)."""

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
    # Where this config's runs go, each in a new version_N folder (rose_ray/runs.py); under
    # ROSE_RAY_RUNS when set (shared storage for a Ray job), else ./runs.
    run_dir: str = "${oc.env:ROSE_RAY_RUNS,runs}/${name}"
    seed: int = 0  # the order of the training games and the decay policy's draws
    # The algorithm and its settings, a recipe chosen by name (rose_ray/recipes/): `rose`,
    # `{name: rose, handoff: {policy: fixed, k: 5}, lam: 0.0}`, `opd`, `{name: teacher_sft, owners: [...]}`
    algorithm: Any = "rose"
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
        recipe = self.algorithm
        if self.mode not in MODES:
            raise ConfigError(f"mode: must be one of {MODES}, got {self.mode!r}")
        for key in ("steps", "publish_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be >= 1, got {getattr(self, key)!r}")
        if self.learner.max_tokens < self.student_engine.context_tokens:
            raise ConfigError(
                f"learner.max_tokens: {self.learner.max_tokens} is less than student_engine.context_tokens "
                f"{self.student_engine.context_tokens}; a packed row must hold whatever the engine kept "
                "(the learner cuts a trajectory only where the engine did)"
            )
        if recipe.teacher_scores_student() and self.teacher_engine.context_tokens < self.student_engine.context_tokens:
            raise ConfigError(
                f"teacher_engine.context_tokens: {self.teacher_engine.context_tokens} is less than "
                f"student_engine.context_tokens {self.student_engine.context_tokens}; the teacher scores each "
                "episode's student tokens in one pass over what the learner trains on, up to the student's context"
            )
        if self.teacher_warmup.enabled and self.teacher_engine.spec.served:
            raise ConfigError(f"teacher_warmup.enabled: the warm-up trains a local teacher folder, but "
                              f"teacher_engine.backend is {self.teacher_engine.backend} (a served model, used as it "
                              "is); set teacher_warmup.enabled=false (or warm a folder with `rose-ray sft` and serve that)")
        if self.student_warmup.enabled and self.student_engine.spec.served:
            raise ConfigError(f"student_warmup.enabled: the warm-up trains a local student folder, but "
                              f"student_engine.backend is {self.student_engine.backend} (a served model); "
                              "set student_warmup.enabled=false")
        if self.publish.method == "collective" and not self.student_engine.spec.takes_weights:
            takers = " or ".join(b.name for b in BACKENDS.values() if b.takes_weights)
            raise ConfigError(f"publish.method: collective needs a student engine that is a local Ray actor "
                              f"(backend {takers}), not {self.student_engine.backend!r}; use "
                              "publish.method=object_store or auto")
        student_vllm = self.student_engine.vllm
        if self.publish.collective_backend == "nccl" and student_vllm and student_vllm.tensor_parallel_size > 1:
            # (each vLLM worker would have to join the group itself, as OpenRLHF's worker extension does)
            raise ConfigError(f"publish.collective_backend: nccl receives the weights in the engine actor's process, "
                              f"but student_engine.vllm.tensor_parallel_size is {student_vllm.tensor_parallel_size} "
                              "(the weights live in its worker processes); with tensor parallelism use "
                              "publish.collective_backend=gloo or auto, or publish.method=object_store")
        if self.publish.collective_backend == "nccl" and self.resources.colocate:
            raise ConfigError("publish.collective_backend: nccl takes one rank per GPU, but resources.colocate puts "
                              "student engine 0 on learner rank 0's GPU; use publish.collective_backend=auto or gloo")
        if self.publish.in_flight == "keep" and "keep" not in self.student_engine.spec.in_flight:
            raise ConfigError(f"publish.in_flight: keep loads the weights under an engine's running requests, "
                              f"which only the {'/'.join(in_flight_backends('keep'))} backend can (the hf backend "
                              f"generates a batch to its end; an openai engine takes no weights); "
                              f"student_engine.backend is {self.student_engine.backend!r}: use publish.in_flight=wait")
        recipe.check(self)
        if self.teacher.expert:
            self._check_expert(recipe)
        if self.teacher_warmup.enabled and self.teacher_warmup.continuation == "expert":
            self._check_expert_tasks("teacher_warmup.continuation")
        if self.chat.history == "template" and recipe.teacher_scores_student():
            setting = recipe.scoring_key.split(".")[1:]  # `algorithm` itself, or one of its keys
            value = getattr(recipe, setting[0]) if setting else recipe.name
            raise ConfigError(f"chat.history: 'template' re-renders earlier turns from their text, but the OPD "
                              f"term ({recipe.scoring_key}={value}) needs the ids that were sampled; "
                              "use chat.history=sampled")


    def engines(self) -> list[tuple[str, EngineConfig]]:
        """(role, engine config) of each engine the run starts: the student's, and the
        teacher's unless the teacher is the world's expert."""
        return [("student", self.student_engine)] + ([] if self.teacher.expert else [("teacher", self.teacher_engine)])

    def _check_expert(self, recipe: Recipe) -> None:
        """An expert teacher: a world that has one, tasks it plays, no OPD, no model to warm."""
        self._check_expert_tasks("teacher.kind")
        if recipe.teacher_scores_student():
            setting = recipe.scoring_key.split(".")[1:]
            value = getattr(recipe, setting[0]) if setting else recipe.name
            raise ConfigError(f"{recipe.scoring_key}: {value} asks the teacher to score the student's tokens (OPD), "
                              "but the expert teacher has no logprobs; use teacher.kind=model, or ROSE without "
                              "its OPD term (algorithm.lam=0) or teacher_sft")
        if self.teacher_warmup.enabled:
            raise ConfigError("teacher_warmup.enabled: the expert teacher is no model to warm; set "
                              "teacher_warmup.enabled=false (or teacher.kind=model)")

    def _check_expert_tasks(self, key: str) -> None:
        """The world has an expert teacher (`key` asks for it) and it plays every task of the run."""
        from rose_ray.envs.worlds import get_world

        world = get_world(self.env.world)
        if world.expert is None:
            raise ConfigError(f"{key}: expert: {world.name} has no expert teacher (env.world={world.name})")
        tasks = self.tasks or world.catalogue(self.env.mapping).task_names()
        unknown = [t for t in tasks if t not in world.expert_tasks]
        if unknown:
            raise ConfigError(f"tasks: the expert teacher ({key}) plays {list(world.expert_tasks)}, not {unknown}; "
                              "set tasks to those it plays" + ("" if self.tasks else " (empty tasks means every task)"))


# Keys that no longer exist, and what took their place: an old config gets told, by key.
# A run's own saved config (a resume) has the moved ones carried to their new place.
MOVED_KEYS = {  # the old key: (where it lives now, an example)
    "rollout.handoff": ("algorithm.handoff", "rose's turn policy: algorithm: {name: rose, handoff: {policy: fixed, k: 5}}"),
    "learner.lam": ("algorithm.lam", "rose's OPD weight: algorithm: {name: rose, lam: 0.5}"),
    "learner.sft_owners": ("algorithm.owners", "algorithm: {name: teacher_sft, owners: [teacher]}"),
}
REMOVED_KEYS = {
    **{key: f"moved to {new} ({example})" for key, (new, example) in MOVED_KEYS.items()},
    "learner.algorithm": "set `algorithm` only (rose, opd or teacher_sft); its recipe chooses the learner's loss",
    "learner.context_policy": "the learner cuts a trajectory where the engine cut it (student_engine.context_policy)",
    "learner.grad_accum": "micro-batches follow a token budget (learner.max_tokens each); their number follows from the batch",
    "learner.gradient_checkpointing": "use learner.activation_checkpointing: full | selective | none (true was full)",
    "publish.object_store_bucket_mb": "one bucket size for every method: publish.bucket_mb (MB, 0: no buckets)",
}


def default_config_path() -> Path:
    return Path(str(resources.files("rose_ray").joinpath("configs/tiny.yaml")))


def load_config(path: str | Path | TrainConfig | None = None, overrides: list[str] | None = None,
                saved: bool = False) -> TrainConfig:
    """YAML (default: the embedded tiny config) + `key=value` overrides -> a validated config.
    `path` may also be a TrainConfig (the Python API's), checked again with the overrides over it.

    `saved`: the file is a run's own config.yaml (a resume), whose removed keys are dropped
    (they were checked when it was written) rather than refused."""
    given = None
    if isinstance(path, TrainConfig):
        given = [OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(path)))]
        path = Path("the TrainConfig given")  # names it in errors
    path = Path(path) if path else default_config_path()
    if given is None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        schema = OmegaConf.structured(TrainConfig)
        # One layer per override, so that `algorithm=teacher_sft algorithm.owners=[teacher]`
        # reads as written: the name, then a key of that recipe (see _algorithm_of).
        files = given or yaml_layers(path)
        layers = [*files, *(override_layer(o) for o in overrides or [])]
        for n, layer in enumerate(layers):
            for key, why in REMOVED_KEYS.items():
                if OmegaConf.select(layer, key, default=None) is None:
                    continue
                if saved and n < len(files):
                    _carry_saved(layer, key)
                else:
                    raise ConfigError(f"key {key!r}: removed; {why}")
        algorithm = _algorithm_of(layers)
        for role in ENGINE_SECTIONS:
            _engine_sections(role, schema[role].backend, layers)
            for name in BACKENDS:  # the default engines' own sections come from their backends, after the layers
                schema[role][name] = None
        merged = OmegaConf.merge(schema, *layers)
        merged.algorithm = algorithm
        # A variable set to nothing (`ROSE_RAY_RUNS=$UNSET`) would put runs at /<name>.
        if os.environ.get("ROSE_RAY_RUNS") == "" and "ROSE_RAY_RUNS" in str(
                OmegaConf.to_container(merged, resolve=False)["run_dir"]):
            raise ConfigError("run_dir: ROSE_RAY_RUNS is set but empty; unset it (runs go to ./runs) or name a folder")
        return OmegaConf.to_object(merged)  # runs every section's __post_init__ checks
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{path}: {'key ' + repr(key) + ': ' if key else ''}{first_line(e)}") from None
    except InputError as e:  # a section's check, naming its key; anything else is a bug
        raise ConfigError(f"{path}: {e}") from None


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


def _carry_saved(layer: Any, key: str) -> None:
    """A run's saved config from before a key moved: the value goes where it lives now, when
    the saved algorithm has that setting (rose's handoff and lam, teacher_sft's owners)."""
    section, leaf = key.rsplit(".", 1)
    value = OmegaConf.select(layer, section).pop(leaf)
    if key == "learner.gradient_checkpointing" and "activation_checkpointing" not in layer.learner:
        layer.learner.activation_checkpointing = "full" if value else "none"
    moved = MOVED_KEYS.get(key)
    algorithm = layer.get("algorithm", "rose")
    name = algorithm if isinstance(algorithm, str) else algorithm.get("name", "rose")
    field_ = moved[0].split(".")[1] if moved else None
    if field_ and field_ in OmegaConf.structured(get_recipe(name)):
        if isinstance(algorithm, str):
            layer.algorithm = {"name": name}
        if field_ not in layer.algorithm:
            layer.algorithm[field_] = value


def _algorithm_of(layers: list[Any]) -> dict[str, Any]:
    """The `algorithm` section over the layers (popped from them). A layer that names another
    recipe, or another turn policy, starts that section afresh: `algorithm=opd` over a rose
    YAML, or `algorithm.handoff.policy=decay` over `{policy: fixed, k: 2}`, keeps none of the
    other kind's keys (which the new kind would refuse)."""
    section: dict[str, Any] = {"name": "rose"}
    for layer in layers:
        if "algorithm" not in layer:
            continue
        value = layer.pop("algorithm")
        value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        section = _layered(section, value, "name", {"handoff": "policy"})
    return section


ENGINE_SECTIONS = ("student_engine", "teacher_engine")


def _engine_sections(role: str, backend: str, layers: list[Any]) -> None:
    """An engine section over the layers, its backend's own settings in the section named after
    the backend (`student_engine: {backend: vllm, vllm: {kv_cache_mb: 256}}`), in place.

    A setting given flat (`student_engine.kv_cache_mb=256`, as before the sections) moves to
    its backend's section; one of another backend than the engine's is ignored, as it was
    before (a run's config.yaml from before the sections holds every backend's). A layer that
    names another backend drops the other backends' sections of the layers before it
    (settings the new one would refuse), as the algorithm section does. A section left for
    another backend than the engine's is refused by key, and so is a setting in the wrong
    backend's section, naming where it lives."""
    from dataclasses import fields

    common = {f.name for f in fields(EngineConfig)} - set(BACKENDS)
    written: list[tuple[int, dict[str, Any], set[str]]] = []  # per layer: its section, its keys given flat
    for n, layer in enumerate(layers):
        if not isinstance(layer.get(role), DictConfig):
            continue
        section = OmegaConf.to_container(layer[role], resolve=False)
        flat = set()
        for key in list(section):
            if key in BACKENDS:
                if section[key] is None:  # a saved config's empty section
                    del section[key]
                    continue
                if not isinstance(section[key], dict):
                    continue  # OmegaConf names it
                for inner in section[key]:
                    owner = settings_owner(inner)
                    where = (f"{role}.{owner.name}.{inner}" if owner is not None
                             else f"{role}.{inner}" if inner in common else None)
                    if where is not None and (owner is None or owner.name != key):
                        raise ConfigError(f"key '{role}.{key}.{inner}': not a setting of the {key} backend; "
                                          f"it lives at {where}")
            elif (owner := settings_owner(key)) is not None:
                value = section.pop(key)
                section.setdefault(owner.name, {}).setdefault(key, value)
                flat.add(key)
        if "backend" in section and section["backend"] != backend:
            backend = section["backend"]
            for _, earlier, _ in written:  # another backend: the earlier layers' other sections go
                for name in BACKENDS:
                    if name != backend:
                        earlier.pop(name, None)
        written.append((n, section, flat))
    for n, section, flat in written:
        for name in [k for k in BACKENDS if k in section and k != backend]:
            if set(section[name]) - flat:
                raise ConfigError(f"key '{role}.{name}': settings of the {name} backend, but {role}.backend is "
                                  f"{backend}; set {role}.backend={name} or drop them")
            del section[name]
        layers[n][role] = section


def _layered(old: dict[str, Any], new: Any, tag: str, nested: dict[str, str]) -> Any:
    if not isinstance(new, dict):
        if not isinstance(new, str):
            return new  # the recipe's own check names it
        new = {tag: new}
    out = dict(old) if new.get(tag, old.get(tag)) == old.get(tag) else {}
    for key, value in new.items():
        if key in nested and isinstance(out.get(key), dict):
            value = _layered(out[key], value, nested[key], {})
        out[key] = value
    return out


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0]


def check_served_urls(cfg: TrainConfig, nodes: int) -> None:
    """A served model's URL as every node reaches it: on a cluster of more than one node a
    loopback address names a different machine for each engine actor (ConfigError naming the key)."""
    import ipaddress
    from urllib.parse import urlparse

    if nodes < 2:
        return
    for role in ("student", "teacher"):
        engine = getattr(cfg, f"{role}_engine")
        if not engine.spec.served:
            continue
        base_url = engine.settings.base_url
        host = urlparse(base_url).hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if loopback:
            raise ConfigError(f"{role}_engine.{engine.backend}.base_url: {base_url} is a loopback address, but this cluster has "
                              f"{nodes} nodes and the {role} engine's actor may run on any of them; give the server's "
                              "address as the other nodes reach it")
