"""A training run's components (Rollouts, Learning, Evals) and its failure channel (Failures),
started in order by `Run.start`, driven by train.py's `Trainer`, closed by `Run.close`; each owns
its checkpoint state (checkpoint.py). docs/design.md lists what each holds."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rose_ray.checkpoint import (
    Checkpoint,
    EvalState,
    LearningState,
    RolloutState,
    kept_steps,
    load_learner,
    read_checkpoint,
    write_checkpoint,
)
from rose_ray.config import TrainConfig
from rose_ray.learner.learner import LearnerLost
from rose_ray.provision.warmup import resolve_models
from rose_ray.reliability import RoleFailed, describe_error
from rose_ray.runs import saved_config

if TYPE_CHECKING:
    from rose_ray.learner.learner import LearnerGroup
    from rose_ray.metrics import MetricsLogger
    from rose_ray.placement import PlacementGroups
    from rose_ray.rollout.agent import Agent
    from rose_ray.rollout.ledger import Draw, EpisodeLedger
    from rose_ray.rollout.runner import EpisodeRunner
    from rose_ray.types import GameId, Trajectory


class Failures:
    """The run's one failure channel: parts `report`, the loop waits on `reported` and raises
    what it takes."""

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

    def raise_taken(self) -> None:
        if (error := self.take()) is not None:
            raise error


class Rollouts:
    """Episodes played into the buffer: while there is room (`start_playing`, async mode) or a
    batch at a time (`play_batch`, sync mode)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, failures: Failures) -> None:
        self.cfg, self.run_dir, self.failures = cfg, run_dir, failures
        self.pools: list[Any] = []
        self.student: Agent | None = None
        self.teacher: Agent | None = None
        self.ledger: EpisodeLedger | None = None
        self.producer: asyncio.Task | None = None
        self.episode_tasks: set[asyncio.Task] = set()
        self.failed_in_a_row = 0  # episodes failed since the last one that finished
        self.finished: Callable[[], None] = lambda: None  # told of each finished episode (the watchdog)

    def start(self, groups: PlacementGroups, student_path: str, teacher_path: str | None, session: str,
              fresh: bool) -> None:
        import ray

        from rose_ray.envs.worlds import get_world
        from rose_ray.publish.group import nccl_env
        from rose_ray.rollout.actors import start_agents, start_env_pools
        from rose_ray.rollout.agent import EXPERT, EpisodeConfig
        from rose_ray.rollout.buffer import TrajectoryBuffer
        from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
        from rose_ray.rollout.runner import EpisodeRunner
        from rose_ray.rollout.supervisor import EngineSupervisor

        cfg = self.cfg
        catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
        sampler = GameSampler(catalogue.sample(cfg.rollout.split, None, cfg.seed, tasks=cfg.tasks), seed=cfg.seed)
        # The env pools are created first: their JVMs boot while the engines load their weights.
        self.pools = start_env_pools(cfg.env, max_turns=cfg.rollout.max_turns)
        expert = cfg.teacher.expert  # the world's expert teaches: it plays from the env pools, no engine
        # The weight group's members run with the same NCCL settings (publish/group.py says why).
        nccl = {"runtime_env": {"env_vars": nccl_env()}} if cfg.resources.student_gpus > 0 else {}
        self.student, self.teacher = start_agents(
            replace(cfg.student_engine, model=student_path),
            EXPERT if expert else replace(cfg.teacher_engine, model=teacher_path),
            cfg.resources.student_cpus, cfg.resources.teacher_cpus,
            cfg.resources.student_gpus, cfg.resources.teacher_gpus,
            # Named, so the dashboard (and bench/chaos.py) can tell them apart.
            student_options={**groups.options("student engine"), **nccl,
                             "name": f"rose_ray {session} student engine"},
            teacher_options=None if expert else {**groups.options("teacher engine"),
                                                 "name": f"rose_ray {session} teacher engine"},
            enable_thinking=cfg.chat.enable_thinking, history=cfg.chat.history,
        )
        r = cfg.reliability  # a lost engine is replaced on its placement; past max_restarts the run stops
        self.engines = EngineSupervisor(r.max_restarts, r.health_every_s, r.health_timeout_s, r.start_timeout_s,
                                        on_failed=self.failures.report)
        agents = {"student engine": self.student, **({} if expert else {"teacher engine": self.teacher})}
        for role, agent in agents.items():  # loaded: a broken teacher fails the start, not the first rollout
            self.engines.watch(role, agent)
            try:
                ray.get(agent.engine.ready.remote(), timeout=r.start_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(f"the {role} did not start within reliability.start_timeout_s "
                                   f"({r.start_timeout_s:g} s)") from None
            except ray.exceptions.RayActorError as e:
                raise RuntimeError(f"the {role} failed to start: {e}") from None
        self.protocol = cfg.env.protocol()
        recipe = cfg.algorithm  # who acts when, which tokens train (rose_ray/recipes/)
        recipe.check_agents(cfg, self.teacher.chat is self.student.chat)
        self.handoff = recipe.turn_policy()
        self.episode_cfg = EpisodeConfig(
            max_turns=cfg.rollout.max_turns,
            student_sampling=cfg.rollout.student_sampling,
            teacher_sampling=cfg.rollout.teacher_sampling,
            score_student_with_teacher=recipe.teacher_scores_student(),
            report=cfg.rollout.report,
        )
        self.runner = EpisodeRunner(self.pools, cfg.env.games_per_worker, cfg.rollout.max_retries, self.engines)
        self.ledger = EpisodeLedger(self.run_dir / "episodes.jsonl", sampler, fresh=fresh)
        # Lag makes only the student's own tokens off-policy: a recipe that trains none of them
        # (ROSE without its OPD term) keeps every episode.
        self.buffer = TrajectoryBuffer(cfg.rollout.batch_episodes, cfg.rollout.max_lag,
                                       on_drop=lambda t: self.ledger.record(t.episode_id, "dropped_stale"),
                                       drop_stale=recipe.token_weights().trains("student"))

    def state_dict(self) -> RolloutState:
        """Taken in the event loop: the ledger's open episodes, counters without them."""
        return RolloutState(ledger=self.ledger.state_dict(), buffer=self.buffer.state_dict(),
                            runner=self.runner.state_dict(buffered=len(self.buffer.items)))

    def load_state_dict(self, state: RolloutState) -> None:
        self.ledger.load_state_dict(state.ledger)
        self.buffer.load_state_dict(state.buffer)
        self.runner.load_state_dict(state.runner)

    def start_playing(self, learning: Learning, stop: asyncio.Event) -> None:
        """Async mode: episodes keep coming while there is room in the buffer, until `stop`."""
        async def produce() -> None:
            while not stop.is_set():
                await self.buffer.admit()
                task = asyncio.create_task(self.play_one(self.ledger.draw(), learning))
                self.episode_tasks.add(task)
                task.add_done_callback(self.episode_tasks.discard)

        self.producer = asyncio.create_task(produce())

    async def play_batch(self, learning: Learning) -> None:
        """Sync mode: one batch of episodes, then back to the learner."""
        async def one() -> None:
            await self.buffer.admit()
            await self.play_one(self.ledger.draw(), learning)

        await asyncio.gather(*(one() for _ in range(self.cfg.rollout.batch_episodes)))

    async def stop_playing(self) -> None:
        """Cancel the producer and every episode in flight (they stay open in the ledger)."""
        tasks = [t for t in (self.producer, *self.episode_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.producer = None

    async def play_one(self, draw: Draw, learning: Learning) -> None:
        """One admitted episode, from its game to the buffer or the ledger."""
        from rose_ray.rollout.episode import EpisodeInterrupted, run_episode

        game = draw.game
        # The decay policy's draws follow the game's place in the (checkpointed) order, not timing.
        handoff_seed = f"{self.cfg.seed}/{draw.epoch}/{draw.position}/{game.item_id}"

        async def episode(g: GameId, slot: Any) -> Trajectory:
            return await run_episode(g, slot, self.student, self.teacher, self.episode_cfg, self.handoff,
                                     protocol=self.protocol, learner_step=learning.step,
                                     request_prefix=f"s{learning.step}/", handoff_seed=handoff_seed)
        try:
            t = await self.runner.play(game, episode)  # a cancel (a BaseException) passes through
        except RoleFailed:
            return  # the run is stopping: the episode stays open (in flight at the stop)
        except Exception as e:  # noqa: BLE001 - one bad episode must not stop the run
            role = self.engines.whose(e)
            error = f"{role + ': ' if role else ''}{describe_error(e)}"
            if not isinstance(e, EpisodeInterrupted):
                print(f"\ntrain: episode on {game.item_id} failed: {error}", flush=True)
            self.ledger.record(draw.episode_id, "failed", error=error)
            await self.buffer.fail()
            self.failed_in_a_row += 1
            limit = self.cfg.reliability.max_failed_in_a_row
            if limit and self.failed_in_a_row == limit:  # nothing works: stop, naming why, not draw on
                self.failures.report(RoleFailed(
                    f"{limit} episodes in a row failed, none finishing between them "
                    f"(reliability.max_failed_in_a_row={limit}); the last: {error}"))
            return
        self.failed_in_a_row = 0
        t.timing["finished_at"] = time.time()
        t.episode_id = draw.episode_id
        self.finished()
        await self.buffer.add(t, learning.learner.version)

    async def waiting(self) -> list[str]:
        """What the buffer, the episodes, the engines and the env pools wait on (the watchdog's report)."""
        from rose_ray.rollout.actors import ping_pools

        lines = [f"buffer: {len(self.buffer.items)} of {self.cfg.rollout.batch_episodes} episodes ready, "
                 f"{self.buffer.in_flight} in flight", *self.runner.waiting(), *await self.engines.describe()]
        return lines + (await ping_pools(self.pools) or [f"env pools: all {len(self.pools)} answer a ping"])

    async def env_health(self) -> list[dict[str, Any]]:
        """Each env worker's health; a hung pool costs its numbers, not the step."""
        try:
            return [h for hs in await asyncio.wait_for(asyncio.gather(
                *(p.health.remote() for p in self.pools)), 5) for h in hs]
        except Exception:  # noqa: BLE001
            return []


class Learning:
    """The learner group trained on the buffer's batches (`train`), its weights published to the
    student engine (`publish`), and to a replacement student engine before it serves."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.learner: LearnerGroup | None = None
        self.step = 0  # the loop's learner steps
        self.replies = {"replies": 0, "truncated": 0, "cut_before_action": 0}  # trained episodes' replies
        self.restarts = 0  # learner groups restarted in this process (reliability.max_restarts counts these)
        self.checkpointed_step: int | None = None  # the step whose checkpoint the learner's state is
        self.publish_config = cfg.publish  # a PublishConfig (rose_ray/publish/route.py): how the weights travel
        self.weights_ms = 0.0
        self.published: tuple[Any, int] | None = None  # (engine, learner version) last sent
        self.fallbacks = 0  # collectives given up for the object store (publish/fallbacks)

    def start(self, groups: PlacementGroups, student_path: str, rollouts: Rollouts, failures: Failures) -> None:
        from rose_ray.learner.learner import LearnerGroup
        from rose_ray.models import load_tokenizer
        from rose_ray.publish.group import nccl_env

        cfg = self.cfg
        nccl = {"runtime_env": {"env_vars": nccl_env()}} if cfg.learner.gpus_per_rank > 0 else {}
        self.learner = LearnerGroup(replace(cfg.learner, model=student_path),
                                    worker_options=lambda r: {**groups.options("learner ranks", r), **nccl})
        self.student, self.engines, self.failures = rollouts.student, rollouts.engines, failures
        rollouts.engines.on_start = self.engine_started
        self.token_weights = cfg.algorithm.token_weights()
        tok = load_tokenizer(student_path)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else rollouts.student.chat.eos_id

    def state_dict(self) -> LearningState:
        return LearningState(step=self.step, version=self.learner.version, replies=dict(self.replies))

    def load_state_dict(self, state: LearningState) -> None:
        """The counters; the learner's own state (its version too) comes from its folder."""
        self.step, self.replies = state.step, dict(state.replies)

    async def train(self, batch: list[Trajectory], call: Callable[..., Awaitable[Any]]) -> dict[str, float]:
        """One optimizer step on `batch` through `call` (Trainer.in_learner), logged to
        trajectories.jsonl."""
        from rose_ray.metrics import trained_scalars
        from rose_ray.tokens import loss_turns, make_batch, render, trained_tokens

        seqs = [render(t) for t in batch]
        made = make_batch(seqs, self.token_weights, self.cfg.learner.max_tokens, self.pad_id)
        metrics = await call(self.learner.train_step, made)
        self.step += 1
        flags = [loss_turns(seq, len(t.turns), self.token_weights) for t, seq in zip(batch, seqs)]
        metrics.update(trained_scalars(batch, flags, trained_tokens(seqs, self.token_weights)))
        with (self.run_dir / "trajectories.jsonl").open("a") as f:
            for t, loss in zip(batch, flags):  # `loss` per turn: did its tokens carry loss this step
                f.write(json.dumps({"step": self.step, **t.to_record(loss=loss)}) + "\n")
        for t in batch:
            self.replies["replies"] += t.rounds
            self.replies["truncated"] += t.truncated_turns
            self.replies["cut_before_action"] += t.cut_before_action
        return metrics

    def publish_now(self, engine: Any) -> None:
        """The learner's weights to `engine` (the student engine, or its replacement), now."""
        version = self.learner.version
        out = self.learner.publish_weights([engine], self.publish_config)
        self.weights_ms = out["total_ms"]
        self.published = (engine, version)
        if out.get("fallback"):
            # The object store from now on, a restarted learner group too (else it stalls again).
            self.fallbacks += 1
            self.publish_config = replace(self.publish_config, method="object_store", collective_backend="auto")
            print(f"\ntrain: weight publication: {out['fallback']}; version {version} and every later one go "
                  "through the object store (publish/fallbacks)", flush=True)

    async def publish(self) -> None:
        """To the serving student engine; one lost meanwhile is replaced first."""
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


class Evals:
    """The held-out games played by the student (or the teacher) alone, as `rose-ray eval --run`
    plays them (evaluate.training_evals), on env pools of their own; `dev`: `eval.every_n` games
    of the dev split."""

    def __init__(self, cfg: TrainConfig, rollouts: Rollouts) -> None:
        self.cfg, self.rollouts = cfg, rollouts
        self.history: dict[str, Any] = {"eval": []}
        self.pools: list[Any] = []

    def start(self, student_path: str) -> None:
        from rose_ray.evaluate import training_evals

        self.job, self.spec = training_evals(self.cfg, student_path)
        self.games = self.job.games()  # now: a bad split fails the start, not the last eval

    def state_dict(self) -> EvalState:
        return EvalState(history=copy.deepcopy(self.history))

    def load_state_dict(self, state: EvalState) -> None:
        self.history = copy.deepcopy(state.history)  # a copy: the state may be restored again

    @cached_property
    def runner(self) -> EpisodeRunner:
        """The evals' own env pools, started at the first eval."""
        from rose_ray.rollout.actors import start_env_pools
        from rose_ray.rollout.runner import EpisodeRunner

        env = replace(self.cfg.env, workers=1, resources=dict(self.cfg.env.resources))
        self.pools = start_env_pools(env, max_turns=self.cfg.eval.max_turns)
        return EpisodeRunner(self.pools, env.games_per_worker, engines=self.rollouts.engines)

    async def play(self, step: int, who: str) -> dict[str, float]:
        """`who` ("student", "teacher", or "dev": the student on the dev games) plays; the
        result goes to the history. Returns its numbers for the metrics: the held-out games' as
        `eval/`, the dev games' as `eval/dev_`, none for the teacher's (the before/after table's)."""
        from rose_ray.evaluate import game_record, summarise
        from rose_ray.rollout.play import Players, play

        agent = self.rollouts.teacher if who == "teacher" else self.rollouts.student
        dev = who == "dev"  # the student on `eval.every_n` games of the dev split
        games = replace(self.job, split="dev", n=self.cfg.eval.every_n).games() if dev else self.games
        played = await play(self.spec, games, players=Players(self.runner, agent, None),
                            protocols=self.rollouts.protocol, request_prefix="eval/")
        result = summarise([game_record(t) for t in played])["overall"]
        self.history["eval"].append({"step": step, "who": who, **result})
        if who == "teacher":
            return {}
        more = ("invalid_action_rate", "cut_before_action_rate") if dev else ()
        prefix = "eval/dev_" if dev else "eval/"
        return {prefix + k: result[k] for k in ("score", "success", "pass", *more)}


class Run:
    """One training run's components: `start` starts them in order, `close` ends what it got to."""

    student_path: str
    start_state: Checkpoint  # where "back to the latest checkpoint" goes without one

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool) -> None:
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.session = f"{cfg.name}-{os.urandom(3).hex()}"  # names its engines (a run folder is version_N)
        self.failures = Failures()
        self.groups: PlacementGroups | None = None
        self.rollouts = Rollouts(cfg, run_dir, self.failures)
        self.learning = Learning(cfg, run_dir)
        self.evals = Evals(cfg, self.rollouts)
        self.metrics: MetricsLogger | None = None
        self.restarts_before: dict[str, int] = {}  # per role, before a --resume

    def components(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in Checkpoint.parts()}

    def start(self) -> None:
        from rose_ray.metrics import MetricsLogger
        from rose_ray.placement import PlacementGroups, demands
        from rose_ray.rollout.actors import init_ray

        cfg = self.cfg
        self.clear_leftovers()
        init_ray(cfg.ray_address)
        prepare_cluster(cfg, self.run_dir)
        self.groups = PlacementGroups(demands(cfg), timeout_s=cfg.resources.placement_timeout_s)
        self.student_path, teacher_path = resolve_models(cfg)  # tiny models, the teacher warm-up
        self.evals.start(self.student_path)
        self.rollouts.start(self.groups, self.student_path, teacher_path, self.session, fresh=not self.resume)
        # The learner last: a bad engine or recipe fails in seconds, not after DeepSpeed's init.
        self.learning.start(self.groups, self.student_path, self.rollouts, self.failures)
        self.metrics = MetricsLogger(self.run_dir, cfg.logging.wandb, f"{cfg.name}/{self.run_dir.name}",
                                     yaml.safe_load(saved_config(cfg)))  # W&B's copy: no secrets, as config.yaml
        if not self.resume:
            (self.run_dir / "trajectories.jsonl").unlink(missing_ok=True)  # left by a run that never checkpointed
        self.start_state = self.checkpoint_state()
        self.start_state.rollouts.ledger["offset"] = 0
        if self.resume:
            self.resume_from_latest()

    # ----------------------------------------------------------------- checkpoints
    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoint_state(self) -> Checkpoint:
        """The loop's side of a checkpoint, taken in the event loop (nothing moves meanwhile)."""
        return Checkpoint(**{name: c.state_dict() for name, c in self.components().items()}, restarts=self.restarts())

    def save_checkpoint(self, state: Checkpoint) -> None:
        """`state` (taken in the event loop: `checkpoint_state`) beside the learner's folder."""
        learning = self.learning
        # Saved or loaded at this step already: only its record again.
        same_state = learning.checkpointed_step == learning.learner.step
        write_checkpoint(self.run_dir, state, learning.learner, self.cfg.keep_checkpoints, same_state)
        learning.checkpointed_step = learning.learner.step

    def clear_leftovers(self) -> None:
        """What a kill left in this run folder: rose_ray's temp files and folders, and checkpoint
        step folders without their mark."""
        from rose_ray.checkpoint import prune
        from rose_ray.files import clear_leftovers

        for line in clear_leftovers(self.run_dir, owned=True) + clear_leftovers(self.ckpt_dir, owned=True):
            print(f"train: {line}", flush=True)
        prune(self.ckpt_dir)  # none there yet: nothing to do

    def load_checkpoint(self, publish: bool = True) -> Checkpoint:
        """Back to the latest whole checkpoint (or the start, without one): the learner, each
        component's state, and the logs cut to match. Returns the record."""
        from rose_ray.rollout.ledger import keep_steps

        learning = self.learning
        if kept_steps(self.run_dir):  # a save cut short is not among them
            state = read_checkpoint(self.run_dir)  # the newest whose record reads (it says when it goes back)
            load_learner(learning.learner, self.run_dir, state.tag, "train --resume")
            learning.checkpointed_step = state.step
        else:
            state = self.start_state
            if self.resume:
                print(f"train: --resume: {self.run_dir} has no whole checkpoint: starting again from step 0", flush=True)
        for name, component in self.components().items():
            component.load_state_dict(getattr(state, name))
        for log in ("trajectories.jsonl", "metrics.jsonl"):  # steps after it are trained again
            keep_steps(self.run_dir / log, state.step)
        if publish:  # the student engine starts from the checkpoint's weights
            learning.publish_now(self.rollouts.student.engine)
        print(f"train: {self.run_dir} at step {state.step} (policy version {learning.learner.version}); "
              f"{len(self.rollouts.ledger.replay)} open episodes to play again", flush=True)
        return state

    def resume_from_latest(self, publish: bool = True) -> None:
        """`--resume`: back to the latest checkpoint, counting on from the restarts before it."""
        self.restarts_before = dict(self.load_checkpoint(publish).restarts)

    def restarts(self) -> dict[str, int]:
        """Replacements per role over the whole run: this process's plus those before a resume."""
        before = self.restarts_before
        now = {**self.rollouts.engines.restarts(), "learner": self.learning.restarts}
        return {role: before.get(role, 0) + now.get(role, 0) for role in {**before, **now}}

    # ----------------------------------------------------------------- model/ and the end
    def export_model(self) -> None:
        """The student as a Hugging Face folder, `<run_dir>/model/`, replaced atomically."""
        from rose_ray.export import MODEL_INFO, model_info

        learner = self.learning.learner
        info = model_info(self.cfg, self.run_dir, self.learning.step, learner.version, self.student_path)
        learner.export(self.run_dir / "model", {MODEL_INFO: info})

    def summary(self) -> dict[str, Any]:
        """What the run did (summary.json)."""
        evals, step, rollouts = self.evals.history["eval"], self.learning.step, self.rollouts
        student = [e for e in evals if e["who"] == "student"]
        return {
            "run_dir": str(self.run_dir), "steps": step, "version": self.learning.learner.version,
            "model": str(self.run_dir / "model"),
            "before": student[0] if student and student[0]["step"] == 0 else None,
            "after": student[-1] if student and student[-1]["step"] == step and step else None,
            "teacher": next((e for e in evals if e["who"] == "teacher"), None),
            "dev": [e for e in evals if e["who"] == "dev"],  # the eval.every curve
            "buffer": rollouts.buffer.counters.as_dict(), "runner": rollouts.runner.counters.as_dict(),
            "replies": self.learning.replies,
            "accounting_holds": rollouts.buffer.accounting_holds(),
            "restarts": self.restarts(),
            "episodes": dict(rollouts.ledger.outcomes),  # outcomes in episodes.jsonl
        }

    def close(self) -> None:
        """Ends what `start` started, as far as it got."""
        from rose_ray.rollout.actors import close_pools, stop_agents

        close_pools(self.rollouts.pools + self.evals.pools)
        stop_agents(self.rollouts.student, self.rollouts.teacher)
        for part, end in ((self.learning.learner, "shutdown"), (self.groups, "remove"),
                          (self.metrics, "close"), (self.rollouts.ledger, "close")):
            if part is not None:
                getattr(part, end)()


def prepare_cluster(cfg: TrainConfig, run_dir: Path) -> None:
    """Before any actor starts: shared storage checked, hub models downloaded once, and
    (resources.check_placement) the cluster checked to hold every role."""
    from rose_ray.models import download_model, hub_cache, is_hub_id
    from rose_ray.placement import check_cluster, check_shared_storage

    shared = {"run_dir": run_dir}
    if any(e.model.startswith("tiny:") for e in (cfg.student_engine, cfg.teacher_engine)) or \
            cfg.teacher_warmup.enabled or cfg.student_warmup.enabled:
        shared["tiny_dir (ROSE_RAY_CACHE)"] = Path(cfg.tiny_dir)
    hub_ids = [e.model for e in (cfg.student_engine, cfg.teacher_engine) if not e.spec.served and is_hub_id(e.model)]
    if hub_ids:
        # Every node reads the driver's one download, so the cache must be shared; the marker
        # goes into `.locks`, the one entry `hf cache ls` passes over.
        shared["HF_HOME (the Hugging Face cache)"] = Path(hub_cache()) / ".locks"
    for line in check_shared_storage(shared):
        print(line, flush=True)
    for name in dict.fromkeys(hub_ids):  # before any actor starts, with the client's progress bars
        download_model(name, "train")
    if cfg.resources.check_placement:  # fail now, naming the role, rather than wait forever
        check_cluster(cfg, use_total=True)


def results_table(summary: dict[str, Any]) -> str:
    lines = ["| model | games | Score | Success | Pass |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, key in (("student before", "before"), ("student after", "after"), ("teacher", "teacher")):
        if (r := summary[key]) is not None:
            lines.append(f"| {name} | {r['games']} | {r['score']:.4f} | {r['success']:.3f} | {r['pass']:.3f} |")
    return "\n".join(lines)
