"""Dataset rows (an episode a row: `item_id`, `conversations`, optional `task`, `var`, `score`,
`success`, `rounds`; messages of the card's schema or AgentGym's, docs/configuration.md): JSONL
files read, validated (DataError naming the file, line and key), written and turned into Turns."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rose_ray.errors import DataError, InputError
from rose_ray.files import json_line, json_records, open_for_append, writing_file
from rose_ray.types import (
    GameId,
    Trajectory,
    Turn,
    message_text,
    validate_conversation,
)

_OPTIONAL = {"task": str, "var": int, "rounds": int}


def validate_row(row: Any, where: str = "row") -> dict[str, Any]:
    """Check one row against either schema; returns it unchanged or raises DataError."""
    if not isinstance(row, dict):
        raise DataError.at(where, "row", f"expected a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("item_id"), str) or not row["item_id"]:
        raise DataError.at(where, "item_id", f"expected a non-empty string, got {row.get('item_id')!r}")
    for key, kind in _OPTIONAL.items():
        value = row.get(key)
        # bool is an int subclass: reject True as a `var` or `rounds`
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise DataError.at(where, key, f"expected {kind.__name__}, got {value!r}")
    score = row.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                              or not 0.0 <= score <= 1.0):
        raise DataError.at(where, "score", f"expected the completion in [0, 1] (a game score of 0..100 "
                    f"divided by 100; failures count 0), got {score!r}")
    success = row.get("success")
    if success is not None and success not in (0, 1):  # 0/1 (the card), false/true (AgentGym)
        raise DataError.at(where, "success", f"expected 0 or 1 (or false/true), got {success!r}")
    validate_conversation(row.get("conversations"), where)
    return row


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL file (gzipped where it ends in `.gz`), validated; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = []
    opened = gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    try:
        with opened as f:  # bytes, decoded line by line: a bad byte is named by its line
            for n, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                where = f"{path}:{n}"
                rows.append(validate_row(json_line(raw, where, DataError), where))
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # a .gz file cut short or not gzip at all
        raise DataError(f"{path}: not a readable gzip file ({e})") from None
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Validate and write rows whole (files.writing_file: a temp file renamed into place); returns the count."""
    n = 0
    with writing_file(path) as f:
        for n, row in enumerate(rows, start=1):
            validate_row(row, f"row {n}")
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return n


def digest(obj: Any) -> str:
    """A short sha256 of `obj` as JSON: what ties a partial file to the games it holds."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


START_OVER = "give another --out, or --overwrite to start over (the file is left as it is)"


class PartialRows:
    """A dataset file written as its rows come, resumed by the same `job` (`done`: its rows by game;
    docs/configuration.md, "Nothing is lost or replaced unasked"): `<out>.partial` holds a
    `{"partial_of": job}` header, then a `{"game": i, "row": row}` line per finished game, flushed;
    `finish` writes `<out>` whole, in game order. Subclasses change the file's format."""

    suffix, header_key = ".partial", "partial_of"
    header_name = "the partial file's header"
    other_job = "the rows of another job (other settings or games: {})"

    def __init__(self, out: str | Path, job: dict[str, Any], overwrite: bool = False) -> None:
        self.out = Path(out)
        self.path = self.out.with_name(self.out.name + self.suffix)
        self.job = json.loads(json.dumps(job))  # as it reads back from the file
        self.done: dict[Any, dict[str, Any]] = {}
        if self.path.exists():
            try:
                self._read()
            except InputError as e:
                if not overwrite:
                    raise
                print(f"{str(e).split('; give')[0]}; --overwrite: starting over", file=sys.stderr, flush=True)
                self.path.unlink()
                self.done = {}
        self._lock = threading.Lock()
        self._file: Any = None

    def _read(self) -> None:
        """The rows of the partial file into `done` (a line a kill cut short left out). A row line
        that cannot be read is named (file:line) and its game played again; a header that cannot
        be read, or another job's, is refused."""
        def bad(n: int, problem: str) -> None:
            if n == 1:
                raise InputError(f"{problem}: {self.header_name} cannot be read; {START_OVER}")
            print(f"{problem}; passed over (that game is played again)", file=sys.stderr, flush=True)

        for n, _, record in json_records(self.path, bad):
            if n == 1:
                if not isinstance(record.get(self.header_key), dict):
                    bad(1, f"{self.path}:1: no header ({self.header_key})")
                if record[self.header_key] != self.job:
                    other = self.other_job.format(record[self.header_key])
                    raise InputError(f"{self.path}: {other}; {START_OVER}")
                continue
            try:
                key, row = self._parse(record, f"{self.path}:{n}")
                self.done[key] = row
            except KeyError as e:
                bad(n, f"{self.path}:{n}: no {e.args[0]!r}")
            except DataError as e:
                bad(n, str(e))

    def _parse(self, record: dict[str, Any], where: str) -> tuple[Any, dict[str, Any]]:
        """A line's game and row, checked (DataError, KeyError)."""
        game = record["game"]
        if not isinstance(game, int) or isinstance(game, bool):
            raise DataError(f"{where}: game: expected an integer, got {game!r}")
        return game, validate_row(record["row"], where)

    def _line(self, game: Any, row: dict[str, Any]) -> dict[str, Any]:
        return {"game": game, "row": row}

    def __enter__(self) -> PartialRows:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def add(self, game: Any, row: dict[str, Any]) -> None:
        """Game `game`'s row, checked and on disk before this returns."""
        record = self._line(game, row)
        self._parse(record, f"row of game {game}")
        with self._lock:  # gold's games finish on several threads
            if self._file is None:  # opened at the first row: a job that fails before one writes nothing
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open_for_append(self.path)
                if self.path.stat().st_size == 0:  # new, or only a cut header was there
                    self._file.write(json.dumps({self.header_key: self.job}, ensure_ascii=False) + "\n")
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._file.flush()
        self.done[game] = row

    def finish(self) -> int:
        """Write `out` from every row (game order) and remove the partial file; the row count."""
        n = write_jsonl(self.out, [self.done[i] for i in sorted(self.done)])
        self.path.unlink(missing_ok=True)
        return n


def row_to_turns(row: dict[str, Any]) -> list[Turn]:
    """Turns of a row (text only). Owners, unless a message names one: the instruction and its
    acknowledgement are the "prompt", later user messages "env", other assistant messages
    "teacher" (teacher or gold play); `loss: false` makes an assistant message "prompt"."""
    turns = []
    for i, msg in enumerate(row["conversations"]):
        role, text = message_text(msg)
        owner = msg.get("owner")
        if owner is None:
            if role == "user":
                owner = "prompt" if i == 0 else "env"
            elif i == 1 and msg.get("loss") is not True:
                owner = "prompt"  # the protocol's acknowledgement of the instruction
            else:
                owner = "teacher"
        if role == "assistant" and msg.get("loss") is False:
            owner = "prompt"  # an explicit "no loss" wins over a named owner: context only
        turns.append(Turn(role=role, text=text, owner=owner, truncated=bool(msg.get("truncated"))))
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

