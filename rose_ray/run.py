"""A training run's parts, which the loop in `train.py` drives: they are built here
(`RunParts.start`), handed to the `Trainer`, and closed here.

- Actors: placement groups, the models (tiny ones built, a tiny teacher warmed:
  recipes/warmup.py), a student and a teacher engine under an `EngineSupervisor`, EnvPools,
  the episode runner, the episode ledger, the trajectory buffer and the learner group.
- `Publisher`: the learner's weights to the student engine, a replacement engine included.
- `Failures`: the run's one failure channel. A part that meets a failure it cannot handle
  itself (an engine lost for good, the learner lost while publishing to a replacement engine,
  episodes that keep failing) reports it there, and the loop raises it where it waits.
- Checkpoints (checkpoint.py): each part's `state_dict()` in one record beside the learner's
  DeepSpeed state; going back to one (`--resume`, or a learner group restarted after a rank's
  loss) puts each part back (`load_state_dict`): counters, history, the game order and the
  episodes open then, and cuts the logs to match. `<run_dir>/model/` is the student as a
  Hugging Face folder.
"""

from __future__ import annotations

import asyncio
import copy
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rose_ray.checkpoint import Checkpoint, kept_steps, read_checkpoint, unreadable_checkpoint
from rose_ray.config import TrainConfig
from rose_ray.learner.learner import LearnerLost
from rose_ray.provision.warmup import resolve_models
from rose_ray.runs import saved_config

if TYPE_CHECKING:
    from rose_ray.commands import EvalCommand
    from rose_ray.envs.protocol import Protocol
    from rose_ray.learner.learner import LearnerGroup
    from rose_ray.metrics import MetricsLogger
    from rose_ray.placement import PlacementGroups
    from rose_ray.recipes import Recipe
    from rose_ray.rollout.agent import Agent, EpisodeConfig
    from rose_ray.rollout.buffer import TrajectoryBuffer
    from rose_ray.rollout.handoff import TurnPolicy
    from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
    from rose_ray.rollout.play import PlaySpec
    from rose_ray.rollout.runner import EpisodeRunner
    from rose_ray.rollout.supervisor import EngineSupervisor
    from rose_ray.tokens import TokenWeights
    from rose_ray.types import GameId


