"""The prepared GPU check (issue 23, point 9): the seed student's shape on one GPU, random weights.

A Qwen3-1.7B-shaped model is built from its config (the Qwen3 sizes rose_ray ships; nothing
is downloaded) with random bf16 weights, and each part runs in a process of its own so one
part's GPU memory never counts in another's:

- `engine`: the vllm backend (VLLMEngine, bf16, CUDA graphs) serving 16 and then 64 concurrent
  multi-turn episodes (bench/generation.py's callers: 3 turns of 128 new tokens, temperature 1)
  -> generated tokens/s; then one weight update of the whole model (update_weights, i.e.
  vLLM's reload_weights and a prefix-cache reset) -> seconds; peak GPU memory of the process.
- `learner`: the learner's forward as runs use it (learner/forward.py: packed segments, the
  attention implementation `auto` picks, the LM head in chunks of 1,024 tokens, gradient
  checkpointing) on one packed row of 16,384 tokens (4 segments), bf16 weights with an fp32
  AdamW step -> tokens/s, MFU (6 x parameters x tokens/s over the GPU's dense bf16 peak; the
  attention's own FLOPs are left out, as is usual) and peak GPU memory. DeepSpeed is left out:
  one rank's compute is what the row's shape decides.

    bash bench/gpu_check.sh                       # on a GPU machine, ~5 minutes on one H200
    python bench/gpu_check.py --part learner --shape tiny --device cpu   # a smoke run here

Prints a table and writes bench/results/gpu_check.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense, per the vendors' sheets
TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 151936, "tie_word_embeddings": True}


def shape(name: str) -> dict[str, Any]:
    if name == "tiny":
        return dict(TINY)
    from rose_ray.memory import shipped_sizes

    return dict(shipped_sizes()["Qwen/Qwen3-1.7B"])


def build_model(folder: Path, sizes: dict[str, Any], tokenizer_dir: Path) -> Path:
    """A Qwen3 of these sizes with random bf16 weights and a Qwen3-style tokenizer, saved once."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    keep = {k: sizes[k] for k in TINY}
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**keep, max_position_embeddings=40960, torch_dtype="bfloat16",
                                         eos_token_id=2, pad_token_id=0)).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def gpu_peak_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def part_engine(model: Path, device: str) -> dict[str, Any]:
    import asyncio

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generation import play  # the same episode-like callers as bench/generation.py

    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(EngineConfig(backend="vllm", model=str(model), dtype="bfloat16", max_batch_size=64,
                                     context_tokens=16384, gpu_memory_utilization=0.6, kv_cache_mb=2048),
                        device=device)
    out: dict[str, Any] = {}
    try:
        asyncio.run(play(engine.frontend(), engine.chat, 4, 1, 16))  # warm-up
        for callers in (16, 64):
            r = asyncio.run(play(engine.frontend(), engine.chat, callers, 3, 128))
            out[f"tokens_per_s_{callers}"] = r["tokens"] / r["seconds"]
        from safetensors.torch import load_file

        state = {}
        for f in sorted(model.glob("*.safetensors")):
            state.update(load_file(str(f)))
        t0 = time.perf_counter()
        engine.update_weights(state, version=1)
        out["weight_update_s"] = time.perf_counter() - t0
        out["weights_gib"] = sum(t.numel() * t.element_size() for t in state.values()) / 2**30
    finally:
        engine.close()
    if device.startswith("cuda"):
        out["engine_gpu_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    return out


def part_learner(model: Path, device: str, tokens: int, steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from rose_ray.learner.attention import resolve, transformers_name
    from rose_ray.learner.forward import PackedForward

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    attn = resolve("auto", dtype)
    net = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype),
                                               attn_implementation=transformers_name(attn)).to(device)
    net.gradient_checkpointing_enable()
    net.config.use_cache = False
    net.train()
    fwd = PackedForward(net, attn, chunk=1024)
    optim = torch.optim.AdamW(net.parameters(), lr=1e-5)  # fp32 moments of bf16 weights
    params = sum(p.numel() for p in net.parameters())
    segments = 4
    seg = tokens // segments
    vocab = min(net.config.vocab_size, 8000)
    t = {"input_ids": torch.randint(0, vocab, (1, tokens), device=device),
         "position_ids": torch.arange(seg, device=device).repeat(segments)[None],
         "attention_mask": torch.arange(1, segments + 1, device=device).repeat_interleave(seg)[None],
         "cu_seq_lens": torch.arange(0, tokens + 1, seg, device=device, dtype=torch.int32)}

    def step() -> None:
        hidden = fwd.hidden_states(net, t)
        loss = -fwd.token_logprobs(hidden, t["input_ids"]).mean()
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    step()  # warm-up (allocations, kernels)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    out = {"attention": attn, "parameters": params, "row_tokens": tokens, "segments": segments,
           "step_s": seconds, "tokens_per_s": tokens / seconds, "learner_peak_gib": gpu_peak_gib(device)}
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        out["gpu"] = name
        out["mfu"] = 6 * params * out["tokens_per_s"] / (peak * 1e12) if peak else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["all", "engine", "learner"], default="all")
    p.add_argument("--shape", choices=["qwen3-1.7b", "tiny"], default="qwen3-1.7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=16384, help="the packed row's tokens (the seed's rows)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "rose_ray_gpu_check"))
    p.add_argument("--out", default=str(RESULTS / "gpu_check.json"))
    args = p.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.part != "all":  # one part, in this process
        from rose_ray.models import init_tiny

        tok = init_tiny(work / "tok", style="qwen3")["student"]
        model = build_model(work / f"model_{args.shape}", shape(args.shape), tok)
        result = (part_engine(model, args.device) if args.part == "engine"
                  else part_learner(model, args.device, args.tokens, args.steps))
        print("RESULT " + json.dumps(result), flush=True)
        return

    results: dict[str, Any] = {"shape": args.shape, "device": args.device}
    for part in ("engine", "learner"):
        cmd = [sys.executable, __file__, "--part", part, "--shape", args.shape, "--device", args.device,
               "--tokens", str(args.tokens), "--steps", str(args.steps), "--work", args.work]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            results[part] = {"error": " | ".join(tail), "exit": proc.returncode}
        else:
            results[part] = json.loads(lines[-1][len("RESULT "):])
        results[part]["wall_s"] = time.perf_counter() - t0
        print(f"{part}: {json.dumps(results[part])}", flush=True)
    e, lr = results["engine"], results["learner"]

    def cell(d: dict[str, Any], k: str, fmt: str) -> str:
        return format(d[k], fmt) if d.get(k) is not None else "-"

    print(f"\n| {args.shape} on {lr.get('gpu', args.device)} | value |\n| --- | ---: |")
    print(f"| vllm tokens/s, 16 episodes | {cell(e, 'tokens_per_s_16', '.0f')} |")
    print(f"| vllm tokens/s, 64 episodes | {cell(e, 'tokens_per_s_64', '.0f')} |")
    print(f"| one weight update (s) | {cell(e, 'weight_update_s', '.2f')} |")
    print(f"| engine GPU memory reserved (GiB) | {cell(e, 'engine_gpu_reserved_gib', '.1f')} |")
    print(f"| learner tokens/s ({args.tokens:,}-token row, {lr.get('attention', '?')}) | {cell(lr, 'tokens_per_s', '.0f')} |")
    print(f"| learner MFU | {cell(lr, 'mfu', '.1%')} |")
    print(f"| learner peak GPU memory (GiB) | {cell(lr, 'learner_peak_gib', '.1f')} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
