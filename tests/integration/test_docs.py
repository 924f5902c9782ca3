"""The half of tests/unit/test_docs.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_docs import ROOT


def test_the_reference_does_not_depend_on_which_recipe_was_imported_first():
    """The suite imports recipes in any order (a CI run imported teacher_sft before opd): the
    reference lists them the same whatever the order."""
    code = ("import rose_ray.recipes.teacher_sft, rose_ray.recipes.rose\n"
            "from rose_ray.docs_reference import REFERENCE, render\n"
            "assert REFERENCE.read_text() == render(), 'the recipes came out in import order'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
