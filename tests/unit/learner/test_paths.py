"""The learner's memory-lean paths give the numbers of its original dense path: attention over
padding-free packed micro-batches without an L×L mask (learner/attention.py) and token
logprobs from the LM head in chunks (learner/forward.py), on the tiny model and on a tiny Qwen3
with Qwen3's vocabulary (151,936), for packed rows of several segments with padding. The
reference is the original path: padded rows, the [B, 1, L, L] block-diagonal mask, whole logits.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from rose_ray.learner.attention import segment_mask, transformers_name
from rose_ray.learner.batching import micro_batches, position_ids
from rose_ray.learner.forward import PackedForward
from rose_ray.learner.losses import token_logprobs as dense_token_logprobs
from rose_ray.tokens import TokenWeights, make_batch, render
from rose_ray.types import Turn

RTOL = 1e-5


def qwen3_vocab(path):
    from rose_ray.provision.tiny import build_qwen3_vocab_model

    if not (path / "config.json").exists():
        build_qwen3_vocab_model(seed=0).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["tiny", "qwen3_vocab"])
def model_path(request, tiny_models, tmp_path_factory):
    if request.param == "tiny":
        return tiny_models["student"]
    return qwen3_vocab(tmp_path_factory.mktemp("qwen3_vocab"))


def load(path, attn: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation=transformers_name(attn)).eval()


def packed_batch(vocab: int, lengths=(37, 90, 23, 61, 15, 70), max_tokens=160, seed=0):
    """Sequences packed several to a row, the rows padded to the longest."""
    rng = np.random.default_rng(seed)
    seqs = [render([Turn("user", "", "env", rng.integers(5, vocab, n).tolist())]) for n in lengths]
    batch = make_batch(seqs, TokenWeights(ce={"env": 1.0}), max_tokens=max_tokens)
    segments = np.asarray(batch.attention_mask)
    assert (segments.max(axis=1) >= 2).any() and (segments == 0).any()  # several segments, and padding
    return batch


def dense_reference(model, batch, device="cpu"):
    """The original path: padded rows, the L×L block mask, whole logits: logp [rows, L-1]."""
    seg = np.asarray(batch.attention_mask)
    ids = torch.from_numpy(np.asarray(batch.input_ids)).to(device)
    logits = model(input_ids=ids, position_ids=torch.from_numpy(position_ids(seg)).to(device),
                   attention_mask=segment_mask(torch.from_numpy(seg).to(device)), use_cache=False).logits
    return dense_token_logprobs(logits, ids)


def flat_targets(batch) -> list[tuple[int, int]]:
    """(row, column) of each token in the order micro_batches lays a single micro-batch out."""
    seg = np.asarray(batch.attention_mask)
    return [(r, c) for r in range(seg.shape[0]) for c in np.flatnonzero(seg[r] > 0)]


def new_path(model, batch, attn: str, chunk: int):
    (parts,) = micro_batches(batch, ranks=1, max_tokens=int(np.asarray(batch.attention_mask).size))
    (part,) = parts  # one budget for the whole batch: every row in one padding-free micro-batch
    t = {k: torch.from_numpy(v) for k, v in part.items()}
    forward = PackedForward(model, attn, chunk)
    return forward.token_logprobs(forward.hidden_states(model, t), t["input_ids"])[0], part


def compare(model_ref, model_new, batch, attn, chunk):
    """Per-token logprobs and every parameter's gradient of Σ w·logp, new path vs dense path."""
    weights = np.random.default_rng(1).uniform(0.5, 1.5, np.asarray(batch.input_ids).shape).astype(np.float32)
    ref = dense_reference(model_ref, batch)
    targets = flat_targets(batch)
    new, part = new_path(model_new, batch, attn, chunk)
    assert part["input_ids"].shape[1] == len(targets)  # no padding left
    # flat position j predicts flat token j+1; skip the first token of every row (no target there)
    pairs = [(j, targets[j + 1]) for j in range(len(targets) - 1) if targets[j + 1][1] > 0]
    ref_lp = torch.stack([ref[r, c - 1] for _, (r, c) in pairs])
    new_lp = torch.stack([new[j] for j, _ in pairs])
    torch.testing.assert_close(new_lp, ref_lp, rtol=RTOL, atol=RTOL * ref_lp.abs().max().item())
    w = torch.tensor([weights[r, c] for _, (r, c) in pairs])
    (ref_lp * w).sum().backward()
    (new_lp * w).sum().backward()
    assert_same_grads(model_ref, model_new)


