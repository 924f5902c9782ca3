"""The slow half of tests/unit/test_packaging.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.test_packaging import (
    PACKAGE,
    DataRef,
    _module_constants,
    _RefFinder,
)

ROOT = Path(__file__).resolve().parents[2]


BUILD_FILES = ("pyproject.toml", "README.md", "LICENSE")  # what setuptools reads besides the package


NOT_SHIPPED: frozenset[str] = frozenset()  # package files deliberately left out of wheels


def package_files() -> list[str]:
    """Files under rose_ray/ that a clean clone has: tracked or about to be (not ignored).

    Outside a git checkout, every file on disk except bytecode caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", PACKAGE],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
        files = [f for f in out.split("\0") if f and (ROOT / f).is_file()]  # drop deleted files
    except (OSError, subprocess.CalledProcessError):
        files = [
            p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    return sorted(files)


def _run(args: list[str], cwd: Path) -> None:
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "PIP_NO_INPUT": "1"})
    assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"


def _pip_wheel(source: Path, out: Path) -> Path:
    # --no-build-isolation: build offline with the installed setuptools
    _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
          "--no-cache-dir", "-q", "-w", str(out)], cwd=out)
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """{"tree": wheel, "sdist": wheel}: one built straight from a copy of the package files
    (`pip install .`) and one built from the sdist of that copy (`pip install rose_ray`)."""
    base = tmp_path_factory.mktemp("packaging")
    src = base / "src"
    for rel in [*BUILD_FILES, *package_files()]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    (base / "tree").mkdir()
    (base / "sdist").mkdir()
    built = {"tree": _pip_wheel(src, base / "tree")}
    _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
          "b.build_sdist(sys.argv[1])", str(base / "sdist")], cwd=src)
    (sdist,) = (base / "sdist").glob("*.tar.gz")
    built["sdist"] = _pip_wheel(sdist, base / "sdist")
    return built


def _wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if not n.endswith("/")}


@pytest.mark.slow
@pytest.mark.parametrize("route", ["tree", "sdist"])
def test_wheel_ships_every_package_file(wheels, route):
    files = package_files()
    assert any(not f.endswith(".py") for f in files), "no data files found under rose_ray/"
    missing = sorted(set(files) - NOT_SHIPPED - _wheel_names(wheels[route]))
    assert not missing, (
        f"the wheel built from the {route} lacks {missing}: add a glob for them to "
        "[tool.setuptools.package-data] in pyproject.toml"
    )


def data_references() -> list[DataRef]:
    """Every path inside the package that the package's code builds."""
    refs: list[DataRef] = []
    for rel in package_files():
        if rel.endswith(".py"):
            module = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"), filename=rel)
            finder = _RefFinder(module, rel, _module_constants(tree))
            finder.visit(tree)
            refs.extend(r for r in finder.refs if not r.path.endswith(".py"))
    return refs


@pytest.mark.slow
@pytest.mark.parametrize("route", ["tree", "sdist"])
def test_wheel_ships_every_file_the_code_reads(wheels, route):
    refs = data_references()
    assert refs, "found no reads of package data in rose_ray/ (is the finder broken?)"
    names = _wheel_names(wheels[route])
    # a complete path is a file or a folder that holds files; of a partial one, the folder
    missing = [
        f"{r.path} ({r.where})" for r in refs
        if not (r.complete and r.path in names) and not any(n.startswith(r.path + "/") for n in names)
    ]
    assert not missing, f"the wheel built from the {route} lacks files the code reads: {missing}"


@pytest.mark.slow
def test_wheel_installs_the_console_script(wheels):
    # `rose-ray` is what users run after a non-editable install
    with zipfile.ZipFile(wheels["tree"]) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(name).decode()
    assert "rose-ray = rose_ray.cli:main" in entry_points


@pytest.mark.slow
@pytest.mark.parametrize("route", ["tree", "sdist"])
def test_wheel_carries_the_license_and_the_projects_metadata(wheels, route):
    """What an installer and an index read: the license (Apache-2.0, its text beside the metadata),
    the version `rose-ray --version` prints, authors, classifiers, keywords, the extras."""
    import email

    import rose_ray

    with zipfile.ZipFile(wheels[route]) as z:
        names = z.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(z.read(metadata))
        (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        license_text = z.read(license_file).decode()
    assert license_text == (ROOT / "LICENSE").read_text()
    assert license_text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert (meta["License-Expression"], meta.get_all("License-File")) == ("Apache-2.0", ["LICENSE"])
    assert not [c for c in meta.get_all("Classifier") if c.startswith("License ::")]  # PEP 639: the expression says it
    assert (meta["Name"], meta["Version"], meta["Requires-Python"]) == ("rose_ray", rose_ray.__version__, ">=3.10")
    assert meta["Author"] == "the rose_ray developers"
    assert {"Intended Audience :: Science/Research", "Topic :: Scientific/Engineering :: Artificial Intelligence",
            "Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.11"} <= set(meta.get_all("Classifier"))
    assert {"scienceworld", "distillation", "ray"} <= set(meta["Keywords"].split(","))
    assert {"wandb", "vllm", "dev"} <= set(meta.get_all("Provides-Extra"))
