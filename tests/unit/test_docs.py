"""The manual keeps its word: every command line in README.md and docs/*.md parses, every
relative link (and #anchor) resolves, and docs/reference.md is what the typed configs generate.

Command lines are parsed, never run: `rose-ray ...` and `python -m rose_ray.cli ...` by the real
parser (`rose_ray.cli.build_parser()`; a subcommand and its flags must exist, and KEY=VALUE
overrides must name a key of the training config or of the command's own settings); `python
bench/X.py` and `bash launch/X.sh` by the script's own flags; any repository path a command
names (configs/, launch/, docker/, bench/, ...) must exist. Fenced blocks are parsed whole;
inline `rose-ray ...` spans (synopses with [optional] parts) have their subcommand and flags checked.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_DIRS = ("configs/", "launch/", "docker/", "bench/", "rose_ray/", "tests/", "docs/", ".ci/")
NOT_IN_REPO = ("bench/results", "bench/wheels")  # outputs a command writes
TRAIN_CONFIG_COMMANDS = ("train", "check", "plan", "warmup", "migrate")  # their KEY=VALUE are the training config's


# --------------------------------------------------------------------------- reading pages
def strip_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block."""
    return re.findall(r"^```([^\n`]*)\n(.*?)^```", text, flags=re.S | re.M)


def logical_lines(body: str) -> list[str]:
    """A block's lines with `\\` continuations joined."""
    return body.replace("\\\n", " ").splitlines()


def inline_spans(text: str) -> list[str]:
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", strip_fences(text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in strip_fences(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """Relative links and images of a page whose file or #anchor does not exist."""
    text = path.read_text() if text is None else text
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", strip_fences(text)):
        if re.match(r"^[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.name}: {target}: no heading #{anchor} in {dest.name}")
    return bad


# --------------------------------------------------------------------------- command lines
@cache
def parser():
    from rose_ray.cli import build_parser

    return build_parser()


def subparsers() -> dict:
    import argparse

    action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@cache
def config_keys() -> frozenset[str]:
    from rose_ray.docs_reference import config_keys as keys

    return frozenset(keys())


def config_key_ok(key: str) -> bool:
    """A training config key, a section, or a key under a free-form mapping (`env.resources.X`)."""
    keys = config_keys()
    if key in keys or any(k.startswith(key + ".") for k in keys):
        return True
    parts = key.split(".")
    return any(".".join(parts[:i]) + ".*" in keys for i in range(1, len(parts)))


@dataclass
class Problem:
    where: str
    line: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: `{self.line}`: {self.why}"


