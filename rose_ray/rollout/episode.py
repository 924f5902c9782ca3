"""One episode: the student acts until the turn policy (handoff.py) hands over, then the teacher
plays to the end, in the same game and conversation. `run_episode` is the ROSE rollout; what it
changes as it plays is one `Episode`. Every Ray call is awaited, so many episodes share one
event loop.
"""

from __future__ import annotations

import time
from typing import Any

from rose_ray.envs.base import StepResult
from rose_ray.envs.protocol import ParsedAction, Protocol, parse_action, strip_thinking
from rose_ray.envs.worlds import get_world
from rose_ray.errors import InputError
from rose_ray.inference.engine import GenerationRequest
from rose_ray.rollout.agent import Agent, EnvSlot, EpisodeConfig
from rose_ray.rollout.conversation import Conversation, TextReply, View
from rose_ray.rollout.handoff import TurnPolicy, TurnState
from rose_ray.types import GameId, Trajectory, Turn


class ReplayMismatch(InputError):
    """A replayed prefix's observation differs from the recorded one."""


class EpisodeInterrupted(RuntimeError):
    """The game's process died or hung; the episode must be restarted from its first turn."""


class Episode:
    """One episode's state as it is played; `step` and `generate` are its timed calls to the
    game and the engines."""

    def __init__(self, game: GameId, env: EnvSlot, protocol: Protocol, student: Agent, teacher: Agent | None) -> None:
        self.started = time.perf_counter()
        self.timing = {"env_s": 0.0, "student_s": 0.0, "teacher_s": 0.0, "teacher_score_s": 0.0}
        self.game, self.env, self.protocol = game, env, protocol
        self.conv = Conversation(protocol, student, teacher)
        # Counts over the replies played now (not replayed); indices of every reply the game did
        # not accept or that repeated the action before.
        self.invalid = self.truncated = self.cut_before_action = 0
        self.invalid_turns: list[int] = []
        self.repeated_turns: list[int] = []
        self.first: StepResult | None = None  # the game loaded
        self.last: StepResult | None = None
        self.last_action: str | None = None
        self.done, self.end_reason = False, "turn_limit"
        self.handoff_state: dict[str, bool] | None = None
        self.expert: dict[str, Any] | None = None  # an expert teacher's record (`generate`)

    async def step(self, action: str | None) -> None:
        """The game's answer to an action (None: load the game) becomes `last` and joins the conversation."""
        t0 = time.perf_counter()
        call = ("reset", self.game) if action is None else ("step", action)
        result = await self.env.call(*call)
        self.timing["env_s"] += time.perf_counter() - t0
        if result.interrupted:
            error = result.info.get("error", "")
            raise EpisodeInterrupted(f"episode on {self.game.item_id} interrupted: {error}")
        self.conv.add_text("user", result.observation)
        if action is None:
            self.first = result
        self.last = result

    async def generate(self, owner: str, request: GenerationRequest) -> Any:
        """The reply of the agent playing `owner`; an expert's from the slot (None: no plan)."""
        t0 = time.perf_counter()
        if self.conv.agent(owner).expert:
            reply = await self.env.call("expert_reply")
            result = None if reply.text is None else TextReply(reply.text)
            if self.expert is None:  # what it had at the handoff
                self.expert = {"planned": reply.planned, "verified": reply.verified, "plan_s": 0.0}
            self.expert.update(status=reply.status, replans=reply.replans,
                               plan_s=self.expert["plan_s"] + reply.plan_s)
        else:
            result = await self.conv.agent(owner).engine.generate.remote(request)
        self.timing[f"{owner}_s"] += time.perf_counter() - t0
        return result

    async def hand_over(self) -> None:
        """At the handoff: which parts of the game's state differ from the state at load."""
        t0 = time.perf_counter()
        state = await self.env.call("state")
        self.timing["env_s"] += time.perf_counter() - t0
        initial, now = state.get("initial") or {}, state.get("now") or {}
        if initial and now:
            differs = {k: initial[k] != now.get(k) for k in initial}
            self.handoff_state = {**differs, "changed": any(differs.values())}

    def record(self, parsed: ParsedAction, played: Turn | None = None) -> bool:
        """The reply just sent and the game's answer (`last`); `played`: its turn if sampled now.
        Whether it failed: not accepted, or a repeat of the action before."""
        bad = not parsed.valid_format or self.protocol.is_invalid(self.last.observation)
        repeated = parsed.action == self.last_action
        at = len(self.conv.turns) - 2  # the reply's index in the turns
        if bad:
            self.invalid_turns.append(at)
        if repeated:
            self.repeated_turns.append(at)
        if played is not None:
            self.invalid += bad
            self.truncated += played.truncated
            self.cut_before_action += played.truncated and not parsed.valid_format
        self.last_action = parsed.action
        if self.last.done:
            self.done, self.end_reason = True, self.last.end_reason
        return bad or repeated


