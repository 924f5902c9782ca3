"""The GPU memory plan (rose_ray/memory.py): sizes from config.json or the shipped Qwen3 table,
each role's memory per GPU, and `rose-ray plan`/`check` refusing a role that cannot fit its GPUs."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rose_ray.cli import main
from rose_ray.config import ConfigError, load_config
from rose_ray.learner.memory import learner_activation_bytes
from rose_ray.memory import (
    GIB,
    SHIPPED_TABLE,
    check_memory,
    gpu_memory,
    learner_memory,
    memory_plan,
    model_shape,
    shipped_sizes,
)
from rose_ray.placement import NodeInfo, PlacementError

ROOT = Path(__file__).resolve().parents[2]


SEEDS = {name: str(ROOT / f"configs/{name}_qwen3_1p7b_32b.yaml") for name in ("rose", "opd", "sft")}


TINY = str(ROOT / "rose_ray/configs/tiny.yaml")


ONE_GPU_TEACHER = ["teacher_engine.backend.tensor_parallel_size=1", "resources.teacher_gpus=1"]


EIGHT_GPUS = ["--node", "CPU=64,GPU=8"]


def roles(config: str, gpu_gib: float | None, overrides: list[str] = ()) -> dict:
    return {m.role: m for m in memory_plan(load_config(config, list(overrides)), gpu_gib)}


# --------------------------------------------------------------------------- model sizes
def test_the_shipped_qwen3_sizes_give_the_model_cards_parameter_counts():
    cards = {"0.6B": 0.6, "1.7B": 1.7, "4B": 4.0, "8B": 8.2, "14B": 14.8, "32B": 32.8}
    table = shipped_sizes()
    for size, billions in cards.items():
        shape = model_shape(f"Qwen/Qwen3-{size}", "student_engine.model", "unused", {})
        assert shape.source == SHIPPED_TABLE
        assert shape.parameters() / 1e9 == pytest.approx(billions, abs=0.05), size
    assert set(table) == {f"Qwen/Qwen3-{s}" for s in cards}
    big = model_shape("Qwen/Qwen3-32B", "k", "unused", {})
    assert big.kv_bytes_per_token(2) == 256 * 1024  # DESIGN.md: ~256 KiB a token in bf16
    assert big.kv_bytes_per_token(2, tensor_parallel=4) == 64 * 1024
    assert big.kv_bytes_per_token(2, tensor_parallel=16) == 2 * 64 * 1 * 128 * 2  # one KV head per rank, replicated
    assert model_shape("Qwen/Qwen3-1.7B", "k", "unused", {}).kv_bytes_per_token(2) == 112 * 1024


def test_a_local_tiny_model_is_read_from_its_config_json(tiny_models):
    import torch

    from rose_ray.inference.hf import kv_bytes_per_token
    from rose_ray.models import load_model

    folder = tiny_models["teacher"]
    shape = model_shape(str(folder), "teacher_engine.model", "unused", {})
    assert shape.source == str(folder / "config.json")
    model = load_model(folder)  # only to compare: the plan itself never loads weights
    assert shape.parameters() == sum(p.numel() for p in model.parameters())
    assert shape.kv_bytes_per_token(4) == kv_bytes_per_token(model)
    assert next(model.parameters()).dtype == torch.float32
    # `tiny:` names read the tiny folder under tiny_dir, and a stand-in wins over the shipped table.
    assert model_shape("tiny:teacher", "k", str(folder.parent), {}) == replace(shape, name="tiny:teacher")
    stood_in = model_shape("Qwen/Qwen3-32B", "teacher_engine.model", "unused", {"Qwen/Qwen3-32B": str(folder)})
    assert stood_in.hidden_size == shape.hidden_size and stood_in.source == str(folder / "config.json")


def test_a_model_with_no_sizes_anywhere_is_named_by_its_key(tmp_path):
    with pytest.raises(ValueError, match=r"student_engine.model: 'org/not-here' has no config.json .*--model-config-for org/not-here=DIR"):
        memory_plan(load_config(TINY, ["student_engine.model=org/not-here"]), 80)
    with pytest.raises(ValueError, match=r"teacher_engine.model: .* holds no config.json"):
        model_shape("Qwen/Qwen3-32B", "teacher_engine.model", "unused", {"Qwen/Qwen3-32B": str(tmp_path)})


# --------------------------------------------------------------------------- engines
def test_the_32b_teacher_at_32_by_16k_on_one_80gb_gpu_is_refused_and_fits_over_4():
    one = roles(SEEDS["rose"], 80, ONE_GPU_TEACHER)["teacher engine"]
    assert one.parts["KV cache"] == 32 * 16384 * 256 * 1024  # 128 GiB
    assert one.parts["weights"] == pytest.approx(61.0 * GIB, rel=0.01)
    assert one.budget == 0.9 * 80 * GIB
    assert one.problem.startswith("the teacher engine cannot fit its GPU: Qwen/Qwen3-32B needs 61.0 GiB weights "
                                  "+ 128.0 GiB KV cache")
    assert "more than teacher_engine.backend.gpu_memory_utilization 0.9 x 80 GiB = 72.0 GiB" in one.problem
    assert "at full context 1 of its 32 sequences fit at once" in one.problem
    assert "set teacher_engine.backend.tensor_parallel_size: 4 with resources.teacher_gpus: 4" in one.problem
    with pytest.raises(PlacementError, match="the teacher engine cannot fit its GPU: .* = 194.8 GiB per GPU"):
        check_memory(list(roles(SEEDS["rose"], 80, ONE_GPU_TEACHER).values()))
    # Two GPUs hold 18 full conversations, not 32; four hold them all (weights and KV split four ways).
    two = roles(SEEDS["rose"], 80, ["teacher_engine.backend.tensor_parallel_size=2", "resources.teacher_gpus=2"])
    assert "at full context 18 of its 32 sequences fit at once" in two["teacher engine"].problem
    four = roles(SEEDS["rose"], 80)["teacher engine"]
    assert four.problem is None and four.parts["KV cache"] == one.parts["KV cache"] / 4
    assert four.parts["weights"] == pytest.approx(one.parts["weights"] / 4)
    # An H200 holds the teacher on two GPUs.
    assert roles(SEEDS["rose"], 141, ["teacher_engine.backend.tensor_parallel_size=2", "resources.teacher_gpus=2"])[
        "teacher engine"].problem is None


def test_the_student_says_what_concurrency_fits():
    wide = roles(SEEDS["rose"], 80, ["student_engine.max_batch_size=64"])["student engine"]
    assert "lower student_engine.max_batch_size to 37" in wide.problem
    assert "37 sequences fit at full context (64 wanted)" in wide.notes
    assert roles(SEEDS["rose"], 141, ["student_engine.max_batch_size=64"])["student engine"].problem is None


def test_an_hf_engine_is_planned_on_the_whole_gpu_with_its_prefix_cache():
    hf = roles(SEEDS["rose"], 80, ["student_engine.backend=hf", "student_engine.max_batch_size=1",
                                   "student_engine.backend.prefix_cache_mb=2048"])["student engine"]
    assert hf.budget == 80 * GIB and hf.parts["KV cache"] == 16384 * 112 * 1024 + 2 * GIB
    assert hf.problem is None
    # Only vllm splits a model: tensor_parallel_size is a vllm setting, which an hf engine refuses.
    with pytest.raises(ConfigError, match="teacher_engine.backend.tensor_parallel_size: hf has no such key"):
        load_config(SEEDS["rose"], ["teacher_engine.backend=hf", "teacher_engine.backend.tensor_parallel_size=4"])


def test_the_opd_teacher_keeps_room_for_its_scoring_logits():
    scoring = roles(SEEDS["opd"], 80)["teacher engine"]
    assert scoring.problem is None and scoring.budget == 0.75 * 80 * GIB
    assert any("scoring (prompt logprobs of a 16,384-token chunk): 18.5 GiB beside vLLM's share, 20.0 GiB left" in n
               for n in scoring.notes)
    greedy = roles(SEEDS["opd"], 80, ["teacher_engine.backend.gpu_memory_utilization=0.9"])["teacher engine"]
    assert "leaves 8.0 GiB of each 80 GiB GPU; set it to 0.75 or lower" in greedy.problem
    # rose with lam = 0 never scores: the same share is fine there.
    assert roles(SEEDS["rose"], 80, ["teacher_engine.backend.gpu_memory_utilization=0.9"])["teacher engine"].problem is None


def test_the_student_gpu_keeps_room_for_an_nccl_publications_receive_buffers():
    """Where the publication may go over NCCL, the student engine receives the learner's whole
    state (Qwen3-1.7B in bf16: 3.2 GiB) into buffers on its GPU: beside vLLM's share, or in an
    hf engine's GPU. Over gloo or the object store they are host memory."""
    student = roles(SEEDS["rose"], 80)["student engine"]
    assert student.problem is None
    assert ("weight publication over NCCL: receive buffers of 3.2 GiB (the learner's state) beside vLLM's share, "
            "8.0 GiB left there") in student.notes
    greedy = roles(SEEDS["rose"], 80, ["student_engine.backend.gpu_memory_utilization=0.97"])["student engine"]
    assert "leaves 2.4 GiB of each 80 GiB GPU; set it to 0.95 or lower, or publish.collective_backend=gloo" in \
        greedy.problem
    for host_buffers in (["publish.collective_backend=gloo"], ["publish.method=object_store"], ["resources.colocate=true"]):
        plan = roles(SEEDS["rose"], 80, ["student_engine.backend.gpu_memory_utilization=0.97", *host_buffers])
        assert plan["student engine"].problem is None, host_buffers
        assert not any("receive buffers" in n for n in plan["student engine"].notes)
    hf = roles(SEEDS["rose"], 80, ["student_engine.backend=hf", "student_engine.max_batch_size=1"])["student engine"]
    assert hf.parts["publication buffers"] == pytest.approx(3.2 * GIB, rel=0.01) and hf.problem is None


