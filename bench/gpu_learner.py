"""The learner at the seed's step shape, its speed settings added one at a time (bench/gpu_check.py
--part learner; issue 53).

A step is what a seed rank runs: `micro` packed rows of `tokens` tokens (4 segments each; the
seed: 3-4 rows of 16,384, ~55k tokens per rank per optimizer step) through a real learner rank
(LearnerWorker.train_step: DeepSpeed ZeRO-2, bf16 weights with fp32 master weights and AdamW
moments, the loss's metrics kept on the device), then one optimizer step. A quarter of each
segment's tokens carry the loss (cross entropy), in blocks of 256 in its second half: the shape
of a ROSE trajectory, whose teacher turns alone are trained.

Rungs, each adding one setting to the one before (each in a process of its own, so its peak
memory is its own and Liger's patches stay in it):

    0 shipped      sdpa_varlen, the full head in chunks, torch's default AdamW, full checkpointing
    1 attention    torch_varlen (one FlashAttention call per row)
    2 optimizer    adamw_fused
    3 checkpointing  none where the memory plan fits it on this GPU, else selective
    4 kernels      fused_kernels: liger (RMSNorm, RoPE, SwiGLU)
    5 head         trained (only the trained tokens through the head)
    6 fused head   cce (cut-cross-entropy on those tokens)

A rung whose setting cannot run here (no CUDA, a package missing) is run without it and says so.
`overlap_comm` needs two ranks (ZeRO-2 over one rank has nothing to reduce): not measured here.

MFU under two conventions, the same formula on every rung (tokens/s × FLOPs per token over the
GPU's dense bf16 peak): `6N` (N: every parameter, the tied embedding counted once, as the LM
head's matmul), and `6N + attn`, adding 12·layers·heads·head_dim·T/2 per token with T each
segment's length (the causal half of the score and value matmuls; torchtitan and PaLM count
12·L·H·Q·T without halving). Neither counts checkpointing's recomputation (that would be HFU).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense, per the vendors' sheets
SHIPPED = {"attn_implementation": "sdpa_varlen", "head": "full", "optimizer": "adamw",
           "activation_checkpointing": "full", "fused_kernels": "none"}
RUNGS = [("shipped", {}), ("attention", {"attn_implementation": "torch_varlen"}),
         ("optimizer", {"optimizer": "adamw_fused"}), ("checkpointing", {"activation_checkpointing": "plan"}),
         ("kernels", {"fused_kernels": "liger"}), ("head", {"head": "trained"}), ("fused head", {"head": "cce"})]
SEGMENTS = 4


def step_parts(tokens: int, micro: int, vocab: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """`micro` packed rows of `tokens` tokens in 4 segments, as learner/batching.py deals them,
    a quarter of each segment's tokens trained; and the loss's denominators."""
    rng = np.random.default_rng(seed)
    seg = tokens // SEGMENTS
    segments = np.repeat(np.arange(1, SEGMENTS + 1), seg)[None].astype(np.int32)
    trained = np.zeros(seg, dtype=np.float32)
    half = np.arange(seg // 2, seg)
    trained[half[(half // 256) % 2 == 0]] = 1.0
    parts = []
    for _ in range(micro):
        n = seg * SEGMENTS
        parts.append({"input_ids": rng.integers(0, vocab, (1, n)), "attention_mask": segments,
                      "old_logprobs": np.full((1, n), np.nan, np.float32),
                      "teacher_logprobs": np.full((1, n), np.nan, np.float32),
                      "versions": np.zeros((1, n), np.int64), "ce_weights": np.tile(trained, SEGMENTS)[None],
                      "position_ids": np.tile(np.arange(seg), SEGMENTS)[None],
                      "cu_seq_lens": np.arange(0, n + 1, seg).astype(np.int32)})
    den = {"ce": float(sum((p["ce_weights"][:, 1:] > 0).sum() for p in parts))}
    return parts, den


def flops_per_token(config: Any, parameters: int, segment: int) -> dict[str, float]:
    """The two conventions' FLOPs per trained-through token."""
    attn = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * segment / 2
    return {"6N": 6.0 * parameters, "6N+attn": 6.0 * parameters + attn}


def fits_without_checkpointing(model: Path, tokens: int, gpu_bytes: float | None) -> bool:
    """The memory plan's answer for one rank of this bench (ZeRO-2 over 1 rank, bf16) on this GPU."""
    if gpu_bytes is None:
        return True
    from rose_ray.learner.learner import LearnerConfig
    from rose_ray.memory import ModelShape, learner_memory

    shape = ModelShape.from_config(str(model), str(model / "config.json"), json.loads((model / "config.json").read_text()))
    cfg = LearnerConfig(model=str(model), dtype="bfloat16", zero_stage=2, max_tokens=tokens, gpus_per_rank=1,
                        activation_checkpointing="none", optimizer="adamw_fused")
    return learner_memory(cfg, shape, gpu_bytes, "this").problem is None


