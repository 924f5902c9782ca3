"""Tiny Qwen3 models built locally (nothing downloaded), for tests, benches and `tiny:` names:
a byte-level BPE tokenizer trained on shipped ScienceWorld text and two random Qwen3 models
(student smaller than teacher) sharing it. Style `plain`: ChatML turns; `qwen3`: Qwen3's special
tokens, pre-tokenizer split and a template that behaves like theirs (QWEN3_LIKE_TEMPLATE).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rose_ray.errors import InputError
from rose_ray.models import quiet_transformers

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Behaves like Qwen3's official template for text conversations (no tools).
QWEN3_LIKE_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- set state = namespace(last_user=messages|length - 1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set state.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set answer = m.content %}{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in answer %}"
    "{%- set reasoning = answer.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}"
    "{%- set answer = answer.split('</think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > state.last_user and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n'"
    " + answer.lstrip('\n') + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\n' + answer + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
    "{%- endif %}{%- endif %}"
)
# Qwen2/Qwen3's pre-tokenizer split (before byte-level BPE).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]
STYLES = ("plain", "qwen3")
DONE_MARKER = "rose_ray_tiny.json"


# Qwen3Config's size keys of each tiny model (bench/generation.py builds a larger one the same way).
TINY_SIZES = {
    "student": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, intermediate_size=384),
    "teacher": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, intermediate_size=768),
}


def build_tokenizer(vocab_size: int = 8192, style: str = "plain") -> Any:
    """A byte-level BPE tokenizer trained on ScienceWorld text, with a Qwen-style template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rose_ray.envs.worlds import get_world

    if style not in STYLES:
        raise InputError(f"tiny style: must be one of {STYLES}, got {style!r}")
    tok = Tokenizer(models.BPE())
    if style == "qwen3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = get_world(None).corpus()  # the default world's (ScienceWorld's)
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)  # deterministic for a corpus
    if style == "qwen3":  # single tokens, not special: decoding keeps them (as Qwen3's do)
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = QWEN3_LIKE_TEMPLATE if style == "qwen3" else CHAT_TEMPLATE
    return fast


def _random_qwen3(size: dict[str, int], seed: int, max_positions: int, **token_ids: int) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=None,
                         **token_ids, **size)
    return Qwen3ForCausalLM(config).eval()


def build_tiny_model(tokenizer: Any, size: dict[str, int], seed: int, max_positions: int = 16384) -> Any:
    return _random_qwen3(size, seed, max_positions, vocab_size=len(tokenizer),
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id)


# Qwen3's vocabulary size (Qwen3-1.7B and Qwen3-32B): at this size the LM head, not the body,
# decides the learner's memory, which the tiny models (8k vocabulary) cannot show.
QWEN3_VOCAB_SIZE = 151_936
QWEN3_VOCAB_SIZE_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, intermediate_size=128)


def build_qwen3_vocab_model(seed: int = 0, max_positions: int = 16384) -> Any:
    """A 2-layer, 64-wide Qwen3 with Qwen3's vocabulary size and special-token ids, randomly
    initialised (no tokenizer: token ids only), for the learner's memory and equality tests."""
    return _random_qwen3(QWEN3_VOCAB_SIZE_TINY, seed, max_positions, vocab_size=QWEN3_VOCAB_SIZE,
                         eos_token_id=151645, pad_token_id=151643)


def init_tiny(out_dir: str | Path, seed: int = 0, vocab_size: int = 8192, style: str = "plain") -> dict[str, Path]:
    """Make (or reuse) `out_dir/student` and `out_dir/teacher`; returns their paths. Runs sharing
    a cache build it once (under `out_dir/rose_ray_tiny.json.lock`, each model written whole); a
    folder there that rose_ray did not write is never replaced (InputError, before any build)."""
    from rose_ray.files import (
        FOLDER_MARKER,
        check_replaceable,
        clear_leftovers,
        locked,
        write_file,
        writing_folder,
    )

    out = Path(out_dir).expanduser()
    paths = {role: out / role for role in TINY_SIZES}
    marker = out / DONE_MARKER
    # Positions up to the card's 16,384-token context (Qwen3-1.7B allows 40,960).
    wanted = {"seed": seed, "vocab_size": vocab_size, "style": style, "max_positions": 16384}

    def built() -> bool:
        try:
            return json.loads(marker.read_text()) == wanted
        except (OSError, ValueError):
            return False

    if built():
        return paths
    with locked(marker):
        if built():  # another run built them while this one waited
            return paths
        for name in (*paths, DONE_MARKER):  # the lock's holder: a temp of these is a stopped build's
            clear_leftovers(out, name, owned=True)
        for path in paths.values():
            if marker.is_file() and (path / "config.json").is_file() and not (path / FOLDER_MARKER).exists():
                write_file(path / FOLDER_MARKER, "{}\n")  # built before tiny folders held it: the marker vouches
            check_replaceable(path, "tiny model folder")  # before anything is built
        try:
            quiet_transformers()
            tokenizer = build_tokenizer(vocab_size, style)
            for i, (role, size) in enumerate(TINY_SIZES.items()):
                model = build_tiny_model(tokenizer, size, seed=seed * 1000 + i, max_positions=wanted["max_positions"])
                with writing_folder(paths[role], "tiny model folder") as tmp:  # never half-written, never none
                    model.save_pretrained(tmp, safe_serialization=True)
                    tokenizer.save_pretrained(tmp)
            write_file(marker, json.dumps(wanted))
        except FileNotFoundError as e:  # a failed build, not a missing input: keep its traceback (exit 1)
            raise RuntimeError(f"building the tiny models in {out} failed: {e}") from e
    return paths


def resolve_tiny(name: str, tiny_dir: str | Path) -> str:
    """A model name as it runs: `tiny:student` / `tiny:teacher` become the tiny models' folders
    (built under `tiny_dir` on first use); other names stay."""
    return str(init_tiny(Path(tiny_dir).expanduser(), seed=0)[name[5:]]) if name.startswith("tiny:") else name
