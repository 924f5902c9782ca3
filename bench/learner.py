"""Learner benchmarks (not a test): training tokens/s of the DeepSpeed learner vs a plain
torch loop on the same model and batches, and weight publication ms/MB (object store into a
real engine actor vs a gloo broadcast) for the tiny student and a ~100M-parameter model.

    python bench/learner.py [--steps 8] [--threads 2] [--quick]

Prints a table and writes bench/results/learner.json (the latest; each run keeps its own copy
in bench/results/learner/version_N/).

    python bench/learner.py --memory [--tokens 2048 4096 8192 16384]

Peak memory of one training step of a 2-layer, 64-wide Qwen3 with Qwen3's vocabulary
(151,936) on one packed row of N tokens (4 segments), through the real learner rank (DeepSpeed,
1 rank, fp32), each point in a fresh process (its peak RSS, ru_maxrss): the original path
(`dense_mask` attention, whole logits) where this machine's free memory holds it, and the new
one (sdpa per segment, the head in chunks of `learner.logprob_chunk`). Prints a table and
writes bench/results/learner_memory.json (the latest; each run keeps its own copy in
bench/results/learner_memory/version_N/).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rose_ray.runs import keep_result

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


class TorchLoop:
    """The baseline: the same model, micro-batches and loss in a plain torch loop."""

    def __init__(self, model: str, dtype: str, attn: str, threads: int, lr: float) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from rose_ray.learner.attention import transformers_name
        from rose_ray.learner.forward import PackedForward

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch.float32, attn_implementation=transformers_name(attn)).train()
        self.packed = PackedForward(self.model, attn, 1024)
        self.dtype = dtype
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)

    def train_step(self, parts, den) -> float:
        import torch

        from rose_ray.learner.losses import aligned
        from rose_ray.learner.losses import loss as batch_loss

        start = time.perf_counter()
        for part in parts:
            t = {k: torch.from_numpy(np.array(v)) for k, v in part.items()}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bfloat16"):
                logp = self.packed.token_logprobs(self.packed.hidden_states(self.model, t), t["input_ids"])
            loss, _ = batch_loss(logp, aligned(t), den, 0.2)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start


class Broadcaster:
    """One side of a 2-process gloo group: rank 0 sends weights, rank 1 receives in place."""

    def __init__(self, rank: int, model: str, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.rank = rank
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)

    def addr(self):
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def init(self, addr: str, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=self.rank, world_size=2)

    def broadcast(self) -> float:
        import torch
        import torch.distributed as dist

        dist.barrier()
        start = time.perf_counter()
        with torch.no_grad():
            for p in self.model.parameters():  # receiver: straight into its parameters
                dist.broadcast(p.data, src=0)
        dist.barrier()
        return time.perf_counter() - start


def make_sequences(vocab: int, n: int, length: int, seed: int = 0):
    from rose_ray.tokens import render
    from rose_ray.types import Turn

    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(n):
        ln = int(rng.integers(length // 2, length))
        k = ln // 4
        turns = [Turn("user", "", "prompt", rng.integers(5, vocab, k).tolist()),
                 Turn("assistant", "", "student", rng.integers(5, vocab, k).tolist()),
                 Turn("user", "", "env", rng.integers(5, vocab, k).tolist()),
                 Turn("assistant", "", "teacher", rng.integers(5, vocab, ln - 3 * k).tolist())]
        seqs.append(render(turns))
    return seqs


def bench_training(model: str, vocab: int, args) -> list[dict]:
    """DeepSpeed and torch steps alternate, so load from other processes hits both alike."""
    import ray

    from rose_ray.learner.batching import micro_batches
    from rose_ray.learner.learner import LearnerConfig, LearnerGroup
    from rose_ray.learner.losses import denominators
    from rose_ray.recipes.teacher_sft import imitate
    from rose_ray.tokens import make_batch

    seqs = make_sequences(vocab, args.sequences, args.length)
    rows = []
    for dtype in ("float32", "bfloat16"):
        cfg = LearnerConfig(model=model, dtype=dtype, lr=1e-4, threads=args.threads,
                            cpus_per_rank=1, max_tokens=args.length)
        group = LearnerGroup(cfg)
        batch = make_batch(seqs, imitate(["student", "teacher"]), cfg.max_tokens)
        tokens = int((np.asarray(batch.attention_mask) > 0).sum())
        attn = group.info["speed"]["attn_implementation"]  # the learner's own (`auto` resolved)
        loop = ray.remote(num_cpus=1)(TorchLoop).remote(model, dtype, attn, args.threads, 1e-4)
        den = denominators(batch)
        parts = ray.put(micro_batches(batch, 1, cfg.max_tokens)[0])
        ds_times, torch_times = [], []
        for _ in range(args.warmup + args.steps):
            ds_times.append(group.train_step(batch)["step_s"])
            torch_times.append(ray.get(loop.train_step.remote(parts, den)))
        group.shutdown()
        ray.kill(loop)
        ds = tokens / statistics.median(ds_times[args.warmup:])
        plain = tokens / statistics.median(torch_times[args.warmup:])
        rows.append({"model": Path(model).name, "dtype": dtype, "tokens_per_step": tokens,
                     "deepspeed_tokens_per_s": ds, "torch_tokens_per_s": plain, "ratio": ds / plain})
    return rows


def build_100m(tokenizer_dir: str, out: Path) -> str:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    if (out / "config.json").exists():
        return str(out)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=10,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                      tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def bench_publication(model: str, args) -> dict:
    import ray

    from rose_ray.inference.actor import engine_actor
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.learner.learner import LearnerConfig, LearnerGroup

    group = LearnerGroup(LearnerConfig(model=model, threads=args.threads, cpus_per_rank=1))
    engine = engine_actor(EngineConfig(model=model, dtype="float32", threads=1), num_cpus=1)
    ray.get(engine.ready.remote())
    runs = [group.publish_weights([engine]) for _ in range(args.publish_repeats)]
    group.shutdown()
    ray.kill(engine)
    mb = runs[0]["mb"]
    store_ms = statistics.median(r["total_ms"] for r in runs)

    cls = ray.remote(num_cpus=1)(Broadcaster)
    pair = [cls.remote(r, model, args.threads) for r in range(2)]
    addr, port = ray.get(pair[0].addr.remote())
    ray.get([p.init.remote(addr, port) for p in pair])
    bcast = [max(ray.get([p.broadcast.remote() for p in pair])) for _ in range(args.publish_repeats)]
    for p in pair:
        ray.kill(p)
    bcast_ms = statistics.median(bcast) * 1e3
    return {"model": Path(model).name, "mb": mb,
            "object_store_ms": store_ms, "object_store_ms_per_mb": store_ms / mb,
            "gather_ms": statistics.median(r["gather_ms"] for r in runs),
            "gloo_broadcast_ms": bcast_ms, "gloo_broadcast_ms_per_mb": bcast_ms / mb}


# --memory: the learner's peak memory per row length -------------------------------------

MEMORY_TOKENS = [2048, 4096, 8192, 16384]
ORIGINAL = {"attn_implementation": "dense_mask", "logprob_chunk": 0}  # the L×L mask, whole logits
# The original path's cost per token with Qwen3's vocabulary (~1.8 MiB measured here), plus
# the process and model: what a point must find free before it is run.
ORIGINAL_BYTES_PER_TOKEN = 2.0e6
PROCESS_BYTES = 1.5e9


def path_name(settings: dict) -> str:
    chunk = settings["logprob_chunk"]
    return f"{settings['attn_implementation']}+{'whole_logits' if chunk == 0 else f'chunk{chunk}'}"


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def memory_point(tokens: int, settings: dict, model: str, threads: int) -> dict:
    """One training step of the real learner rank (DeepSpeed, 1 rank, gloo, fp32) on one packed
    row of `tokens` tokens in 4 segments; run in a fresh process, so ru_maxrss is this point's."""
    import socket

    from rose_ray.learner.batching import micro_batches
    from rose_ray.learner.learner import LearnerConfig
    from rose_ray.learner.losses import denominators
    from rose_ray.learner.worker import LearnerWorker
    from rose_ray.tokens import TokenWeights, make_batch, render
    from rose_ray.types import Turn

    rng = np.random.default_rng(0)
    sizes = [tokens * 4 // 10, tokens * 3 // 10, tokens * 2 // 10]
    sizes.append(tokens - sum(sizes))
    seqs = [render([Turn("user", "", "env", rng.integers(5, 150_000, n // 4).tolist()),
                    Turn("assistant", "", "teacher", rng.integers(5, 150_000, n - n // 4).tolist())])
            for n in sizes]
    batch = make_batch(seqs, TokenWeights(ce={"teacher": 1.0}), max_tokens=tokens)
    assert batch.input_ids.shape == (1, tokens)
    worker = LearnerWorker(0, 1, threads)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker.init_distributed("127.0.0.1", port, "gloo")
    worker.setup(LearnerConfig(model=model, max_tokens=tokens, threads=threads, lr=1e-4, **settings))
    before = peak_mib()
    start = time.perf_counter()
    metrics = worker.train_step(micro_batches(batch, 1, tokens)[0], denominators(batch))
    return {"tokens": tokens, "peak_mib": round(peak_mib(), 1), "path": path_name(settings),
            "before_step_mib": round(before, 1), "step_s": round(time.perf_counter() - start, 2),
            "loss": metrics["sum/loss"]}


def available_bytes() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    return float("inf")


def bench_memory(args) -> None:
    from rose_ray.provision.tiny import QWEN3_VOCAB_SIZE, build_qwen3_vocab_model

    model_dir = Path(tempfile.gettempdir()) / "rose_ray_bench" / "qwen3_vocab"
    if not (model_dir / "config.json").exists():
        build_qwen3_vocab_model(seed=0).save_pretrained(model_dir)
    lean = {"attn_implementation": "sdpa_varlen", "logprob_chunk": args.logprob_chunk}
    rows, skipped = [], []
    for tokens in args.tokens:
        for settings in (ORIGINAL, lean):
            need = PROCESS_BYTES + (ORIGINAL_BYTES_PER_TOKEN * tokens if settings is ORIGINAL else 0)
            if need > 0.85 * available_bytes():
                skipped.append({"tokens": tokens, "path": path_name(settings), "needs_gib": round(need / 2**30, 1),
                                "available_gib": round(available_bytes() / 2**30, 1)})
                print(f"{tokens:>6} {path_name(settings):28} skipped: needs ~{need / 2**30:.1f} GiB, "
                      f"{available_bytes() / 2**30:.1f} GiB available", flush=True)
                continue
            out = subprocess.run([sys.executable, __file__, "--memory-point", str(tokens),
                                  json.dumps(settings), str(model_dir), "--threads", str(args.threads)],
                                 capture_output=True, text=True, timeout=3600)
            if out.returncode != 0:
                raise RuntimeError(f"memory point {tokens} {path_name(settings)} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{tokens:>6} {r['path']:28} peak {r['peak_mib']:9.0f} MiB  (before the step "
                  f"{r['before_step_mib']:.0f} MiB, step {r['step_s']:.1f} s)", flush=True)
    lean_peak = {r["tokens"]: r["peak_mib"] for r in rows if r["path"] == path_name(lean)}
    growth = lean_peak[16384] / lean_peak[4096] if {4096, 16384} <= set(lean_peak) else None

    print(f"\npeak memory of one training step (Qwen3 vocabulary {QWEN3_VOCAB_SIZE:,}, hidden 64, 2 layers, "
          "fp32, 1 rank; MiB, fresh process each)")
    print(f"{'tokens':>6} | {path_name(ORIGINAL):>26} | {path_name(lean):>26}")
    for tokens in args.tokens:
        cells = [next((f"{r['peak_mib']:.0f}" for r in rows if r["tokens"] == tokens and r["path"] == path_name(s)),
                      "skipped") for s in (ORIGINAL, lean)]
        print(f"{tokens:>6} | {cells[0]:>26} | {cells[1]:>26}")
    if growth is not None:
        print(f"lean path, 4,096 -> 16,384 tokens: x{growth:.2f}")
    out = Path(__file__).parent / "results" / "learner_memory.json"
    kept = keep_result(out, json.dumps({"rows": rows, "skipped": skipped, "growth_4096_to_16384": growth,
                                        "model": {"vocab_size": QWEN3_VOCAB_SIZE, "hidden_size": 64, "layers": 2},
                                        "threads": args.threads, "load_average": os.getloadavg()}, indent=2))
    print(f"wrote {out} (and {kept})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--publish-repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny model only, fewer steps")
    p.add_argument("--memory", action="store_true", help="peak memory per row length (see the top)")
    p.add_argument("--tokens", type=int, nargs="+", default=MEMORY_TOKENS, help="row lengths for --memory")
    p.add_argument("--logprob-chunk", type=int, default=1024, help="learner.logprob_chunk of the new path")
    p.add_argument("--memory-point", nargs=3, metavar=("TOKENS", "SETTINGS", "MODEL"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_point:
        tokens, settings, model = args.memory_point
        print(json.dumps(memory_point(int(tokens), json.loads(settings), model, args.threads)))
        return
    if args.memory:
        bench_memory(args)
        return
    if args.quick:
        args.steps, args.publish_repeats = 3, 3

    import ray

    from rose_ray.models import load_tokenizer
    from rose_ray.provision.tiny import init_tiny

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    root = Path(tempfile.gettempdir()) / "rose_ray_bench"
    tiny = init_tiny(root / "tiny")
    vocab = len(load_tokenizer(tiny["student"]))
    train = bench_training(str(tiny["teacher"]), vocab, args)
    models = [str(tiny["student"])] + ([] if args.quick else [build_100m(str(tiny["student"]), root / "m100")])
    publish = [bench_publication(m, args) for m in models]
    ray.shutdown()

    print("\ntraining (1 rank, ZeRO 0, same model/batches/loss; median step)")
    print(f"{'model':10} {'dtype':9} {'tok/step':>8} {'deepspeed tok/s':>16} {'torch tok/s':>12} {'ratio':>6}")
    for r in train:
        print(f"{r['model']:10} {r['dtype']:9} {r['tokens_per_step']:8d} {r['deepspeed_tokens_per_s']:16.0f} "
              f"{r['torch_tokens_per_s']:12.0f} {r['ratio']:6.2f}")
    print("\nweight publication (learner rank 0 -> 1 engine actor; median)")
    print(f"{'model':10} {'MB':>7} {'store ms':>9} {'store ms/MB':>12} {'gather ms':>10} "
          f"{'gloo ms':>8} {'gloo ms/MB':>11}")
    for r in publish:
        print(f"{r['model']:10} {r['mb']:7.1f} {r['object_store_ms']:9.1f} {r['object_store_ms_per_mb']:12.3f} "
              f"{r['gather_ms']:10.1f} {r['gloo_broadcast_ms']:8.1f} {r['gloo_broadcast_ms_per_mb']:11.3f}")
    out = Path(__file__).parent / "results" / "learner.json"
    kept = keep_result(out, json.dumps({"args": vars(args), "load_average": os.getloadavg(),
                                        "training": train, "publication": publish}, indent=2))
    print(f"\nwrote {out} (and {kept})")
    shutil.rmtree(root / "m100", ignore_errors=True) if os.environ.get("BENCH_CLEAN") else None


if __name__ == "__main__":
    main()
