"""A learner's weights written as a Hugging Face folder (rose_ray/learner/export.py:
`gather_state`, `write_hf_folder`): a bf16 export casts the parameters and keeps the model's
fp32 buffers, and an fp32 export of parameters that are views into one flat buffer (as ZeRO-1/2
keep them) is written and loads with the same logits. Which route publication takes:
test_publish_route.py; outputs that must not replace a user's folder: test_safe_outputs.py."""

from __future__ import annotations

import torch


def test_bf16_export_keeps_fp32_buffers(tiny_models, tmp_path):
    """Parameters cast to the export dtype; buffers stay as the model defines them."""
    from transformers import AutoModelForCausalLM

    from rose_ray.learner.export import gather_state, write_hf_folder

    model = AutoModelForCausalLM.from_pretrained(tiny_models["student"], dtype=torch.float32).eval()
    state = gather_state(model, zero3=False, keep=True, dtype="bfloat16")
    assert "lm_head.weight" not in state  # tied to the embeddings: written once
    write_hf_folder(state, str(tiny_models["student"]), str(tmp_path / "bf16"), "bfloat16")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto").eval()  # v5 default
    assert loaded.dtype == torch.bfloat16
    assert loaded.model.rotary_emb.inv_freq.dtype == torch.float32
    ids = torch.arange(5, 40)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits.float(), model(input_ids=ids).logits,
                                   atol=0.1, rtol=0.05)


def test_an_fp32_export_of_parameters_in_one_flat_buffer(tiny_models, tmp_path):
    """Found by the rehearsal: ZeRO-1/2 keep a rank's fp32 parameters as views into one flat
    buffer, and an fp32 export (no cast, so no copy) was refused by safetensors. The layout is
    made here as DeepSpeed makes it (torch._utils._flatten_dense_tensors / views)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rose_ray.learner.export import gather_state, write_hf_folder

    model = AutoModelForCausalLM.from_pretrained(tiny_models["student"], dtype=torch.float32).eval()
    params = list(model.parameters())
    flat = torch._utils._flatten_dense_tensors([p.data for p in params])
    for p, view in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.data for p in params])):
        p.data = view  # as DeepSpeed's ZeRO-1/2 optimizer points the module's parameters into its buffer
    state = gather_state(model, zero3=False, keep=True)
    write_hf_folder(state, str(tiny_models["student"]), str(tmp_path / "fp32"), "float32")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", dtype=torch.float32).eval()
    ids = torch.arange(5, 40)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
