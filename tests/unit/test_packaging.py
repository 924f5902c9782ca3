"""The installed package is complete: wheels built from the tree and from the sdist ship every
file under rose_ray/ and every file the code reads by a path inside the package.

An editable checkout hides a missing package-data glob (the files sit next to the code), so
these tests build real wheels from a copy of the package's files, as `pip install .` and
`pip install rose_ray` would, and compare their file lists with the tree and the code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

PACKAGE = "rose_ray"


@dataclass(frozen=True)
class DataRef:
    """A path inside the package that the code builds (a file or a folder): `parts` from the
    repository root; `complete` is False when the tail is computed (only the folder is known)."""

    where: str
    parts: tuple[str, ...]
    complete: bool

    @property
    def path(self) -> str:
        return "/".join(self.parts)


def _str(node: ast.AST, consts: dict[str, str] | None = None) -> str | None:
    """A string literal, or a module-level string constant by name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return (consts or {}).get(node.id) if isinstance(node, ast.Name) else None


def _module_constants(tree: ast.Module) -> dict[str, str]:
    """`NAME = "text"` at module level (file names are often kept so)."""
    return {
        target.id: node.value.value
        for node in tree.body if isinstance(node, ast.Assign) and _str(node.value) is not None
        for target in node.targets if isinstance(target, ast.Name)
    }


def _is_name(node: ast.AST, *names: str) -> bool:
    return isinstance(node, ast.Name) and node.id in names


class _RefFinder(ast.NodeVisitor):
    """Finds `resources.files(pkg).joinpath(...)` / `files(pkg) / "..."` and
    `Path(__file__).parent / "..."` (also `os.path.join(os.path.dirname(__file__), ...)`)."""

    def __init__(self, module: str, rel: str, consts: dict[str, str] | None = None) -> None:
        self.module, self.rel, self.consts = module, rel, consts or {}
        self.package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        self.refs: list[DataRef] = []

    def anchor(self, node: ast.AST) -> list[str] | None:
        """Path parts (from the repository root) of a package folder or module file expression."""
        if isinstance(node, ast.Call) and node.args and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "files")
            or _is_name(node.func, "files")
        ):
            arg = node.args[0]
            pkg = _str(arg) or (self.package if _is_name(arg, "__package__", "__name__") else None)
            if pkg is not None and pkg.split(".")[0] == PACKAGE:
                return pkg.split(".")
            return None
        if isinstance(node, ast.Call) and len(node.args) == 1 and _is_name(node.args[0], "__file__") \
                and (_is_name(node.func, "Path") or getattr(node.func, "attr", "") == "Path"):
            return self.rel.split("/")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "resolve":
            return self.anchor(node.func.value)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = self.anchor(node.value)
            return inner[:-1] if inner else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "dirname" and len(node.args) == 1:
            inner = [*self.rel.split("/")] if _is_name(node.args[0], "__file__") else self.anchor(node.args[0])
            return inner[:-1] if inner else None
        return None

    def resolve(self, node: ast.AST) -> tuple[list[str], list[ast.AST]] | None:
        """(anchor parts, path arguments) of `anchor.joinpath(*a)`, `anchor / a / b`, or
        `os.path.join(anchor, *a)`, however nested."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left = self.resolve(node.left)
            return (left[0], [*left[1], node.right]) if left else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "joinpath":
                inner = self.resolve(node.func.value)
                return (inner[0], [*inner[1], *node.args]) if inner else None
            if node.func.attr == "join" and node.args:
                inner = self.resolve(node.args[0])
                return (inner[0], [*inner[1], *node.args[1:]]) if inner else None
        anchor = self.anchor(node)
        return (anchor, []) if anchor is not None else None

    def generic_visit(self, node: ast.AST) -> None:
        found = self.resolve(node) if isinstance(node, (ast.BinOp, ast.Call)) else None
        if found and found[1]:  # an outermost path expression with at least one argument
            parts, complete = list(found[0]), True
            for arg in found[1]:
                text = _str(arg, self.consts)
                if text is None:
                    complete = False
                    break
                parts.extend(p for p in text.split("/") if p)
            where = f"{self.rel}:{getattr(node, 'lineno', '?')}"
            self.refs.append(DataRef(where, tuple(parts), complete))
            return  # its sub-expressions are parts of this one
        super().generic_visit(node)


def test_reference_finder_sees_the_forms_the_code_uses():
    # the finder itself, on the forms it claims to read (a silent miss would pass everything)
    src = (
        "from importlib import resources\nimport os\nfrom pathlib import Path\n"
        "a = resources.files('rose_ray.envs').joinpath('data/x.json').read_text()\n"
        "b = resources.files('rose_ray.envs').joinpath('data', name)\n"
        "c = Path(__file__).parent / 'data' / 'y.txt'\n"
        "d = resources.files(__package__) / 'z.yaml'\n"
        "e = os.path.join(os.path.dirname(__file__), 'w.jinja')\n"
        "f = Path(__file__).resolve().parent.parent / 'configs' / 'v.yaml'\n"
        "g = resources.files('rose_ray.envs').joinpath('data', NAME)\n"
    )
    tree = ast.parse("NAME = 'u.jsonl'\n" + src)
    finder = _RefFinder("rose_ray.envs.mod", "rose_ray/envs/mod.py", _module_constants(tree))
    finder.visit(tree)
    assert [(r.path, r.complete) for r in finder.refs] == [
        ("rose_ray/envs/data/x.json", True),
        ("rose_ray/envs/data", False),
        ("rose_ray/envs/data/y.txt", True),
        ("rose_ray/envs/z.yaml", True),
        ("rose_ray/envs/w.jinja", True),
        ("rose_ray/configs/v.yaml", True),
        ("rose_ray/envs/data/u.jsonl", True),
    ]
