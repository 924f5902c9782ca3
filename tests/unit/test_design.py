"""The walls of the house, as import rules over the package's source (every import, the ones
inside functions too): a change that breaks one fails here, naming the module and the import.

- envs/ (worlds, pools, games) runs on CPU workers: no torch, no inference, no learner.
- learner/ sees tokens only: nothing from inference, rollout, envs, the data modules, the
  token rendering or the recipes; a Batch arrives ready.
- Worlds are reached by name (envs/worlds.py): nothing outside envs/ imports a concrete world
  or names one in its code (a string that is a world's name or item-id prefix).
- train.py and run.py (the online loop and its house) are imported only by the CLI (and, by
  name, the Python API: `rose_ray.train`).
- inference/engine.py, the engine contract, imports no backend (no circle with hf/openai).
- The algorithm recipes and the turn policies import no config (the config imports them).
- placement.py is below check.py and memory.py: it imports neither (no circle through `plan`).
- The layers point down (issue 54's four leaks): types.py, the shared vocabulary, imports nothing
  of the package but errors.py; envs/ imports neither the data modules (rows, collect) nor the
  loop, the rollout, the config or the commands; config.py imports nothing of rollout/;
  inference/ imports neither envs/ nor the command layer (commands.py, cli.py); provisioning
  (provision/: tiny models, gold demonstrations, warm-ups) is above the algorithms (recipes/),
  the rollout and the worlds, which import none of it.
- No circle: the whole package's file-level import graph has none, however far round (a lazy
  import inside a function is how a module reaches a later layer on purpose).
- A backend is a plug-in (inference/registry.py): outside inference/ no code compares backend
  names or reads a backend's own settings; it asks the questions its section answers
  (`BackendSettings`: tensor parallel, GPU share, KV budget, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rose_ray"


CONCRETE_WORLDS = ("rose_ray.envs.sciworld", "rose_ray.envs.discoveryworld")


def imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (`from a.b import c` gives a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py")) if folder else sorted(PACKAGE.rglob("*.py"))


def breaks(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{p.name if PACKAGE not in p.parents else p.relative_to(PACKAGE.parent)} imports {name}" for p in paths for name in sorted(imports(p))
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


def test_envs_import_no_torch_inference_or_learner():
    assert not breaks(modules("envs"), ("torch", "transformers", "deepspeed", "rose_ray.inference",
                                        "rose_ray.learner"))


def test_the_learner_sees_tokens_only():
    assert not breaks(modules("learner"), ("rose_ray.inference", "rose_ray.rollout", "rose_ray.envs",
                                           "rose_ray.rows", "rose_ray.collect", "rose_ray.tokens",
                                           "rose_ray.recipes", "rose_ray.chat"))


def test_nothing_outside_envs_names_a_concrete_world():
    outside = [p for p in modules("") if (PACKAGE / "envs") not in p.parents]
    assert not breaks(outside, CONCRETE_WORLDS)


def world_names(paths: list[Path]) -> list[str]:
    """String constants in code that are a world's name or its item-id prefix (`"sciworld"`,
    `"discoveryworld_"`); prose that mentions one (a docstring, a help text) is not code."""
    from rose_ray.envs.worlds import WORLDS

    named = {w for w in WORLDS} | {f"{w}_" for w in WORLDS}
    return [f"{p.relative_to(PACKAGE.parent) if PACKAGE in p.parents else p.name}:{node.lineno} names {node.value!r}"
            for p in paths for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Constant) and node.value in named]


def test_nothing_outside_envs_names_a_world_in_code():
    outside = [p for p in modules("") if (PACKAGE / "envs") not in p.parents]
    assert not world_names(outside)


def test_the_loop_is_imported_only_by_the_cli():
    """cli.py reaches train.py by name ("rose_ray.train:cli_main"), and so does the Python API
    (rose_ray/__init__.py: `rose_ray.train`, imported when first used); nothing else in the package
    imports the loop or the run's parts, train.py aside (its Run)."""
    others = [p for p in modules("") if p.name not in ("cli.py", "train.py") or p.parent != PACKAGE]
    assert not breaks(others, ("rose_ray.train", "rose_ray.run"))
    assert "rose_ray.train:cli_main" in (PACKAGE / "cli.py").read_text()
    import rose_ray

    assert "train" in rose_ray.API


