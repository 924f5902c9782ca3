"""Regenerate `envs/data/sciworld_corpus.txt`: ScienceWorld text to train tiny tokenizers on.

    python -m rose_ray.envs.sciworld.make_corpus

Plays the gold paths of each task's first training variations (shipped: `init-tiny` needs no JVM).
"""

from __future__ import annotations

from pathlib import Path

from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.game import SciWorldGame
from rose_ray.envs.sciworld.protocol import ACKNOWLEDGEMENT, INSTRUCTION

OUT = Path(__file__).parent.parent / "data" / "sciworld_corpus.txt"
VARIATIONS_PER_TASK = 2
MAX_CHARS = 600_000


def main() -> None:
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
    text = "\n\n".join(parts)[:MAX_CHARS]
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text):,} characters)")


if __name__ == "__main__":
    main()