def assert_same_grads(model_ref, model_new, rtol: float = RTOL) -> None:
    """Every parameter's gradient in `model_new` equals `model_ref`'s (each within `rtol`,
    absolutely within rtol × that gradient's largest entry)."""
    grads = dict(model_ref.named_parameters())
    for name, p in model_new.named_parameters():
        g_ref = grads[name].grad
        torch.testing.assert_close(p.grad, g_ref, rtol=rtol, atol=rtol * g_ref.abs().max().item(), msg=name)


@pytest.mark.parametrize("chunk", [0, 64])
def test_sdpa_varlen_and_chunked_head_equal_the_dense_path(model_path, chunk):
    ref, new = load(model_path, "dense_mask"), load(model_path, "sdpa_varlen")
    compare(ref, new, packed_batch(ref.config.vocab_size), "sdpa_varlen", chunk)


def test_chunked_head_on_the_dense_mask_path_equals_whole_logits(tiny_models):
    ref, new = load(tiny_models["student"], "dense_mask"), load(tiny_models["student"], "dense_mask")
    compare(ref, new, packed_batch(ref.config.vocab_size), "dense_mask", 17)  # 17: a ragged last chunk


@pytest.mark.parametrize("attn", ["sdpa_varlen", "dense_mask"])
def test_a_token_sees_no_other_segment(tiny_models, attn):
    """Changing one segment's tokens leaves every other segment's logprobs as they were; the
    same check on attention that ignores the boundaries does see the change (it can fail)."""
    model = load(tiny_models["student"], attn)
    batch = packed_batch(model.config.vocab_size)
    (parts,) = micro_batches(batch, ranks=1, max_tokens=10_000)
    (part,) = parts
    seg = part["attention_mask"][0]
    changed = part["input_ids"].copy()
    victim = seg == 2
    changed[0, victim] = (changed[0, victim] + 7) % model.config.vocab_size
    others = np.flatnonzero((seg[1:] != 2) & (seg[:-1] != 2))  # targets whose context and token are elsewhere
    forward = PackedForward(model, attn, 32)
    with torch.no_grad():
        def logp(ids, boundaries=True):
            t = {k: torch.from_numpy(v) for k, v in {**part, "input_ids": ids}.items()}
            if not boundaries:
                t = {k: v for k, v in t.items() if k not in ("cu_seq_lens",)}
                t["position_ids"] = torch.arange(ids.shape[1])[None]
            return forward.token_logprobs(forward.hidden_states(model, t), t["input_ids"])[0].numpy()

        np.testing.assert_array_equal(logp(changed)[others], logp(part["input_ids"])[others])
        if attn == "sdpa_varlen":  # without its boundaries the same row is one sequence
            assert np.abs(logp(changed, False)[others] - logp(part["input_ids"], False)[others]).max() > 1e-4


@pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("flash_attn")),
                    reason="flash_attention_2 needs a CUDA GPU and the flash-attn package")
def test_flash_attention_varlen_equals_the_dense_path(tiny_models):
    """On a GPU with flash-attn: bf16, so a bf16 tolerance; and segments stay apart."""
    from transformers import AutoModelForCausalLM

    def gpu(attn):
        return AutoModelForCausalLM.from_pretrained(tiny_models["student"], dtype=torch.bfloat16,
                                                    attn_implementation=transformers_name(attn)).cuda().eval()

    ref, new = gpu("dense_mask"), gpu("flash_attention_2")
    batch = packed_batch(ref.config.vocab_size)
    with torch.no_grad():
        dense = dense_reference(ref, batch, "cuda")
        (parts,) = micro_batches(batch, ranks=1, max_tokens=10_000)
        t = {k: torch.from_numpy(v).cuda() for k, v in parts[0].items()}
        forward = PackedForward(new, "flash_attention_2", 64)
        flash = forward.token_logprobs(forward.hidden_states(new, t), t["input_ids"])[0]
    targets = flat_targets(batch)
    pairs = [(j, targets[j + 1]) for j in range(len(targets) - 1) if targets[j + 1][1] > 0]
    got = torch.stack([flash[j] for j, _ in pairs]).float().cpu()
    want = torch.stack([dense[r, c - 1] for _, (r, c) in pairs]).float().cpu()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)
