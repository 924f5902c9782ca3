"""docs/reference.md, generated from the typed config sections (config.py's `TrainConfig` and
every section it holds: each key's type, default and the comment beside it), so that it cannot
drift from them; tests/unit/test_docs.py compares. Imports no torch.

    python -m rose_ray.docs_reference            # write docs/reference.md (in a checkout)
    python -m rose_ray.docs_reference --check    # exit 1 if docs/reference.md is not what it would write
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import os
import re
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

import yaml

from rose_ray.tagged import Tagged

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
# Defaults read from the environment when a config is made (`tiny_dir`): shown as they are without it.
ENV_DEFAULTS = ("ROSE_RAY_CACHE", "ROSE_RAY_RUNS")


# --------------------------------------------------------------------------- reading the source
def class_doc(cls: type) -> str:
    """The class's own docstring ('' when it has none: a dataclass's generated signature is not a doc)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{cls.__name__}(") else inspect.cleandoc(doc)


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the source of the class (or of the base class that declares it):
    the comment lines right above it and the comment on its own line(s), joined."""
    out: dict[str, str] = {}
    for klass in [k for k in reversed(cls.__mro__) if dataclasses.is_dataclass(k)]:
        source = textwrap.dedent(inspect.getsource(klass))
        alone: dict[int, str] = {}  # line number (1-based) -> text of a comment on a line of its own
        inline: dict[int, str] = {}  # ... of a comment after code
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                own_line = tok.line.lstrip().startswith("#")
                (alone if own_line else inline)[tok.start[0]] = tok.string.lstrip("#").strip()
        for stmt in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            n, above = stmt.lineno - 1, []
            while n in alone:
                above.insert(0, alone[n])
                n -= 1
            lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
            after = [inline[n] for n in lines if n in inline]
            out[stmt.target.id] = " ".join(part for part in [*above, *after] if part)
    return out


def docstring_table(doc: str) -> dict[str, str]:
    """The `name   what it does` lines of a module docstring (recipes, turn policies), with their
    continuation lines, as {name: text}; a last column naming a .py file is dropped."""
    rows = re.findall(r"^ {4}(\w+) {2,}(\S.*)((?:\n {8,}\S.*)*)", doc, flags=re.M)
    joined = {name: " ".join(p.strip() for p in (first + more).split("\n")) for name, first, more in rows}
    return {name: re.sub(r"\s{2,}\S+\.py$", "", text).strip() for name, text in joined.items()}


# --------------------------------------------------------------------------- types and values
def show(value: Any) -> str:
    """A default as it is written in YAML or on the command line."""
    if value is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return f"`{text.removesuffix('...').strip()}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def prose(text: str) -> str:
    """A docstring or comment as paragraphs of the page."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n")) + "\n"


# --------------------------------------------------------------------------- rendering
def _rows(cls: type, prefix: str, defaults: list[Any]) -> tuple[list[str], list[tuple[str, type, list[Any], str]]]:
    """The table rows of one section (its plain keys) and the sections it holds, in field order.
    `defaults`: the section's value in each config it is shown for (engines: the student's and
    the teacher's), to show a key's default per config where they differ."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    rows, sections = [], []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        values = [default if d is None else getattr(d, f.name) for d in defaults]
        inner = f.metadata.get("tagged") or (hint if dataclasses.is_dataclass(hint) else None)
        if inner is not None:
            sections.append((f"{prefix}{f.name}", inner, values, comments.get(f.name, "")))
            continue
        shown = [show(v) for v in values]
        default = shown[0] if len(set(shown)) == 1 else " / ".join(shown)
        kind = "any" if f.type == "Any" else f.type  # as written (the modules' annotations are strings)
        why = cell(comments.get(f.name, ""))
        rows.append(f"| `{prefix}{f.name}` | {cell(kind)} | {cell(default)} | {why} |")
    return rows, sections


HEADER = "| key | type | default | what it is |\n| --- | --- | --- | --- |"


def _section(title_keys: list[str], cls: type, defaults: list[Any], comment: str, level: int, out: list[str]) -> None:
    out.append(f"{'#' * level} {', '.join(f'`{k}`' for k in title_keys)}\n")
    if issubclass(cls, Tagged):
        return _tagged(title_keys, cls, comment, level, out)
    out.extend(prose(text) for text in (class_doc(cls), comment) if text)
    prefix = title_keys[0] + "."
    rows, sections = _rows(cls, prefix, defaults)
    if len(title_keys) > 1:
        named = " and ".join(f"`{k}`" for k in title_keys)
        differ = any(" / " in r.split(" | ")[2] for r in rows)
        out.append(f"The same keys under {named}; the rows name the first"
                   + (", and a default shown as `a` / `b` is each one's in that order.\n" if differ else ".\n"))
    if rows:
        out.append(HEADER + "\n" + "\n".join(rows) + "\n")
    for key, inner, values, why in sections:
        keys = [key] + [f"{k}.{key.rsplit('.', 1)[1]}" for k in title_keys[1:]]
        _section(keys, inner, values, why, level + 1, out)


def _tagged(title_keys: list[str], family: type[Tagged], comment: str, level: int, out: list[str]) -> None:
    """A section chosen by its tag (tagged.py), under its heading: the rule, then one heading per
    kind with its line of the family's module docstring table (else its class doc) and its keys."""
    key, tag, kinds = title_keys[0], family.TAG, family.kinds()
    if comment:
        out.append(prose(comment))
    bare = f"{key}={next(iter(kinds))}"
    out.append(f"One section chosen by `{tag}` (a bare name is that kind with its defaults: `{bare}`); a key the "
               "chosen kind lacks is refused by name. A later layer naming another kind starts the section afresh"
               + (f"; the same keys under {' and '.join(f'`{k}`' for k in title_keys)}" if len(title_keys) > 1 else "")
               + ".\n")
    said = docstring_table(sys.modules[family.__module__].__doc__ or "")
    for name, kind in kinds.items():
        out.append(f"{'#' * (level + 1)} `{key}.{tag}: {name}`\n")
        out.extend(prose(text) for text in [said.get(name) or class_doc(kind)] if text)
        rows, sections = _rows(kind, f"{key}.", [None])
        rows = [r for r in rows if not r.startswith(f"| `{key}.{tag}`")]
        out.append(HEADER + "\n" + "\n".join(rows) + "\n" if rows else "No other keys.\n")
        for inner_key, inner, values, why in sections:
            _section([inner_key], inner, values, why, level + 2, out)


