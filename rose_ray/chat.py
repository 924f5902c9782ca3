"""Conversation token ids, turn by turn, as the chat template renders them.

Engines extend a conversation's ids turn by turn instead of re-rendering its text (the
learner must train on the ids that were sampled). The pieces, derived once from the
tokenizer's own chat template:

    opening  = instruction + acknowledgement, up to the acknowledgement's end-of-turn token
    user     = separator + user header + text + end of turn + the generation prompt
    assistant= the sampled ids, ending with the end-of-turn token

Some templates rewrite earlier turns as a conversation grows. Qwen3's renders the assistant
turn after the last user message with a `<think>…</think>` block and every earlier assistant
turn without one, so [user, assistant] and [user, assistant, user] disagree on the assistant
part. The pieces are therefore cut from conversations that end with a user turn (plus the
generation prompt): appending a user piece never re-renders an assistant turn, and the
generation prompt (with Qwen3's empty think block when thinking is off) is part of the user
piece, so it is context and never trained.

For templates that do not rewrite history, the pieces concatenated give exactly the ids of
the template applied to the whole conversation; for those that do, they give what the model
saw while it generated each turn (earlier turns keep the form they were sampled in).
"""

from __future__ import annotations

from typing import Any

_MARK = "\x1fROSE_RAY_TEXT\x1f"


class ChatTemplateError(ValueError):
    """A chat template whose turns cannot be cut into per-turn pieces."""


class ChatFormat:
    """Token-id pieces of one tokenizer's chat template.

    `enable_thinking` is passed to the template (Qwen3's variable; other templates ignore it):
    False puts an empty think block into the generation prompt so the model answers directly.
    """

    def __init__(self, tokenizer: Any, enable_thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.enable_thinking = bool(enable_thinking)
        end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
        self.eos_id: int = end if end is not None else tokenizer.eos_token_id
        if self.eos_id is None:
            raise ChatTemplateError("tokenizer has neither <|im_end|> nor an eos token")
        self.end_text: str = tokenizer.convert_ids_to_tokens(self.eos_id)
        probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        head, self.user_prefix, self.user_suffix = self._split_user_turn(probe)
        # What follows an end-of-turn token before the next turn ("\n" for Qwen templates).
        self.separator = self.user_prefix[: len(self.user_prefix) - len(self.user_prefix.lstrip())]
        # Informational (`rose-ray check`): does the template render a closing assistant turn
        # differently from the same turn once a user turn follows (Qwen3 does)?
        closed = self.render_text(probe, add_generation_prompt=False)
        self.rewrites_history = not closed.startswith(head)

    def _split_user_turn(self, messages: list[dict[str, str]]) -> tuple[str, str, str]:
        """Render `messages` + a marked user turn with the generation prompt; return (the
        rendering up to the end-of-turn token that closes `messages`, the text between it and
        the user's text, the text after the user's text)."""
        text = self.render_text(messages + [{"role": "user", "content": _MARK}], True)
        if text.count(_MARK) != 1:
            raise ChatTemplateError("chat template does not render a user message's content verbatim")
        before, after = text.split(_MARK)
        end = before.rfind(self.end_text)
        if end < 0:
            raise ChatTemplateError(
                f"chat template does not close the assistant turn with {self.end_text!r} "
                "before the next user turn"
            )
        end += len(self.end_text)
        return before[:end], before[end:], after

    def render_text(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                    enable_thinking: bool | None = None) -> str:
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=thinking,
        )

    def encode(self, text: str) -> list[int]:
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
        head, _, _ = self._split_user_turn([{"role": r, "content": t} for r, t in opening])
        return self.encode(head)

    def user_ids(self, text: str) -> list[int]:
        """A user turn appended after a finished turn; ends with the generation prompt."""
        return self.encode(self.user_prefix + text + self.user_suffix)

    def assistant_ids(self, text: str) -> list[int]:
        """An assistant turn that was not sampled by this tokenizer (teacher text, data)."""
        return self.encode(text) + [self.eos_id]

    def finish_sampled(self, sampled_ids: list[int]) -> list[int]:
        """Sampled ids closed with the end-of-turn token if generation stopped without it
        (that token was never sampled: the learner gives it no loss in a truncated turn)."""
        if sampled_ids and sampled_ids[-1] == self.eos_id:
            return list(sampled_ids)
        return list(sampled_ids) + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        """Text of an assistant turn (end-of-turn token dropped)."""
        return self.tokenizer.decode([i for i in ids if i != self.eos_id], skip_special_tokens=False)

    def pieces(self) -> dict[str, str]:
        """The text around a user turn's content (what `rose-ray check` shows)."""
        return {"separator": self.separator, "user_prefix": self.user_prefix,
                "user_suffix": self.user_suffix, "end_of_turn": self.end_text}