def test_cpu_roles_print_their_needs_and_are_never_refused(tiny_models):
    plan = memory_plan(load_config(TINY, [f"tiny_dir={tiny_models['student'].parent}"]), 80)
    assert [m.role for m in plan] == ["student engine", "teacher engine", "learner ranks"]
    assert all(not m.on_gpu and m.budget is None and m.problem is None and m.total > 0 for m in plan)
    check_memory(plan)
    vllm = roles(TINY, None, [f"tiny_dir={tiny_models['student'].parent}", "student_engine.backend=vllm"])
    assert "student_engine.backend.kv_cache_mb 512 holds" in vllm["student engine"].notes[0]


def test_unknown_gpu_size_plans_without_checking():
    plan = roles(SEEDS["rose"], None, ONE_GPU_TEACHER)
    assert all(m.budget is None and m.problem is None for m in plan.values())
    assert plan["teacher engine"].total > 190 * GIB


# --------------------------------------------------------------------------- learner
def test_the_zero_stage_partitions_what_it_should():
    cfg = load_config(SEEDS["rose"])
    shape = model_shape("Qwen/Qwen3-1.7B", "learner.model", "unused", {})
    p = shape.parameters()
    by_stage = {s: learner_memory(replace(cfg.learner, zero_stage=s), shape, 80 * GIB, "80 GiB").parts for s in range(4)}
    assert by_stage[0]["weights"] == 2 * p and by_stage[0]["gradients"] == 6 * p and by_stage[0]["optimizer states"] == 12 * p
    assert by_stage[1]["gradients"] == 2 * p + 2 * p and by_stage[1]["optimizer states"] == 6 * p  # 2 ranks
    assert by_stage[2]["gradients"] == 3 * p and by_stage[2]["weights"] == 2 * p
    assert by_stage[3]["weights"] == p + 4 * shape.embedding_parameters()  # its part + a gathered (prefetched) layer
    assert by_stage[3]["gradients"] == by_stage[2]["gradients"]
    assert all(by_stage[s]["activations"] == by_stage[0]["activations"] for s in range(4))  # data parallel
    total = [sum(parts.values()) for parts in by_stage.values()]
    assert total[0] > total[1] > total[2] > total[3]
    fp32 = learner_memory(replace(cfg.learner, dtype="float32", zero_stage=0), shape, None, "?").parts
    assert (fp32["weights"], fp32["gradients"], fp32["optimizer states"]) == (4 * p, 4 * p, 8 * p)
    four = learner_memory(replace(cfg.learner, ranks=4), shape, None, "?").parts
    assert four["optimizer states"] == 3 * p


