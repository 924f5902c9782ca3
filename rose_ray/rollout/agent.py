"""Who plays an episode and under what settings: an `Agent` (an engine actor, its chat format
and its context settings; or the world's expert teacher: `expert_agent`), the `EnvSlot` it plays
in, and the `EpisodeConfig`. Kept apart from the loop (episode.py) so the conversation and the
report turn can import them without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rose_ray.rollout.context import ContextSettings
from rose_ray.types import REPORT_MODES, GameId, SamplingParams

if TYPE_CHECKING:
    from rose_ray.chat import ChatFormat

# The teacher named where an engine config would be (start_agents, PlaySpec.teacher):
# the world's expert teacher (`expert_agent`).
EXPERT = "expert"


@dataclass
class EpisodeConfig:
    max_turns: int = 10
    student_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=1.0, max_new_tokens=512))
    teacher_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_new_tokens=512))
    score_student_with_teacher: bool = False  # OPD: teacher logprobs of every student token
    # The world's report question after the last observation (DiscoveryWorld): "ask" records
    # the answer on the Trajectory, "train" also adds it to the turns the learner sees, "off".
    report: str = "ask"

    def __post_init__(self) -> None:
        if self.report not in REPORT_MODES:
            raise ValueError(f"report: must be one of {REPORT_MODES}, got {self.report!r}")


class EnvSlot:
    """One slot of an EnvPool actor."""

    def __init__(self, pool: Any, slot: int) -> None:
        self.pool, self.slot = pool, slot

    async def reset(self, game: GameId):
        return await self.pool.reset.remote(self.slot, game)

    async def step(self, action: str):
        return await self.pool.step.remote(self.slot, action)

    async def expert_reply(self):
        """The world's expert teacher's next reply in this slot's episode (an ExpertReply)."""
        return await self.pool.expert_reply.remote(self.slot)

    async def state(self) -> dict[str, Any]:
        """The game's state fingerprint at load and now ({"initial": ..., "now": ...})."""
        return await self.pool.state.remote(self.slot)


@dataclass
class Agent:
    """An engine actor, the chat format of its tokenizer, and its context (its engine's:
    `ContextSettings.of`), with which the conversation cuts this agent's prompts."""

    engine: Any
    chat: ChatFormat
    name: str = ""
    context: ContextSettings = ContextSettings()
    # spawn(generation): a replacement engine actor, same config, resources and placement
    # (set by start_agents; the run's EngineSupervisor swaps it in when `engine` is lost).
    spawn: Any = None
    # "engine": its engine actor writes its replies from the prompt's ids; "expert": the world's
    # expert teacher writes them from the game (no engine, no logprobs: `expert_agent`)
    kind: str = "engine"

    @property
    def expert(self) -> bool:
        return self.kind == "expert"


def expert_agent(student: Agent) -> Agent:
    """The world's expert teacher as an agent (envs/sciworld/expert.py). It needs the game, not
    the text, so it sits beside the game in the EnvPool slot, and an episode asks the slot for
    its reply instead of an engine (the engine contract, prompt ids in and ids and logprobs out,
    stays as it is). Its text joins the conversation in the student's ids, as a model teacher's
    with another tokenizer does, and its context is the student's: the episode cuts the
    conversation for it as it would for a model teacher with the student's context, so the
    learner gets the same rows either way."""
    return Agent(engine=None, chat=student.chat, name="expert", context=student.context, kind="expert")
