"""The shared vocabulary: plain dataclasses that cross Ray (nothing holds a model, a JVM or a
handle) and go to JSONL (`Trajectory.to_record()`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rose_ray.errors import DataError, InputError

Owner = Literal["prompt", "env", "student", "teacher"]
Role = Literal["user", "assistant"]
OWNERS: tuple[str, ...] = ("prompt", "env", "student", "teacher")
# Dataset row schemas (the card's, AgentGym's): per schema, its messages' (role key, text key,
# {the schema's role name: our role}). Here, below rows.py and envs/protocol.py that both read them.
MESSAGE_KEYS: dict[str, tuple[str, str, dict[str, str]]] = {
    "card": ("role", "content", {"user": "user", "assistant": "assistant"}),
    "agentgym": ("from", "value", {"human": "user", "gpt": "assistant"}),
}
SCHEMAS: tuple[str, ...] = tuple(MESSAGE_KEYS)
# Prompt + reply tokens, the dataset card's: the default engine context_tokens and learner.max_tokens.
CONTEXT_TOKENS = 16384
# `rollout.report`, the world's report question after the last observation (DiscoveryWorld).
REPORT_MODES: tuple[str, ...] = ("ask", "train", "off")


@dataclass(frozen=True)
class GameId:
    """One game of a world. `item_id` is `<world>_<n>` (`sciworld_12`, `discoveryworld_3`) under
    the world's catalogue mapping in force; `world` defaults to the world it names."""

    task: str
    variation: int
    item_id: str
    world: str = ""

    def __post_init__(self) -> None:
        if not self.world:
            object.__setattr__(self, "world", self.item_id.rsplit("_", 1)[0])  # frozen

    @property
    def index(self) -> int:
        return int(self.item_id.rsplit("_", 1)[1])


@dataclass
class Turn:
    """One message of a conversation; `owner` says who produced the text.

    `token_ids`: the ids the engine produced or appended, in the student's tokenizer; the learner
    trains on exactly these. `teacher_logprobs`: the teacher's logprobs of a student turn's ids
    (OPD). `truncated`: the reply hit max_new_tokens, its end-of-turn id appended, not sampled (no
    loss). `frame` / `close`: leading ids that are the template's role header, trailing ids after
    the end-of-turn id (the last turn's generation prompt or close); context only.
    `policy_version_end`: the version of the last tokens when a weight update landed during
    sampling (publish.in_flight keep); `tokens_on_version`: how many of the first sampled tokens
    are `policy_version`'s (the one the learner and the buffer count).
    """

    role: Role
    text: str
    owner: Owner
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    policy_version: int | None = None
    teacher_logprobs: list[float] | None = None
    truncated: bool = False
    frame: int = 0
    close: int = 0
    policy_version_end: int | None = None
    tokens_on_version: int | None = None


@dataclass
class Trajectory:
    """One episode. `score` is the normalised score in [0, 1]; `raw_score` the game's."""

    game: GameId
    turns: list[Turn]
    score: float = 0.0
    raw_score: int = 0
    success: bool = False
    rounds: int = 0
    handoff_turn: int | None = None
    student_version: int | None = None
    done: bool = False
    end_reason: str = ""
    invalid_actions: int = 0
    # Indices of the turns the learner leaves out, decided by the rollout (rollout/context.py:
    # ContextSettings.learner_cut): those left out of the last prompt, and what would not fit.
    context_cut: list[int] = field(default_factory=list)
    truncated_turns: int = 0  # replies cut at max_new_tokens
    cut_before_action: int = 0  # of those, replies with no `Action:` line before the cut
    # Indices in `turns` of the replies whose action the game did not accept (or that had none),
    # and of those that sent the same action as the reply before them (a loop's mark).
    invalid_turns: list[int] = field(default_factory=list)
    repeated_turns: list[int] = field(default_factory=list)
    episode_id: str = ""
    handoff_p: float | None = None  # decay: the takeover probability per student turn
    handoff_seed: str | None = None  # decay: seeds the takeover draws (with the turn)
    timing: dict[str, float] = field(default_factory=dict)
    # The agent's answer to the world's report question after the last observation (DiscoveryWorld)
    # and that exchange's two turns; not in `turns` (nothing trains on them) unless rollout.report=train.
    report: str | None = None
    report_turns: list[Turn] = field(default_factory=list)
    # What the world says about scoring this game, never shown to the agent (DiscoveryWorld:
    # task description, critical questions, the package's own normalised score `process`).
    scoring: dict[str, Any] = field(default_factory=dict)
    # At the handoff, which parts of the game's state differed from its state at load (ScienceWorld:
    # room, inventory, focus; `changed`: any); None without a handoff or a world's state.
    handoff_state: dict[str, bool] | None = None
    # An expert teacher's record: whether it had a plan at the handoff (`planned`) and one that
    # won on replay (`verified`), its last `status`, its `replans` and planning time `plan_s`;
    # `status` "unwinnable": the game was lost before the handoff. None for a model teacher.
    expert: dict[str, Any] | None = None

    def to_record(self, schema: str = "card", loss: list[bool] | None = None) -> dict[str, Any]:
        """A dataset row: the card's schema (`role`/`content` messages, `success` 0/1) or
        AgentGym's (`from`/`value`, with `loss`); either way each message keeps its `owner`.
        `loss`, one flag per turn: whether the turn carried loss (a training step's record).
        Without it the card's messages carry none and AgentGym's mark every model reply."""
        if schema not in SCHEMAS:
            raise InputError(f"schema: must be one of {SCHEMAS}, got {schema!r}")
        if loss is not None and len(loss) != len(self.turns):
            raise ValueError(f"loss: {len(loss)} flags for {len(self.turns)} turns")
        conversations = []
        invalid, repeated = set(self.invalid_turns), set(self.repeated_turns)
        for i, t in enumerate(self.turns):
            if schema == "card":
                m: dict[str, Any] = {"role": t.role, "content": t.text, "owner": t.owner}
            else:
                m = {"from": "gpt" if t.role == "assistant" else "human",
                     "loss": t.role == "assistant" and t.owner in ("student", "teacher"),
                     "value": t.text, "owner": t.owner}
            if loss is not None:
                m["loss"] = bool(loss[i])
            m.update((k, True) for k, on in (("truncated", t.truncated), ("invalid", i in invalid),
                                             ("repeated", i in repeated)) if on)
            conversations.append(m)
        extra: dict[str, Any] = ({"handoff_p": self.handoff_p, "handoff_seed": self.handoff_seed}
                                 if self.handoff_p is not None else {})
        # end_reason: why the episode ended (`context`: its prompt no longer fit)
        extra.update((k, v) for k, v in (("report", self.report), ("end_reason", self.end_reason or None),
                                         ("handoff_state", self.handoff_state), ("expert", self.expert))
                     if v is not None)
        return {
            "item_id": self.game.item_id,
            "task": self.game.task,
            "var": self.game.variation,
            "score": self.score,
            "success": int(self.success) if schema == "card" else bool(self.success),
            "rounds": self.rounds,
            "conversations": conversations,
            "handoff_turn": self.handoff_turn,
            "episode_id": self.episode_id,
            "student_version": self.student_version,
            **extra,
        }


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling (1: off)
    max_new_tokens: int = 512  # tokens per reply; a reply cut there is `truncated`
    stop: list[str] = field(default_factory=list)  # strings that end a reply
    seed: int | None = None  # None: unseeded; else each turn of each game draws from its own seed (`for_turn`)

    def for_turn(self, game: str, turn: int | str) -> SamplingParams:
        """These settings for one turn of one game: a set `seed` becomes that turn's own, a
        stable hash of (seed, game, turn), so the turns and games of a seeded run draw
        independently of each other and the same on every rerun."""
        if self.seed is None:
            return self
        digest = hashlib.sha256(f"{self.seed}/{game}/{turn}".encode()).digest()
        return replace(self, seed=int.from_bytes(digest[:8], "big") >> 1)  # 63 bits: any engine takes it


