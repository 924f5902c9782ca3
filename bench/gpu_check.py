"""The prepared GPU check (issue 23, point 9): the seed student's shape on one GPU, random weights.

A Qwen3-1.7B-shaped model is built from its config (the Qwen3 sizes rose_ray ships; nothing
is downloaded) with random bf16 weights, and each part runs in a process of its own so one
part's GPU memory never counts in another's:

- `engine`: the vllm backend (VLLMEngine, bf16, CUDA graphs) serving 16 and then 64 concurrent
  multi-turn episodes (bench/generation.py's callers: 3 turns of 128 new tokens, temperature 1)
  -> generated tokens/s; the KV cache vLLM allocated (blocks x block tokens) beside what the
  memory plan (rose_ray/memory.py) counts for the same engine; then one weight update of the
  whole model as the object-store path sends it (`publish.method: object_store`,
  rose_ray/publish/flat.py), its stages timed apart: `pack` (each tensor's bytes, no copy),
  the put's one copy, `unpack` into views, the engine's name/shape check, and vLLM's reload plus
  the prefix-cache reset; beside it the pickled path before flat buffers (bench/publish.py's
  `to_wire`, then the pickling a torch tensor pays in Ray's object store); peak GPU memory of
  the process.
- `publish`: the NCCL publication's two ends on one GPU (`publish.collective_backend: nccl`;
  rose_ray/publish/group.py): learner rank 0's state on the GPU packed into device buffers (no
  copy), a one-rank NCCL WeightGroup broadcasting them (the group's construction over its own
  TCPStore and the broadcast call, checked against this torch), unpacked into CUDA views and
  reloaded by a vLLM engine (bf16) with no host round trip; beside it the object-store path from
  the same GPU state (to host, pack, the put's copy, unpack, vLLM's reload from host tensors).
  Each publishes perturbed weights, then the engine's own: greedy outputs change, then equal the
  engine's fresh load. ms/MB for both; what `auto` chose for an engine on this GPU (object_store:
  NCCL takes one rank per GPU) and for one on another GPU (the collective over NCCL). The
  broadcast between two processes needs a second GPU: bench/gpu_check.sh then runs
  tests/integration/test_publish.py's NCCL test (a one-GPU machine skips it, saying so).
- `stall`: a weight group whose second member never joins (NCCL on the GPU; gloo on a CPU),
  learner rank 0's side as the publisher runs it: it must give up within its timeout
  (CollectiveTimeout), abort the group, and live past the group's own timeout (twice that: the
  NCCL watchdog of a group made with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 aborts the communicator
  and leaves the process alone), the GPU still computing. Needs no vLLM.
- `hf`: the transformers engine (HFEngine, `backend: hf`, bf16) on the GPU: its greedy ids beside
  transformers' own `generate` (one prompt at a time), tokens/s at 16 and 64 concurrent episodes
  (its AsyncBatcher), and a weight update from tensors on the GPU (perturbed weights change the
  greedy ids, the engine's own restore them). It needs no vLLM: it and `learner` run where vLLM
  cannot be installed (`--part hf`, `--part learner`).
- `learner`: the learner at the seed's step shape (bench/gpu_learner.py): a real learner rank
  (LearnerWorker: DeepSpeed ZeRO-2, bf16 weights with fp32 master weights and fp32 AdamW moments,
  as runs hold them), `--micro` packed rows of `--tokens` tokens (4 segments each) per optimizer
  step, first with the settings shipped before issue 53, then adding its speed settings one at a
  time (each rung in a process of its own): seconds per step, tokens/s, peak GPU memory, MFU
  under two conventions (6N; 6N plus attention with T = each segment, causal-halved), and the
  publication's first stage (the full bf16 state gathered on the rank).

    bash bench/gpu_check.sh                       # on a GPU machine, within 8 minutes on one H200
    python bench/gpu_check.py --part learner --quick   # a dry run here: tiny shape, CPU, small rows

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
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_learner  # noqa: E402  (bench/gpu_learner.py: the learner part)

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
    # initialised on the GPU where there is one (1.7B parameters: seconds, not a minute on CPU),
    # written whole before it is named (a rung killed mid-write leaves no half model behind)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(Qwen3Config(**keep, max_position_embeddings=40960, torch_dtype="bfloat16",
                                             eos_token_id=2, pad_token_id=0)).to(torch.bfloat16)
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(partial)
    partial.replace(folder)
    return folder


def gpu_peak_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


PROMPTS = [[100 + 7 * i + j for j in range(32)] for i in range(4)]  # 4 prompts of 32 ids


def greedy_ids(engine: Any) -> list[list[int]]:
    """The engine's greedy replies (16 new tokens) to PROMPTS."""
    from rose_ray.inference.engine import GenerationRequest
    from rose_ray.types import SamplingParams

    requests = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=16)) for p in PROMPTS]
    return [r.token_ids for r in engine.generate(requests)]


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def perturbed(state: dict[str, Any], device: str) -> dict[str, Any]:
    """`state` with seeded noise of half each tensor's std added: weights whose greedy ids differ."""
    import torch

    g = torch.Generator(device=device).manual_seed(1)
    return {k: t + 0.5 * t.float().std().to(t.dtype) * torch.randn(t.shape, generator=g, device=device, dtype=t.dtype)
            if t.is_floating_point() and t.numel() > 1 else t for k, t in state.items()}


