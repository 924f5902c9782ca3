"""The learner's speed settings: what `auto` chooses on this machine, applied to a model before
DeepSpeed wraps it. docs/learner.md has what each costs; tests/unit/learner/test_speed.py checks
each against its reference."""

from __future__ import annotations

import importlib.util
from typing import Any

# No torch at import: the config reads these.
ATTN_IMPLEMENTATIONS = ("auto", "torch_varlen", "sdpa_varlen", "flash_attention_2", "dense_mask")
HEADS = ("auto", "full", "trained", "cce", "liger")
OPTIMIZERS = ("auto", "adamw_fused", "adamw")
CHECKPOINTING = ("none", "full", "selective")
FUSED_KERNELS = ("auto", "none", "liger", "compile")


def make_optimizer(name: str, params: Any, cfg: Any) -> Any:
    """A torch AdamW of `cfg`'s hyper-parameters, fused or torch's default implementation."""
    import torch

    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                             weight_decay=cfg.weight_decay, fused=True if name == "adamw_fused" else None)


def checkpointed_layers(mode: str, layers: int) -> list[int]:
    """Indices of the decoder layers recomputed in backward under `mode`."""
    every = {"full": 1, "selective": 2}.get(mode)  # none: no layer
    return list(range(0, layers, every)) if every else []


def apply_checkpointing(model: Any, mode: str) -> None:
    """Gradient checkpointing on the layers `mode` names (transformers' own, per layer)."""
    if mode == "none":
        return
    model.gradient_checkpointing_enable()
    layers = model.base_model.layers
    keep = set(checkpointed_layers(mode, len(layers)))
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in keep


def liger_supports(model_type: str) -> bool:
    """Whether Liger (with Triton, on CUDA) is here and has kernels for this model type."""
    import torch

    if not (torch.cuda.is_available() and importlib.util.find_spec("triton")
            and importlib.util.find_spec("liger_kernel")):
        return False
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return model_type in MODEL_TYPE_TO_APPLY_LIGER_FN


def apply_fused_kernels(model: Any, name: str) -> None:
    """Liger's kernels, or regional compilation, put into `model` (in place)."""
    if name == "liger":
        if not liger_supports(model.config.model_type):
            raise RuntimeError(f"learner.fused_kernels=liger: needs CUDA, triton and liger-kernel with kernels for "
                               f"{model.config.model_type!r} (pip install 'rose-ray[gpu]')")
        from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

        # RMSNorm, RoPE and SwiGLU; the head stays the learner's own (learner.head)
        _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True,
                                        cross_entropy=False, fused_linear_cross_entropy=False)
    elif name == "compile":
        for module in model.modules():
            if type(module).__name__.endswith(("RMSNorm", "MLP")):
                module.compile(dynamic=True)


def chosen(cfg: Any, model_type: str, on_cuda: bool) -> dict[str, str]:
    """Every speed setting of `cfg` as it runs here (`auto` resolved)."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    from rose_ray.learner.attention import torch_varlen_available
    from rose_ray.learner.forward import FUSED_HEADS

    attn, optimizer, kernels, head = cfg.attn_implementation, cfg.optimizer, cfg.fused_kernels, cfg.head
    if attn == "auto":  # on a GPU under bf16: flash-attn where it is installed, else torch's varlen
        gpu_bf16 = on_cuda and cfg.dtype == "bfloat16"
        attn = ("flash_attention_2" if gpu_bf16 and importlib.util.find_spec("flash_attn")
                else "torch_varlen" if gpu_bf16 and torch_varlen_available() else "sdpa_varlen")
    if optimizer == "auto":  # fused where this torch's AdamW has a CUDA kernel
        optimizer = "adamw_fused" if on_cuda and "cuda" in _get_fused_kernels_supported_devices() else "adamw"
    if kernels == "auto":
        kernels = "liger" if cfg.dtype == "bfloat16" and liger_supports(model_type) else "none"
    if head == "auto":  # a fused kernel on a GPU under bf16 only (Triton's fp32 dot rounds like TF32);
        # `full` on CPU, so CPU runs keep their weights bit for bit (`trained`: within tolerance)
        fused = [h for h, package in FUSED_HEADS.items() if on_cuda and cfg.dtype == "bfloat16"
                 and importlib.util.find_spec("triton") and importlib.util.find_spec(package)]
        head = fused[0] if fused else ("trained" if on_cuda else "full")
    return {"attn_implementation": attn,
            "optimizer": optimizer,
            "activation_checkpointing": cfg.activation_checkpointing,
            "fused_kernels": kernels,
            "head": head}
