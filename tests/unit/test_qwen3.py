"""The seed's real shape: Qwen3's chat template (history rewritten, thinking mode), replies cut
at max_new_tokens, and every command on tiny models that look like Qwen3 from the outside.

Qwen/Qwen3-1.7B cannot be downloaded here: `init-tiny --style qwen3` builds a stand-in with
Qwen3's special tokens, its pre-tokenizer split, and a template written here that behaves like
Qwen3's (reasoning stripped from earlier assistant turns, a think block on the assistant turn
after the last user message, `enable_thinking=False` -> an empty think block in the prompt).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rose_ray.chat import ChatFormat
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.protocol import PROTOCOL
from rose_ray.models import load_tokenizer

INSTR, ACK = "You are an agent. Answer with Thought: and Action:.", "OK."


OBS = ["Your task is to boil water.\nThis room is called the kitchen.", "The stove is now activated."]


REPLY = "Thought: heat it.\nAction: activate stove"


def render(tok, messages, gen, **kw):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kw)


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_the_stand_in_template_behaves_like_qwen3(tiny_qwen3):
    tok = load_tokenizer(tiny_qwen3["student"])
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    assert all(isinstance(i, int) and i != tok.unk_token_id for i in think)
    assert tok("<think>\n\n</think>", add_special_tokens=False)["input_ids"][0] == think[0]
    assert tok.decode(think, skip_special_tokens=True) == "<think></think>"  # not special: kept
    assert [t for t in tok.tokenize(" 123") if t.strip("Ġ")] == ["1", "2", "3"]  # digits one by one
    reasoned = "<think>\nboil means heat\n</think>\n\n" + REPLY
    conv = msgs(("user", INSTR), ("assistant", ACK), ("user", OBS[0]), ("assistant", reasoned))
    last = render(tok, conv, False)
    assert last.endswith("<|im_start|>assistant\n<think>\nboil means heat\n</think>\n\n" + REPLY + "<|im_end|>\n")
    assert "<|im_start|>assistant\nOK.<|im_end|>" in last  # before the last user turn: no block
    later = render(tok, conv + msgs(("user", OBS[1])), True)
    assert "boil means heat" not in later and ("<|im_start|>assistant\n" + REPLY + "<|im_end|>") in later
    assert later.endswith("<|im_start|>assistant\n")  # the template's default: thinking on
    assert render(tok, conv + msgs(("user", OBS[1])), True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


# Written here to behave exactly as Qwen3's own chat template does on a conversation's history
# (text and tool responses, no tool calls): the last query is the last user message that is not a
# wrapped tool response; an assistant message's reasoning (`reasoning_content`, else what comes
# before `</think>`) is dropped, and it gets a think block only after the last query, when it is
# the last message or has reasoning.
QWEN3_HISTORY = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- set query = namespace(found=false, index=messages|length - 1) %}"
    "{%- for m in messages|reverse %}"
    "{%- if not query.found and m.role == 'user' and m.content is string and not "
    "(m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) %}"
    "{%- set query.found = true %}{%- set query.index = messages|length - loop.index %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set text = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\n' + text + '<|im_end|>\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set thought = '' %}"
    "{%- if m.reasoning_content is string %}{%- set thought = m.reasoning_content %}"
    "{%- elif '</think>' in text %}"
    "{%- set thought = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}"
    "{%- set text = text.split('</think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > query.index and (loop.last or thought) %}"
    "{{- '<|im_start|>assistant\n<think>\n' + thought.strip('\n') + '\n</think>\n\n' + text.lstrip('\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\n' + text }}{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)


# The last one spells the end-of-turn token: a chat API tokenizes it to that token, and so do we.
REPLIES = [REPLY, "<think>\nheat first\n</think>\n\n" + REPLY, "\n\n  Thought: odd<|im_end|> spacing\nAction: wait"]


def _conversation(n_replies: int) -> list[dict[str, str]]:
    conv = msgs(("user", INSTR), ("assistant", ACK), ("user", OBS[0]))
    for i in range(n_replies):
        conv += msgs(("assistant", REPLIES[i]), ("user", f"observation {i + 1}"))
    return conv


def _sampled_prompt(chat: ChatFormat, conv: list[dict[str, str]]) -> list[int]:
    """The prompt for `conv` as chat.history=sampled builds it (replies' ids as if sampled from their text)."""
    return chat.opening_ids([(m["role"], m["content"]) for m in conv[:2]]) + sum(
        (chat.user_ids(m["content"]) if m["role"] == "user" else chat.assistant_ids(m["content"])
         for m in conv[2:]), [])


def _turns(conv: list[dict[str, str]]):
    from rose_ray.types import Turn

    owners = ["prompt", "prompt"] + ["env" if m["role"] == "user" else "teacher" for m in conv[2:]]
    return [Turn(m["role"], m["content"], o) for m, o in zip(conv, owners)]


@pytest.mark.parametrize("template", ["stand-in", "qwen3-history"])
@pytest.mark.parametrize("thinking", [False, True])
def test_template_history_gives_the_templates_own_rendering(tiny_qwen3, template, thinking):
    """chat.history=template: every prompt is the template's rendering of the conversation so far,
    tokenized whole (what a chat API sends the model), and the learner's sequence is its
    rendering of the whole conversation, trained on the replies as the template shows them."""
    from rose_ray.tokens import TokenWeights, make_batch
    from rose_ray.tokens import render as render_seq

    tok = load_tokenizer(tiny_qwen3["student"])
    if template == "qwen3-history":
        stand_in = tok.chat_template
        tok.chat_template = QWEN3_HISTORY
        for k in range(4):  # the stand-in renders history exactly as Qwen3's does
            assert render(tok, _conversation(k), True, enable_thinking=thinking) == tok.apply_chat_template(
                _conversation(k), tokenize=False, add_generation_prompt=True, enable_thinking=thinking,
                chat_template=stand_in)
    chat, sampled = ChatFormat(tok, thinking, "template"), ChatFormat(tok, thinking)
    for k in range(4):
        conv = _conversation(k)
        ids = [i for t in chat.apply_template(_turns(conv), True) for i in t.token_ids]
        api = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, enable_thinking=thinking)
        assert ids == chat.render_ids(conv, True) == list(api["input_ids"])
        # Sampled history keeps each earlier reply as it was (thinking off: after an empty think block).
        assert (_sampled_prompt(sampled, conv) == ids) == (k == 0 or (thinking and k == 1))
    # The learner: the whole conversation as the template renders it; only the replies' text
    # (as the template shows it) and their end-of-turn ids train, never a role header.
    conv = _conversation(3)
    turns = chat.apply_template(_turns(conv), add_generation_prompt=False)
    seq = render_seq(turns)
    assert seq.input_ids == chat.render_ids(conv, False)
    batch = make_batch([seq], TokenWeights(ce={"teacher": 1.0}), max_tokens=len(seq))
    trained = tok.decode([int(i) for i, w in zip(batch.input_ids[0], batch.weights["ce"][0]) if w > 0])
    shown = [r.split("</think>")[-1].lstrip("\n") if "</think>" in r else r for r in REPLIES]
    assert trained == "".join(f"{r}<|im_end|>" for r in shown)
    # A dataset row (text only) under template history renders the same: `rose-ray sft --history template`.
    assert render_seq(_turns(conv), chat).input_ids == seq.input_ids


