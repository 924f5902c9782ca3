"""JSONL datasets in the AgentGym conversation schema: read, validate, write, convert to Turns.

A row is one episode: `item_id`, `conversations` (required) and `task`, `var`, `score`,
`success`, `rounds` (optional). Each conversation message is
`{"from": "human"|"gpt", "value": str, "loss": bool|null (optional), "owner": OWNER (optional)}`.
Bad rows raise `DataError` naming the file, line and key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rose_ray.types import OWNERS, GameId, Trajectory, Turn

ROLES = {"human": "user", "gpt": "assistant"}
_OPTIONAL = {"task": str, "var": int, "score": (int, float), "success": bool, "rounds": int}


class DataError(ValueError):
    """A dataset row that does not follow the schema; the message names file:line and key."""


def _fail(where: str, key: str, msg: str) -> DataError:
    return DataError(f"{where}: {key}: {msg}")


def validate_row(row: Any, where: str = "row") -> dict[str, Any]:
    """Check one row against the schema; returns it unchanged or raises DataError."""
    if not isinstance(row, dict):
        raise _fail(where, "row", f"expected a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("item_id"), str) or not row["item_id"]:
        raise _fail(where, "item_id", f"expected a non-empty string, got {row.get('item_id')!r}")
    for key, kind in _OPTIONAL.items():
        value = row.get(key)
        # bool is an int subclass: reject True as a `var` or `rounds`
        bad_bool = isinstance(value, bool) and kind is not bool
        if value is not None and (bad_bool or not isinstance(value, kind)):
            raise _fail(where, key, f"expected {getattr(kind, '__name__', 'a number')}, got {value!r}")
    conv = row.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise _fail(where, "conversations", "expected a non-empty list of messages")
    for i, msg in enumerate(conv):
        key = f"conversations[{i}]"
        if not isinstance(msg, dict):
            raise _fail(where, key, f"expected an object, got {type(msg).__name__}")
        if msg.get("from") not in ROLES:
            raise _fail(where, f"{key}.from", f"expected 'human' or 'gpt', got {msg.get('from')!r}")
        if not isinstance(msg.get("value"), str):
            raise _fail(where, f"{key}.value", f"expected a string, got {msg.get('value')!r}")
        if msg.get("loss") is not None and not isinstance(msg["loss"], bool):
            raise _fail(where, f"{key}.loss", f"expected true, false or null, got {msg['loss']!r}")
        if msg.get("owner") is not None and msg["owner"] not in OWNERS:
            raise _fail(where, f"{key}.owner", f"expected one of {OWNERS}, got {msg['owner']!r}")
    return row


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL file, validated; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            rows.append(validate_row(row, where))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Validate and write rows atomically (a temp file renamed into place); returns the count."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for n, row in enumerate(rows, start=1):
                validate_row(row, f"row {n}")
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def row_to_turns(row: dict[str, Any]) -> list[Turn]:
    """Turns of a row (text only; batching renders them through the chat template).

    Owners, unless a message names one: the first human message is the "prompt", later ones
    "env"; gpt messages are "teacher" (datasets hold teacher or gold play), or "prompt"
    (context, never trained) when `loss` is false, e.g. the acknowledgement of the instruction.
    """
    turns = []
    for i, msg in enumerate(row["conversations"]):
        role = ROLES[msg["from"]]
        owner = msg.get("owner")
        if owner is None:
            if role == "user":
                owner = "prompt" if i == 0 else "env"
            else:
                owner = "prompt" if msg.get("loss") is False else "teacher"
        if role == "assistant" and msg.get("loss") is False:
            owner = "prompt"  # an explicit "no loss" wins over a named owner: context only
        turns.append(Turn(role=role, text=msg["value"], owner=owner))
    return turns


def row_to_trajectory(row: dict[str, Any]) -> Trajectory:
    """A Trajectory of text turns; game fields default where the row has none."""
    game = GameId(task=row.get("task") or "", variation=int(row.get("var") or 0), item_id=row["item_id"])
    return Trajectory(
        game=game,
        turns=row_to_turns(row),
        score=float(row.get("score") or 0.0),
        success=bool(row.get("success") or False),
        rounds=int(row.get("rounds") or 0),
    )
