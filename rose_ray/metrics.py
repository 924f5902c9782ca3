"""Run metrics: TensorBoard scalars and text under `<run_dir>/tb`, the same numbers as JSONL in
`<run_dir>/metrics.jsonl`, and a one-line console progress display."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


class MetricsLogger:
    def __init__(self, run_dir: str | Path, console: bool = True) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.tb = SummaryWriter(str(self.run_dir / "tb"))
        self.jsonl = (self.run_dir / "metrics.jsonl").open("a")
        self.console = console and sys.stdout.isatty()
        self.t0 = time.time()

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Scalars named `group/name` (e.g. `learner/loss`) at a learner step."""
        clean = {k: float(v) for k, v in scalars.items() if v is not None}
        for k, v in clean.items():
            self.tb.add_scalar(k, v, step)
        self.jsonl.write(json.dumps({"step": step, "time": round(time.time() - self.t0, 3), **clean}) + "\n")
        self.jsonl.flush()

    def text(self, step: int, tag: str, text: str) -> None:
        self.tb.add_text(tag, text, step)

    def progress(self, line: str) -> None:
        """Rewrite one console line (a plain line per call when stdout is not a terminal)."""
        if self.console:
            sys.stdout.write("\r\033[K" + line)
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def end_progress(self) -> None:
        if self.console:
            sys.stdout.write("\n")

    def close(self) -> None:
        self.tb.flush()
        self.tb.close()
        self.jsonl.close()


def read_scalars(tb_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in a TensorBoard folder, read back with tensorboard's event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def trajectory_markdown(record: dict[str, Any], max_chars: int = 600) -> str:
    """A trajectory record as readable text for TensorBoard (who wrote each turn)."""
    lines = [f"**{record['item_id']}** ({record['task']}) score {record['score']:.2f}, "
             f"handoff turn {record.get('handoff_turn')}", ""]
    from rose_ray.data import message_text

    for m in record["conversations"][2:]:
        role, text = message_text(m)
        lines.append(f"- *{m.get('owner', role)}*: {text.replace(chr(10), ' ')[:max_chars]}")
    return "\n".join(lines)
