"""One episode: the student acts for turns 1..K, then the teacher takes over, in the same game
and the same conversation. Read top to bottom, this is the ROSE rollout. Who acts when is the
recipe's turn policy (rollout/handoff.py), asked before each turn the student would play.

Episodes talk to an EnvPool slot and to engine actors through Ray; every call is awaited,
so many episodes run concurrently in one event loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rose_ray.envs.protocol import Protocol, parse_action
from rose_ray.envs.worlds import get_world
from rose_ray.errors import InputError
from rose_ray.inference.engine import GenerationRequest
from rose_ray.rollout.agent import Agent, EnvSlot, EpisodeConfig
from rose_ray.rollout.conversation import Conversation
from rose_ray.rollout.handoff import TurnPolicy, TurnState
from rose_ray.rollout.report import ask_report
from rose_ray.types import GameId, Trajectory, Turn


@dataclass
class Replies:
    """What the episode's replies did, for the Trajectory: those the game did not accept and
    those that repeated the action before them (indices in the conversation's turns, replayed
    replies flagged as when they were played), and the played ones cut at max_new_tokens."""

    invalid: int = 0  # played replies the game did not accept
    truncated: int = 0
    cut_before_action: int = 0  # truncated before an action could be read
    invalid_turns: list[int] = field(default_factory=list)
    repeated_turns: list[int] = field(default_factory=list)

    def add(self, at: int, parsed: Any, bad: bool, repeated: bool, played: Turn | None = None) -> None:
        """The reply at `at` in the turns; `played`: its turn when the engine sampled it now."""
        if bad:
            self.invalid_turns.append(at)
        if repeated:
            self.repeated_turns.append(at)
        if played is not None:
            self.invalid += bad
            self.truncated += played.truncated
            self.cut_before_action += played.truncated and not parsed.valid_format


class ReplayMismatch(InputError):
    """A replayed prefix's observation differs from the recorded one."""