def render() -> str:
    """docs/reference.md's text."""
    from rose_ray.config import TrainConfig

    saved = {n: os.environ.pop(n) for n in ENV_DEFAULTS if n in os.environ}
    try:
        rows, sections = _rows(TrainConfig, "", [None])
    finally:
        os.environ.update(saved)
    grouped: dict[type, list[tuple[str, Any, str]]] = {}  # one heading per kind (the two engines share one)
    for key, kind, values, comment in sections:
        grouped.setdefault(kind, []).append((key, values[0], comment))
    # a heading's anchor as GitHub makes it: its keys, lower case, punctuation dropped
    anchors = [re.sub(r"[^\w\- ]", "", ", ".join(f"`{k}`" for k, _, _ in g).lower()).replace(" ", "-")
               for g in grouped.values()]
    out = [
        "# Configuration reference\n",
        "[← README](../README.md) · [all pages](../README.md#documentation)\n",
        "Every key of a training config (`rose-ray train`, and the config that `check`, `plan` and `warmup` "
        "read), with its type, its default and what it is. Set keys in a YAML file (`--config FILE.yaml`; a "
        "file's `base:` is loaded first) or on the command line (`rose-ray train steps=40 "
        "algorithm.handoff.k=3`), each layer over the one before; an unknown key, a wrong type or an "
        "impossible value stops the command at start naming the key (exit 2). How to use them: "
        "[configuration.md](configuration.md).\n",
        "This page is generated from the typed config sections (`rose_ray/config.py` and the sections it "
        "holds) by `python -m rose_ray.docs_reference`; `tests/unit/test_docs.py` fails when it is out of "
        "date. A default like `${steps}` is another key's value; `${oc.env:VAR,default}` is an environment "
        "variable's.\n",
        "Sections: [top level](#top-level), "
        + ", ".join(f"[`{g[0][0]}`](#{a})" for g, a in zip(grouped.values(), anchors)) + ".\n",
        "## Top level\n",
    ]
    out.extend(prose(text) for text in [class_doc(TrainConfig)] if text)
    out.append(HEADER + "\n" + "\n".join(rows) + "\n")
    for kind, group in grouped.items():
        comment = " ".join(dict.fromkeys(c for _, _, c in group if c))
        _section([k for k, _, _ in group], kind, [v for _, v, _ in group], comment, 2, out)
    return "\n".join(out).rstrip() + "\n"


def config_keys(cls: type | None = None, prefix: str = "") -> set[str]:
    """Every key a training config (or section `cls` under `prefix`) can set, dotted (`learner.lr`):
    every kind's keys under a section chosen by its tag (each recipe's under `algorithm`, each
    backend's under an engine's `backend`), and `KEY.*` under a free-form mapping (`env.resources.*`)."""
    from rose_ray.config import TrainConfig

    hints, keys = typing.get_type_hints(cls or TrainConfig), set()
    for f in dataclasses.fields(cls or TrainConfig):
        key, hint = prefix + f.name, hints[f.name]
        keys |= {key, *([f"{key}.*"] if typing.get_origin(hint) is dict else [])}
        inner = f.metadata["tagged"].kinds().values() if "tagged" in f.metadata else [hint]
        for kind in filter(dataclasses.is_dataclass, inner):
            keys |= config_keys(kind, f"{key}.")
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rose_ray.docs_reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/reference.md; exit 1 if it differs")
    parser.add_argument("--out", type=Path, default=REFERENCE, help=f"where to write (default {REFERENCE})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'out of date: run python -m rose_ray.docs_reference'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
