"""Regenerate ScienceWorld's shipped data from live JVMs (a test checks the catalogue against one):

    python -m rose_ray.envs.sciworld.make_data

`envs/data/sciworld_catalogue.json`: each task's variations and splits, so listing games starts no
JVM; `envs/data/sciworld_corpus.txt`: text to train tiny tokenizers on (`init-tiny` needs no JVM),
the gold paths of each task's first training variations.
"""

from __future__ import annotations

import json
from pathlib import Path

from scienceworld.constants import TASKS

from rose_ray.envs.sciworld.game import SciWorldGame
from rose_ray.envs.sciworld.protocol import ACKNOWLEDGEMENT, INSTRUCTION

DATA = Path(__file__).parent.parent / "data"
VARIATIONS_PER_TASK = 2  # the corpus's games per task
MAX_CHARS = 600_000


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


def corpus_text() -> str:
    """The opening, then each game's first observation and its gold path's replies and observations."""
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue

    catalogue = SciWorldCatalogue("agentgym")
    parts = [INSTRUCTION, ACKNOWLEDGEMENT]
    with SciWorldGame() as game:
        for task in catalogue.tasks:
            for variation in range(task.train[0], task.train[0] + VARIATIONS_PER_TASK):
                first = game.load(catalogue.find(task.task, variation), gold=True)
                parts.append(first.observation)
                for action in game.gold_actions():
                    result = game.step(action)
                    parts.append(f"Thought: I should {action} next.\nAction: {action}")
                    parts.append(result.observation)
                    if result.done:
                        break
    return "\n\n".join(parts)[:MAX_CHARS]


def main() -> None:
    import scienceworld

    rows = read_live_catalogue()
    out = DATA / "sciworld_catalogue.json"
    # One task per line, so a diff after a ScienceWorld upgrade reads per task.
    tasks = ",\n  ".join(json.dumps(r) for r in rows)
    version = json.dumps(scienceworld.__version__)
    out.write_text(f'{{"scienceworld_version": {version},\n "tasks": [\n  {tasks}\n ]\n}}\n')
    print(f"wrote {out} ({sum(r['num_variations'] for r in rows)} games, {len(rows)} tasks)")
    text = corpus_text()  # its games as the catalogue just written lists them
    (DATA / "sciworld_corpus.txt").write_text(text)
    print(f"wrote {DATA / 'sciworld_corpus.txt'} ({len(text):,} characters)")


if __name__ == "__main__":
    main()
