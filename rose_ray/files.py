"""Files and folders written whole, where other runs may write too and a kill may land at any
moment. A folder is built in a temp folder beside its target and swapped in; it replaces only
nothing, an empty folder or a folder rose_ray wrote (it holds FOLDER_MARKER). A file goes to a
temp file, fsynced and renamed over its target. Temp names (`.<target>.rose_ray-<kind>.<host>.
<pid>.<random>`) let `clear_leftovers` tell a stopped writer's temps from anything else.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import json
import mmap
import os
import re
import secrets
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rose_ray.errors import InputError

# Every folder rose_ray writes holds this file: the only folders it will replace.
FOLDER_MARKER = "rose_ray_folder.json"
# Folders written before the marker existed hold one of these (a run's model/ and `export`'s
# provenance, a warm-up's record, `sft`'s log) next to their config.json.
OLDER_MARKERS = ("rose_ray_model.json", "rose_ray_warmup.json", "sft_log.jsonl")
TEMP_TAG = ".rose_ray-"  # in every temp name rose_ray gives, between the target's name and the kind
CRASH_ENV = "ROSE_RAY_CRASH_AT"


def written_here(folder: str | Path) -> bool:
    """Whether `folder` is a folder rose_ray wrote (so it may replace it)."""
    folder = Path(folder)
    return (folder / FOLDER_MARKER).is_file() or (
        (folder / "config.json").is_file() and any((folder / m).is_file() for m in OLDER_MARKERS))


def is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def out_path(path: str | Path) -> Path:
    """`path` absolute, every symlink on it resolved (a dangling one: where it points)."""
    return Path(os.path.realpath(Path(path).expanduser()))


_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """A test's crash here: with ROSE_RAY_CRASH_AT=`name` (or `name#N`: the N-th time here) the
    process stops itself (SIGSTOP) for the test to SIGKILL, as a lost node would."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or wanted.partition("#")[0] != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if str(_crash_counts[name]) == (wanted.partition("#")[2] or "1"):
        print(f"rose_ray: stopped at crash point {wanted!r} ({CRASH_ENV})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


# ----------------------------------------------------------------------------- temp names
def _host() -> str:
    return "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname()) or "host"


def temp_name(target: str | Path, kind: str = "tmp") -> Path:
    """A fresh name `.<name>.rose_ray-<kind>.<host>.<pid>.<random>` beside `target` (nothing made)."""
    target = Path(os.path.abspath(target))
    return target.with_name(f".{target.name}{TEMP_TAG}{kind}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}")


def _parse_temp(name: str) -> tuple[str, str, str, int] | None:
    """(target name, kind, host, pid) of a temp name rose_ray gave, else None."""
    target, tag, tail = name.rpartition(TEMP_TAG)
    m = re.fullmatch(r"([^.]+)\.(.*)\.(\d+)\.[^.]*", tail, re.DOTALL)  # kind, host, pid, random
    return (target[1:], m[1], m[2], int(m[3])) if tag and target.startswith(".") and m else None


def _writer_gone(host: str, pid: int) -> bool:
    """Whether the process that named a temp is known to be gone (on this host, no such pid)."""
    if host != _host() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:  # no permission: a process of someone else's, alive
        return isinstance(e, ProcessLookupError)
    return False


def clear_leftovers(folder: str | Path, name: str | None = None, owned: bool = False) -> list[str]:
    """Temp files and folders rose_ray named in `folder` (of target `name`, or of every target)
    whose writer is gone: removed, or put back where a swap's old copy lost its target (a kill
    between the two renames). `owned`: the caller owns the folder (a run folder, a builder
    holding the cache lock), so every such temp is a leftover. Returns a line per thing done."""
    folder = Path(folder)  # glob finds nothing in a folder that is not there
    done = []
    pattern = f".{glob.escape(name)}{TEMP_TAG}*" if name is not None else f".*{TEMP_TAG}*"
    for path in sorted(folder.glob(pattern)):
        parsed = _parse_temp(path.name)
        if parsed is None or (name is not None and parsed[0] != name):
            continue
        target_name, kind, host, pid = parsed
        if not owned and not _writer_gone(host, pid):
            continue
        target = folder / target_name
        if kind == "old" and not os.path.lexists(target):
            os.replace(path, target)
            done.append(f"{target}: put back (a swap was cut between its two renames)")
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        done.append(f"{path}: removed (left by a writer that was stopped)")
    return done


# ----------------------------------------------------------------------------- folders
def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system or
    the file system cannot (then nothing happened)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2  # glibc's, Linux only
    except (OSError, AttributeError, TypeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_dir(folder: Path) -> None:
    """A folder's entries (a file created or renamed in it) on disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_in(new: str | Path, target: str | Path) -> None:
    """Move folder `new` to `target`, replacing what is there (callers decide whether it may be):
    by an atomic exchange where the file system has one, else renamed aside first (put back if
    the second rename fails; after a kill between them, by `clear_leftovers`)."""
    new, target = Path(new), Path(os.path.abspath(target))
    old = None  # where what was at `target` went
    if not os.path.lexists(target) or is_empty_folder(target):
        os.replace(new, target)  # rename(2) replaces an empty folder, and fails on a non-empty one
    elif _exchange(new, target):
        old = new
        crash_point("swap")
    else:
        old = temp_name(target, "old")
        os.replace(target, old)
        crash_point("swap")
        try:
            os.replace(new, target)
        except BaseException:
            os.replace(old, target)
            raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_replaceable(target: str | Path, what: str) -> None:
    """InputError (naming `what` and the path) unless `target` is nothing, an empty folder, or a
    folder rose_ray wrote: what `writing_folder` may replace."""
    target = Path(target)
    if not os.path.lexists(target) or is_empty_folder(target):
        return
    if not target.is_dir():
        raise InputError(f"{what} {target}: a file is there, not a folder; give a new folder")
    if not written_here(target):
        raise InputError(f"{what} {target}: not a folder rose-ray wrote (it has no {FOLDER_MARKER}), so it is "
                         "not replaced; it is left as it is: move it away or give another folder")


@contextmanager
def writing_folder(target: str | Path, what: str = "folder") -> Iterator[Path]:
    """Yields a new empty temp folder beside `target`, swapped in with FOLDER_MARKER when the block
    ends, where `check_replaceable` allows it (before and just before the swap); if the block
    fails, `target` is untouched. A symlink at `target` is written through (`out_path`)."""
    target = out_path(target)
    clear_leftovers(target.parent, target.name)
    check_replaceable(target, what)
    tmp = temp_name(target)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        yield tmp
        if not (tmp / FOLDER_MARKER).exists():
            (tmp / FOLDER_MARKER).write_text(json.dumps({"written_by": "rose_ray"}) + "\n")
        check_replaceable(target, what)  # again: something may have appeared there meanwhile
        swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------- files
@contextmanager
def writing_file(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file streamed whole: the block writes a temp file beside `path` (`mode` "w" or "wb"), renamed
    over `path` when it ends; if it fails, `path` is untouched. A symlink is written through."""
    path = out_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(path.parent, path.name)
    tmp = temp_name(path)
    try:
        with tmp.open(mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_file(path: str | Path, data: str | bytes) -> None:
    """`path` holding `data`, written whole (`writing_file`); readers see the old file or the new."""
    with writing_file(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def locked(target: str | Path) -> Any:
    """The lock `<target>.lock` (a file beside `target`), to hold for a `with` block; waits for it."""
    from filelock import FileLock

    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(target.with_name(target.name + ".lock")))


# ----------------------------------------------------------------------------- JSONL
def json_line(raw: bytes, where: str, error: type[InputError] = InputError) -> Any:
    """One JSONL line's value; an `error` naming `where` (file:line) when it is not UTF-8 or not
    JSON (too deep, an integer too long to read included)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read") from None
    except ValueError as e:  # an integer longer than Python converts (sys.set_int_max_str_digits)
        raise error(f"{where}: unreadable JSON value ({e})") from None


def json_records(path: str | Path, on_bad: Callable[[int, str], None]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """(line number, bytes, object) of each whole line of a JSONL file holding a JSON object, as a
    stream; another line's number and problem (naming file:line) go to `on_bad`. Blank lines and
    a last line without its newline (cut by a kill) are passed over silently."""
    with Path(path).open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            try:
                record = json_line(raw, f"{path}:{n}")
                if not isinstance(record, dict):
                    raise InputError(f"{path}:{n}: expected a JSON object, got {type(record).__name__}")
            except InputError as e:
                on_bad(n, str(e))
            else:
                yield n, raw, record


def drop_cut_line(path: str | Path) -> int:
    """Truncate `path` after its last newline (a line a kill cut short has none); returns the
    number of bytes dropped (0 for a missing file)."""
    size = Path(path).stat().st_size if os.path.exists(path) else 0
    if size == 0:
        return 0
    with Path(path).open("rb+") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            keep = m.rfind(b"\n") + 1  # from the end, reading only the pages it passes
        if keep < size:
            f.truncate(keep)
    return size - keep


def open_for_append(path: str | Path) -> IO[str]:
    """`path` opened to append text (created if missing), after dropping a cut last line."""
    drop_cut_line(path)
    return Path(path).open("a", encoding="utf-8")
