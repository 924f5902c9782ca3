"""Writing files where other runs may be writing too, and where a kill may land at any moment.

- `temp_sibling`: a fresh, uniquely named temp folder next to a target (two writers never share one).
- `swap_in`: a finished folder replaces a target by rename-aside: the old one renamed to a
  temp name, the new one renamed in, then the old one deleted; some copy is always on disk.
- `locked`: an exclusive lock of a shared cache entry (`filelock`, over flock on POSIX),
  held while one process builds it; a second waits, then finds it built.
- `open_for_append`: a JSONL file opened to append, a last line cut by a kill dropped first,
  so what is appended starts on a line of its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def temp_sibling(target: str | Path, kind: str = "tmp") -> Path:
    """A new empty folder `.<name>.<random>.<kind>` beside `target` (its parent made if needed)."""
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=f".{kind}"))


def is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def swap_in(new: str | Path, target: str | Path) -> None:
    """Move folder `new` to `target`, replacing what is there: an empty folder directly; a
    non-empty one renamed aside first and deleted after (if renaming `new` in fails, it is
    put back). Callers decide whether `target` may be replaced."""
    new, target = Path(new), Path(os.path.abspath(target))
    if not target.exists() or is_empty_folder(target):
        os.replace(new, target)  # rename(2) replaces an empty folder, and fails on a non-empty one
        return
    aside = temp_sibling(target, "old")
    os.replace(target, aside)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def locked(target: str | Path) -> Iterator[None]:
    """Hold the lock `<target>.lock` (a file beside `target`) for the block; waits for it."""
    from filelock import FileLock

    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        yield


def drop_cut_line(path: str | Path) -> int:
    """Truncate `path` after its last newline (a line a kill cut short has none); returns the
    number of bytes dropped."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return 0
        # Search back from the end for the last newline, a block at a time.
        end, block = size, 1 << 16
        keep = 0
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        f.truncate(keep)
    return size - keep


def open_for_append(path: str | Path) -> IO[str]:
    """`path` opened to append text (created if missing), after dropping a cut last line."""
    path = Path(path)
    if path.exists():
        drop_cut_line(path)
    return path.open("a", encoding="utf-8")