@pytest.mark.parametrize("template", ["stand-in", "qwen3-history"])
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("replies", [1, 3])
def test_a_row_that_ends_with_a_reply_trains_only_the_replies(tiny_qwen3, template, thinking, replies):
    """A conversation that ends with a reply (AgentGym rows, `rose-ray sft`): the template frames
    that reply with a think block and closes it with "\n"; both are context. Cut at
    max_new_tokens, the reply's appended end-of-turn id is the one left untrained."""
    from rose_ray.tokens import TokenWeights, make_batch
    from rose_ray.tokens import render as render_seq

    tok = load_tokenizer(tiny_qwen3["student"])
    if template == "qwen3-history":
        tok.chat_template = QWEN3_HISTORY
    chat = ChatFormat(tok, thinking, "template")
    conv = _conversation(replies)[:-1]
    shown = [r.split("</think>")[-1].lstrip("\n") if "</think>" in r else r for r in REPLIES[:replies]]
    # As the closing message, the template shows the reply after its think block, newlines stripped.
    shown[-1] = shown[-1].lstrip("\n")
    for cut in (False, True):
        turns = _turns(conv)
        turns[-1].truncated = cut
        for seq in (render_seq(chat.apply_template(turns, add_generation_prompt=False)), render_seq(turns, chat)):
            assert seq.input_ids == chat.render_ids(conv, False)  # still the template's, token for token
            batch = make_batch([seq], TokenWeights(ce={"teacher": 1.0}), max_tokens=len(seq))
            trained = tok.decode([int(i) for i, w in zip(batch.input_ids[0], batch.weights["ce"][0]) if w > 0])
            assert trained == "".join(f"{r}<|im_end|>" for r in shown)[: -len("<|im_end|>") if cut else None]


