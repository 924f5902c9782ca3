"""Who plays an episode and under what settings: an `Agent` (an engine actor, its chat format
and its context settings), the `EnvSlot` it plays in, and the `EpisodeConfig`. Kept apart from
the loop (episode.py) so the conversation and the report turn can import them without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rose_ray.types import CONTEXT_TOKENS, GameId, SamplingParams

if TYPE_CHECKING:
    from rose_ray.chat import ChatFormat

REPORT_MODES = ("ask", "train", "off")


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


@dataclass
class Agent:
    """An engine actor, the chat format of its tokenizer, and its context settings: its
    engine's (`EngineConfig`: context_tokens, context_policy, keep_first_turns), with which the
    conversation cuts this agent's prompts (`Conversation.prompt_for`)."""

    engine: Any
    chat: ChatFormat
    name: str = ""
    keep_first_turns: int = 1  # turns after the opening the context policy never drops
    context_tokens: int = CONTEXT_TOKENS  # prompt + reply
    context_policy: str = "drop_oldest"
    # spawn(generation): a replacement engine actor, same config, resources and placement
    # (set by start_agents; the run's EngineSupervisor swaps it in when `engine` is lost).
    spawn: Any = None
