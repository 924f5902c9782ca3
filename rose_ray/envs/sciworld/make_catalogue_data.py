"""Regenerate `envs/data/sciworld_catalogue.json` from a live ScienceWorld JVM.

    python -m rose_ray.envs.sciworld.make_catalogue_data

A test checks the shipped file against a live JVM.
"""

from __future__ import annotations

import json
from pathlib import Path

from scienceworld.constants import TASKS

from rose_ray.envs.sciworld.game import SciWorldGame

OUT = Path(__file__).parent.parent / "data" / "sciworld_catalogue.json"


def read_live_catalogue() -> list[dict]:
    """Per task in topic order: id, name, variation count, train/dev/test as [start, end)."""
    rows = []
    with SciWorldGame() as game:
        server = game.server
        for t in TASKS:
            server.load(t["task_name"], 0, "", False)
            row = {
                "task_id": t["task_id"],
                "task": t["task_name"],
                "num_variations": int(server.getTaskMaxVariations(t["task_name"])),
            }
            for split in ("train", "dev", "test"):
                variations = sorted(int(v) for v in getattr(server, f"getVariations{split.title()}")())
                # ScienceWorld's splits are contiguous; store them as half-open ranges.
                assert variations == list(range(variations[0], variations[-1] + 1)), split
                row[split] = [variations[0], variations[-1] + 1]
            rows.append(row)
    return rows


def main() -> None:
    import scienceworld

    rows = read_live_catalogue()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # One task per line, so a diff after a ScienceWorld upgrade reads per task.
    tasks = ",\n  ".join(json.dumps(r) for r in rows)
    version = json.dumps(scienceworld.__version__)
    OUT.write_text(f'{{"scienceworld_version": {version},\n "tasks": [\n  {tasks}\n ]\n}}\n')
    print(f"wrote {OUT} ({sum(r['num_variations'] for r in rows)} games, {len(rows)} tasks)")


if __name__ == "__main__":
    main()
