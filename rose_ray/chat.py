"""Conversation token ids, turn by turn, as the chat template renders them (`chat.history` in
docs/reference.md). The pieces (opening, user turn + generation prompt, assistant ids + end-of-turn)
are cut once from the template, from conversations that end with a user turn, so templates that
rewrite earlier turns (Qwen3 drops old `<think>` blocks) are cut right: `history="sampled"`, what the
model saw while it generated each turn. `history="template"` renders history as a chat API does
(`apply_template`): tokenized whole and cut after each end-of-turn token."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from rose_ray.errors import ConfigError, InputError
from rose_ray.types import Turn

_MARK = "\x1fROSE_RAY_TEXT\x1f"
HISTORIES: tuple[str, ...] = ("sampled", "template")


class ChatTemplateError(InputError):
    """A chat template whose turns cannot be cut into per-turn pieces."""


@dataclass
class RenderCache:
    """The last template rendering tokenized for one conversation (its text and ids), for the next
    `apply_template` to tokenize only what changed."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    reused: int = 0  # ids taken from earlier renderings instead of tokenized again (a gauge)


class ChatFormat:
    """Token-id pieces of one tokenizer's chat template. `enable_thinking` is passed to the
    template (Qwen3's switch): False puts an empty think block into the generation prompt."""

    def __init__(self, tokenizer: Any, enable_thinking: bool = False, history: str = "sampled") -> None:
        if history not in HISTORIES:
            raise ConfigError(f"chat.history: must be one of {HISTORIES}, got {history!r}")
        self.tokenizer = tokenizer
        self.enable_thinking = bool(enable_thinking)
        self.history = history
        # A fast tokenizer's Rust backend, called directly (`tokenizer(text)` costs more than the
        # tokenizing) where the call would change nothing; a subclass's own call is kept.
        mro = type(tokenizer).__mro__
        fast = next((i for i, c in enumerate(mro) if c.__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")),
                    None)
        own_call = fast is None or any(name in vars(c) for c in mro[:fast]
                                       for name in ("__call__", "_call_one", "_encode_plus", "_batch_encode_plus"))
        self._backend = None if own_call else getattr(tokenizer, "backend_tokenizer", None)
        self.eos_id: int = tokenizer.get_vocab().get("<|im_end|>", tokenizer.eos_token_id)
        if self.eos_id is None:
            raise ChatTemplateError("tokenizer has neither <|im_end|> nor an eos token")
        self.end_text: str = tokenizer.convert_ids_to_tokens(self.eos_id)
        probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        head, self.user_prefix, self.user_suffix = self._split_user_turn(probe)
        # For `rose-ray check`: is a closing assistant turn rendered unlike the same turn later?
        self.rewrites_history = not self.render_text(probe, False).startswith(head)
        # Template history: end-of-turn ids beyond one per message (a default system prompt), and
        # the framing that opens a user and an assistant turn.
        self._extra_ends = self.encode(self.render_text(probe[:1], False)).count(self.eos_id) - 1
        marked = self.render_text([probe[0], {"role": "assistant", "content": _MARK}, probe[0]], False)
        header = marked.split(_MARK)[0].rpartition(self.end_text)[2]  # after the user turn's end
        self._frames = {"user": len(self.encode(self.user_prefix)), "assistant": len(self.encode(header))}
        # Ids split at the end-of-turn token only where the tokenizer cuts its text there first:
        # an added token that strips no whitespace.
        added = getattr(tokenizer, "added_tokens_decoder", {}).get(self.eos_id)
        self._openings: dict[tuple[tuple[str, str], ...], list[int]] = {}  # every episode opens alike
        self._splits_at_end = added is not None and not any(
            getattr(added, flag, True) for flag in ("normalized", "lstrip", "rstrip", "single_word"))

    def _split_user_turn(self, messages: list[dict[str, str]]) -> tuple[str, str, str]:
        """`messages` + a marked user turn, rendered with the generation prompt: (the text up to the
        end-of-turn token that closes `messages`, the text before the user's, the text after it)."""
        text = self.render_text(messages + [{"role": "user", "content": _MARK}], True)
        if text.count(_MARK) != 1:
            raise ChatTemplateError("chat template does not render a user message's content verbatim")
        before, after = text.split(_MARK)
        end = before.rfind(self.end_text)
        if end < 0:
            raise ChatTemplateError(f"chat template does not close the assistant turn with {self.end_text!r} "
                                    "before the next user turn")
        end += len(self.end_text)
        return before[:end], before[end:], after

    def render_text(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                    enable_thinking: bool | None = None) -> str:
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=thinking,
        )

    def encode(self, text: str) -> list[int]:
        backend = self._backend
        if (backend is not None and backend.truncation is None and backend.padding is None
                and getattr(backend, "encode_special_tokens", False)
                == bool(getattr(self.tokenizer, "split_special_tokens", False))):
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                   enable_thinking: bool | None = None) -> list[int]:
        """Whole-conversation rendering (OpenAI chat requests, reference checks)."""
        return self.encode(self.render_text(messages, add_generation_prompt, enable_thinking))

    def opening_ids(self, opening: list[tuple[str, str]]) -> list[int]:
        """The instruction/acknowledgement turns, up to the acknowledgement's end-of-turn
        token, rendered as they appear once the conversation goes on."""
        if not opening or opening[-1][0] != "assistant":
            raise ChatTemplateError("the opening must end with an assistant turn (the acknowledgement)")
        key = tuple((r, t) for r, t in opening)
        if key not in self._openings:
            head, _, _ = self._split_user_turn([{"role": r, "content": t} for r, t in opening])
            self._openings[key] = self.encode(head)
        return list(self._openings[key])

    def user_ids(self, text: str) -> list[int]:
        """A user turn appended after a finished turn; ends with the generation prompt."""
        return self.encode(self.user_prefix + text + self.user_suffix)

    def assistant_ids(self, text: str) -> list[int]:
        """An assistant turn that was not sampled by this tokenizer (teacher text, data)."""
        return self.encode(text) + [self.eos_id]

    def finish_sampled(self, sampled_ids: list[int]) -> list[int]:
        """Sampled ids closed with the end-of-turn token if generation stopped without it
        (that token was never sampled: the learner gives it no loss in a truncated turn)."""
        closed = bool(sampled_ids) and sampled_ids[-1] == self.eos_id
        return list(sampled_ids) + ([] if closed else [self.eos_id])

    def decode(self, ids: list[int]) -> str:
        """Text of an assistant turn (end-of-turn token dropped)."""
        return self.tokenizer.decode([i for i in ids if i != self.eos_id], skip_special_tokens=False)

    def encode_rendering(self, text: str, cache: RenderCache | None = None) -> list[int]:
        """`encode(text)`; with a cache, the ids up to the last end-of-turn token that `text`
        shares with the cached rendering are the cached ones, and only the rest is tokenized
        (the same ids: the tokenizer cuts its text at that token before anything else)."""
        if cache is None:
            return self.encode(text)
        ids, cut = None, len(cache.text)
        while self._splits_at_end and (cut := cache.text.rfind(self.end_text, 0, cut)) >= 0:  # the last first
            shared = cut + len(self.end_text)
            if text[:shared] == cache.text[:shared]:
                ends = [i for i, t in enumerate(cache.ids) if t == self.eos_id]  # each one a single id
                n = cache.text.count(self.end_text, 0, shared)
                if n <= len(ends):  # else ids that are not this text's: tokenize it whole
                    ids = cache.ids[: ends[n - 1] + 1] + self.encode(text[shared:])
                    cache.reused += ends[n - 1] + 1
                break
        cache.text, cache.ids = text, ids if ids is not None else self.encode(text)
        return list(cache.ids)

    def apply_template(self, turns: list[Turn], add_generation_prompt: bool,
                       cache: RenderCache | None = None) -> list[Turn]:
        """The turns with the ids of the template's rendering of their texts, tokenized whole as a
        chat API does and cut after each message's end-of-turn id (extra turns, a default system
        prompt, go with the first): the last turn also holds the generation prompt or close
        (`close` counts them), each turn's `frame` counts its role header. Replies keep their
        text; their sampled ids and logprobs give way. `cache`: see `encode_rendering`."""
        messages = [{"role": t.role, "content": t.text} for t in turns]
        ids = self.encode_rendering(self.render_text(messages, add_generation_prompt), cache)
        ends = [i for i, t in enumerate(ids) if t == self.eos_id]
        # A text that spells the end-of-turn token is tokenized to it (as a chat API does): it
        # belongs to its message, whose own end-of-turn id comes after.
        counts = (1 + m["content"].count(self.end_text) for m in messages)
        own_ends = list(accumulate(counts, initial=self._extra_ends - 1))[1:]
        if len(ends) != own_ends[-1] + 1:
            raise ChatTemplateError(f"the template's rendering of {len(messages)} messages has {len(ends)} "
                                    f"{self.end_text!r} tokens, not the {own_ends[-1] + 1} its texts make")
        ends = [ends[i] for i in own_ends]
        starts = [0] + [e + 1 for e in ends[:-1]]
        pieces, tail = [ids[a : e + 1] for a, e in zip(starts, ends)], ids[ends[-1] + 1 :]
        frames = [self._frames[t.role] if i else 0 for i, t in enumerate(turns)]
        if len(turns) > 1 and turns[-1].role == "assistant":
            frames[-1] = self._last_reply_frame(messages, pieces[-1])
        pieces[-1], closes = pieces[-1] + tail, [0] * (len(turns) - 1) + [len(tail)]
        out = []
        for t, ids, frame, close in zip(turns, pieces, frames, closes):
            unchanged = (t.token_ids, t.frame, t.close) == (ids, frame, close)
            if not unchanged or (t.logprobs is not None and t.role == "assistant"):
                t = replace(t, token_ids=ids, frame=frame, close=close,
                            logprobs=None if t.role == "assistant" else t.logprobs)
            out.append(t)  # else as the last rendering left it (a prompt re-renders every turn)
        return out

    def _last_reply_frame(self, messages: list[dict[str, str]], ids: list[int]) -> int:
        """The leading ids of a conversation's closing reply (`ids`: its piece) that are the
        template's framing, which may differ from earlier replies' (Qwen3 puts an empty think
        block before it): read off the rendering with that reply's text marked."""
        marked = self.render_text(messages[:-1] + [{"role": "assistant", "content": _MARK}], False)
        header = marked.split(_MARK)[0].rpartition(self.end_text)[2]
        shown = self.tokenizer.decode(ids, skip_special_tokens=False)
        shared = len(os.path.commonprefix([header, shown]))
        for frame in range(len(ids)):
            text = self.tokenizer.decode(ids[: frame + 1], skip_special_tokens=False)
            if len(text) > shared or not shown.startswith(text):
                return frame
        return len(ids)
