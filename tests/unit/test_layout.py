"""The tests' layout rule (docs/design.md, "Tests"): tests/unit/<package path>/ holds the tests that
start no process, mirroring rose_ray/; tests/integration/ those that start Ray, engines, servers
or JVMs; tests/e2e/ whole runs named by scenario. A file under tests/unit/ that asks for a
fixture that starts Ray, imports a module whose use is starting processes, or calls what starts a
Ray cluster, a JVM or a server fails here, naming the file, line and what it starts; so does a
folder under tests/unit/ that is no package path of rose_ray/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# tests/conftest.py's fixtures that start a Ray cluster (one node, or several)
PROCESS_FIXTURES = {"ray_cluster", "env_node_cluster"}
# modules whose use is starting processes: commands, process pools, DeepSpeed's launcher
PROCESS_MODULES = {"subprocess", "multiprocessing", "deepspeed.launcher"}
# what starts one when called: a Ray cluster (`ray.init`; a Ray actor needs one), a ScienceWorld or
# DiscoveryWorld game (a JVM or a worker process), a pool of them, tests/served.py's server
# process, a process of a pool or a fork, vLLM's engine (its compiler processes)
PROCESS_CALLS = {"init", "EnvPool", "SciWorldGame", "DiscoveryWorldGame", "ScienceWorldEnv",
                 "start_server", "launch_gateway", "Popen", "ProcessPoolExecutor", "fork", "VLLMEngine"}


def process_starts(path: Path, rel: str) -> list[str]:
    """'file:line: what' for each way `path`'s code starts a process."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [f"{where}: fixture {a.arg}" for a in node.args.args if a.arg in PROCESS_FIXTURES]
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in PROCESS_MODULES
                      or a.name in PROCESS_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and (node.module.split(".")[0] in PROCESS_MODULES or node.module in PROCESS_MODULES):
            found.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in PROCESS_CALLS and (name != "init" or (isinstance(f, ast.Attribute) and ast.unparse(f.value) == "ray")):
                found.append(f"{where}: calls {ast.unparse(f)}")
    return sorted(found, key=lambda fault: int(fault.split(":")[1]))


def layout_faults(root: Path) -> list[str]:
    """Every fault of the rule under `root`/tests/unit: process starts, and folders holding
    Python files that are no package path under `root`/rose_ray/."""
    unit = root / "tests" / "unit"
    faults = []
    for path in sorted(unit.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        folder = path.parent.relative_to(unit)
        if folder.parts and not (root / "rose_ray" / folder / "__init__.py").is_file():
            faults.append(f"{rel}: tests/unit/{folder.as_posix()}/ is no package of rose_ray/")
        faults += process_starts(path, rel)
    return faults


def test_unit_tests_start_no_process_and_mirror_the_package():
    faults = layout_faults(ROOT)
    assert not faults, "tests/unit/ holds tests that start no process, in rose_ray/'s folders " \
        "(tests/integration/ takes the others):\n" + "\n".join(faults)


def test_the_layout_rule_sees_what_it_forbids(tmp_path):
    """A planted tree: each way of starting a process, and a folder that is no package."""
    (tmp_path / "rose_ray" / "learner").mkdir(parents=True)
    (tmp_path / "rose_ray" / "learner" / "__init__.py").write_text("")
    unit = tmp_path / "tests" / "unit"
    (unit / "learner").mkdir(parents=True)
    (unit / "learner" / "test_ok.py").write_text("import ast\n\ndef test_a(tmp_path, tiny_models):\n    ray_init = 1\n")
    (unit / "learner" / "test_bad.py").write_text(
        "import subprocess\nimport ray\nfrom multiprocessing import Process\nfrom tests.served import json_server, start_server\n"
        "from rose_ray.envs.pool import EnvPool\n\n"
        "def test_a(ray_cluster):\n    ray.init(address='local')\n\n"
        "def test_b(tmp_path):\n    pool = EnvPool(num_games=1, world='sciworld')\n    game = SciWorldGame()\n    served = start_server(['rose-ray', 'serve'])\n"
        "    with ProcessPoolExecutor(2) as pool:\n        pass\n")
    (unit / "nowhere").mkdir()
    (unit / "nowhere" / "test_c.py").write_text("def g(env_node_cluster):\n    pass\n")
    faults = layout_faults(tmp_path)
    bad = "tests/unit/learner/test_bad.py"
    assert faults == [
        f"{bad}:1: import subprocess", f"{bad}:3: from multiprocessing import", f"{bad}:7: fixture ray_cluster",
        f"{bad}:8: calls ray.init", f"{bad}:11: calls EnvPool", f"{bad}:12: calls SciWorldGame",
        f"{bad}:13: calls start_server", f"{bad}:14: calls ProcessPoolExecutor",
        "tests/unit/nowhere/test_c.py: tests/unit/nowhere/ is no package of rose_ray/",
        "tests/unit/nowhere/test_c.py:1: fixture env_node_cluster",
    ]