def test_learner_activations_count_a_chunked_head_and_checkpointed_layers():
    cfg = load_config(SEEDS["rose"])
    shape = model_shape("Qwen/Qwen3-1.7B", "learner.model", "unused", {})
    sizes = asdict(shape)
    kept = learner_activation_bytes(sizes, 16384, 1024, True, 2)
    whole = learner_activation_bytes(sizes, 16384, 0, True, 2)
    full = learner_activation_bytes(sizes, 16384, 1024, False, 2)
    assert kept["head"] == 1024 * 151936 * 14 and whole["head"] == 16 * kept["head"]  # ~2 GiB vs ~32 GiB
    assert full["body"] > 10 * kept["body"] and kept["body"] < 4 * GIB
    # linear: no L x L mask
    assert learner_activation_bytes(sizes, 8192, 1024, True, 2)["body"] * 2 == kept["body"]
    # learner.logprob_chunk sets the head's chunk (the `trained` head: the chunk, and the trained
    # tokens' hidden states gathered for it)
    chunked = replace(cfg.learner, logprob_chunk=256, activation_checkpointing="full", head="trained")
    assert learner_memory(chunked, shape, None, "?").parts["activations"] == pytest.approx(
        kept["body"] + kept["head"] / 4 + 16384 * 2 * shape.hidden_size)
    # selective checkpointing keeps half the layers whole; the fused heads write no logits
    half = learner_activation_bytes(sizes, 16384, 1024, "selective", 2)
    assert kept["body"] < half["body"] < full["body"] and half["body"] == pytest.approx(
        (kept["body"] + full["body"]) / 2, rel=0.05)
    assert learner_activation_bytes(sizes, 16384, 1024, "none", 2, "cce")["head"] < kept["head"] / 20