def test_the_engine_contract_imports_no_backend():
    assert not breaks([PACKAGE / "inference" / "engine.py"], ("rose_ray.inference.hf", "rose_ray.inference.openai",
                                                              "rose_ray.inference.backends", "torch"))


def test_recipes_and_turn_policies_import_no_config():
    recipes = [PACKAGE / "recipes" / f for f in ("__init__.py", "rose.py", "opd.py", "teacher_sft.py")]
    assert not breaks([*recipes, PACKAGE / "rollout" / "handoff.py", PACKAGE / "errors.py"], ("rose_ray.config",))


def test_placement_imports_neither_check_nor_memory():
    """memory.py imports placement.py, and check.py both; `rose-ray plan` lives in check.py."""
    assert not breaks([PACKAGE / "placement.py"], ("rose_ray.check", "rose_ray.memory"))
    assert "rose_ray.check:plan_main" in (PACKAGE / "cli.py").read_text()


COMMAND_LAYER = ("rose_ray.commands", "rose_ray.cli")


def test_the_shared_vocabulary_imports_only_errors():
    package = [name for name in imports(PACKAGE / "types.py") if name.split(".")[0] == "rose_ray"]
    assert package and all(name == "rose_ray.errors" or name.startswith("rose_ray.errors.") for name in package)


@pytest.mark.parametrize(("paths", "forbidden"), [
    pytest.param(lambda: modules("envs"), ("rose_ray.rows", "rose_ray.collect", "rose_ray.evaluate", "rose_ray.config",
                                           "rose_ray.rollout", "rose_ray.recipes", "rose_ray.train", "rose_ray.run",
                                           *COMMAND_LAYER), id="envs below the data modules"),
    pytest.param(lambda: [PACKAGE / "config.py"], ("rose_ray.rollout", *COMMAND_LAYER), id="config below rollout"),
    pytest.param(lambda: modules("inference"), ("rose_ray.envs", *COMMAND_LAYER), id="inference below the commands"),
    pytest.param(lambda: [*modules("recipes"), *modules("rollout"), *modules("envs")], ("rose_ray.provision",),
                 id="the algorithms below provisioning"),
])
def test_the_layers_point_down(paths, forbidden):
    assert not breaks(paths(), forbidden)


