"""Weight publication benchmark (not a test): learner rank 0's weights into a real engine actor,
per stage, for each `publish.method`, beside bounds measured in the same run.

    python bench/publish.py [--quick] [--busy [--busy-tokens 512]] [--backend hf|vllm] [--sizes 0.3 1.0] [--repeats 3]

The states are synthetic: Qwen3-0.6B-shaped bf16 tensors (hidden 1024, 16 query / 8 key-value
heads of 128, MLP 3072, a 32,768-token tied embedding), with as many layers as make 0.3 or
1 GiB, saved as a model folder that an engine actor loads (`--backend`: transformers, `hf`, the
default; or `vllm`, bf16 where the CPU has it, as a run's engine). The driver
stands in for learner rank 0: it holds the model, gathers its state (`gather_state`, as a rank
does; on CPU no copy) and publishes through `WeightPublisher`, the code a run's rank 0 uses.

Beside the methods a run can use, `pickled` is the path before flat buffers, kept here as a
baseline (`PickledPublisher`; not a `publish.method`): numpy arrays where numpy has the dtype,
torch tensors (bf16) pickled, in one `ray.put`.

Stages, in ms per MB (median of `--repeats` after one warm-up publication):
- gather: the state out of the module (a GPU run copies it to host here, or keeps it on device);
- pack: into flat buffers (`pickled`: the numpy/tensor dict; the flat methods by default
  each tensor's byte view, no copy; `/b256`: one copy into 256 MB buckets, reused);
- transfer: `ray.put` and the call (object store, pickling included for `pickled`) or the
  broadcast of every bucket to the engine (collective);
- load: the engine's copy into its model (between batches; idle here).

Bounds, same bytes, same run (measured in every round, the methods interleaved with them so a
shared machine's load falls on all alike): a raw gloo broadcast of the bytes from this process
to another actor (256 MB pieces, preallocated buffers on both sides, no header, Ray call or
load), and a memcpy of every tensor's bytes into a preallocated buffer. `fraction_of_bound`
= the raw broadcast's ms/MB over a method's total ms/MB. Projected: a method's total for the
3.4 GB of Qwen3-1.7B in bf16 at the same ms/MB (linear in bytes, as the rows show or not).

Busy (`--busy`, opt-in): after the idle rounds, each method publishes again while the engine
generates BUSY_REQUESTS requests of `--busy-tokens` new tokens (default BUSY_TOKENS; greedy;
submitted just before the publication in one `generate_many` call, so that they decode in one
batch, already running when it starts; the engine has no ignore-EOS switch, so the tokens each
produced are reported), once with `publish.wait_for_load` true and once false, and on a vllm
engine each of those once with `publish.in_flight: wait` (the drain) and once `keep` (loaded
under the running requests at once, `in_flight_wait_ms` 0; `kept` counts the requests that
spanned the update). Per row:
`publish_wall_ms`, rank 0's wall time (gather and publish: what the learner waits), and
`serve_new_ms`, from the same start until the engine reports the new version (every request
after that runs on it), polled every BUSY_POLL_S. One publication each, after the idle rounds'
warm-up: on this 2-core machine a batch of 32 x 512 tokens took over 5 minutes, so runs here
used `--busy-tokens 16` or 64. The idle rows carry the same fields (`busy` false,
`wait_for_load` true, `in_flight` wait: the engine serves the new version when publish returns).

Prints a table and writes bench/results/publish.json (the latest; each run keeps its own copy in
bench/results/publish/version_N/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rose_ray.runs import keep_result

# (label, publish config): the pickled baseline, each method as a run's default config sends it,
# and each flat method with the other bucketing (0: every tensor's own bytes; 256: packed into
# 256 MB buckets)
VARIANTS = (("pickled", {"method": "pickled"}),
            ("object_store", {"method": "object_store"}),
            ("object_store/b256", {"method": "object_store", "bucket_mb": 256}),
            ("collective", {"method": "collective"}),
            ("collective/b256", {"method": "collective", "bucket_mb": 256}))
PROJECT_BYTES = 3.4e9  # Qwen3-1.7B in bf16
BUSY_REQUESTS, BUSY_TOKENS, BUSY_PROMPT_TOKENS, BUSY_POLL_S = 32, 512, 16, 0.005
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 1024, 3072, 16, 8, 128, 32768


def layer_params() -> int:
    attn = HIDDEN * HEADS * HEAD_DIM * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2 + 2 * HEAD_DIM
    return attn + 3 * HIDDEN * INTER + 2 * HIDDEN


def build_model(tokenizer_dir: str, gib: float, out: Path) -> tuple[str, Any]:
    """A Qwen3-shaped bf16 model of ~`gib` GiB (random weights), saved for the engine; returns
    (folder, the module)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    layers = max(1, round((gib * 2**30 / 2 - VOCAB * HIDDEN) / layer_params()))
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=layers,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      dtype="bfloat16")
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.tie_weights()  # to_empty made the head a tensor of its own
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out), model.eval()  # only its state is used here (rotary buffers left uninitialised)