def test_a_learner_that_does_not_fit_names_its_knobs():
    off = roles(SEEDS["rose"], 40, ["learner.activation_checkpointing=none"])["learner ranks"]
    assert off.problem.startswith("the learner ranks cannot fit their GPUs: Qwen/Qwen3-1.7B under ZeRO-2 over 2 ranks")
    assert "learner.activation_checkpointing: selective" in off.problem and "learner.zero_stage: 3" in off.problem
    assert roles(SEEDS["rose"], 40, ["learner.activation_checkpointing=full"])["learner ranks"].problem is None
    # the seed's settings, on paper: none fits 141 GB GPUs, selective 80 GB ones (the seed's)
    assert roles(SEEDS["rose"], 80)["learner ranks"].problem is None
    assert roles(SEEDS["rose"], 140.4, ["learner.activation_checkpointing=none"])["learner ranks"].problem is None


def test_the_speed_settings_memory_is_counted():
    """overlap_comm's buckets (4.5x, DeepSpeed's figure) and torch's foreach AdamW's temporary,
    each in the learner's plan; the fused optimizer adds none."""
    base = roles(SEEDS["rose"], 80, ["learner.overlap_comm=false"])["learner ranks"]
    over = roles(SEEDS["rose"], 80, ["learner.overlap_comm=true"])["learner ranks"]
    assert over.parts["runtime"] - base.parts["runtime"] == pytest.approx(3.5 * 2 * 2e8 * 2)
    p = base.model.parameters()
    short = replace(load_config(SEEDS["rose"]).learner, max_tokens=4096, activation_checkpointing="full", head="cce")
    foreach = learner_memory(replace(short, optimizer="adamw"), base.model, 80 * GIB, "80 GiB")
    fused = learner_memory(replace(short, optimizer="adamw_fused"), base.model, 80 * GIB, "80 GiB")
    assert foreach.parts["activations"] == 4 * (p // 2) > fused.parts["activations"]  # at the step
    assert "optimizer adamw (3.2 GiB at the step)" in "\n".join(foreach.notes)


def test_a_colocated_learner_gets_what_the_student_engine_leaves():
    shared = ["resources.colocate=true", "resources.student_gpus=0.5", "learner.gpus_per_rank=0.5",
              "student_engine.backend.gpu_memory_utilization=0.4", "student_engine.max_batch_size=8"]
    plan = roles(SEEDS["rose"], 80, shared)
    assert plan["learner ranks"].budget == pytest.approx(0.6 * 80 * GIB)
    assert "less the colocated student engine's 32.0 GiB" in plan["learner ranks"].budget_why


# --------------------------------------------------------------------------- GPU size and the CLI
def test_the_gpu_size_comes_from_the_flag_or_the_nodes_accelerator_type():
    h100 = NodeInfo("a", "x", {"CPU": 8, "GPU": 8, "accelerator_type:H100": 1})
    h200 = NodeInfo("b", "x", {"CPU": 8, "GPU": 8, "accelerator_type:H200": 1})
    assert gpu_memory(None, [h100, h200])[0] == 79.6  # the smallest GPU
    assert gpu_memory(141, [h100])[0] == 141
    assert gpu_memory(None, [NodeInfo("c", "x", {"CPU": 8, "GPU": 8})])[0] is None
    with pytest.raises(ValueError, match="--gpu-memory: must be > 0"):
        gpu_memory(0, [])


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_plan_prints_the_seed_configs_memory_and_they_fit_80_and_141_gb(name, capsys):
    for gib in ("80", "141"):
        assert main(["plan", "--config", SEEDS[name], *EIGHT_GPUS, "--gpu-memory", gib]) == 0
        out = capsys.readouterr().out
        table = out[out.index("memory per GPU"):]
        assert f"GPU: {gib} GiB per GPU (--gpu-memory)" in table and " NO" not in table
        assert [line.split()[-1] for line in table.splitlines()[2:5]] == ["yes", "yes", "yes"]
        assert "every role fits its GPUs" in out


def test_plan_and_check_exit_2_naming_the_role_and_its_numbers(tiny_qwen3, capsys):
    assert main(["plan", "--config", SEEDS["rose"], *EIGHT_GPUS, "--gpu-memory", "80", *ONE_GPU_TEACHER]) == 2
    err = capsys.readouterr().err
    assert "rose-ray plan: error: the teacher engine cannot fit its GPU: Qwen/Qwen3-32B needs" in err
    assert "= 194.8 GiB per GPU" in err
    stand_ins = ["--tokenizer-for", f"Qwen/Qwen3-1.7B={tiny_qwen3['student']}",
                 "--tokenizer-for", f"Qwen/Qwen3-32B={tiny_qwen3['teacher']}"]
    assert main(["check", SEEDS["rose"], *ONE_GPU_TEACHER, *stand_ins, "--node", "CPU=64,GPU=8,accelerator_type:H100=1"]) == 2
    assert "the teacher engine cannot fit its GPU" in capsys.readouterr().err
    # A config.json stand-in is read instead of the shipped table (the tiny teacher fits anywhere).
    assert main(["check", SEEDS["rose"], *ONE_GPU_TEACHER, *stand_ins, "--gpu-memory", "80",
                 "--model-config-for", f"Qwen/Qwen3-32B={tiny_qwen3['teacher']}", *EIGHT_GPUS]) == 0
    out = capsys.readouterr().out
    assert f"sizes from {tiny_qwen3['teacher'] / 'config.json'}" in out and out.rstrip().endswith("OK")
