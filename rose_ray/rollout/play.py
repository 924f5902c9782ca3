"""`play(spec, games)`: games played to their ends, the one way every command plays them (eval,
collect, continue, a training run's evals, the warm-ups' openings, the benches). What to play is
a `PlaySpec`; each command's settings become one in one place (commands.py's `play_spec`s and
`training_play`), so a setting reaches every caller alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from rose_ray.envs import DEFAULT_WORLD
from rose_ray.rollout.agent import EXPERT, Agent, EpisodeConfig
from rose_ray.rollout.handoff import StudentOnly, TurnPolicy
from rose_ray.types import GameId, SamplingParams, Trajectory, Turn

if TYPE_CHECKING:
    from rose_ray.envs.protocol import Protocol
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.rollout.runner import EpisodeRunner


@dataclass
class PlaySpec:
    """What to play: who plays and who acts at each turn (`handoff`), for how many turns, with
    what sampling, chat and opening, on which world, how many at once (the context is each
    engine's own)."""

    student: EngineConfig  # plays the student's turns (with the expert teacher: lends it its tokenizer)
    teacher: EngineConfig | str | None = None  # a model's engine, EXPERT, or None (the student alone)
    handoff: TurnPolicy = field(default_factory=StudentOnly)
    max_turns: int | None = None  # None: each game ends at its world's own limit (catalogue.turn_limit)
    student_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(0.0))
    teacher_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(0.0))
    report: str = "off"  # the world's report question when a game ends (types.REPORT_MODES)
    enable_thinking: bool = False  # the chat templates' thinking switch
    history: str = "template"  # how earlier turns are rendered (chat.HISTORIES)
    world: str = DEFAULT_WORLD
    mapping: str | None = None  # the world's item-id mapping (None: its default)
    instruction_from: str | None = None  # a dataset whose first row gives the opening (None: the world's)
    concurrency: int = 8  # episodes at once
    env_workers: int = 1  # game processes, sharing `concurrency`

    def engines(self, student: str = "--model", teacher: str = "--teacher") -> dict[str, EngineConfig]:
        """The engines to start, by the flag naming each (a teacher that is the student is one)."""
        out = {student: self.student}
        if self.teacher not in (None, EXPERT, self.student):
            out[teacher] = self.teacher
        return out

    def protocol(self) -> Protocol:
        """The world's protocol, with the opening of `instruction_from` when set (a bad file: InputError)."""
        from rose_ray.envs.worlds import world_protocol

        return world_protocol(self.world, self.instruction_from)


class Players(NamedTuple):
    """Who plays: an episode runner (env pool slots) and the student's and the teacher's agents."""

    runner: EpisodeRunner
    student: Agent
    teacher: Agent | None


async def play(spec: PlaySpec, games: list[GameId], *, players: Players | None = None,
               protocols: Protocol | list[Protocol] | None = None, replays: list[list[Turn]] | None = None,
               on_done: Callable[[int, Trajectory], None] | None = None, skip: tuple[type[Exception], ...] = (),
               request_prefix: str = "") -> list[Trajectory | Exception]:
    """Play every game to its end, concurrently over the players' slots (None: the spec's own,
    `local_players`); the trajectories in game order. `protocols`: one, or one per game;
    `replays[i]`: turns game i replays first; `on_done(i, t)` as game i finishes. An episode
    that raises one of `skip` gets that exception in its place."""
    from rose_ray.envs.worlds import get_world
    from rose_ray.rollout.episode import run_episode

    protocols = spec.protocol() if protocols is None else protocols
    per_game = protocols if isinstance(protocols, list) else [protocols] * len(games)
    max_turns = spec.max_turns or max((get_world(spec.world).catalogue(spec.mapping).turn_limit(g) for g in games),
                                      default=1)
    config = EpisodeConfig(max_turns=max_turns, student_sampling=spec.student_sampling,
                           teacher_sampling=spec.teacher_sampling, report=spec.report)

    async def one(i: int, game: GameId) -> Trajectory | Exception:
        async def episode(g: GameId, slot: Any) -> Trajectory:
            return await run_episode(g, slot, players.student, players.teacher, config, spec.handoff,
                                     protocol=per_game[i], request_prefix=request_prefix,
                                     replay=replays[i] if replays else None)
        try:
            t = await players.runner.play(game, episode)
        except skip as e:
            return e
        if on_done is not None:
            on_done(i, t)
        return t

    with local_players(spec, len(games)) if players is None else nullcontext(players) as players:
        return list(await asyncio.gather(*(one(i, g) for i, g in enumerate(games))))


@contextmanager
def local_players(spec: PlaySpec, games: int) -> Iterator[Players]:
    """The spec's players for `games` games (env pools and engine actors), ended on the way out."""
    import ray

    from rose_ray.envs.config import EnvConfig
    from rose_ray.rollout import actors
    from rose_ray.rollout.runner import EpisodeRunner

    env = EnvConfig(workers=spec.env_workers, mapping=spec.mapping, world=spec.world, cpus_per_worker=0.5,
                    games_per_worker=max(1, -(-min(spec.concurrency, games) // spec.env_workers)))
    actors.init_ray()
    pools = actors.start_env_pools(env, max_turns=spec.max_turns)
    agents: tuple[Agent | None, Agent | None] = (None, None)
    # An engine that computes gets a CPU, or its share of what the env pools leave (else on a
    # 2-core machine the second engine would never start); a served model's client gets none.
    computing = {id(c) for c in (spec.student, spec.teacher) if c not in (None, EXPERT) and c.spec.local}
    left = ray.cluster_resources().get("CPU", 1.0) - env.workers * env.cpus_per_worker
    share = min(1.0, max(left, 0.25) / max(len(computing), 1))
    cpus = [share if id(c) in computing else 0.0 for c in (spec.student, spec.teacher)]
    try:
        agents = actors.start_agents(spec.student, spec.teacher, *cpus, enable_thinking=spec.enable_thinking,
                                     history=spec.history)
        yield Players(EpisodeRunner(pools, env.games_per_worker), agents[0], agents[1])
    finally:
        actors.close_pools(pools)
        actors.stop_agents(*agents)