@pytest.mark.parametrize("template", ["stand-in", "qwen3-history", "plain"])
@pytest.mark.parametrize("thinking", [False, True])
def test_template_prompts_tokenized_turn_by_turn_equal_the_whole_rendering(tiny_qwen3, tiny_models, template,
                                                                            thinking):
    """chat.history=template builds each prompt with a RenderCache (only the text after the last
    end-of-turn token it shares with the last rendering is tokenized): every prompt, and the
    learner's closing rendering, is token for token the template's whole rendering tokenized at
    once, as a chat API does; and the cache did spare the re-tokenization."""
    from rose_ray.chat import RenderCache

    tok = load_tokenizer(tiny_models["student"] if template == "plain" else tiny_qwen3["student"])
    if template == "qwen3-history":
        tok.chat_template = QWEN3_HISTORY
    chat, cache = ChatFormat(tok, thinking, "template"), RenderCache()
    for k in range(len(REPLIES) + 1):  # the conversation as an episode grows it, one reply and observation a turn
        conv = _conversation(k)
        whole = list(tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True,
                                             enable_thinking=thinking)["input_ids"])
        cached = chat.apply_template(_turns(conv), True, cache=cache)
        assert [i for t in cached for i in t.token_ids] == whole
        assert cached == chat.apply_template(_turns(conv), True)  # ids, frames and closes: as without a cache
    assert cache.reused > 0
    # The learner's rendering ends with a reply (a think block around it where the template puts one).
    conv = _conversation(len(REPLIES))[:-1]
    closing = chat.apply_template(_turns(conv), False, cache=cache)
    assert [i for t in closing for i in t.token_ids] == chat.render_ids(conv, False)
    assert closing == chat.apply_template(_turns(conv), False)
    # A conversation whose history changed (an earlier observation edited) shares only its start.
    edited = _conversation(2)
    edited[4]["content"] = "observation 1, seen again<|im_end|>"
    reused = cache.reused
    ids = [i for t in chat.apply_template(_turns(edited), True, cache=cache) for i in t.token_ids]
    assert ids == chat.render_ids(edited, True) and cache.reused > reused
    # ... and one that shares no end-of-turn token with it is tokenized whole.
    fresh = msgs(("user", "another game"), ("assistant", ACK), ("user", OBS[1]))
    reused = cache.reused
    ids = [i for t in chat.apply_template(_turns(fresh), True, cache=cache) for i in t.token_ids]
    assert ids == chat.render_ids(fresh, True) and cache.reused == reused


@pytest.mark.parametrize("style", ["plain", "qwen3"])
def test_chat_ids_are_the_tokenizer_calls_ids(tiny_qwen3, tiny_models, style):
    """ChatFormat.encode calls a fast tokenizer's backend directly (the episode loop tokenizes
    every observation): the ids are the tokenizer call's, special and think tokens included,
    and once a setting the call would change differs (special tokens split), it is the call.
    An episode's opening is tokenized once per format: the same ids, a list of its own each time."""
    tok = load_tokenizer(tiny_models["student"] if style == "plain" else tiny_qwen3["student"])
    chat = ChatFormat(tok)
    assert chat._backend is not None  # the direct path is the one under test
    texts = ["", " ", OBS[0], REPLY, "<|im_start|>user\nhi<|im_end|>\n", "<think>\nx\n</think>\n\nAction: go",
             "  two  spaces\n\n\ttab é ü 中文 🙂", "a<|im_end|>b<|endoftext|>"]
    for text in texts:
        assert chat.encode(text) == tok(text, add_special_tokens=False)["input_ids"], text
    tok.split_special_tokens = True
    try:
        for text in texts:
            assert chat.encode(text) == tok(text, add_special_tokens=False)["input_ids"], text
    finally:
        tok.split_special_tokens = False
        tok("", add_special_tokens=False)  # the call puts the backend's setting back
    opening = [("user", INSTR), ("assistant", ACK)]
    first = chat.opening_ids(opening)
    first.append(-1)
    assert chat.opening_ids(opening) == ChatFormat(tok).opening_ids(opening) == first[:-1]


class _Game:
    """An env slot answering every action at once (no JVM)."""

    async def call(self, method: str, *args):  # as EnvSlot.call
        return await getattr(self, method)(*args)

    async def reset(self, game):
        from rose_ray.envs.base import StepResult

        return StepResult(OBS[0], game=game)

    async def step(self, action):
        from rose_ray.envs.base import StepResult

        return StepResult(f"You did {action}.")

    async def state(self):
        return {"initial": {}, "now": {}}  # no state fingerprint (as a world that gives none)