class EpisodeInterrupted(RuntimeError):
    """The game's process died or hung; the episode must be restarted from its first turn."""

    def __init__(self, game: GameId, detail: str = "") -> None:
        super().__init__(f"episode on {game.item_id} interrupted: {detail}")
        self.game = game


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
    """Play one game; the returned Trajectory's token ids are in the student's tokenizer.

    With `replay` (a recorded conversation's turns after the opening: first observation,
    then action/observation pairs), the recorded actions are replayed first and every
    observation is checked against the record (`ReplayMismatch` otherwise); the episode then
    continues from there under the handoff policy.

    `handoff_seed` seeds the `decay` policy's draws (default: the item id); a run passes one
    per episode, made from its seed and the episode's place in the game order.
    """
    protocol = protocol or get_world(game.world).protocol
    t_start = time.perf_counter()
    timing = {"env_s": 0.0, "student_s": 0.0, "teacher_s": 0.0, "teacher_score_s": 0.0}
    if teacher is None and handoff.needs_teacher:
        raise ValueError(f"handoff policy {handoff.policy} needs a teacher")
    # No teacher: the student plays on whatever the policy says (eval without a teacher).
    state = TurnState(learner_step, handoff_seed if handoff_seed is not None else game.item_id)
    p = handoff.takeover_p(learner_step) if teacher is not None else None
    conv = Conversation(protocol, student, teacher)

    async def step(action: str | None) -> Any:
        """The game's answer to an action (None: the game loaded), into the conversation."""
        t0 = time.perf_counter()
        result = await env.reset(game) if action is None else await env.step(action)
        timing["env_s"] += time.perf_counter() - t0
        if result.interrupted:
            raise EpisodeInterrupted(game, result.info.get("error", ""))
        conv.add_observation(result.observation)
        return result

    last = first = await step(None)  # the latest observation: its scores are the episode's
    scoring = dict(first.info.get("scoring") or {})
    handoff_turn: int | None = None
    replies = Replies()
    last_action, done, end_reason, replayed = None, False, "turn_limit", 0
    if replay:  # the recorded replies first, each observation checked against the record
        _check_observation(game, 0, replay[0].text, first.observation)
        for replayed, (reply, expected) in enumerate(zip(replay[1::2], replay[2::2]), 1):
            conv.add_recorded(reply)
            parsed = parse_action(reply.text)
            last = await step(parsed.action)
            _check_observation(game, replayed, expected.text, last.observation)
            replies.add(len(conv.turns) - 2, parsed, not parsed.valid_format or protocol.is_invalid(last.observation),
                        parsed.action is not None and parsed.action == last_action)
            last_action = parsed.action
            if last.done:
                done, end_reason = True, last.end_reason
    for turn in range(replayed + 1, config.max_turns + 1):
        if done:
            break
        if teacher is not None and handoff_turn is None and handoff.takes_over(turn, state):
            handoff_turn = turn  # the teacher acts from this turn to the end
        owner = "student" if handoff_turn is None else "teacher"
        sampling = config.teacher_sampling if owner == "teacher" else config.student_sampling
        prompt = conv.prompt_for(owner, sampling.max_new_tokens)
        if prompt is None:  # no cut fits this agent's context
            end_reason = "context"
            break
        request = GenerationRequest(prompt, sampling.for_turn(game.item_id, turn),  # a seed: this turn's own
                                    request_id=f"{request_prefix}{game.item_id}/t{turn}")
        t0 = time.perf_counter()
        result = await conv.agent(owner).engine.generate.remote(request)
        timing[f"{owner}_s"] += time.perf_counter() - t0
        if result.finish_reason == "context":
            end_reason = "context"
            break
        reply = conv.add_reply(owner, result)
        parsed = parse_action(result.text)
        last = await step(parsed.action)
        bad = not parsed.valid_format or protocol.is_invalid(last.observation)
        replies.add(len(conv.turns) - 2, parsed, bad, parsed.action is not None and parsed.action == last_action, reply)
        if owner == "student":
            state.student_failed = bad or parsed.action == last_action
        last_action = parsed.action
        if last.done:
            done, end_reason = True, last.end_reason

    rounds = conv.rounds()
    if handoff_turn is not None and handoff_turn > rounds:
        handoff_turn = None  # the episode ended before the teacher acted
    scoring.update(last.info.get("scoring") or {})
    report, report_turns = None, []
    if config.report != "off" and protocol.report_question:
        report, report_turns = await ask_report(protocol.report_question, conv, config,
                                                f"{request_prefix}{game.item_id}/report", timing)
        if config.report == "train":
            conv.turns[-1:] = report_turns  # the last observation with the question, then the answer
    if config.score_student_with_teacher and teacher is not None and conv.shared:
        await score_student_tokens(conv.turns, conv.cut, teacher, timing)
    turns = conv.for_learner()
    timing["total_s"] = time.perf_counter() - t_start
    versions = [t.policy_version for t in turns if t.owner == "student" and t.policy_version is not None]
    return Trajectory(
        game=game, turns=turns, score=float(last.score), raw_score=int(last.raw_score), success=bool(last.success),
        rounds=rounds, handoff_turn=handoff_turn, student_version=min(versions) if versions else None,
        done=done, end_reason=end_reason, context_cut=conv.cut, invalid_actions=int(replies.invalid),
        truncated_turns=int(replies.truncated), cut_before_action=int(replies.cut_before_action),
        invalid_turns=replies.invalid_turns, repeated_turns=replies.repeated_turns,
        handoff_p=p, handoff_seed=state.seed if p is not None else None, timing=timing,
        report=report, report_turns=report_turns, scoring=scoring,
    )


async def score_student_tokens(turns: list[Turn], cut: list[int], teacher: Agent, timing: dict[str, float]) -> None:
    """OPD: the teacher's logprob of every student token (the end-of-turn id appended after a
    cut-off included), set on the student's turns. One pass over the conversation the learner
    trains on (the turns less the last prompt's recorded cut): the teacher reads an episode once, not
    once per turn, and scores each token in the context the learner sees it in."""
    left_out = set(cut)
    spans, at = [], 0
    for i, t in enumerate(turns):
        if i not in left_out:
            spans.append((t, at, at + len(t.token_ids)))
            at += len(t.token_ids)
    ids = [i for j, t in enumerate(turns) if j not in left_out for i in t.token_ids]
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


def _check_observation(game: GameId, turn: int, expected: str, got: str) -> None:
    if expected.strip() != got.strip():
        raise ReplayMismatch(
            f"{game.item_id}: observation after turn {turn} differs from the record: "
            f"expected {expected.strip()[:80]!r}, got {got.strip()[:80]!r}"
        )


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers give the same ids (then OPD and shared id lists work)."""
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab())