@dataclass
class Progress:
    """The loop's counters: what a checkpoint keeps beside the learner's state."""

    step: int = 0
    history: dict[str, Any] = field(default_factory=lambda: {"eval": []})
    # trained episodes' replies, and how many of them were cut
    replies: dict[str, int] = field(default_factory=lambda: {"replies": 0, "truncated": 0, "cut_before_action": 0})
    learner_restarts: int = 0  # in this process (reliability.max_restarts counts these)
    restarts_before: dict[str, int] = field(default_factory=dict)  # per role, before a --resume

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (restarts apart: `RunParts.restarts` counts them with the engines')."""
        return {"step": self.step, "history": copy.deepcopy(self.history), "replies": dict(self.replies)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.replies = state["step"], dict(state["replies"])
        self.history = copy.deepcopy(state["history"])  # a copy: the state may be restored again


class Failures:
    """The run's one failure channel. Parts report what they cannot handle (`report`); the loop
    waits on it beside its batch (`wait`) and raises what it takes (`take`)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.reported = asyncio.Event()

    def report(self, error: BaseException) -> None:
        self.errors.append(error)
        self.reported.set()

    def take(self) -> BaseException | None:
        """The oldest failure not yet raised, or None."""
        error = self.errors.pop(0) if self.errors else None
        if not self.errors:
            self.reported.clear()
        return error


class Publisher:
    """The learner's weights to the student engine, every `publish_every` steps and to each
    replacement student engine before it serves."""

    def __init__(self, learner: Any, student: Any, engines: Any, failures: Failures, config: Any = None) -> None:
        self.learner, self.student, self.engines, self.failures = learner, student, engines, failures
        self.config = config  # a PublishConfig (rose_ray/publish/route.py): how the weights travel
        self.weights_ms = 0.0
        self.published: tuple[Any, int] | None = None  # (engine, learner version) last sent
        self.fallbacks = 0  # collectives given up for the object store (publish/fallbacks)

    def publish_now(self, engine: Any) -> None:
        from rose_ray.publish.route import PublishConfig

        version = self.learner.version
        out = self.learner.publish_weights([engine], self.config)
        self.weights_ms = out["total_ms"]
        self.published = (engine, version)
        if out.get("fallback"):
            # The object store from now on, a restarted learner group's publisher included (it
            # would otherwise try the collective again, and stall as long again).
            self.fallbacks += 1
            self.config = replace(self.config or PublishConfig(), method="object_store", collective_backend="auto")
            print(f"\ntrain: weight publication: {out['fallback']}; version {version} and every later one go "
                  "through the object store (publish/fallbacks)", flush=True)

    async def publish(self) -> None:
        """To the serving student engine. One lost meanwhile is replaced first (the replacement
        gets the weights before it serves); LearnerLost is the learner's, raised."""
        while True:
            engine = self.student.engine
            if self.published == (engine, self.learner.version):
                return  # a step skipped for a non-finite loss made no new version: nothing to send
            try:
                return await asyncio.to_thread(self.publish_now, engine)
            except LearnerLost:
                raise
            except Exception:
                if not await self.engines.lost("student engine", engine):
                    raise

    async def engine_started(self, role: str, engine: Any) -> None:
        """The supervisor's hook: a replacement student engine gets the latest weights first."""
        if role == "student engine":
            try:
                await asyncio.to_thread(self.publish_now, engine)
            except LearnerLost as lost:  # not the engine's fault: the loop restarts the learner
                self.failures.report(lost)  # group, which then publishes to this engine


def await_ready(agents: dict[str, Any], timeout_s: float) -> None:
    """Each engine has loaded its model (its actor constructed) before anything runs on it: a
    broken teacher fails the start, not the first rollout after a long eval."""
    import ray

    for role, agent in agents.items():
        try:
            ray.get(agent.engine.ready.remote(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the {role} did not start within reliability.start_timeout_s "
                               f"({timeout_s:g} s)") from None
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"the {role} failed to start: {e}") from None


class RunParts:
    """The actors and state of one training run (see the module docstring): `start` sets the
    parts below, in this order; `close` ends those it got to (the ones None until then)."""

    student_path: str
    teacher_path: str | None  # None: the world's expert teaches (teacher.kind=expert)
    sampler: GameSampler
    eval_job: EvalCommand  # the run's evals, as `rose-ray eval --run` makes them
    eval_spec: PlaySpec
    eval_games: list[GameId]
    engines: EngineSupervisor
    protocol: Protocol
    recipe: Recipe
    token_weights: TokenWeights
    handoff: TurnPolicy
    episode_cfg: EpisodeConfig
    runner: EpisodeRunner
    buffer: TrajectoryBuffer
    publisher: Publisher
    pad_id: int
    start_state: Checkpoint  # where "back to the latest checkpoint" goes without one

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.session = f"{cfg.name}-{os.urandom(3).hex()}"  # names its engines (a run folder is version_N)
        self.progress = Progress()
        self.failures = Failures()
        self.groups: PlacementGroups | None = None
        self.pools: list[Any] = []
        self.student: Agent | None = None
        self.teacher: Agent | None = None
        self.ledger: EpisodeLedger | None = None
        self.learner: LearnerGroup | None = None
        self.metrics: MetricsLogger | None = None
        self.eval_pools: list[Any] = []  # started at the first eval (none if evals are off)
        self._eval_runner: EpisodeRunner | None = None
        self.checkpointed_step: int | None = None  # the step whose checkpoint the learner's state is

    def start(self) -> None:
        from rose_ray.envs.worlds import get_world
        from rose_ray.evaluate import training_evals
        from rose_ray.learner.learner import LearnerGroup
        from rose_ray.metrics import MetricsLogger
        from rose_ray.models import download_model, hub_cache, is_hub_id, load_tokenizer
        from rose_ray.placement import PlacementGroups, check_cluster, check_shared_storage, demands
        from rose_ray.publish.group import nccl_env
        from rose_ray.rollout.actors import init_ray, start_agents, start_env_pools
        from rose_ray.rollout.agent import EXPERT, EpisodeConfig
        from rose_ray.rollout.buffer import TrajectoryBuffer
        from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
        from rose_ray.rollout.runner import EpisodeRunner
        from rose_ray.rollout.supervisor import EngineSupervisor

        cfg = self.cfg
        self.clear_leftovers()
        init_ray(cfg.ray_address)
        shared = {"run_dir": self.run_dir}
        if any(e.model.startswith("tiny:") for e in (cfg.student_engine, cfg.teacher_engine)) or \
                cfg.teacher_warmup.enabled or cfg.student_warmup.enabled:
            shared["tiny_dir (ROSE_RAY_CACHE)"] = Path(cfg.tiny_dir)
        hub_ids = [e.model for e in (cfg.student_engine, cfg.teacher_engine) if not e.spec.served and is_hub_id(e.model)]
        if hub_ids:
            # The driver downloads a hub model once; every node's actors then read that one
            # snapshot, so the cache must be shared. The marker goes into the cache's `.locks`
            # folder, the one entry the client's cache scan (`hf cache ls`) passes over.
            shared["HF_HOME (the Hugging Face cache)"] = Path(hub_cache()) / ".locks"
        for line in check_shared_storage(shared):
            print(line, flush=True)
        for name in dict.fromkeys(hub_ids):  # before any actor starts, with the client's progress bars
            download_model(name, "train")
        if cfg.resources.check_placement:  # fail now, naming the role, rather than wait forever
            check_cluster(cfg, use_total=True)
        self.groups = PlacementGroups(demands(cfg), timeout_s=cfg.resources.placement_timeout_s)
        student_path, teacher_path = resolve_models(cfg)  # tiny models, the teacher warm-up
        self.student_path, self.teacher_path = student_path, teacher_path
        catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
        self.sampler = GameSampler(catalogue.sample(cfg.rollout.split, None, cfg.seed, tasks=cfg.tasks), seed=cfg.seed)
        # The evals are `rose-ray eval --run`'s: its job (games, settings) and spec.
        self.eval_job, self.eval_spec = training_evals(cfg, student_path)
        self.eval_games = self.eval_job.games()

        # The env pools are created first: their JVMs boot while the engines load their weights.
        self.pools = start_env_pools(cfg.env, max_turns=cfg.rollout.max_turns)
        expert = cfg.teacher.expert  # the world's expert teaches: it plays from the env pools, no engine
        # The weight group's members (the student engine, learner rank 0) run with the same NCCL
        # settings wherever Ray starts them (rose_ray/publish/group.py NCCL_DEFAULTS says why).
        nccl = {"runtime_env": {"env_vars": nccl_env()}}
        student_nccl = nccl if cfg.resources.student_gpus > 0 else {}
        learner_nccl = nccl if cfg.learner.gpus_per_rank > 0 else {}
        self.student, self.teacher = start_agents(
            replace(cfg.student_engine, model=student_path),
            EXPERT if expert else replace(cfg.teacher_engine, model=teacher_path),
            cfg.resources.student_cpus, cfg.resources.teacher_cpus,
            cfg.resources.student_gpus, cfg.resources.teacher_gpus,
            # Named, so the dashboard (and bench/chaos.py) can tell them apart.
            student_options={**self.groups.options("student engine"), **student_nccl,
                             "name": f"rose_ray {self.session} student engine"},
            teacher_options=None if expert else {**self.groups.options("teacher engine"),
                                                 "name": f"rose_ray {self.session} teacher engine"},
            enable_thinking=cfg.chat.enable_thinking, history=cfg.chat.history,
        )
        r = cfg.reliability  # a lost engine is replaced on its placement; past max_restarts the run stops
        self.engines = EngineSupervisor(r.max_restarts, r.health_every_s, r.health_timeout_s, r.start_timeout_s,
                                        on_failed=self.failures.report)
        engines = {"student engine": self.student, **({} if expert else {"teacher engine": self.teacher})}
        for role, agent in engines.items():
            self.engines.watch(role, agent)
        await_ready(engines, r.start_timeout_s)
        self.protocol = cfg.env.protocol()
        self.recipe = cfg.algorithm  # who acts when, which tokens train (rose_ray/recipes/)
        self.recipe.check_agents(cfg, self.teacher.chat is self.student.chat)
        self.token_weights = self.recipe.token_weights()
        self.handoff = self.recipe.turn_policy()
        self.episode_cfg = EpisodeConfig(
            max_turns=cfg.rollout.max_turns,
            student_sampling=cfg.rollout.student_sampling,
            teacher_sampling=cfg.rollout.teacher_sampling,
            score_student_with_teacher=self.recipe.teacher_scores_student(),
            report=cfg.rollout.report,
        )
        self.runner = EpisodeRunner(self.pools, cfg.env.games_per_worker, cfg.rollout.max_retries, self.engines)
        self.ledger = EpisodeLedger(self.run_dir / "episodes.jsonl", self.sampler, fresh=not self.resume)
        # Lag makes only the student's own tokens off-policy: a recipe that trains none of them
        # (ROSE without its OPD term) keeps every episode.
        self.buffer = TrajectoryBuffer(cfg.rollout.batch_episodes, cfg.rollout.max_lag,
                                       on_drop=lambda t: self.ledger.record(t.episode_id, "dropped_stale"),
                                       drop_stale=self.token_weights.trains("student"))
        # The learner last: an engine that cannot start, or agents the recipe refuses, fail the
        # run in seconds, not after DeepSpeed's init.
        self.learner = LearnerGroup(replace(cfg.learner, model=student_path),
                                    worker_options=lambda r: {**self.groups.options("learner ranks", r), **learner_nccl})
        self.publisher = Publisher(self.learner, self.student, self.engines, self.failures, cfg.publish)
        self.engines.on_start = self.publisher.engine_started
        tok = load_tokenizer(student_path)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.student.chat.eos_id
        self.metrics = MetricsLogger(self.run_dir, cfg.logging.wandb, f"{cfg.name}/{self.run_dir.name}",
                                     yaml.safe_load(saved_config(cfg)))  # W&B's copy: no secrets, as config.yaml
        if not self.resume:
            (self.run_dir / "trajectories.jsonl").unlink(missing_ok=True)  # left by a run that never checkpointed
        self.start_state = self.checkpoint_state()
        self.start_state.ledger["offset"] = 0
        if self.resume:
            self.progress.restarts_before = dict(self.load_checkpoint().restarts)

    # ----------------------------------------------------------------- checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoint_state(self) -> Checkpoint:
        """The loop's side of a checkpoint, taken in the event loop (nothing moves meanwhile):
        the ledger's open episodes, and counters without them (a resume plays them again)."""
        return Checkpoint(version=self.learner.version, ledger=self.ledger.state_dict(), buffer=self.buffer.state_dict(),
                          runner=self.runner.state_dict(buffered=len(self.buffer.items)), restarts=self.restarts(),
                          **self.progress.state_dict())

    def clear_leftovers(self) -> None:
        """What a run stopped by a kill left in this run folder (its own: nothing else writes
        there): temp files and folders rose_ray named (a swap's old copy put back where the
        new one never came), and checkpoint step folders without their mark."""
        from rose_ray.checkpoint import prune
        from rose_ray.files import clear_leftovers

        for line in clear_leftovers(self.run_dir, owned=True) + clear_leftovers(self.ckpt_dir, owned=True):
            print(f"train: {line}", flush=True)
        if self.ckpt_dir.is_dir():
            prune(self.ckpt_dir)

    def load_checkpoint(self, publish: bool = True) -> Checkpoint:
        """Back to the latest whole checkpoint (or the start, without one): the learner, the game
        order and the episodes open then (played again first), counters, and the logs cut to
        match. Returns the record it went back to."""
        from rose_ray.learner.worker import CheckpointUnreadable
        from rose_ray.rollout.ledger import keep_steps

        state = self.start_state
        if kept_steps(self.run_dir):  # a save cut short is not among them
            state = read_checkpoint(self.run_dir)  # the newest whose record reads (it says when it goes back)
            try:
                self.learner.load_checkpoint(self.ckpt_dir, state.tag)
            except CheckpointUnreadable as e:
                raise unreadable_checkpoint(e, self.run_dir, state.step, kept_steps(self.run_dir),
                                            "train --resume") from None
            self.checkpointed_step = state.step
        elif self.resume:
            print(f"train: --resume: {self.run_dir} has no whole checkpoint: starting again from step 0", flush=True)
        for part, part_state in ((self.progress, state.progress), (self.ledger, state.ledger),
                                 (self.buffer, state.buffer), (self.runner, state.runner)):
            part.load_state_dict(part_state)
        for log in ("trajectories.jsonl", "metrics.jsonl"):  # steps after it are trained again
            keep_steps(self.run_dir / log, state.step)
        if publish:
            self.publisher.publish_now(self.student.engine)  # the student engine starts from the checkpoint's weights
        print(f"train: {self.run_dir} at step {state.step} (policy version {self.learner.version}); "
              f"{len(self.ledger.replay)} open episodes to play again", flush=True)
        return state

    def restarts(self) -> dict[str, int]:
        """Replacements per role over the whole run: this process's, plus those before a resume
        (kept in each checkpoint; a learner group going back to one keeps counting on)."""
        before = self.progress.restarts_before
        now = {**self.engines.restarts(), "learner": self.progress.learner_restarts}
        return {role: before.get(role, 0) + now.get(role, 0) for role in {**before, **now}}

    # ----------------------------------------------------------------- model/ and evals
    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"

    def export_model(self) -> None:
        """The student as a Hugging Face folder, `<run_dir>/model/`, replaced atomically."""
        from rose_ray.export import MODEL_INFO, model_info

        info = model_info(self.cfg, self.run_dir, self.progress.step, self.learner.version, self.student_path)
        self.learner.export(self.model_dir, {MODEL_INFO: info})

    def eval_runner(self) -> EpisodeRunner:
        """The runner of the held-out evals: env pools of its own, started at the first eval."""
        from rose_ray.rollout.actors import start_env_pools
        from rose_ray.rollout.runner import EpisodeRunner

        if not self.eval_pools:
            eval_env = replace(self.cfg.env, workers=1, resources=dict(self.cfg.env.resources))
            self.eval_pools = start_env_pools(eval_env, max_turns=self.cfg.eval.max_turns)
            self._eval_runner = EpisodeRunner(self.eval_pools, eval_env.games_per_worker, engines=self.engines)
        return self._eval_runner

    def close(self) -> None:
        """Ends what `start` started, as far as it got."""
        from rose_ray.rollout.actors import close_pools, stop_agents

        close_pools(self.pools + self.eval_pools)
        stop_agents(self.student, self.teacher)
        if self.learner is not None:
            self.learner.shutdown()
        if self.groups is not None:
            self.groups.remove()
        if self.metrics is not None:
            self.metrics.close()
        if self.ledger is not None:
            self.ledger.close()


def results_table(summary: dict[str, Any]) -> str:
    rows = [("student before", summary["before"]), ("student after", summary["after"]),
            ("teacher", summary["teacher"])]
    lines = ["| model | games | Score | Success | Pass |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in rows:
        if r is not None:
            lines.append(f"| {name} | {r['games']} | {r['score']:.4f} | {r['success']:.3f} | {r['pass']:.3f} |")
    return "\n".join(lines)