class _Replies:
    """An engine handle answering REPLIES in turn (ids from its own tokenizer), keeping each
    request's prompt ids as the engine got them."""

    def __init__(self, chat: ChatFormat) -> None:
        from rose_ray.inference.engine import GenerationResult

        self.log, replies = [], iter(REPLIES * 4)
        outer = self

        class _Generate:
            def remote(self, request):
                outer.log.append(list(request.prompt_ids))
                text = next(replies)
                ids = chat.encode(text) + [chat.eos_id]

                async def answer():
                    return GenerationResult(text, ids, [-0.5] * len(ids), "stop", 0, 1, request.request_id)
                return answer()

        self.generate = _Generate()


@pytest.mark.parametrize("template", ["stand-in", "qwen3-history"])
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("teacher_tokenizer", ["shared", "own"])
def test_a_template_history_episode_renders_each_prompt_whole(tiny_qwen3, tiny_models, template, thinking,
                                                               teacher_tokenizer):
    """chat.history=template in the episode loop, which skips what the template's rendering
    replaces (an observation's or replayed reply's own ids), keeps each rendering's unchanged
    turns and tokenizes only the new text (RenderCache): every prompt either engine got, for
    the student and a teacher with the same or its own tokenizer, after a replayed prefix, is
    token for token the template's rendering of the conversation so far tokenized whole, and
    the trajectory is the whole conversation's, frames and closes as a fresh rendering gives."""
    from rose_ray.rollout.episode import Agent, EpisodeConfig, run_episode
    from rose_ray.rollout.handoff import turn_policy
    from rose_ray.types import GameId, SamplingParams, Turn

    def chat_of(path):
        tok = load_tokenizer(path)
        if template == "qwen3-history":
            tok.chat_template = QWEN3_HISTORY
        return ChatFormat(tok, thinking, "template")

    student_chat = chat_of(tiny_qwen3["student"])
    teacher_chat = student_chat if teacher_tokenizer == "shared" else chat_of(tiny_models["student"])
    student, teacher = _Replies(student_chat), _Replies(teacher_chat)
    replay = [Turn("user", OBS[0], "env"), Turn("assistant", REPLIES[1], "teacher"),
              Turn("user", "You did activate stove.", "env")]
    config = EpisodeConfig(max_turns=6, student_sampling=SamplingParams(1.0, 1.0, 32),
                           teacher_sampling=SamplingParams(0.0, 1.0, 32))
    traj = asyncio.run(run_episode(GameId("boil", 0, "sciworld_0"), _Game(), Agent(student, student_chat, "student"),
                                   Agent(teacher, teacher_chat, "teacher"), config, turn_policy("fixed", k=3),
                                   protocol=PROTOCOL, replay=replay))
    assert len(student.log) == 2 and len(teacher.log) == 3
    conv = [{"role": t.role, "content": t.text} for t in traj.turns]
    sampled = [n for n, t in enumerate(traj.turns) if t.role == "assistant" and t.owner != "prompt"][1:]  # less the replayed
    for engine, chat, owner in ((student, student_chat, "student"), (teacher, teacher_chat, "teacher")):
        asked = [n for n in sampled if traj.turns[n].owner == owner]  # the conversation before each reply
        assert engine.log == [chat.render_ids(conv[:n], True) for n in asked]
    assert [i for t in traj.turns for i in t.token_ids] == student_chat.render_ids(conv, False)
    fresh = [Turn(t.role, t.text, t.owner, policy_version=t.policy_version) for t in traj.turns]
    assert traj.turns == student_chat.apply_template(fresh, add_generation_prompt=False)


def test_actions_are_parsed_outside_the_think_block():
    assert parse_action("<think>\nAction: go to hell\n</think>\n\nThought: t\nAction: look around").action == "look around"
    assert parse_action("<think>\nmaybe Action: open door").valid_format is False  # cut while thinking
    assert parse_action("Thought: x\nAction: wait\n<think>more").action == "wait"


def test_template_history_is_refused_where_the_opd_term_needs_sampled_ids():
    from rose_ray.config import ConfigError, load_config

    assert load_config(None, ["chat.history=template"]).chat.history == "template"  # rose, lam 0
    for extra, says in ((["algorithm=opd"], r"\(algorithm=opd\)"), (["algorithm.lam=0.5"], r"\(algorithm.lam=0.5\)")):
        with pytest.raises(ConfigError, match=r"chat.history: 'template' .* OPD term " + says):
            load_config(None, ["chat.history=template", *extra])
    with pytest.raises(ConfigError, match="chat.history: must be one of"):
        load_config(None, ["chat.history=rendered"])
    # The seed configs follow the card: template where it trained on rendered conversations.
    configs = Path(__file__).resolve().parents[2] / "configs"
    histories = {name: load_config(configs / f"{name}_qwen3_1p7b_32b.yaml").chat.history for name in ("rose", "sft", "opd")}
    assert histories == {"rose": "template", "sft": "template", "opd": "sampled"}