def rung_settings(k: int, model: Path, tokens: int, on_cuda: bool) -> tuple[dict[str, str], list[str]]:
    """The settings of rung `k` (the rungs before it included) and what could not run here."""
    from rose_ray.learner import attention, speed
    from rose_ray.learner.learner import LearnerConfig

    settings, missing = dict(SHIPPED), []
    # what `auto` takes here: cce (its first fused head) and adamw_fused where they run (torch >= 2.6
    # has AdamW's fused CPU kernel)
    bf16 = LearnerConfig(model=str(model), dtype="bfloat16", gpus_per_rank=1)
    auto = speed.chosen(bf16, "qwen3", on_cuda)
    runnable = {"torch_varlen": attention.torch_varlen_available,
                "liger": lambda: speed.liger_supports("qwen3"), "cce": lambda: auto["head"] == "cce",
                "adamw_fused": lambda: not on_cuda or auto["optimizer"] == "adamw_fused"}
    for name, change in RUNGS[1:k + 1]:
        for key, value in change.items():
            if value == "plan":
                gpu = None
                if on_cuda:
                    import torch

                    gpu = torch.cuda.get_device_properties(0).total_memory
                value = "none" if fits_without_checkpointing(model, tokens, gpu) else "selective"
            if key in ("attn_implementation", "fused_kernels", "head") and value in runnable and not on_cuda:
                missing.append(f"{name}: {value} needs CUDA")
            elif value in runnable and not runnable[value]():
                missing.append(f"{name}: {value} cannot run here (its package or this torch's kernel is missing)")
            else:
                settings[key] = value
    return settings, missing


def rung(model: Path, device: str, k: int, tokens: int, micro: int, steps: int) -> dict[str, Any]:
    """Rung `k` on a real learner rank: seconds per optimizer step, tokens/s, peak memory, MFU."""
    import torch

    from rose_ray.learner.learner import LearnerConfig
    from rose_ray.learner.worker import LearnerWorker

    on_cuda = device.startswith("cuda")
    settings, missing = rung_settings(k, model, tokens, on_cuda)
    rank = LearnerWorker(rank=0, world_size=1, threads=max(1, (os.cpu_count() or 2) // 2))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank.init_distributed("127.0.0.1", port, "auto")
    cfg = LearnerConfig(model=str(model), dtype="bfloat16" if on_cuda else "float32", zero_stage=2, ranks=1,
                        max_tokens=tokens, logprob_chunk=1024, gpus_per_rank=1.0 if on_cuda else 0.0, **settings)
    info = rank.setup(cfg)
    config = rank.engine.module.config
    parts, den = step_parts(tokens, micro, min(config.vocab_size, 8000))
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    rank.train_step(parts, den)  # warm-up: allocations, kernels, Triton's autotuning
    if on_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses = [rank.train_step(parts, den)["sum/loss"] for _ in range(steps)]
    if on_cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    step_tokens = tokens * micro
    out = {"rung": k, "name": RUNGS[k][0], "settings": info["speed"], "not_run_here": missing,
           "parameters": info["parameters"], "micro_batches": micro, "row_tokens": tokens, "segments": SEGMENTS,
           "step_tokens": step_tokens, "step_s": seconds, "tokens_per_s": step_tokens / seconds,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None, "losses": losses}
    if on_cuda:
        name = torch.cuda.get_device_name()
        peak = next((v for key, v in PEAK_BF16_TFLOPS.items() if key in name), None)
        out["gpu"] = name
        for conv, flops in flops_per_token(config, info["parameters"], tokens // SEGMENTS).items():
            out[f"mfu_{conv}"] = flops * out["tokens_per_s"] / (peak * 1e12) if peak else None
    if k == len(RUNGS) - 1:
        t0 = time.perf_counter()
        rank.full_state("bfloat16")  # the publication's first stage: the full bf16 state on rank 0
        out["gather_ms"] = (time.perf_counter() - t0) * 1e3
    return out


def ladder(script: str, model_args: list[str], budget_s: float) -> list[dict[str, Any]]:
    """Every rung in a process of its own (`script --part learner-rung --rung k ...`), within
    `budget_s` seconds: a rung not started by then is listed as skipped."""
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    for k, (name, _) in enumerate(RUNGS):
        if time.perf_counter() - start > budget_s:
            results.append({"rung": k, "name": name, "error": f"skipped: the ladder's {budget_s:.0f} s were spent"})
            continue
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, script, "--part", "learner-rung", "--rung", str(k), *model_args],
                              capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            result = {"rung": k, "name": name, "error": " | ".join(tail), "exit": proc.returncode}
        else:
            result = json.loads(lines[-1][len("RESULT "):])
        result["wall_s"] = time.perf_counter() - t0
        print(f"learner rung {k} ({name}): {json.dumps(result)}", flush=True)
        results.append(result)
    return results


def table(results: list[dict[str, Any]]) -> list[str]:
    """The ladder as a markdown table."""
    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        return format(r[key], fmt) if r.get(key) is not None else "-"

    lines = ["| rung | settings (cumulative) | s/step | tokens/s | peak GiB | MFU 6N | MFU 6N+attn (T = segment, causal/2) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['rung']} {r['name']} | {r['error'][:120]} | - | - | - | - | - |")
            continue
        s = r["settings"]
        what = (f"{s['attn_implementation']}, head {s['head']}, {s['optimizer']}, ckpt {s['activation_checkpointing']}, "
                f"kernels {s['fused_kernels']}" + (f" ({'; '.join(r['not_run_here'])})" if r["not_run_here"] else ""))
        lines.append(f"| {r['rung']} {r['name']} | {what} | {cell(r, 'step_s', '.3f')} | {cell(r, 'tokens_per_s', ',.0f')} "
                     f"| {cell(r, 'peak_gib', '.1f')} | {cell(r, 'mfu_6N', '.1%')} | {cell(r, 'mfu_6N+attn', '.1%')} |")
    return lines
