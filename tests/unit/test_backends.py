"""The backend registry (rose_ray/inference/registry.py) and each engine's backend section in a
config: what each backend says of itself, where its settings live, and the errors that name a
setting given in the wrong place."""

from __future__ import annotations

import re
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from rose_ray.config import ConfigError, load_config, to_yaml
from rose_ray.inference.backends import command_engine
from rose_ray.inference.engine import EngineConfig
from rose_ray.inference.registry import (
    BACKENDS,
    HFSettings,
    OpenAISettings,
    VLLMSettings,
    settings_owner,
)

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "configs/rose_qwen3_1p7b_32b.yaml"


def test_each_backend_says_whether_it_is_served_and_what_it_can_do():
    hf, vllm, openai = BACKENDS["hf"], BACKENDS["vllm"], BACKENDS["openai"]
    assert [b.served for b in (hf, vllm, openai)] == [False, False, True]
    assert [b.local for b in (hf, vllm, openai)] == [True, True, False]
    assert [b.takes_weights for b in (hf, vllm, openai)] == [True, True, False]
    assert (hf.in_flight, vllm.in_flight, openai.in_flight) == (("wait",), ("wait", "keep"), ())
    assert [b.settings for b in (hf, vllm, openai)] == [HFSettings, VLLMSettings, OpenAISettings]
    assert EngineConfig(model="m").spec is hf and EngineConfig(backend="openai").spec.served


def test_every_setting_belongs_to_one_backend_and_none_is_shared():
    owned = [f.name for b in BACKENDS.values() for f in fields(b.settings)]
    assert len(owned) == len(set(owned))
    shared = {f.name for f in fields(EngineConfig)}
    assert not shared & set(owned) and set(BACKENDS) <= shared
    assert settings_owner("kv_cache_mb") is BACKENDS["vllm"] and settings_owner("base_url") is BACKENDS["openai"]
    assert settings_owner("prefix_cache_mb") is BACKENDS["hf"] and settings_owner("context_tokens") is None


def test_an_engine_fills_its_own_section_and_refuses_another():
    engine = EngineConfig(backend="vllm", model="m")
    assert engine.vllm == VLLMSettings() and engine.hf is None and engine.openai is None
    assert engine.settings is engine.vllm and engine.tensor_parallel_size == 1
    assert EngineConfig.of("vllm", model="m", tensor_parallel_size=2).tensor_parallel_size == 2
    assert EngineConfig(model="m").tensor_parallel_size == 1  # hf splits no model
    with pytest.raises(ConfigError, match="engine.vllm: settings of the vllm backend, but engine.backend is 'hf'"):
        EngineConfig(model="m", vllm=VLLMSettings())
    with pytest.raises(ConfigError, match="engine.kv_cache_mb: a setting of the vllm backend, not of hf"):
        EngineConfig.of("hf", model="m", kv_cache_mb=64)
    with pytest.raises(ConfigError, match="engine.vllm.gpu_memory_utilization: must be in"):
        EngineConfig.of("vllm", model="m", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="engine.backend: must be one of"):
        EngineConfig(backend="tgi", model="m")


def test_a_command_engine_takes_only_its_backends_settings():
    """`--kv-cache-mb` is a vllm flag: an hf engine leaves it, a served one too."""
    assert command_engine("m", "--model", "hf", kv_cache_mb=64, dtype="float32").hf == HFSettings()
    served = command_engine("openai:http://h:1/v1", "--teacher", "hf", "tok", kv_cache_mb=64)
    assert served.spec.served and served.openai.base_url == "http://h:1/v1" and served.vllm is None


def test_the_config_sections_per_backend():
    cfg = load_config(SEED)
    assert cfg.teacher_engine.vllm.tensor_parallel_size == 4 and cfg.teacher_engine.hf is None
    # A flat setting (the spelling before the sections) moves to its backend's section.
    flat = load_config(SEED, ["teacher_engine.kv_cache_mb=64", "teacher_engine.tensor_parallel_size=2",
                              "resources.teacher_gpus=2"])
    assert flat.teacher_engine.vllm.kv_cache_mb == 64 and flat.teacher_engine.vllm.tensor_parallel_size == 2
    # A later backend drops the other backends' sections before it; its own stay.
    hf = load_config(SEED, ["teacher_engine.backend=hf", "teacher_engine.hf.prefix_cache_mb=0"])
    assert hf.teacher_engine.vllm is None and hf.teacher_engine.hf.prefix_cache_mb == 0
    tiny = load_config(None, ["student_engine.vllm.kv_cache_mb=64", "student_engine.backend=vllm"])
    assert tiny.student_engine.vllm.kv_cache_mb == 64
    # A flat setting of another backend is ignored, as it was before the sections.
    assert load_config(None, ["student_engine.kv_cache_mb=64"]).student_engine.vllm is None


@pytest.mark.parametrize("overrides, message", [
    (["student_engine.vllm.prefix_cache_mb=0", "student_engine.backend=vllm"],
     "key 'student_engine.vllm.prefix_cache_mb': not a setting of the vllm backend; it lives at "
     "student_engine.hf.prefix_cache_mb"),
    (["student_engine.hf.max_batch_size=2"],
     "key 'student_engine.hf.max_batch_size': not a setting of the hf backend; it lives at student_engine.max_batch_size"),
    (["teacher_engine.openai.base_url=http://h:1/v1"],
     "key 'teacher_engine.openai': settings of the openai backend, but teacher_engine.backend is hf; "
     "set teacher_engine.backend=openai or drop them"),
    (["student_engine.vllm.kv_cache=64", "student_engine.backend=vllm"],
     "key 'student_engine.vllm.kv_cache': Key 'kv_cache' not in 'VLLMSettings'"),
    (["student_engine.kv_cache=64"], "key 'student_engine.kv_cache': Key 'kv_cache' not in 'EngineConfig'"),
])
def test_a_setting_in_the_wrong_place_is_named_with_where_it_lives(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_a_saved_config_loads_in_either_spelling(tmp_path):
    """A run's config.yaml from before the sections held every backend's settings flat: it
    loads as it ran (resume, export)."""
    cfg = load_config(None, ["student_engine.backend=vllm", "student_engine.kv_cache_mb=64"])
    new = tmp_path / "new.yaml"
    new.write_text(to_yaml(cfg))
    assert load_config(new, saved=True) == cfg
    old = yaml.safe_load(to_yaml(cfg))
    for role in ("student_engine", "teacher_engine"):
        section = old[role]
        for name in BACKENDS:
            section.pop(name)
            section.update({f.name: f.default for f in fields(BACKENDS[name].settings)})
    old["student_engine"]["kv_cache_mb"] = 64
    old["teacher_engine"]["kv_cache_mb"] = 32  # an hf teacher's: ignored, as it was
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    assert load_config(tmp_path / "old.yaml") == cfg


def test_outside_inference_no_code_compares_backend_names():
    found = subprocess.run(["grep", "-rnE", r"""(==|!=| in |not in) *\(?["'](openai|vllm|hf)["']|["'](openai|vllm|hf)["'] *(==|!=| in )""",
                            "rose_ray", "--include=*.py"], cwd=ROOT, capture_output=True, text=True).stdout
    assert [line for line in found.splitlines() if not line.startswith("rose_ray/inference/")] == []