def simple_commands(line: str) -> list[list[str]]:
    """A shell line as its simple commands' words (`a && b | c &` is three), with `$(...)`
    taken as one word and leading VAR=value assignments dropped; [] for what is not shell."""
    line = re.sub(r"\$\([^()]*\)", "SUBST", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: prose, not a command
        return []
    out: list[list[str]] = [[]]
    for w in words:
        if w and set(w) <= set("&|;()<>"):
            out.append([])
        else:
            out[-1].append(w)
    commands = []
    for words in out:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def check_rose_ray(argv: list[str], whole: bool) -> str | None:
    """Why `rose-ray argv` does not parse (None: it does). `whole`: parse it as argparse would;
    else (a synopsis) only its subcommand and --flags are checked."""
    subs = subparsers()
    if not argv or argv[0] in ("-h", "--help", "--version"):
        return None
    name = argv[0]
    if name not in subs:
        return f"no subcommand {name!r}"
    sub = subs[name]
    options = set(sub._option_string_actions)
    for word in argv[1:]:
        for flag in re.findall(r"(?:^|[\[|])(--?[a-zA-Z][\w-]*)", word):
            if flag.split("=")[0] not in options:
                return f"`rose-ray {name}` has no flag {flag}"
    if not whole:
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser().parse_known_args(argv)
    except SystemExit as e:
        return None if e.code == 0 else err.getvalue().strip().splitlines()[-1]
    overrides = [*(getattr(args, "overrides", None) or []), *extra]
    if extra and getattr(args, "overrides", None) is None:
        return f"unrecognized arguments: {' '.join(extra)}"
    for item in overrides:
        if "=" not in item or item.startswith("-"):
            return f"{item!r} is not KEY=VALUE"
        key = item.split("=", 1)[0]
        if name in TRAIN_CONFIG_COMMANDS:
            if not config_key_ok(key):
                return f"{key!r} is not a key of the training config (docs/reference.md)"
        elif key not in {a.dest for a in sub._actions}:
            return f"{key!r} is not a setting of `rose-ray {name}`"
    return None


@cache
def script_flags(path: Path) -> frozenset[str]:
    """The flags a bench script's argparse takes, or the words a shell script matches on."""
    text = path.read_text()
    if path.suffix == ".py":
        flags = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        return frozenset(flags)
    return frozenset(re.findall(r"--[a-zA-Z][\w-]*", text))


def repo_paths(words: list[str]) -> list[str]:
    out = []
    for w in words:
        w = w.split("=", 1)[-1] if w.startswith("-") else w
        if w.startswith(REPO_DIRS) and not w.startswith(NOT_IN_REPO) and not any(c in w for c in "*<>{}$"):
            out.append(w.rstrip(".,:;"))
    return out


def check_command(words: list[str], whole: bool) -> str | None:
    """Why a simple command named in the docs does not parse, or None."""
    missing = [p for p in repo_paths(words) if not (ROOT / p).exists()]
    if missing:
        return f"no such file in the repository: {missing[0]}"
    prog, args = words[0], words[1:]
    if prog == "rose-ray":
        if args and args[0].endswith(":"):  # an output line (`rose-ray plan: error: ...`)
            return None
        return check_rose_ray(args, whole)
    if prog in ("python", "python3") and args[:1] == ["-m"] and len(args) > 1:
        module, rest = args[1], args[2:]
        if module in ("rose_ray", "rose_ray.cli"):
            return check_rose_ray(rest, whole)
        import importlib.util

        if module.startswith("rose_ray") and importlib.util.find_spec(module) is None:
            return f"no module {module}"
        return None
    script = None
    if prog in ("python", "python3", "bash", "sh") and args and args[0].startswith(("bench/", "launch/")):
        script, args = args[0], args[1:]
    elif prog.startswith(("launch/", "bench/")):
        script = prog
    if script is None:
        return None
    flags = script_flags(ROOT / script)
    for word in args:
        for flag in re.findall(r"(?:^|[\[|])(--[a-zA-Z][\w-]*)", word):
            if flag.split("=")[0] not in flags:
                return f"{script} takes no {flag}"
    return None


def command_problems(path: Path, text: str | None = None) -> list[Problem]:
    text = path.read_text() if text is None else text
    problems = []
    for lang, body in fenced_blocks(text):
        if lang.strip() not in ("", "bash", "sh", "shell", "console"):
            continue
        for line in logical_lines(body):
            for words in simple_commands(line.strip().removeprefix("$ ")):
                why = check_command(words, whole=True)
                if why:
                    problems.append(Problem(path.name, line.strip(), why))
    for span in inline_spans(text):
        if re.match(r"^(rose-ray |python3? (-m rose_ray|bench/)|bash (launch|bench)/|launch/\S+\.sh)", span):
            for words in simple_commands(span):
                why = check_command(words, whole=False)
                if why:
                    problems.append(Problem(path.name, span, why))
    return problems


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_parses(page):
    assert [str(p) for p in command_problems(page)] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / t.split("#")[0]).resolve() for t in re.findall(r"\]\((docs/[^)#\s]+)", readme)}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_configuration_reference_is_what_the_configs_generate():
    from rose_ray.docs_reference import REFERENCE, render

    assert REFERENCE.read_text() == render(), "docs/reference.md is out of date: run python -m rose_ray.docs_reference"


def test_the_reference_names_every_key_a_config_can_set():
    """Every leaf of a loaded default config (read by OmegaConf, not by the generator's walk) is
    a key of the reference: a row, or a section's heading (`algorithm.name: rose`)."""
    from rose_ray.config import load_config, to_dict

    reference = (ROOT / "docs/reference.md").read_text()

    def leaves(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict) and v:
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    keys = [k.replace("teacher_engine.", "student_engine.") for k in leaves(to_dict(load_config(None, [])))]
    assert len(keys) > 100
    assert [k for k in keys if f"`{k}`" not in reference and f"`{k}: " not in reference] == []


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The checker itself: a flag, a subcommand, a key, a script flag, a path, a link and an
    anchor that do not exist are each reported; their good twins are not."""
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page.write_text("\n".join([
        "# Page", "", "```bash",
        "rose-ray train --config configs/tiny.yaml steps=2 algorithm.handoff.k=3",
        "rose-ray train --no-such-flag",
        "rose-ray trian steps=2",
        "rose-ray train no_such_key=1",
        "rose-ray eval --model M seed=2",
        "rose-ray eval --model M steps=2",
        "python bench/publish.py --quick",
        "python bench/publish.py --no-such-flag",
        "launch/submit.sh configs/no_such.yaml",
        "```", "",
        "Inline: `rose-ray export RUN [--step N] --out DIR` and `rose-ray export RUN [--stpe N]`.",
        "[good](other.md#a-section) [bad file](nothere.md) [bad anchor](other.md#nothing) [self](#page)",
    ]))
    problems = [p.why for p in command_problems(page)]
    assert problems == [
        "`rose-ray train` has no flag --no-such-flag",
        "no subcommand 'trian'",
        "'no_such_key' is not a key of the training config (docs/reference.md)",
        "'steps' is not a setting of `rose-ray eval`",
        "bench/publish.py takes no --no-such-flag",
        "no such file in the repository: configs/no_such.yaml",
        "`rose-ray export` has no flag --stpe",
    ], problems
    assert broken_links(page) == ["page.md: nothere.md: no such file", "page.md: other.md#nothing: no heading #nothing in other.md"]
