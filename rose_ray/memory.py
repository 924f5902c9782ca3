"""The GPU memory plan: what each role holds on each of its GPUs, from the models' config.json
(no weights loaded, no torch); what is counted: docs/cluster.md, "What each GPU holds"."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

from rose_ray.errors import InputError
from rose_ray.inference.engine import resolve_dtype
from rose_ray.inference.registry import BACKENDS
from rose_ray.placement import NodeInfo, PlacementError

GIB = 2**30
MIB = 2**20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The CUDA context, cuBLAS and NCCL workspaces and the allocator's slack: an allowance.
GPU_RUNTIME_BYTES = 1.5 * GIB
# vLLM captures CUDA graphs for decode batches up to max_num_seqs (`cuda_graphs: true`).
CUDA_GRAPHS_BYTES = 1.0 * GIB
# Scoring (prompt logprobs): logits, their fp32 log-softmax, a rank mask and the tensor-parallel
# gather, ~8 bytes a logit, the whole vocabulary on every rank.
SCORE_BYTES_PER_LOGIT = 8
# GPU memory as Ray's `accelerator_type:` names the GPU (GiB that nvidia-smi reports in all).
ACCELERATOR_GIB = {"A100-40G": 40.0, "A100-80G": 80.0, "H100": 79.6, "H200": 140.4,
                   "L4": 22.5, "A10G": 22.5, "L40S": 45.0}
SHIPPED_TABLE = "the Qwen3 sizes shipped with rose_ray"


def vllm_batched_tokens(gpu_bytes: float | None) -> int:
    """The prefill chunk vLLM 0.32 picks for an `LLM` object when the engine leaves
    max_num_batched_tokens unset: 16,384 tokens on GPUs of 70 GiB or more (not A100s), else 8,192."""
    return 16384 if gpu_bytes is not None and gpu_bytes >= 70 * GIB else 8192


# --------------------------------------------------------------------------- model sizes
@dataclass(frozen=True)
class ModelShape:
    """The sizes of a dense decoder-only LM that its memory depends on (config.json's names)."""

    name: str
    source: str  # where the sizes came from
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, name: str, source: str, config: dict[str, Any]) -> ModelShape:
        config = config.get("text_config", config) if "hidden_size" not in config else config
        if config.get("num_experts") or config.get("num_local_experts"):
            raise InputError(f"{name} ({source}): a mixture-of-experts model; the memory plan counts dense models only")
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(name, source, hidden, int(config["num_hidden_layers"]), heads,
                       int(config.get("num_key_value_heads") or heads),
                       int(config.get("head_dim") or hidden // heads),
                       int(config["intermediate_size"]), int(config["vocab_size"]),
                       bool(config.get("tie_word_embeddings", False)))  # untied counts the head: the larger
        except KeyError as e:
            raise InputError(f"{name} ({source}): the model config has no {e.args[0]!r}") from None

    def widths(self) -> tuple[int, int]:
        """The query and the key (or value) projections' output widths."""
        return self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim

    def layer_parameters(self) -> int:
        h, (q, kv) = self.hidden_size, self.widths()
        attention = h * (q + 2 * kv) + q * h + 2 * self.head_dim  # q k v o, q/k norms
        return attention + 3 * h * self.intermediate_size + 2 * h  # gate, up, down; two norms

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def parameters(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2  # the input embedding and the LM head
        return self.num_hidden_layers * self.layer_parameters() + heads * self.embedding_parameters() + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """Keys and values of one token on one GPU: KV heads split over the tensor-parallel
        ranks (vLLM keeps one head per rank, replicated, past the head count)."""
        kv_heads = max(self.num_key_value_heads // tensor_parallel, 1)
        return 2 * self.num_hidden_layers * kv_heads * self.head_dim * dtype_bytes


def shipped_sizes() -> dict[str, dict[str, Any]]:
    table = json.loads(resources.files("rose_ray").joinpath("qwen3_sizes.json").read_text())
    return {k: v for k, v in table.items() if not k.startswith("_")}


def model_shape(name: str, key: str, tiny_dir: str, config_for: dict[str, str]) -> ModelShape:
    """The sizes of the model `name` (config key `key`): a stand-in folder's, the tiny models', a
    local folder's or the hub cache's config.json, else the shipped Qwen3 table; else InputError."""
    from rose_ray.models import model_folder

    if (found := model_folder(name, tiny_dir, config_for)) is not None:
        file = Path(found) / "config.json"
        if not file.is_file():
            raise InputError(f"{key}: {Path(found)} holds no config.json (the memory plan reads the "
                             "model's sizes there)")
        return ModelShape.from_config(name, str(file), json.loads(file.read_text()))
    table = shipped_sizes()
    if name in table:
        return ModelShape.from_config(name, SHIPPED_TABLE, table[name])
    raise InputError(f"{key}: {name!r} has no config.json on this machine and is not one of the shipped "
                     f"Qwen3 sizes ({', '.join(table)}); pass --model-config-for {name}=DIR with a folder "
                     "holding its config.json")


# --------------------------------------------------------------------------- per role
@dataclass
class RoleMemory:
    """One role's memory on each of its GPUs (bytes) and what it may use there."""

    role: str  # as placement names it: "student engine", "teacher engine", "learner ranks"
    model: ModelShape
    setup: str  # backend or ZeRO stage, dtype, GPUs, batch
    parts: dict[str, float]  # weights, KV cache, gradients, optimizer states, activations, runtime
    on_gpu: bool
    budget: float | None = None  # bytes per GPU the parts must fit in; None: on CPU, or GPU size unknown
    budget_why: str = ""  # how the budget was set, e.g. "teacher_engine.gpu_memory_utilization 0.9 x 80 GiB"
    notes: list[str] = field(default_factory=list)
    problem: str | None = None  # why it does not fit, with the numbers and what would (None: it fits)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def _gib(x: float) -> str:
    return f"{x / GIB:.1f}"


def _sequences(n: int) -> str:
    return f"{n} sequence{'' if n == 1 else 's'}"


def _breakdown(parts: dict[str, float]) -> str:
    return " + ".join(f"{_gib(v)} GiB {k}" for k, v in parts.items() if v)


def _engine_parts(engine: Any, shape: ModelShape, dtype_bytes: int, tp: int, gpu_bytes: float | None,
                  on_gpu: bool) -> dict[str, float]:
    vllm = engine.spec.paged_kv
    kv = engine.max_batch_size * engine.context_tokens * shape.kv_bytes_per_token(dtype_bytes, tp)
    kv += engine.backend.kept_kv_mb * MIB  # hf keeps past conversations' keys and values for reuse
    # vLLM prefills at most its batched-token chunk per step; hf prefills a whole batch at once.
    batch_tokens = engine.max_batch_size * engine.context_tokens
    prefill = min(vllm_batched_tokens(gpu_bytes), batch_tokens) if vllm else batch_tokens
    # a layer's activations a prompt token (freed before the next layer): the residual stream and
    # its norm, q/k/v, the attention output, gate/up and their product
    q_width, kv_width = shape.widths()
    split = q_width + 2 * kv_width + 3 * shape.intermediate_size
    parts = {"weights": shape.parameters() * dtype_bytes / tp, "KV cache": float(kv),
             "activations": prefill * (4 * shape.hidden_size + split / tp) * dtype_bytes}
    if on_gpu:
        parts["runtime"] = GPU_RUNTIME_BYTES + (CUDA_GRAPHS_BYTES if engine.backend.captures_cuda_graphs else 0.0)
    return parts


def engine_memory(role: str, engine: Any, gpus: float, shape: ModelShape, gpu_bytes: float | None,
                  gpu_note: str, scores: bool) -> RoleMemory:
    """An engine's memory per GPU, and whether `max_batch_size` sequences at full context fit."""
    key = role.split()[0]  # "student" / "teacher"
    on_gpu, vllm = gpus > 0, engine.spec.paged_kv  # vLLM's memory: a paged KV cache sized by its settings
    section = f"{key}_engine.backend"
    dtype = resolve_dtype(engine.dtype, "cuda" if on_gpu else "cpu")
    e = DTYPE_BYTES[dtype]
    tp = engine.tensor_parallel_size
    where = f"{tp} GPUs (tensor parallel)" if tp > 1 else ("1 GPU" if on_gpu else "CPU")
    setup = (f"{engine.backend.name}, {dtype}, {where}, {engine.max_batch_size} sequences x "
             f"{engine.context_tokens:,} tokens ({shape.kv_bytes_per_token(e) / 1024:,.0f} KiB of KV a token)")
    mem = RoleMemory(role, shape, setup, _engine_parts(engine, shape, e, tp, gpu_bytes, on_gpu), on_gpu)
    per_sequence = engine.context_tokens * shape.kv_bytes_per_token(e, tp)
    if not on_gpu and (kv := engine.backend.kv_budget_mb) is not None:
        mem.notes.append(f"{section}.{kv.key} {kv.value:g} holds "
                         f"{_sequences(int(kv.value * MIB // per_sequence))} at full context "
                         f"({engine.max_batch_size} wanted)")
    if not on_gpu or gpu_bytes is None:
        return mem
    if (share := engine.backend.gpu_share) is not None:  # vLLM's; it gives the KV cache what the rest leaves
        mem.budget, mem.budget_why = share.value * gpu_bytes, f"{section}.{share.key} {share.value:g} x {gpu_note}"
    else:
        mem.budget, mem.budget_why = gpu_bytes, f"the whole {gpu_note} GPU"
    fitting = max(int((mem.budget - mem.total + mem.parts["KV cache"]) // per_sequence), 0)
    if vllm:
        mem.notes.append(f"{_sequences(fitting)} fit at full context ({engine.max_batch_size} wanted)")
    if mem.total > mem.budget:  # why, and what would fit
        fixes = [f"lower {key}_engine.max_batch_size to {fitting}"] if vllm and fitting else []
        split = engine.backend.tensor_parallel
        for bigger in (2, 4, 8) if split is not None else ():
            if bigger > tp and shape.num_attention_heads % bigger == 0 and \
                    sum(_engine_parts(engine, shape, e, bigger, gpu_bytes, True).values()) <= mem.budget:
                fixes.append(f"set {section}.{split.key}: {bigger} with resources.{key}_gpus: {bigger}")
                break
        if not vllm:
            paged = [b.name for b in BACKENDS.values() if b.paged_kv]
            fixes.append(f"use {section}: {'/'.join(paged)} (paged KV, tensor parallel)")
        short = (f"at full context {fitting} of its {engine.max_batch_size} sequences fit at once" if vllm
                 else f"{_sequences(engine.max_batch_size)} at full context do not")
        mem.problem = (f"the {role} cannot fit its GPU{'s' if tp > 1 else ''}: {shape.name} needs "
                       f"{_breakdown(mem.parts)} = {_gib(mem.total)} GiB per GPU, more than "
                       f"{mem.budget_why} = {_gib(mem.budget)} GiB; {short}"
                       + (f"; {' or '.join(fixes)}" if fixes else ""))
    if scores and vllm and mem.problem is None:  # vLLM computes prompt logprobs outside its share
        tokens = min(vllm_batched_tokens(gpu_bytes), engine.context_tokens)
        logits = tokens * shape.vocab_size * SCORE_BYTES_PER_LOGIT
        _outside_share(mem, engine, key, logits, gpu_bytes, gpu_note,
                       f"scoring (prompt logprobs of a {tokens:,}-token chunk): {_gib(logits)} GiB",
                       f"scoring the student's tokens (prompt logprobs of a {tokens:,}-token chunk x "
                       f"{shape.vocab_size:,} vocabulary) needs {_gib(logits)} GiB outside vLLM's share")
    return mem


def _outside_share(mem: RoleMemory, engine: Any, key: str, nbytes: float, gpu_bytes: float, gpu_note: str,
                   note: str, need: str, fix: str = "") -> None:
    """`nbytes` that vLLM holds outside the memory it profiled (`note`, `need`: what they are, for
    the notes and the problem): the rest of each GPU must hold them."""
    rest, share = gpu_bytes - mem.budget, engine.backend.gpu_share
    mem.notes.append(f"{note} beside vLLM's share, {_gib(rest)} GiB left there")
    if nbytes > rest and mem.problem is None:
        most = math.floor((1 - nbytes / gpu_bytes) * 20) / 20  # in steps of 0.05
        gpus = "GPUs" if engine.tensor_parallel_size > 1 else "GPU"
        mem.problem = (f"the {mem.role} cannot fit its {gpus}: {need}, but {key}_engine.backend.{share.key} "
                       f"{share.value:g} leaves {_gib(rest)} GiB of each {gpu_note} GPU; set it to {most:g} "
                       f"or lower{fix}")


def add_receive_buffers(mem: RoleMemory, cfg: Any, shape: ModelShape, gpu_bytes: float | None,
                        gpu_note: str) -> None:
    """The publication's receive buffers (the learner's state in learner.dtype) on the student
    engine's GPU where it may go over NCCL (`nccl_problem`'s rules; else host memory): in an hf
    engine's parts, or beside a vllm engine's GPU share, which must leave room."""
    p, engine = cfg.publish, cfg.student_engine
    if not (p.method in ("auto", "collective") and p.collective_backend in ("auto", "nccl")
            and engine.spec.takes_weights and cfg.resources.student_gpus > 0 and cfg.learner.gpus_per_rank > 0
            and engine.tensor_parallel_size == 1 and not cfg.resources.colocate):
        return
    nbytes = float(shape.parameters() * DTYPE_BYTES[cfg.learner.dtype])
    what = f"weight publication over NCCL: receive buffers of {_gib(nbytes)} GiB (the learner's state)"
    if engine.backend.gpu_share is None:
        mem.parts["publication buffers"] = nbytes
        mem.notes.append(f"{what} in the engine's GPU")
        if mem.budget is not None and mem.problem is None and mem.total > mem.budget:
            mem.problem = (f"the student engine cannot fit its GPU: {_breakdown(mem.parts)} = {_gib(mem.total)} GiB, "
                           f"more than {mem.budget_why} = {_gib(mem.budget)} GiB; use publish.collective_backend=gloo "
                           "(host buffers) or a smaller student_engine.max_batch_size")
        return
    if gpu_bytes is None or mem.budget is None:
        mem.notes.append(f"{what} beside vLLM's share")
        return
    _outside_share(mem, engine, "student", nbytes, gpu_bytes, gpu_note, what,
                   f"a weight publication over NCCL receives the learner's state ({_gib(nbytes)} GiB) into "
                   "buffers beside vLLM's share", ", or publish.collective_backend=gloo")


def learner_memory(learner: Any, shape: ModelShape, gpu_bytes: float | None, gpu_note: str,
                   colocated: RoleMemory | None = None) -> RoleMemory:
    """A learner rank's memory on its GPU under its ZeRO stage, ranks, dtype and checkpointing."""
    from rose_ray.learner import memory as formulas
    from rose_ray.learner.worker import overlap_comm

    p, n, stage = shape.parameters(), learner.ranks, learner.zero_stage
    e = DTYPE_BYTES[learner.dtype]

    def split(nbytes: float, from_stage: int) -> float:  # partitioned over the ranks from this stage on
        return nbytes / n if stage >= from_stage else nbytes

    if e == 2:  # mixed precision: 16-bit weights and gradients, fp32 gradients, master weights and Adam moments
        weights, grads, optim = split(2 * p, 3), split(2 * p, 2) + split(4 * p, 1), split(12 * p, 1)
    else:  # fp32: weights, gradients, Adam moments
        weights, grads, optim = split(4 * p, 3), split(4 * p, 2), split(8 * p, 1)
    if stage == 3:  # a gathered layer (and the next, prefetched) in 16-bit, as DeepSpeed's estimator counts
        weights += 2 * e * max(shape.layer_parameters(), shape.embedding_parameters())
    chunk = learner.logprob_chunk
    on_gpu = learner.gpus_per_rank > 0
    # the speed settings as `auto` resolves them on a GPU cluster (`auto`'s head counted as the
    # chunked one, the larger): the LM head, the optimizer step's temporaries, ZeRO's buckets
    head = {"auto": "trained"}.get(learner.head, learner.head)
    optimizer = "adamw_fused" if learner.optimizer == "auto" else learner.optimizer  # fused on GPUs and CPUs
    overlap = bool(overlap_comm(learner, n))
    step = float(formulas.optimizer_step_bytes(p, n, stage, optimizer, on_gpu))
    buckets = formulas.zero_bucket_bytes(p, stage, learner.zero_bucket_size, overlap, e)
    # one micro-batch's peak: the learner's own formula
    act = formulas.learner_activation_bytes(asdict(shape), learner.max_tokens, chunk,
                                            learner.activation_checkpointing, e, head)
    parts = {"weights": float(weights), "gradients": float(grads), "optimizer states": float(optim),
             # the optimizer step's temporaries come when the activations are gone: the larger counts
             "activations": float(max(act["body"] + act["head"], step))}
    if on_gpu:
        parts["runtime"] = GPU_RUNTIME_BYTES + buckets
    setup = (f"ZeRO-{stage} over {n} rank{'s' if n > 1 else ''} x {learner.gpus_per_rank:g} GPU, "
             f"{learner.dtype}, activation checkpointing {learner.activation_checkpointing}, "
             f"rows of {learner.max_tokens:,} tokens (LM head {head}, {chunk:,} tokens at a time)")
    mem = RoleMemory("learner ranks", shape, setup, parts, on_gpu)
    mem.notes.append(f"activations: {_gib(act['body'])} GiB in the layers, "
                     f"{_gib(act['head'])} GiB in the LM head")
    mem.notes.append(f"speed settings: head {head}, optimizer {optimizer} ({_gib(step)} GiB at the step), "
                     f"ZeRO buckets {learner.zero_bucket_size:.0e} elements"
                     f"{' with overlap_comm' if overlap else ''} ({_gib(buckets)} GiB)")
    if not on_gpu or gpu_bytes is None:
        return mem
    mem.budget, mem.budget_why = gpu_bytes, f"the {gpu_note} GPU"
    if colocated is not None:  # the student engine on the same GPU takes its share first
        taken = colocated.budget if colocated.budget is not None else colocated.total
        mem.budget -= taken
        mem.budget_why += f" less the colocated student engine's {_gib(taken)} GiB"
    if mem.total > mem.budget:
        fixes = [f for ok, f in ((learner.activation_checkpointing == "none", "learner.activation_checkpointing: selective"),
                                 (learner.activation_checkpointing != "full", "learner.activation_checkpointing: full"),
                                 (stage < 3, f"learner.zero_stage: {stage + 1}"),
                                 (True, "more learner.ranks"), (True, "a lower learner.max_tokens")) if ok]
        mem.problem = (f"the learner ranks cannot fit their GPUs: {shape.name} under ZeRO-{stage} over {n} "
                       f"rank{'s' if n > 1 else ''} needs {_breakdown(parts)} = {_gib(mem.total)} GiB per GPU, "
                       f"more than {mem.budget_why} = {_gib(mem.budget)} GiB; try {', '.join(fixes)}")
    return mem


# --------------------------------------------------------------------------- the plan
def gpu_memory(gib: float | None, nodes: list[NodeInfo] | None) -> tuple[float | None, str]:
    """GiB per GPU, and where that came from: `--gpu-memory`, else the smallest GPU Ray's
    `accelerator_type:` resources name on the nodes, else unknown (None)."""
    if gib is not None:
        if gib <= 0:
            raise InputError(f"--gpu-memory: must be > 0 GiB, got {gib:g}")
        return gib, f"{gib:g} GiB per GPU (--gpu-memory)"
    named = {key.split(":", 1)[1] for n in nodes or [] if n.total.get("GPU", 0) > 0
             for key in n.total if key.startswith("accelerator_type:")}
    known = {name: ACCELERATOR_GIB[name] for name in named if name in ACCELERATOR_GIB}
    if not known:
        return None, "unknown (pass --gpu-memory GiB to check that each role fits)"
    name = min(known, key=known.__getitem__)
    return known[name], f"{known[name]:g} GiB per GPU ({name}, from the nodes' accelerator_type)"


def memory_plan(cfg: Any, gpu_gib: float | None, config_for: dict[str, str] | None = None) -> list[RoleMemory]:
    """Each model-holding role of a TrainConfig, per GPU (an openai teacher is served elsewhere)."""
    gpu_bytes = gpu_gib * GIB if gpu_gib else None
    gpu_note = f"{gpu_gib:g} GiB" if gpu_gib else "unknown"
    shape = partial(model_shape, tiny_dir=cfg.tiny_dir, config_for=config_for or {})
    roles = []
    for role, engine in cfg.engines():  # an openai engine is served elsewhere
        if not engine.spec.local:
            continue
        scores = role == "teacher" and cfg.algorithm.teacher_scores_student()
        mem = engine_memory(f"{role} engine", engine, getattr(cfg.resources, f"{role}_gpus"),
                            shape(engine.model, f"{role}_engine.model"), gpu_bytes, gpu_note, scores)
        if role == "student":
            add_receive_buffers(mem, cfg, shape(cfg.learner.model, "learner.model"), gpu_bytes, gpu_note)
        roles.append(mem)
    student = next((m for m in roles if m.role == "student engine" and m.on_gpu), None)
    shared = student if cfg.resources.colocate else None
    roles.append(learner_memory(cfg.learner, shape(cfg.learner.model, "learner.model"), gpu_bytes, gpu_note, shared))
    return roles


COLUMNS = ("weights", "KV cache", "gradients", "optimizer states", "activations", "runtime")


def format_memory(roles: list[RoleMemory], gpu_source: str) -> list[str]:
    """A table of GiB per GPU for each role, then each role's model, setup and notes."""
    heads = ("weights", "KV", "grads", "optim", "activ", "runtime", "total", "budget")
    lines = [f"memory per GPU in GiB (roles on CPU: host memory; model sizes from config.json, no weights "
             f"loaded); GPU: {gpu_source}",
             f"  {'role':<16}" + "".join(f"{h:>9}" for h in heads) + "  fits"]
    for m in roles:
        cells = [_gib(m.parts[c]) if m.parts.get(c) else "-" for c in COLUMNS]
        budget = _gib(m.budget) if m.budget is not None else "-"
        verdict = "on CPU" if not m.on_gpu else ("?" if m.budget is None else ("yes" if m.problem is None else "NO"))
        lines.append(f"  {m.role:<16}" + "".join(f"{c:>9}" for c in [*cells, _gib(m.total), budget]) + f"  {verdict}")
    for m in roles:
        p = m.model.parameters()
        count = f"{p / 1e9:.2f}B" if p >= 1e9 else f"{p / 1e6:.1f}M"
        lines.append(f"  {m.role}: {m.model.name} ({count} parameters, sizes from "
                     f"{m.model.source}); {m.setup}")
        if m.budget is not None:
            lines.append(f"    budget: {m.budget_why}")
        lines += [f"    {note}" for note in m.notes]
    return lines


def check_memory(roles: list[RoleMemory]) -> None:
    """Raise PlacementError with the first role that cannot fit its GPUs."""
    for m in roles:
        if m.problem is not None:
            raise PlacementError(m.problem)
