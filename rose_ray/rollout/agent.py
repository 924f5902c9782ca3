"""Who plays an episode and under what settings: an `Agent`, the `EnvSlot` it plays in, and
the `EpisodeConfig` (apart from episode.py so that conversation.py imports them without a circle).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rose_ray.rollout.context import ContextSettings
from rose_ray.types import REPORT_MODES, SamplingParams

if TYPE_CHECKING:
    from rose_ray.chat import ChatFormat

EXPERT = "expert"  # the teacher named where an engine config would be: the world's expert


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
    """One slot of an EnvPool actor; it remembers what its episode waits on (the watchdog's report)."""

    def __init__(self, pool: Any, slot: int, pool_index: int = 0) -> None:
        self.pool, self.slot, self.pool_index = pool, slot, pool_index
        self.waiting: str | None = None  # the call out now ("reset", "step", "expert reply", "state")
        self.since = time.monotonic()

    async def call(self, method: str, *args: Any) -> Any:
        """`pool.<method>(slot, *args)`: reset, step, expert_reply (the world's expert's ExpertReply)
        or state (the game's fingerprint: {"initial": ..., "now": ...})."""
        self.waiting, self.since = method.replace("_", " "), time.monotonic()
        try:
            return await getattr(self.pool, method).remote(self.slot, *args)
        finally:
            self.waiting, self.since = None, time.monotonic()


@dataclass
class Agent:
    """An engine actor, its tokenizer's chat format, and its engine's context settings."""

    engine: Any
    chat: ChatFormat
    name: str = ""
    context: ContextSettings = ContextSettings()
    spawn: Any = None  # spawn(generation): a replacement engine actor (EngineSupervisor)
    expert: bool = False  # the world's expert writes the replies (`expert_agent`)


def expert_agent(student: Agent) -> Agent:
    """The world's expert teacher as an agent: no engine (an episode asks the EnvPool slot for
    its reply); its text joins in the student's ids and its context is the student's, so the
    learner gets the rows a model teacher with the student's context would give."""
    return Agent(engine=None, chat=student.chat, name="expert", context=student.context, expert=True)