async def run_episode(
    game: GameId,
    env: EnvSlot,
    student: Agent,
    teacher: Agent | None,
    config: EpisodeConfig,
    handoff: TurnPolicy,
    protocol: Protocol | None = None,
    learner_step: int = 0,
    request_prefix: str = "",
    replay: list[Turn] | None = None,
    handoff_seed: str | None = None,
) -> Trajectory:
    """Play one game; the Trajectory's token ids are in the student's tokenizer. `replay`: a
    recorded conversation's turns after the opening, replayed first (`replay_prefix`).
    `handoff_seed` seeds the `decay` policy's draws (default: the item id)."""
    protocol = protocol or get_world(game.world).protocol
    if teacher is None and handoff.needs_teacher:
        raise ValueError(f"handoff policy {handoff.policy} needs a teacher")
    episode = Episode(game, env, protocol, student, teacher)
    conv = episode.conv
    # No teacher: the student plays on whatever the policy says (eval without a teacher).
    state = TurnState(learner_step, handoff_seed if handoff_seed is not None else game.item_id)
    p = handoff.takeover_p(learner_step) if teacher is not None else None
    await episode.step(None)  # the game loads: its first observation
    replayed = await replay_prefix(episode, replay) if replay else 0
    handoff_turn: int | None = None
    for turn in range(replayed + 1, config.max_turns + 1):
        if episode.done:
            break
        if teacher is not None and handoff_turn is None and handoff.takes_over(turn, state):
            handoff_turn = turn  # the teacher acts from this turn to the end
            await episode.hand_over()
        owner = "student" if handoff_turn is None else "teacher"
        sampling = config.teacher_sampling if owner == "teacher" else config.student_sampling
        prompt = conv.prompt_for(owner, sampling.max_new_tokens)
        if prompt is None:  # no cut fits this agent's context
            episode.end_reason = "context"
            break
        result = await episode.generate(owner, GenerationRequest(
            prompt, sampling.for_turn(game.item_id, turn),  # a seed: this turn's own
            request_id=f"{request_prefix}{game.item_id}/t{turn}"))
        if result is None or result.finish_reason == "context":  # None: an expert with no plan from here
            episode.end_reason = "no_plan" if result is None else "context"
            break
        reply = conv.add_reply(owner, result)
        parsed = parse_action(result.text)
        await episode.step(parsed.action)
        failed = episode.record(parsed, reply)
        if owner == "student":
            state.student_failed = failed

    # The played replies, before a report turn joins them.
    rounds = sum(1 for t in conv.turns if t.role == "assistant" and t.owner != "prompt")
    if handoff_turn is not None and handoff_turn > rounds:
        handoff_turn = None  # the episode ended before the teacher acted
    if teacher is not None and teacher.expert and episode.expert is None and episode.last.raw_score < 0:
        episode.expert = {"planned": False, "verified": False, "status": "unwinnable"}  # lost before the handoff
    report, report_turns = None, []
    if config.report != "off" and protocol.report_question:
        report, report_turns = await ask_report(protocol.report_question, conv, config,
                                                f"{request_prefix}{game.item_id}/report", episode.timing)
        if config.report == "train":
            conv.turns[-1:] = report_turns  # the last observation with the question, then the answer
    if config.score_student_with_teacher and teacher is not None and conv.shared:
        await score_student_tokens(conv.turns, conv.cut, teacher, episode.timing)
    (turns, cut), last = conv.for_learner(), episode.last  # the turns as the learner reads them
    episode.timing["total_s"] = time.perf_counter() - episode.started
    versions = [t.policy_version for t in turns if t.owner == "student" and t.policy_version is not None]
    return Trajectory(
        game=game, turns=turns, score=float(last.score), raw_score=int(last.raw_score),
        success=bool(last.success), rounds=rounds, handoff_turn=handoff_turn,
        student_version=min(versions) if versions else None, done=episode.done, end_reason=episode.end_reason,
        context_cut=cut, invalid_actions=int(episode.invalid), truncated_turns=int(episode.truncated),
        cut_before_action=int(episode.cut_before_action), invalid_turns=episode.invalid_turns,
        repeated_turns=episode.repeated_turns, handoff_p=p, timing=episode.timing, report=report,
        report_turns=report_turns, handoff_seed=state.seed if p is not None else None,
        scoring={**(episode.first.info.get("scoring") or {}), **(last.info.get("scoring") or {})},
        handoff_state=episode.handoff_state if handoff_turn is not None else None, expert=episode.expert,
    )


