"""rose_ray/files.py, the one place that writes folders and files whole: folders replaced so that
a whole copy is always on disk, temp names rose_ray can tell from anything else and that the
next writer clears when their writer is gone, JSONL files a kill cut mid-line appended to from
a whole line, and bad lines named. Kills at chosen points (SIGKILL while stopped at a
`crash_point`, in a process of its own): mid-swap, mid-prune, mid-rewrite. Two processes
building one cache entry under `locked`: tests/e2e/test_two_runs_share_one_cache.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import rose_ray.files as files
from rose_ray.errors import InputError
from rose_ray.files import (
    FOLDER_MARKER,
    TEMP_TAG,
    drop_cut_line,
    json_records,
    open_for_append,
    swap_in,
    temp_name,
    writing_folder,
)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_temp_names_are_hidden_beside_the_target_and_say_who_made_them(tmp_path):
    target = tmp_path / "cache" / "teacher"
    a, b = temp_name(target), temp_name(target, "old")
    assert a != b and a.parent == b.parent == target.parent
    with writing_folder(target) as new:  # its parent is made, its temp folder new and empty
        assert new.parent == target.parent and new.is_dir() and not any(new.iterdir())
        assert files._parse_temp(new.name) == ("teacher", "tmp", files._host(), os.getpid())
    assert a.name.startswith(f".teacher{TEMP_TAG}tmp.") and b.name.startswith(f".teacher{TEMP_TAG}old.")
    assert files._parse_temp(a.name) == ("teacher", "tmp", files._host(), os.getpid())
    assert files._parse_temp(".teacher.bak") is None and files._parse_temp("teacher") is None


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "rename-aside"])
def test_swap_in_replaces_a_folder_and_leaves_nothing_aside(tmp_path, monkeypatch, exchange):
    if not exchange:  # a file system without renameat2's exchange
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    target = tmp_path / "model"
    for content in ("first", "second"):  # into nothing, then over a full folder
        new = temp_name(target)
        new.mkdir()
        (new / "weights").write_text(content)
        swap_in(new, target)
        assert (target / "weights").read_text() == content and not new.exists()
    target.joinpath("weights").unlink()  # an empty folder is replaced directly
    new = temp_name(target)
    new.mkdir()
    (new / "weights").write_text("third")
    swap_in(new, target)
    assert (target / "weights").read_text() == "third"
    assert names(tmp_path) == ["model"]


def test_a_swap_that_fails_puts_the_old_folder_back(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    with pytest.raises(FileNotFoundError):
        swap_in(tmp_path / "gone", target)  # the new folder vanished before its rename
    assert (target / "weights").read_text() == "old"
    assert names(tmp_path) == ["model"]


def test_writing_folder_replaces_only_what_rose_ray_wrote(tmp_path):
    target = tmp_path / "out"
    with writing_folder(target) as tmp:
        (tmp / "a").write_text("1")
    assert names(target) == ["a", FOLDER_MARKER]  # marked: a later writer may replace it
    with writing_folder(target) as tmp:
        (tmp / "b").write_text("2")
    assert names(target) == ["b", FOLDER_MARKER]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=f"folder {theirs}: not a folder rose-ray wrote"):
        with writing_folder(theirs):
            raise AssertionError("the block must not run")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="a file is there"):
        with writing_folder(tmp_path / "file"):
            pass
    with pytest.raises(RuntimeError):  # a build that fails leaves the target and no temp
        with writing_folder(target) as tmp:
            (tmp / "c").write_text("3")
            raise RuntimeError("build failed")
    assert names(target) == ["b", FOLDER_MARKER] and names(theirs) == ["notes.txt"]
    assert names(tmp_path) == ["file", "out", "theirs"]


def test_json_records_name_each_bad_line_and_go_on(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n"x"\n{bad\n' + b"[" * 100_000 + b"\n" + b'{"b": 2}\n{"cut')
    bad: list[tuple[int, str]] = []
    got = [(n, r) for n, _, r in json_records(path, lambda n, problem: bad.append((n, problem)))]
    assert got == [(1, {"a": 1}), (6, {"b": 2})]
    assert [n for n, _ in bad] == [3, 4, 5]
    assert "expected a JSON object, got str" in bad[0][1] and "not valid JSON" in bad[1][1]
    assert "nested too deeply" in bad[2][1] and all(p.startswith(f"{path}:{n}: ") for n, p in bad)


def test_drop_cut_line_keeps_whole_lines_only(tmp_path):
    path = tmp_path / "rows.jsonl"
    for text, dropped, kept in (("", 0, ""), ('{"a": 1}\n', 0, '{"a": 1}\n'), ('{"a": 1}\n{"b"', 4, '{"a": 1}\n'),
                                ('{"cut', 5, "")):
        path.write_text(text)
        assert (drop_cut_line(path), path.read_text()) == (dropped, kept), text
    # A cut line longer than the block it searches back by (64 KiB).
    path.write_text('{"a": 1}\n' + "x" * 70_000)
    assert drop_cut_line(path) == 70_000 and path.read_text() == '{"a": 1}\n'


def test_what_is_appended_after_a_kill_starts_on_its_own_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    with open_for_append(path) as f:  # created
        f.write('{"n": 0}\n{"n": 1')  # the kill cut the second line
    with open_for_append(path) as f:
        f.write('{"n": 2}\n')
    assert path.read_text().splitlines() == ['{"n": 0}', '{"n": 2}']


def test_crash_point_is_nothing_unless_named(monkeypatch):
    monkeypatch.delenv(files.CRASH_ENV, raising=False)
    files.crash_point("swap")  # returns: no test asks for a crash (where one does: stopped_at above)
    monkeypatch.setenv(files.CRASH_ENV, "another point")
    files.crash_point("swap")


