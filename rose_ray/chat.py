"""Conversation token ids, turn by turn, exactly as the chat template renders them.

Engines extend a conversation's ids turn by turn instead of re-rendering its text (the
learner must train on the ids that were sampled). The pieces, derived once from the
tokenizer's own chat template:

    opening  = template(instruction, acknowledgement) without its final separator
    user     = separator + user-prefix + text + user-suffix (ends with the assistant header)
    assistant= the sampled ids, ending with the end-of-turn token

Concatenated, they give the same ids as the template applied to the whole conversation
(up to the final separator), except where a sampled turn tokenizes differently from its
text, which is the point.
"""

from __future__ import annotations

from typing import Any

_MARK = "\x1fROSE_RAY_TEXT\x1f"


class ChatFormat:
    """Token-id pieces of one tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
        self.eos_id: int = end if end is not None else tokenizer.eos_token_id
        if self.eos_id is None:
            raise ValueError("tokenizer has neither <|im_end|> nor an eos token")
        probe = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        closed = self.render_text(probe, add_generation_prompt=False)
        extended = self.render_text(probe + [{"role": "user", "content": _MARK}], True)
        if not extended.startswith(closed):
            raise ValueError("chat template rewrites earlier turns when a user turn is added")
        added = extended[len(closed) :]
        self.user_prefix, self.user_suffix = added.split(_MARK)
        # What follows the end-of-turn token before the next turn ("\n" for Qwen templates).
        end_text = tokenizer.convert_ids_to_tokens(self.eos_id)
        self.separator = closed[closed.rindex(end_text) + len(end_text) :]

    def render_text(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        """Whole-conversation rendering (OpenAI chat requests, reference checks)."""
        return self.encode(self.render_text(messages, add_generation_prompt))

    def opening_ids(self, opening: list[tuple[str, str]]) -> list[int]:
        """The instruction/acknowledgement turns, without the separator after the last one."""
        text = self.render_text([{"role": r, "content": t} for r, t in opening], False)
        if self.separator and text.endswith(self.separator):
            text = text[: -len(self.separator)]
        return self.encode(text)

    def user_ids(self, text: str) -> list[int]:
        """A user turn appended after a finished turn; ends with the assistant header."""
        return self.encode(self.separator + self.user_prefix + text + self.user_suffix)

    def assistant_ids(self, text: str) -> list[int]:
        """An assistant turn that was not sampled by this tokenizer (teacher text, data)."""
        return self.encode(text) + [self.eos_id]

    def finish_sampled(self, sampled_ids: list[int]) -> list[int]:
        """Sampled ids closed with the end-of-turn token if generation stopped without it."""
        if sampled_ids and sampled_ids[-1] == self.eos_id:
            return list(sampled_ids)
        return list(sampled_ids) + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        """Text of an assistant turn (end-of-turn token dropped)."""
        return self.tokenizer.decode([i for i in ids if i != self.eos_id], skip_special_tokens=False)