# The report turn: after the last observation, the agent that acted last is asked what it
# discovered (DiscoveryWorld scores the answer as knowledge); no step in the game. The question
# joins the last user turn, whose ids already end with the generation prompt.
async def ask_report(question: str, conv: Conversation, config: EpisodeConfig, request_id: str,
                     timing: dict[str, float]) -> tuple[str, list[Turn]]:
    """(the answer without think blocks, [the last observation with the question, the reply])
    in the student's ids; with no room for a reply, an empty answer and the question alone."""
    turns = conv.turns
    last = turns[-1]
    if last.role != "user":
        raise ValueError("the report question follows an observation (a user turn)")
    last_owner = next((t.owner for t in reversed(turns) if t.role == "assistant" and t.owner != "prompt"), "student")
    owner = "teacher" if conv.teacher is not None and last_owner == "teacher" else "student"
    text = f"{last.text.rstrip()}\n\n{question}"  # the last observation, then the question
    ask = Turn("user", text, last.owner, conv.student.chat.user_ids(text))
    view = conv.views[owner]  # the asking agent reads the question in its own ids
    asked = View(view.chat, view.turns[:-1] + [view.text_turn("user", text, last.owner)], view.cache).rendered()
    sampling = config.teacher_sampling if owner == "teacher" else config.student_sampling
    t0 = time.perf_counter()
    # The conversation's cut, recorded when the learner trains on the answer (report "train").
    prompt = conv.prompt_for(owner, sampling.max_new_tokens, asked, record=config.report == "train")
    result = None if prompt is None else await conv.agent(owner).engine.generate.remote(
        GenerationRequest(prompt, sampling.for_turn(request_id, "report"), request_id=request_id))
    timing["report_s"] = time.perf_counter() - t0
    if result is None or result.finish_reason == "context":  # no room for a reply
        return "", [ask]
    reply = conv.views["student"].reply_turn(owner, result, sampled=view is conv.views["student"])
    return strip_thinking(result.text).strip(), [ask, reply]


async def replay_prefix(episode: Episode, replay: list[Turn]) -> int:
    """Send a recorded conversation's replies (the first observation, then reply/observation
    pairs) to the game again, each answer checked with `Protocol.same_observation`
    (`ReplayMismatch` otherwise). Returns how many replies were replayed."""
    _check_observation(episode, 0, replay[0].text)
    pairs = list(zip(replay[1::2], replay[2::2]))
    for n, (reply, expected) in enumerate(pairs, 1):
        episode.conv.add_text("assistant", reply.text, reply.owner, reply.truncated)
        parsed = parse_action(reply.text)
        await episode.step(parsed.action)
        _check_observation(episode, n, expected.text)
        episode.record(parsed)
    return len(pairs)


async def score_student_tokens(turns: list[Turn], cut: list[int], teacher: Agent, timing: dict[str, float]) -> None:
    """OPD: the teacher's logprob of every student token, in one pass over the conversation as
    the learner sees it (less the recorded cut)."""
    left_out = set(cut)
    spans, ids = [], []
    for i, t in enumerate(turns):
        if i not in left_out:
            spans.append((t, len(ids), len(ids) + len(t.token_ids)))
            ids += t.token_ids
    scored = [(t, a, b) for t, a, b in spans if t.role == "assistant" and t.owner == "student" and b > a]
    if not scored:
        return
    start, end = scored[0][1], scored[-1][2]
    t0 = time.perf_counter()
    logprobs = await teacher.engine.score.remote(ids[:start], ids[start:end])
    timing["teacher_score_s"] += time.perf_counter() - t0
    timing["teacher_scored_tokens"] = float(end)  # what the teacher read
    for t, a, b in scored:
        t.teacher_logprobs = logprobs[a - start : b - start]


def _check_observation(episode: Episode, turn: int, expected: str) -> None:
    got = episode.last.observation
    if not episode.protocol.same_observation(expected, got):
        raise ReplayMismatch(f"{episode.game.item_id}: observation after turn {turn} differs from the record: "
                             f"expected {expected.strip()[:80]!r}, got {got.strip()[:80]!r}")


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers give the same ids (then OPD and shared id lists work)."""
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab())
