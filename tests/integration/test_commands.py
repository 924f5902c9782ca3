"""The half of tests/unit/test_commands.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_commands_loads_no_torch():
    code = ("import sys, rose_ray.commands, rose_ray.cli; rose_ray.cli.build_parser(); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)