@dataclass
class Batch:
    """Token-level training batch, packed: every field is [rows][row_len] (arrays).

    `attention_mask`: each token's 1-based segment number in its row, 0 for padding. `weights`:
    per loss term (learner/losses.py), each token's weight (0: context only; rose_ray/tokens.py).
    `old_logprobs`: the behaviour policy's (NaN where unknown: 0 is a real logprob);
    `teacher_logprobs`: the teacher's (OPD); `versions`: the policy version that sampled each
    token (-1 without an old logprob)."""

    input_ids: Any
    attention_mask: Any
    weights: dict[str, Any]
    old_logprobs: Any = None
    teacher_logprobs: Any = None
    versions: Any = None
    num_sequences: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def message_schema(msg: dict[str, Any]) -> str | None:
    """"card" for a role/content message, "agentgym" for from/value, else None."""
    return next((name for name, (role, text, _) in MESSAGE_KEYS.items() if role in msg or text in msg), None)


def message_text(msg: dict[str, Any]) -> tuple[str, str]:
    """(our role "user"/"assistant", text) of a validated message of either schema."""
    role_key, text_key, roles = MESSAGE_KEYS[message_schema(msg) or "card"]
    return roles[msg[role_key]], msg[text_key]


def validate_conversation(conv: Any, where: str = "row") -> list[dict[str, Any]]:
    """Check a row's `conversations` (messages of one schema); returns it or raises DataError."""
    if not isinstance(conv, list) or not conv:
        raise DataError.at(where, "conversations", "expected a non-empty list of messages")
    schema = None
    for i, msg in enumerate(conv):
        key = f"conversations[{i}]"
        if not isinstance(msg, dict):
            raise DataError.at(where, key, f"expected an object, got {type(msg).__name__}")
        this = message_schema(msg)
        if this is None:
            raise DataError.at(where, key, "expected a message with 'role'/'content' (the card's schema) "
                        f"or 'from'/'value' (AgentGym's), got keys {sorted(msg)}")
        if schema is not None and this != schema:
            raise DataError.at(where, key, f"a {this} message in a row of {schema} messages "
                        "(one schema per row: role/content or from/value)")
        schema = this
        role_key, text_key, roles = MESSAGE_KEYS[this]
        if msg.get(role_key) not in roles:
            raise DataError.at(where, f"{key}.{role_key}", f"expected {' or '.join(map(repr, roles))}, "
                        f"got {msg.get(role_key)!r}")
        if not isinstance(msg.get(text_key), str):
            raise DataError.at(where, f"{key}.{text_key}", f"expected a string, got {msg.get(text_key)!r}")
        for flag in ("loss", "truncated"):
            if msg.get(flag) is not None and not isinstance(msg[flag], bool):
                raise DataError.at(where, f"{key}.{flag}", f"expected true, false or null, got {msg[flag]!r}")
        if msg.get("owner") is not None and msg["owner"] not in OWNERS:
            raise DataError.at(where, f"{key}.owner", f"expected one of {OWNERS}, got {msg['owner']!r}")
    return conv
