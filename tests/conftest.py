"""Shared fixtures: tiny local models (built once per session) and a local Ray cluster.

Layout (docs/design.md, "Tests"): `tests/unit/<package path>/` holds the tests that start no
process, mirroring rose_ray/ (tests/unit/test_layout.py holds them to it); `tests/integration/`
those that start Ray, engines, servers, JVMs or commands; `tests/e2e/` whole runs, named by
scenario. Long tests are marked `slow` wherever they live. A file split between two folders keeps
the helpers both halves use in its unit half, and the other half imports them."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# The tests run two at a time on 2 cores (`-n 2`): OpenMP's threads that spin at each barrier
# while a sibling waits for a core slow a torch step ~10x when another process holds a core
# (the teacher warm-up test: 41 s alone, 529 s beside a busy core; 76 s with PASSIVE). Set
# before torch loads (libgomp reads it once); Ray's workers and subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ScienceWorld's JVMs live for a few games in a test: C1's quick code (no C2 recompilation)
# takes about a third less CPU over a JVM's start and its first hundred steps, the same after
# that. Runs keep the JVM's default (C2), where a JVM plays for hours. The JVM prints the
# option's "Picked up" line on stderr, which py4j sends to /dev/null.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """ROSE_RAY_CACHE for the whole session: a folder of its own, so no test writes the user's
    ~/.cache/rose_ray (a config's default `tiny_dir`) and parallel sessions share nothing.
    Autouse and session-wide, so it is set before the Ray cluster and every subprocess start."""
    cache = tmp_path_factory.mktemp("rose_ray_cache")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ROSE_RAY_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{"student": Path, "teacher": Path}: tiny Qwen3 models sharing one tokenizer."""
    from rose_ray.provision.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny_models"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """Tiny models that look like Qwen3 from the outside: its special tokens (<think> too) and
    a chat template that rewrites history as Qwen3's does (`rose-ray init-tiny --style qwen3`)."""
    from rose_ray.provision.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny_qwen3"), seed=0, style="qwen3")


@pytest.fixture
def tiny_dir(tiny_models, tmp_path):
    """tmp_path holding a copy of the session's tiny models, as `tiny_dir=` finds them once
    built (`tiny:` names reuse them instead of building again, ~25 s under load here); what
    a test warms or writes beside them stays out of the session's folder. A fresh `tiny_dir`
    built on first use is test_cache_lock's (and test_models', for `init_tiny` itself)."""
    shutil.copytree(tiny_models["student"].parent, tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.fixture(scope="session")
def bench_table():
    """bench/table.py as a module (bench/ is scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_table", Path(__file__).resolve().parent.parent / "bench" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stop_process():
    """stop(pid): SIGSTOP a process and return once every thread of it has stopped.

    `kill` returns before the stop lands: each thread stops when it next runs, so on a busy
    machine a JVM's socket thread could still answer one more call (seen in CI)."""

    def stop(pid: int, timeout_s: float = 10.0) -> None:
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = []
            for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
                try:
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
                except (OSError, IndexError):
                    pass  # a thread that just ended
            if states and all(s in "tT" for s in states):
                return
            time.sleep(0.01)
        raise AssertionError(f"process {pid} did not stop within {timeout_s:g} s")

    return stop


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster for the whole session (4 logical CPUs on 2 cores)."""
    import ray

    if not ray.is_initialized():
        # address="local": always a fresh cluster of our own, never one another process started
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def env_node_cluster():
    """(cluster, env nodes): a simulated multi-node Ray cluster for one test module, in place of
    the session's. The head has 2 CPUs and 2 GPUs (fake: Ray only counts them; no GPU exists
    here); two CPU-only nodes carry the `env_node` custom resource env workers ask for."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray
    from ray.cluster_utils import Cluster

    session = ray.is_initialized()  # the session cluster (ray_cluster): put back after
    if session:
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False})
    try:
        env_nodes = [c.add_node(num_cpus=2, resources={"env_node": 10}) for _ in range(2)]
        c.wait_for_nodes()
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        yield c, env_nodes
    finally:
        ray.shutdown()
        c.shutdown()
        if session:
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)


# --------------------------------------------------------------------------- hub ids
REVISION = "0123456789abcdef0123456789abcdef01234567"


def put_in_hub_cache(hub: Path, repo_id: str, folder: Path) -> Path:
    """Copy `folder` into the HF cache `hub` as repo `repo_id`'s main revision; its snapshot folder."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def hub_cache(tiny_models, tmp_path, monkeypatch):
    """HF_HOME with org/tiny-student and org/tiny-teacher in its hub cache; {id: snapshot}."""
    import huggingface_hub.constants

    hub = tmp_path / "hf" / "hub"
    snapshots = {f"org/tiny-{role}": put_in_hub_cache(hub, f"org/tiny-{role}", tiny_models[role])
                 for role in ("student", "teacher")}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The hub client read HF_HOME when it was imported (as it would at a user's start).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    return snapshots


def launch_module(name: str, folder: str = "launch"):
    """<folder>/<name>.py (scripts under launch/ or bench/, not a package) as a module."""
    import importlib.util
    import sys

    key = f"{folder}_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).resolve().parent.parent / folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture
def hub_endpoint(tiny_models, tmp_path, monkeypatch):
    """A local hub (launch/hub_server.py on 127.0.0.1, in a thread) serving org/tiny-student and
    org/tiny-teacher, an empty HF_HOME, and HF_HUB_OFFLINE lifted for this test only: the real
    huggingface_hub client downloads from it. Yields the server (its `file_downloads()` counts
    what was sent)."""
    import huggingface_hub.constants as hf

    server = launch_module("hub_server").HubServer({f"org/tiny-{r}": tiny_models[r] for r in ("student", "teacher")}).start()
    home = tmp_path / "hf_fresh"
    for key, value in {"HF_HOME": str(home), "HF_ENDPOINT": server.url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # The client read these when it was imported, under the session's HF_HUB_OFFLINE=1 (a user's
    # process reads them from the environment at its start, as launch/rehearse.sh's does).
    template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
    for name, value in {"HF_HUB_OFFLINE": False, "ENDPOINT": server.url, "HF_HUB_CACHE": str(home / "hub"),
                        "HUGGINGFACE_CO_URL_TEMPLATE": template}.items():
        monkeypatch.setattr(hf, name, value)
    import huggingface_hub.file_download

    if hasattr(huggingface_hub.file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):  # huggingface_hub < 1.0 copied it
        monkeypatch.setattr(huggingface_hub.file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    try:
        yield server
    finally:
        server.stop()
