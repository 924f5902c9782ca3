"""The backend registry (rose_ray/inference/registry.py) and each engine's backend section in a
config (`backend: {name: vllm, ...}`, chosen by name as tagged.py chooses every such section):
what each backend says of itself, where its settings live, and the errors that name a setting
given in the wrong place."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from rose_ray.config import ConfigError, load_config, to_yaml
from rose_ray.inference.backends import command_engine
from rose_ray.inference.engine import EngineConfig
from rose_ray.inference.registry import (
    BACKENDS,
    HFSettings,
    OpenAISettings,
    Setting,
    VLLMSettings,
    own_settings,
    settings_owner,
)

ROOT = Path(__file__).resolve().parents[3]
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
    owned = [key for b in BACKENDS.values() for key in own_settings(b)]
    assert len(owned) == len(set(owned)) and "name" not in owned
    shared = {f.name for f in fields(EngineConfig)}
    assert not shared & set(owned) and "backend" in shared
    assert settings_owner("kv_cache_mb") is BACKENDS["vllm"] and settings_owner("base_url") is BACKENDS["openai"]
    assert settings_owner("prefix_cache_mb") is BACKENDS["hf"] and settings_owner("context_tokens") is None


def test_an_engine_holds_its_own_backends_section():
    engine = EngineConfig(backend="vllm", model="m")
    assert engine.backend == VLLMSettings() and engine.spec is BACKENDS["vllm"] and engine.tensor_parallel_size == 1
    assert EngineConfig(backend={"name": "vllm", "tensor_parallel_size": 2}, model="m").tensor_parallel_size == 2
    assert EngineConfig.of("vllm", model="m", tensor_parallel_size=2).tensor_parallel_size == 2
    assert EngineConfig(model="m").tensor_parallel_size == 1  # hf splits no model
    with pytest.raises(ConfigError, match="engine.backend.kv_cache_mb: hf has no such key .its keys: name, attn_impl"):
        EngineConfig(model="m", backend={"name": "hf", "kv_cache_mb": 64})
    with pytest.raises(ConfigError, match="engine.kv_cache_mb: a setting of the vllm backend, not of hf"):
        EngineConfig.of("hf", model="m", kv_cache_mb=64)
    with pytest.raises(ConfigError, match="engine.backend.gpu_memory_utilization: must be in"):
        EngineConfig.of("vllm", model="m", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="engine.backend: must be one of"):
        EngineConfig(backend="tgi", model="m")


def test_a_command_engine_takes_only_its_backends_settings():
    """`--kv-cache-mb` is a vllm flag: an hf engine leaves it, a served one too."""
    assert command_engine("m", "--model", "hf", kv_cache_mb=64, dtype="float32").backend == HFSettings()
    served = command_engine("openai:http://h:1/v1", "--teacher", "hf", "tok", kv_cache_mb=64)
    assert served.spec.served and served.backend.base_url == "http://h:1/v1" and not hasattr(served.backend, "kv_cache_mb")


def test_the_config_sections_per_backend(tmp_path):
    cfg = load_config(SEED)
    assert cfg.teacher_engine.backend == VLLMSettings(tensor_parallel_size=4)
    # A layer that names no backend adds to the one before; one that names another starts afresh.
    more = load_config(SEED, ["teacher_engine.backend.kv_cache_mb=64", "teacher_engine.backend.tensor_parallel_size=2",
                              "resources.teacher_gpus=2"])
    assert more.teacher_engine.backend == VLLMSettings(kv_cache_mb=64, tensor_parallel_size=2)
    hf = load_config(SEED, ["teacher_engine.backend=hf", "teacher_engine.backend.prefix_cache_mb=0"])
    assert hf.teacher_engine.backend == HFSettings(prefix_cache_mb=0)
    tiny = load_config(None, ["student_engine.backend={name: vllm, kv_cache_mb: 64}"])
    assert tiny.student_engine.backend == VLLMSettings(kv_cache_mb=64)
    # The section is written out whole, and a run's config.yaml reads back the same.
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(tiny))
    assert load_config(saved) == tiny


@pytest.mark.parametrize("overrides, message", [
    (["student_engine.backend=vllm", "student_engine.backend.prefix_cache_mb=0"],
     "student_engine.backend.prefix_cache_mb: vllm has no such key (its keys: name, kv_cache_mb, "),
    (["student_engine.backend.max_batch_size=2"],
     "student_engine.backend.max_batch_size: hf has no such key (its keys: name, attn_implementation, prefix_cache_mb)"),
    (["teacher_engine.backend.base_url=http://h:1/v1"], "teacher_engine.backend.base_url: hf has no such key"),
    (["student_engine.backend=tgi"], "student_engine.backend: must be one of ('hf', 'vllm', 'openai'), got 'tgi'"),
    (["student_engine.kv_cache=64"], "key 'student_engine.kv_cache': Key 'kv_cache' not in 'EngineConfig'"),
])
def test_a_setting_in_the_wrong_place_is_named(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)



def test_each_backend_answers_the_questions_asked_of_it():
    """What memory, placement and publication ask of an engine's backend section (they read none
    of its settings: tests/unit/test_design.py), each answer naming the key that holds it."""
    vllm = VLLMSettings(kv_cache_mb=64, gpu_memory_utilization=0.5, tensor_parallel_size=2, cuda_graphs=False)
    assert (vllm.tensor_parallel, vllm.gpu_share, vllm.kv_budget_mb) == (
        Setting("tensor_parallel_size", 2), Setting("gpu_memory_utilization", 0.5), Setting("kv_cache_mb", 64.0))
    assert (vllm.kept_kv_mb, vllm.captures_cuda_graphs, VLLMSettings().captures_cuda_graphs) == (0.0, False, True)
    for other in (HFSettings(prefix_cache_mb=256), OpenAISettings()):
        assert (other.tensor_parallel, other.gpu_share, other.kv_budget_mb, other.captures_cuda_graphs) == (
            None, None, None, False)
    assert (HFSettings(prefix_cache_mb=256).kept_kv_mb, OpenAISettings().kept_kv_mb) == (256.0, 0.0)
    assert EngineConfig.of("vllm", model="m", tensor_parallel_size=4).tensor_parallel_size == 4


def test_a_backend_names_its_own_package_install_hint_and_version(monkeypatch, tmp_path):
    """What `rose-ray check --backends` and an engine's start say of a backend come from its own
    record: a backend needing another package (a stand-in registered here, its package missing,
    then present but broken) is named with that package and its own install hint, not vLLM's;
    each backend's version is that of the distributions it names (openai: its HTTP client)."""
    from importlib.metadata import version

    from rose_ray.inference.backends import backend_problem, backend_version
    from rose_ray.inference.registry import Backend

    tgi = Backend("tgi", HFSettings, "rose_ray_tgi_stand_in:Engine", served=False, takes_weights=False,
                  in_flight=(), paged_kv=False, package="rose_ray_tgi_stand_in", package_label="TGI",
                  install="pip install tgi-client", distributions=("aiohttp", "no-such-distribution"))
    monkeypatch.setitem(BACKENDS, "tgi", tgi)
    assert backend_problem("tgi") == (
        "the tgi backend needs TGI, which is not installed: pip install tgi-client")
    (tmp_path / "rose_ray_tgi_stand_in.py").write_text("raise ImportError('no libtgi.so')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert backend_problem("tgi") is None  # found; importing it is the check's job
    assert backend_problem("tgi", import_it=True) == (
        "TGI is installed but does not import (ImportError: no libtgi.so); pip install tgi-client")
    assert backend_version("tgi") == backend_version("openai") == f"aiohttp {version('aiohttp')}"
    assert backend_version("hf") == f"transformers {version('transformers')}, torch {version('torch')}"
    assert backend_problem("hf") is None and backend_problem("openai", import_it=True) is None