def test_the_rules_see_what_they_forbid(tmp_path):
    """The checker itself: a lazy import inside a function counts."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from rose_ray.inference.engine import fit_context\n    import torch\n")
    assert breaks([f], ("rose_ray.inference",)) and breaks([f], ("torch",))
    f.write_text('"""A docstring about sciworld."""\nif world == "discoveryworld":\n    item = "sciworld_" + n\n')
    assert [line.split(" names ")[1] for line in world_names([f])] == ["'discoveryworld'", "'sciworld_'"]


def backend_leaks(paths: list[Path]) -> list[str]:
    """What code outside inference/ may not do with a backend (an AST walk, the lazy code inside
    functions too): compare a backend's name with a string (`name == "vllm"`, `in ("hf", ...)`);
    read an engine's backend section other than its `name` and the questions `BackendSettings`
    declares (`engine.backend.kv_cache_mb`); hand the section to getattr/hasattr/vars/asdict;
    name a backend's settings class (its defaults are its settings too)."""
    from dataclasses import fields

    from rose_ray.inference.registry import BACKENDS, BackendSettings

    names = set(BACKENDS)
    asked = {"name"} | {k for k, v in vars(BackendSettings).items() if isinstance(v, property)}
    classes = {b.settings.__name__ for b in BACKENDS.values()}
    assert asked.isdisjoint(f.name for b in BACKENDS.values() for f in fields(b.settings) if f.name != "name")

    def is_section(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "backend"

    def names_a_backend(node: ast.AST) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(i, ast.Constant) and i.value in names for i in items)

    found = []
    for p in paths:
        where = p.relative_to(PACKAGE.parent) if PACKAGE in p.parents else p.name
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Compare) and any(names_a_backend(n) for n in (node.left, *node.comparators)):
                found.append(f"{where}:{node.lineno} compares a backend's name")
            elif isinstance(node, ast.Attribute) and is_section(node.value) and node.attr not in asked:
                found.append(f"{where}:{node.lineno} reads backend.{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "vars", "asdict") and node.args and is_section(node.args[0])):
                found.append(f"{where}:{node.lineno} {node.func.id}(... .backend ...)")
            elif isinstance(node, ast.Name) and node.id in classes or \
                    isinstance(node, ast.ImportFrom) and classes & {a.name for a in node.names}:
                found.append(f"{where}:{node.lineno} names a backend's settings class")
    return found


def test_outside_inference_a_backend_is_asked_not_read():
    """Adding a backend is one engine module and its settings and registry line in
    inference/registry.py: nothing else knows a backend's name or its settings."""
    outside = [p for p in modules("") if (PACKAGE / "inference") not in p.parents]
    assert not backend_leaks(outside)


def test_the_backend_rule_sees_what_it_forbids(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f(engine):\n"
                 "    from rose_ray.inference.registry import VLLMSettings\n"
                 "    a = engine.backend.kv_cache_mb + VLLMSettings.kv_cache_mb\n"
                 "    b = hasattr(cfg.student_engine.backend, 'cuda_graphs') or engine.backend.name in ('hf', 'x')\n"
                 "    return engine.backend.name, engine.backend.gpu_share, engine.tensor_parallel_size\n")
    assert sorted(line.split(" ", 1)[1] for line in backend_leaks([f])) == [
        "compares a backend's name", "hasattr(... .backend ...)", "names a backend's settings class",
        "names a backend's settings class", "reads backend.kv_cache_mb"]


def file_level_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The package's modules a file imports when it is imported: the statements at file level
    (in a top-level `try`/`if` too, not under `if TYPE_CHECKING:`), not those inside functions,
    which run later. `from a import b` names the module a.b where one exists, else a."""
    root = package.parent
    name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")

    def exists(module: str) -> bool:
        p = root.joinpath(*module.split("."))
        return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()

    def statements(body: list[ast.stmt]):
        for node in body:
            if isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    yield from statements(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                yield from statements(node.body + node.orelse + node.finalbody
                                      + [s for h in node.handlers for s in h.body])
            else:
                yield node

    found: set[str] = set()
    for node in statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package up
                parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{a.name}" if exists(f"{base}.{a.name}") else base for a in node.names)
    return {m for m in found if m.split(".")[0] == package.name and exists(m) and m != name}


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """The circles of the package's file-level import graph (Tarjan's strongly connected parts
    with more than one module)."""
    root = package.parent
    graph = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): file_level_imports(p, package)
             for p in sorted(package.rglob("*.py"))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_the_file_level_import_graph_has_no_circle():
    """The whole package: no module imports, at file level, one that imports it back (however
    far round). A lazy import inside a function is how a later layer is reached on purpose."""
    assert import_cycles() == []


def test_the_circle_check_sees_a_circle(tmp_path):
    """The checker itself, on a package of four modules: a → b → c → a is a circle (found through
    a relative import and a `try`), d's import under TYPE_CHECKING and a lazy one are not."""
    pkg = tmp_path / "rose_ray"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rose_ray.sub import b\n")
    (pkg / "sub" / "b.py").write_text("try:\n    from . import c\nexcept ImportError:\n    c = None\n")
    (pkg / "sub" / "c.py").write_text("import rose_ray.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rose_ray import a\n"
                              "def f():\n    import rose_ray.a\n")
    (pkg / "e.py").write_text("import rose_ray.d\n")
    assert import_cycles(pkg) == [["rose_ray.a", "rose_ray.sub.b", "rose_ray.sub.c"]]
    (pkg / "sub" / "c.py").write_text("def f():\n    import rose_ray.a\n")
    assert import_cycles(pkg) == []