def part_engine(model: Path, device: str) -> dict[str, Any]:
    import asyncio

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pickle

    import numpy as np
    from generation import play  # the same episode-like callers as bench/generation.py
    from publish import to_wire  # bench/publish.py's pickled baseline

    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.vllm_engine import VLLMEngine
    from rose_ray.memory import ModelShape, _engine_parts
    from rose_ray.publish.flat import FlatState, pack, unpack

    config = EngineConfig.of("vllm", model=str(model), dtype="bfloat16", max_batch_size=64,
                          context_tokens=16384, gpu_memory_utilization=0.6, kv_cache_mb=2048)
    engine = VLLMEngine(config, device=device)
    out: dict[str, Any] = {}
    try:
        stats = engine.stats()
        out["kv_allocated_gib"] = stats["kv_cache_bytes"] / 2**30 if stats.get("kv_cache_bytes") else None
        out["kv_allocated_tokens"] = stats["kv_blocks"] * stats["kv_block_tokens"] if stats.get("kv_blocks") else None
        shape = ModelShape.from_config(str(model), str(model / "config.json"),
                                       json.loads((model / "config.json").read_text()))
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else None
        out["kv_plan_gib"] = _engine_parts(config, shape, 2, 1, gpu_bytes, device.startswith("cuda"))["KV cache"] / 2**30
        out["kv_plan_tokens"] = config.max_batch_size * config.context_tokens
        asyncio.run(play(engine.frontend(), engine.chat, 4, 1, 16))  # warm-up
        for callers in (16, 64):
            r = asyncio.run(play(engine.frontend(), engine.chat, callers, 3, 128))
            out[f"tokens_per_s_{callers}"] = r["tokens"] / r["seconds"]
        from safetensors.torch import load_file

        state = {}
        for f in sorted(model.glob("*.safetensors")):
            state.update(load_file(str(f)))
        out["weights_gib"] = sum(t.numel() * t.element_size() for t in state.values()) / 2**30
        # The publication's stages after the learner's gather (timed in the learner part): the
        # pickled path before flat buffers, to its engine-side tensors...
        t0 = time.perf_counter()
        wire = to_wire(state)
        t1 = time.perf_counter()
        wire = pickle.loads(pickle.dumps(wire, protocol=5))  # what the object store does to torch tensors
        t2 = time.perf_counter()
        del wire
        # ... and the object-store path's flat buffers: no copy to pack, the put's one copy, views out.
        flat = pack(state, 0).numpy()
        t3 = time.perf_counter()
        flat = FlatState(flat.header, [np.array(b) for b in flat.buffers])  # the put's copy into the store
        t4 = time.perf_counter()
        views = unpack(flat)
        t5 = time.perf_counter()
        engine._checkpoint_weights(views)  # the engine's name and shape check
        t6 = time.perf_counter()
        engine.update_weights(views, version=1)  # the check again, vLLM's reload, the prefix-cache reset
        t7 = time.perf_counter()
        out.update(wire_ms=(t1 - t0) * 1e3, object_store_pickle_ms=(t2 - t1) * 1e3,
                   flat_pack_ms=(t3 - t2) * 1e3, flat_put_copy_ms=(t4 - t3) * 1e3, flat_unpack_ms=(t5 - t4) * 1e3,
                   check_ms=(t6 - t5) * 1e3, reload_ms=(t7 - t6 - (t6 - t5)) * 1e3,
                   weight_update_s=t7 - t2, weight_update_pickled_s=(t2 - t0) + (t7 - t5))
    finally:
        engine.close()
    if device.startswith("cuda"):
        out["engine_gpu_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    return out


def part_publish(model: Path, device: str) -> dict[str, Any]:
    from dataclasses import replace

    import numpy as np
    import torch
    from safetensors.torch import load_file

    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.vllm_engine import VLLMEngine
    from rose_ray.publish.flat import FlatState, pack, unpack
    from rose_ray.publish.group import WeightGroup
    from rose_ray.publish.route import Member, PublishConfig, ReceiverInfo, choose_route

    on_gpu = device.startswith("cuda")
    config = EngineConfig.of("vllm", model=str(model), dtype="bfloat16" if on_gpu else "float32", max_batch_size=8,
                             context_tokens=1024, gpu_memory_utilization=0.3, kv_cache_mb=256, cuda_graphs=False)
    engine = VLLMEngine(config, device=device)

    out: dict[str, Any] = {}
    try:
        fresh = greedy_ids(engine)
        host: dict[str, Any] = {}
        for f in sorted(model.glob("*.safetensors")):
            host.update(load_file(str(f)))
        mine = {k: t.to(device) for k, t in host.items()}  # rank 0's state, on its GPU
        other = perturbed(mine, device)
        mb = sum(t.numel() * t.element_size() for t in mine.values()) / 2**20
        group = None
        if on_gpu:
            try:
                store, address = WeightGroup.open_store(1, 120.0, "nccl")
                group = WeightGroup(store, address["name"], 0, 1, 120.0, "nccl")
            except Exception as e:  # noqa: BLE001 - recorded: the GPU session's finding
                out["nccl_group_error"] = f"{type(e).__name__}: {e}"[:300]

        def device_path(state: dict[str, Any], version: int) -> dict[str, float]:
            synchronize(device)
            t0 = time.perf_counter()
            flat = pack(state, 0, device=device)  # each tensor's own bytes on the GPU: no copy
            t1 = time.perf_counter()
            if group is not None:
                group.broadcast(flat.buffers)  # one rank: the call path, not a transfer
            t2 = time.perf_counter()
            engine.update_weights(unpack(FlatState(flat.header, flat.buffers)), version)  # CUDA views in
            synchronize(device)
            t3 = time.perf_counter()
            return {"pack_ms": (t1 - t0) * 1e3, "broadcast_1rank_ms": (t2 - t1) * 1e3, "load_ms": (t3 - t2) * 1e3,
                    "total_ms": (t3 - t0) * 1e3}

        def object_store_path(state: dict[str, Any], version: int) -> dict[str, float]:
            synchronize(device)
            t0 = time.perf_counter()
            on_host = {k: t.to("cpu") for k, t in state.items()}  # what rank 0 gathers for it
            t1 = time.perf_counter()
            flat = pack(on_host, 0).numpy()
            flat = FlatState(flat.header, [np.array(b) for b in flat.buffers])  # the put's copy into the store
            t2 = time.perf_counter()
            engine.update_weights(unpack(flat), version)  # host views in: vLLM copies them to the GPU
            synchronize(device)
            t3 = time.perf_counter()
            return {"to_host_ms": (t1 - t0) * 1e3, "pack_put_ms": (t2 - t1) * 1e3, "load_ms": (t3 - t2) * 1e3,
                    "total_ms": (t3 - t0) * 1e3}

        version, checks = 0, {}
        for rnd in range(2):  # the second round's timings are the warm ones reported
            for name, path in (("object_store", object_store_path), ("device", device_path)):
                path(other, version := version + 1)
                changed = greedy_ids(engine) != fresh
                timing = path(mine, version := version + 1)
                checks[f"{name}_{rnd}"] = changed and greedy_ids(engine) == fresh
                out[f"{name}_ms"] = timing
        out["mb"] = mb
        out["greedy_equal_fresh_after_each"] = all(checks.values())
        out["greedy_checks"] = checks
        out["device_path_ms_per_mb"] = out["device_ms"]["total_ms"] / mb
        out["object_store_ms_per_mb"] = out["object_store_ms"]["total_ms"] / mb
        here = "this GPU" if on_gpu else None  # (an id only compared)
        rank0 = Member(node_id="here", gpu=here)
        receiver = ReceiverInfo(node_id="here", gpu=here, backend="vllm", takes_weights=True, device=device)
        out["auto_route_engine_on_this_gpu"] = list(choose_route(PublishConfig(), rank0, [receiver]))
        out["auto_route_engine_on_another_gpu"] = list(choose_route(PublishConfig(), rank0,
                                                                    [replace(receiver, gpu="another GPU")]))
        out["gpus"] = torch.cuda.device_count() if on_gpu else 0
    finally:
        engine.close()
    return out


STALL_TIMEOUT_S = 10.0


def part_stall(device: str) -> dict[str, Any]:
    import torch

    from rose_ray.publish.group import CollectiveTimeout, WeightGroup, within

    backend = "nccl" if device.startswith("cuda") else "gloo"
    timeout = STALL_TIMEOUT_S
    store, address = WeightGroup.open_store(2, 2 * timeout, backend)  # (rank 1 is never started)
    out: dict[str, Any] = {"backend": backend, "timeout_s": timeout, "gave_up": None, "error": None}
    t0 = time.perf_counter()
    group = None
    try:  # as WeightPublisher._collective: gloo's group waits for every member, NCCL's first broadcast
        group = within(timeout, "forming the weight group", WeightGroup, store, address["name"], 0, 2,
                       2 * timeout, backend)
        buffer = torch.zeros(2**20, dtype=torch.uint8, device=group.device)
        within(max(timeout - (time.perf_counter() - t0), 0.1), "broadcasting", group.broadcast, [buffer])
    except CollectiveTimeout as e:
        out["gave_up"] = str(e)
    except Exception as e:  # noqa: BLE001 - recorded: a finding of the GPU session
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    out["gave_up_after_s"] = time.perf_counter() - t0
    if group is not None:
        group.abort()
    time.sleep(2 * timeout + 5)  # past the group's own timeout: its watchdog has fired by now
    x = torch.ones(256, 256, device=device)
    out["computes_after"] = float((x @ x).sum().item()) == 256.0**3
    out["alive_after_s"] = time.perf_counter() - t0
    return out


def part_hf(model: Path, device: str) -> dict[str, Any]:
    """The transformers engine (HFEngine, `backend: hf`) on the device: greedy ids beside
    transformers' own generate, tokens/s at 16 and 64 episodes, and a weight update from tensors
    on the device (perturbed weights change the greedy ids, the engine's own restore them)."""
    import asyncio

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generation import play

    from rose_ray.inference.batcher import async_frontend
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.hf import HFEngine

    on_gpu = device.startswith("cuda")
    config = EngineConfig.of("hf", model=str(model), dtype="bfloat16" if on_gpu else "float32", max_batch_size=64,
                             context_tokens=4096)
    engine = HFEngine(config, device=device)

    out: dict[str, Any] = {}
    fresh = greedy_ids(engine)
    with torch.no_grad():  # transformers' own greedy decoding, one prompt at a time (no padding)
        ref = [engine.model.generate(torch.tensor([p], device=device), max_new_tokens=16, do_sample=False,
                                     eos_token_id=sorted(engine.stop_ids), pad_token_id=engine.pad_id)[0, len(p):].tolist()
               for p in PROMPTS]
    out["greedy_prompts_equal_transformers"] = sum(a == b for a, b in zip(fresh, ref))
    out["greedy_tokens_equal_transformers"] = sum(x == y for a, b in zip(fresh, ref) for x, y in zip(a, b))
    out["greedy_tokens"] = sum(len(a) for a in fresh)

    async def run(callers: int, turns: int, new: int) -> dict[str, float]:
        front = async_frontend(engine)
        try:
            return await play(front, engine.chat, callers, turns, new)
        finally:
            await front.close()

    asyncio.run(run(4, 1, 16))  # warm-up
    for callers in (16, 64):
        r = asyncio.run(run(callers, 3, 128))
        out[f"tokens_per_s_{callers}"] = r["tokens"] / r["seconds"]
    mine = engine.state_dict()  # on the device
    other = perturbed(mine, device)
    synchronize(device)
    t0 = time.perf_counter()
    engine.update_weights(other, 1)
    synchronize(device)
    out["update_ms"] = (time.perf_counter() - t0) * 1e3
    out["greedy_changed_after_update"] = greedy_ids(engine) != fresh
    engine.update_weights(mine, 2)
    out["greedy_restored_after_update"] = greedy_ids(engine) == fresh
    out["mb"] = sum(t.numel() * t.element_size() for t in mine.values()) / 2**20
    out["hf_peak_gib"] = gpu_peak_gib(device)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["all", "engine", "publish", "stall", "hf", "learner", "learner-rung"], default="all")
    p.add_argument("--shape", choices=["qwen3-1.7b", "tiny"], default="qwen3-1.7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=16384, help="each packed row's tokens (the seed's rows)")
    p.add_argument("--micro", type=int, default=3, help="learner: packed rows per optimizer step (the seed's 3-4)")
    p.add_argument("--steps", type=int, default=2, help="learner: timed optimizer steps per rung, after one warm-up")
    p.add_argument("--rung", type=int, default=0, help="learner-rung: which rung of bench/gpu_learner.py")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="learner: no rung starts after this many seconds (0 with --part all: no learner part)")
    p.add_argument("--quick", action="store_true", help="a dry run on CPU: tiny shape, rows of 512, 2 per step, 1 step")
    p.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "rose_ray_gpu_check"))
    p.add_argument("--out", default=str(RESULTS / "gpu_check.json"))
    args = p.parse_args()
    if args.quick:
        args.shape, args.device, args.tokens, args.micro, args.steps = "tiny", "cpu", 512, 2, 1

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.part == "stall":  # no model; its stuck thread may hold the process at exit: leave at once
        print("RESULT " + json.dumps(part_stall(args.device)), flush=True)
        os._exit(0)
    if args.part == "learner":  # the ladder: each rung in a process of its own
        model_args = ["--shape", args.shape, "--device", args.device, "--tokens", str(args.tokens),
                      "--micro", str(args.micro), "--steps", str(args.steps), "--work", args.work]
        rungs = gpu_learner.ladder(__file__, model_args, args.budget_s)
        print("\n" + "\n".join(gpu_learner.table(rungs)))
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"shape": args.shape, "device": args.device, "learner": rungs}, indent=1))
        print(f"wrote {out}")
        return
    if args.part != "all":  # one part, in this process
        from rose_ray.provision.tiny import init_tiny

        tok = init_tiny(work / "tok", style="qwen3")["student"]
        model = build_model(work / f"model_{args.shape}", shape(args.shape), tok)
        result = (part_engine(model, args.device) if args.part == "engine"
                  else part_publish(model, args.device) if args.part == "publish"
                  else part_hf(model, args.device) if args.part == "hf"
                  else gpu_learner.rung(model, args.device, args.rung, args.tokens, args.micro, args.steps))
        print("RESULT " + json.dumps(result), flush=True)
        return

    results: dict[str, Any] = {"shape": args.shape, "device": args.device}
    for part in ("engine", "publish", "stall", "hf"):
        cmd = [sys.executable, __file__, "--part", part, "--shape", args.shape, "--device", args.device,
               "--work", args.work]
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
    model_args = ["--shape", args.shape, "--device", args.device, "--tokens", str(args.tokens),
                  "--micro", str(args.micro), "--steps", str(args.steps), "--work", args.work]
    results["learner"] = gpu_learner.ladder(__file__, model_args, args.budget_s) if args.budget_s > 0 else []
    e, pub, stall, hf = results["engine"], results["publish"], results["stall"], results["hf"]
    lr = next((r for r in reversed(results["learner"]) if "gather_ms" in r), {})

    def cell(d: dict[str, Any], k: str, fmt: str) -> str:
        return format(d[k], fmt) if d.get(k) is not None else "-"

    print(f"\n| {args.shape} on {lr.get('gpu', args.device)} | value |\n| --- | ---: |")
    print(f"| vllm tokens/s, 16 episodes | {cell(e, 'tokens_per_s_16', '.0f')} |")
    print(f"| vllm tokens/s, 64 episodes | {cell(e, 'tokens_per_s_64', '.0f')} |")
    print(f"| vllm KV allocated, GiB (tokens) | {cell(e, 'kv_allocated_gib', '.1f')} ({cell(e, 'kv_allocated_tokens', ',')}) |")
    print(f"| memory plan's KV, GiB (tokens) | {cell(e, 'kv_plan_gib', '.1f')} ({cell(e, 'kv_plan_tokens', ',')}) |")
    print(f"| one weight update, flat buffers (s) | {cell(e, 'weight_update_s', '.2f')} |")
    print(f"| one weight update, pickled tensors as before (s) | {cell(e, 'weight_update_pickled_s', '.2f')} |")
    for stage, key, part in (("gather on the rank", "gather_ms", lr), ("flat pack", "flat_pack_ms", e),
                             ("the object store's copy", "flat_put_copy_ms", e), ("unpack", "flat_unpack_ms", e),
                             ("engine's name check", "check_ms", e), ("vLLM reload + cache reset", "reload_ms", e),
                             ("before: to_wire", "wire_ms", e), ("before: object-store pickling", "object_store_pickle_ms", e)):
        print(f"| publication: {stage} (ms) | {cell(part, key, '.0f')} |")
    print(f"| engine GPU memory reserved (GiB) | {cell(e, 'engine_gpu_reserved_gib', '.1f')} |")
    print(f"| publication from GPU buffers, no wire (NCCL path's ends), ms/MB | "
          f"{cell(pub, 'device_path_ms_per_mb', '.3f')} |")
    print(f"| publication by object store from the GPU state, ms/MB | {cell(pub, 'object_store_ms_per_mb', '.3f')} |")
    print(f"| greedy outputs equal the fresh load after each publication | {pub.get('greedy_equal_fresh_after_each', '-')} |")
    print(f"| auto: engine on rank 0's GPU / on another GPU | {pub.get('auto_route_engine_on_this_gpu', '-')} / "
          f"{pub.get('auto_route_engine_on_another_gpu', '-')} |")
    print(f"| a weight group whose member never joins ({stall.get('backend', '-')}): gave up after (s); error | "
          f"{cell(stall, 'gave_up_after_s', '.1f')} of {cell(stall, 'timeout_s', 'g')}; {stall.get('error') or '-'} |")
    print(f"| ... alive and computing past the group's own timeout (s) | {stall.get('computes_after', '-')} "
          f"({cell(stall, 'alive_after_s', '.0f')}) |")
    print(f"| hf engine tokens/s, 16 / 64 episodes | {cell(hf, 'tokens_per_s_16', '.0f')} / {cell(hf, 'tokens_per_s_64', '.0f')} |")
    print(f"| hf engine greedy tokens equal to transformers' generate | {cell(hf, 'greedy_tokens_equal_transformers', 'd')}"
          f" of {cell(hf, 'greedy_tokens', 'd')} |")
    print(f"| hf engine weight update from device tensors (ms); changed, then restored | {cell(hf, 'update_ms', '.0f')}; "
          f"{hf.get('greedy_changed_after_update', '-')}, {hf.get('greedy_restored_after_update', '-')} |")
    print("\nthe learner at the seed's step shape, its speed settings added one at a time:\n"
          + "\n".join(gpu_learner.table(results["learner"])))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