def to_wire(state: dict[str, Any]) -> dict[str, Any]:
    """The pickled path's message: numpy arrays where numpy has the dtype (zero-copy in the
    object store), else torch tensors (pickled)."""
    import torch

    return {k: v.numpy() if v.dtype in (torch.float32, torch.float16) else v for k, v in state.items()}


class PickledPublisher:
    """The path before flat buffers, as WeightPublisher's object store sends it otherwise: one
    `ray.put` of `to_wire(state)`, then each engine actor's `load_weights` (which takes a dict).
    The same result fields as WeightPublisher.publish."""

    def __init__(self, config: Any) -> None:
        self.config = config  # a PublishConfig: wait_for_load and in_flight are honoured

    def publish(self, state: dict[str, Any], engines: list[Any], version: int) -> dict[str, Any]:
        import numpy as np
        import ray

        t0 = time.perf_counter()
        wire = to_wire(state)
        t1 = time.perf_counter()
        ref = ray.put(wire)
        loads = ray.get([e.load_weights.remote(ref, version, self.config.wait_for_load, self.config.keep_after_ms)
                          for e in engines])
        done = time.perf_counter()
        load = max(r["load_ms"] for r in loads)
        mb = sum(v.nbytes if isinstance(v, np.ndarray) else v.numel() * v.element_size() for v in wire.values()) / 2**20
        return {"method": "pickled", "backend": "", "mb": mb, "pack_ms": (t1 - t0) * 1e3,
                "transfer_ms": (done - t1) * 1e3 - load, "load_ms": load, "send_ms": (done - t0) * 1e3,
                "versions": [int(r["version"]) for r in loads]}


SCRATCH_MB = 256  # the bounds' buffers: the same bytes pass through them in pieces of this size


def pieces(total: int) -> list[int]:
    n = SCRATCH_MB * 2**20
    return [n] * (total // n) + ([total % n] if total % n else [])


class BoundReceiver:
    """The raw broadcast's other end: joins a WeightGroup, receives into a preallocated buffer."""

    def join(self, address: dict[str, Any]) -> None:
        import torch

        from rose_ray.publish.group import WeightGroup

        self.group = WeightGroup.join(address, 1)
        self.scratch = torch.empty(SCRATCH_MB * 2**20, dtype=torch.uint8)

    def receive(self, total: int) -> None:
        self.group.broadcast([self.scratch[:n] for n in pieces(total)])


class Bounds:
    """Measured beside the methods, round by round: a raw gloo broadcast of the state's bytes
    to another actor (in SCRATCH_MB pieces, from and into preallocated buffers: no header, no
    Ray call, no load), and a memcpy of every tensor's bytes into a preallocated buffer."""

    def __init__(self, state: dict[str, Any]) -> None:
        import ray
        import torch

        from rose_ray.publish.flat import byte_view
        from rose_ray.publish.group import WeightGroup

        self.views = [byte_view(t) for t in state.values()]
        self.total = sum(int(v.numel()) for v in self.views)
        self.scratch = torch.empty(SCRATCH_MB * 2**20, dtype=torch.uint8)
        self.receiver = ray.remote(num_cpus=1)(BoundReceiver).remote()
        store, address = WeightGroup.open_store(2, 300)
        joined = self.receiver.join.remote(address)
        self.group = WeightGroup(store, address["name"], 0, 2, 300)
        ray.get(joined)
        self.runs: dict[str, list[float]] = {"memcpy": [], "gloo_broadcast": []}

    def measure(self) -> None:
        import ray

        t0 = time.perf_counter()
        at = 0
        for v in self.views:
            for lo in range(0, int(v.numel()), self.scratch.numel()):
                piece = v[lo:lo + self.scratch.numel()]
                if at + piece.numel() > self.scratch.numel():
                    at = 0
                self.scratch[at:at + piece.numel()].copy_(piece)
                at += piece.numel()
        t1 = time.perf_counter()
        got = self.receiver.receive.remote(self.total)
        self.group.broadcast([self.scratch[:n] for n in pieces(self.total)])
        ray.get(got)
        self.runs["memcpy"].append(t1 - t0)
        self.runs["gloo_broadcast"].append(time.perf_counter() - t1)

    def ms_per_mb(self) -> dict[str, float]:
        mb = self.total / 2**20
        return {f"{k}_ms_per_mb": statistics.median(v[1:]) * 1e3 / mb for k, v in self.runs.items()}

    def close(self) -> None:
        import ray

        ray.kill(self.receiver)


def _decoding(stats: dict[str, Any], before: dict[str, Any]) -> bool:
    """Whether the busy requests are decoding: their batch taken from an hf engine's queue, or
    every one of them added to a vllm engine and a step or two taken since."""
    if "batcher_batches" in stats:
        return stats["batcher_batches"] > before["batcher_batches"] and stats["queued"] == 0
    return stats["requests"] >= before["requests"] + BUSY_REQUESTS and stats["steps"] >= before["steps"] + 2


def _batch_sizes(stats: dict[str, Any], before: dict[str, Any]) -> list[int]:
    """An hf engine's batches since `before`; a vllm engine's running requests per step (the
    last 1024 steps' record)."""
    if "batcher_batches" in stats:
        return stats["batcher_batch_sizes"][before["batcher_batches"] - stats["batcher_batches"]:]
    sizes = stats["batch_sizes"]
    return sizes[max(0, len(sizes) - (stats["steps"] - before["steps"])):]


def busy_publication(model: Any, engine: Any, publisher: Any, version: int, seed: int,
                     tokens: int = BUSY_TOKENS) -> dict[str, Any]:
    """One publication while BUSY_REQUESTS greedy `tokens`-token requests decode on `engine`:
    rank 0's wall time, the time until the engine reports `version`, and the requests' fate."""
    import random

    import ray

    from rose_ray.inference.engine import GenerationRequest
    from rose_ray.learner.export import gather_state
    from rose_ray.types import SamplingParams

    rng = random.Random(seed)
    before = ray.get(engine.stats.remote())
    old_version = ray.get(engine.version.remote())
    sampling = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    # one call, so that all of them reach the engine's queue at once and decode in one batch
    # (separate calls reach a loaded machine's actor spread out, split over batches)
    calls = engine.generate_many.remote([GenerationRequest(
        prompt_ids=[rng.randrange(1000, 30000) for _ in range(BUSY_PROMPT_TOKENS)], sampling=sampling)
        for _ in range(BUSY_REQUESTS)])
    submitted = time.perf_counter()
    while True:  # the requests decoding (their batch taken from the queue) before the publication
        if _decoding(ray.get(engine.stats.remote()), before):
            break
        time.sleep(BUSY_POLL_S)
    t0 = time.perf_counter()
    state = gather_state(model, zero3=False, keep=True)
    gathered = time.perf_counter()
    out = publisher.publish(state, [engine], version)
    returned = time.perf_counter()
    while ray.get(engine.version.remote()) != version:
        time.sleep(BUSY_POLL_S)
    served = time.perf_counter()
    results = ray.get(calls)
    done = time.perf_counter()
    tokens = [len(r.token_ids) for r in results]
    after = ray.get(engine.stats.remote())
    out.update(gather_ms=(gathered - t0) * 1e3, publish_wall_ms=(returned - t0) * 1e3,
               serve_new_ms=(served - t0) * 1e3, requests_done_ms=(done - t0) * 1e3,
               decoding_before_ms=(t0 - submitted) * 1e3, tokens_min=min(tokens), tokens_max=max(tokens),
               requests_on_old_version=sum(r.version == old_version for r in results),
               kept=sum(getattr(r, "version_end", None) is not None for r in results),
               batch_sizes=_batch_sizes(after, before))
    return out


def bench_size(tokenizer_dir: str, gib: float, root: Path, args: argparse.Namespace) -> tuple[list, dict]:
    """Rounds of: the bounds, then one publication by each variant (interleaved, so that
    the load of a shared machine falls on all alike); the first round warms up."""
    import ray

    from rose_ray.inference.actor import engine_actor
    from rose_ray.inference.backends import command_engine
    from rose_ray.inference.registry import get_backend
    from rose_ray.learner.export import gather_state
    from rose_ray.publish.publisher import WeightPublisher
    from rose_ray.publish.route import PublishConfig

    folder, model = build_model(tokenizer_dir, gib, root / f"qwen3_like_{gib}")
    bounds = Bounds(gather_state(model, zero3=False, keep=True))
    # a batch as large as the busy rows' requests, so that they decode together (a vllm KV
    # cache that holds them all: 32 KiB a token at 0.3 GiB)
    engine = engine_actor(command_engine(folder, "--backend", args.backend, dtype="bfloat16", threads=1,
                                         max_batch_size=BUSY_REQUESTS, kv_cache_mb=1024), num_cpus=1)
    ray.get(engine.ready.remote())
    variants = [(label, settings) for label, settings in VARIANTS
                if (not args.methods or settings["method"] in args.methods)
                and (args.bucketed or "/" not in label)]
    publishers = {label: PickledPublisher(PublishConfig()) if settings["method"] == "pickled"
                  else WeightPublisher(PublishConfig(**settings)) for label, settings in variants}
    runs: dict[str, list[dict]] = {label: [] for label, _ in variants}
    version = 0
    for _ in range(args.repeats + 1):
        bounds.measure()
        for label, _ in variants:
            t0 = time.perf_counter()
            state = gather_state(model, zero3=False, keep=True)
            gathered = time.perf_counter()
            version += 1
            out = publishers[label].publish(state, [engine], version)
            if out["versions"] != [version]:
                raise RuntimeError(f"{label}: the engine reports version {out['versions']}, not {version}")
            out["gather_ms"] = (gathered - t0) * 1e3
            runs[label].append(out)
    bound = {"size_gib": gib, "mb": bounds.total / 2**20, **bounds.ms_per_mb()}
    bounds.close()
    rows = []
    for label, settings in variants:
        done = runs[label][1:]
        mb = done[0]["mb"]
        stage = {k: statistics.median(r[f"{k}_ms"] for r in done) / mb
                 for k in ("gather", "pack", "transfer", "load")}
        total = sum(stage.values())
        rows.append({"method": settings["method"], "variant": label, "settings": settings, "size_gib": gib,
                     "mb": mb, "state": "idle", **{f"{k}_ms_per_mb": v for k, v in stage.items()},
                     "total_ms_per_mb": total,
                     "fraction_of_bound": bound["gloo_broadcast_ms_per_mb"] / total,
                     "fraction_of_memcpy": bound["memcpy_ms_per_mb"] / total,
                     "projected_3p4gb_s": total * PROJECT_BYTES / 2**20 / 1e3,
                     "runs_total_ms": [r["send_ms"] + r["gather_ms"] for r in done],
                     "busy": False, "wait_for_load": True, "in_flight": "wait", "backend": args.backend,
                     "publish_wall_ms": statistics.median(r["send_ms"] + r["gather_ms"] for r in done),
                     "serve_new_ms": statistics.median(r["send_ms"] + r["gather_ms"] for r in done)})
        print(f"  {gib} GiB {label}: {total:.3f} ms/MB", flush=True)
    in_flight = get_backend(args.backend).in_flight
    for label, settings in variants if args.busy else ():
        for wait, keep in [(w, k) for w in (True, False) for k in in_flight]:
            publisher = publishers[label]  # the idle rows' (warm: a collective's group is joined)
            publisher.config = replace(publisher.config, wait_for_load=wait, in_flight=keep)
            version += 1
            r = busy_publication(model, engine, publisher, version, seed=version, tokens=args.busy_tokens)
            mb = r["mb"]
            stage = {k: r[f"{k}_ms"] / mb for k in ("gather", "pack", "transfer", "load")}
            wall = r["publish_wall_ms"] / mb  # the learner's wait, per MB: load 0 when not waited for
            rows.append({"method": settings["method"], "variant": label, "settings": settings, "size_gib": gib,
                         "mb": mb, "state": f"busy_{BUSY_REQUESTS}x{args.busy_tokens}",
                         **{f"{k}_ms_per_mb": v for k, v in stage.items()}, "total_ms_per_mb": wall,
                         "fraction_of_bound": bound["gloo_broadcast_ms_per_mb"] / wall,
                         "fraction_of_memcpy": bound["memcpy_ms_per_mb"] / wall,
                         "projected_3p4gb_s": wall * PROJECT_BYTES / 2**20 / 1e3,
                         "runs_total_ms": [r["publish_wall_ms"]], "busy": True, "wait_for_load": wait,
                         "in_flight": keep, "backend": args.backend, "requests": BUSY_REQUESTS,
                         "max_new_tokens": args.busy_tokens,
                         **{k: r[k] for k in ("publish_wall_ms", "serve_new_ms", "requests_done_ms",
                                              "decoding_before_ms", "tokens_min", "tokens_max",
                                              "requests_on_old_version", "kept", "batch_sizes")}})
            print(f"  {gib} GiB {label} busy wait_for_load={wait} in_flight={keep}: rank 0 {r['publish_wall_ms']:.0f} ms, "
                  f"serves new {r['serve_new_ms']:.0f} ms", flush=True)
    ray.kill(engine)
    del model, bounds
    shutil.rmtree(folder, ignore_errors=True)
    return rows, bound


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[0.3, 1.0], help="state sizes in GiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucketed", action="store_true", help="also each flat method with 256 MB buckets (/b256)")
    p.add_argument("--methods", nargs="+", choices=("pickled", "object_store", "collective"), help="default: all")
    p.add_argument("--quick", action="store_true", help="0.3 GiB only, 3 repeats (~1-2 minutes)")
    p.add_argument("--busy", action="store_true",
                   help=f"also each method while {BUSY_REQUESTS} requests of {BUSY_TOKENS} tokens decode "
                        "(wait_for_load true and false; on this 2-core machine 512 tokens took over 5 "
                        "minutes a publication, so it is opt-in)")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf",
                   help="the engine actor's backend (vllm: the busy rows also with publish.in_flight keep)")
    p.add_argument("--busy-tokens", type=int, default=BUSY_TOKENS,
                   help=f"new tokens per busy request (default {BUSY_TOKENS}, the issue's; fewer to fit a slow CPU)")
    args = p.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # (here, not at import: gpu_check.py imports to_wire)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.quick:
        args.sizes, args.repeats = [0.3], 3

    import ray

    from rose_ray.provision.tiny import init_tiny

    start = time.perf_counter()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # a cluster of its own
    root = Path(tempfile.mkdtemp(prefix="rose_ray_bench_publish_"))
    try:
        tokenizer_dir = str(init_tiny(root / "tiny")["student"])
        rows, bound_rows = [], []
        for gib in args.sizes:
            r, b = bench_size(tokenizer_dir, gib, root, args)
            rows += r
            bound_rows.append(b)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)

    print(f"\nweight publication: driver as learner rank 0 -> 1 {args.backend} engine actor (idle), synthetic "
          "Qwen3-shaped bf16 state; ms per MB, median")
    print(f"{'GiB':>4} {'method':18} {'MB':>6} {'gather':>7} {'pack':>7} {'transfer':>9} {'load':>7} "
          f"{'total':>7} {'of bound':>9} {'3.4 GB s':>9}")
    for r in rows if not args.busy else [r for r in rows if not r["busy"]]:
        print(f"{r['size_gib']:4.1f} {r['variant']:18} {r['mb']:6.0f} {r['gather_ms_per_mb']:7.3f} "
              f"{r['pack_ms_per_mb']:7.3f} {r['transfer_ms_per_mb']:9.3f} {r['load_ms_per_mb']:7.3f} "
              f"{r['total_ms_per_mb']:7.3f} {r['fraction_of_bound']:9.2f} {r['projected_3p4gb_s']:9.2f}")
    print("bounds (same bytes, same run): ms per MB")
    for b in bound_rows:
        print(f"{b['size_gib']:4.1f} raw gloo broadcast {b['gloo_broadcast_ms_per_mb']:.3f} "
              f"(3.4 GB: {b['gloo_broadcast_ms_per_mb'] * PROJECT_BYTES / 2**20 / 1e3:.2f} s), "
              f"memcpy {b['memcpy_ms_per_mb']:.3f} (3.4 GB: {b['memcpy_ms_per_mb'] * PROJECT_BYTES / 2**20 / 1e3:.2f} s)")
    if args.busy:
        print(f"\nbusy: the same publication while {BUSY_REQUESTS} greedy {args.busy_tokens}-token requests decode, "
              "beside the idle row (median); ms from rank 0's gather")
        print(f"{'GiB':>4} {'method':18} {'busy':>5} {'wait':>5} {'in_flight':>9} {'rank 0 wall':>11} "
              f"{'serves new':>10} {'reqs done':>9} {'tokens':>9} {'on old':>6} {'kept':>4}")
        for r in sorted(rows, key=lambda r: (r["size_gib"], r["variant"], r["busy"], not r["wait_for_load"],
                                             r["in_flight"])):
            busy = (f"{r['requests_done_ms']:9.0f} {r['tokens_min']:4d}-{r['tokens_max']:<4d} "
                    f"{r['requests_on_old_version']:6d} {r['kept']:4d}") if r["busy"] else \
                f"{'-':>9} {'-':>9} {'-':>6} {'-':>4}"
            print(f"{r['size_gib']:4.1f} {r['variant']:18} {str(r['busy']).lower():>5} "
                  f"{str(r['wait_for_load']).lower():>5} {r['in_flight']:>9} {r['publish_wall_ms']:11.0f} "
                  f"{r['serve_new_ms']:10.0f} {busy}")
    out = Path(__file__).parent / "results" / "publish.json"
    kept = keep_result(out, json.dumps({"args": vars(args), "load_average": os.getloadavg(),
                                        "seconds": time.perf_counter() - start, "rows": rows,
                                        "bounds": bound_rows}, indent=2))
    print(f"\nwrote {out} (and {kept}) in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
