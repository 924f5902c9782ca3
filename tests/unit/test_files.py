"""rose_ray/files.py: folders replaced so that some copy is always on disk, and JSONL files a
kill cut mid-line appended to from a whole line. Two processes building one cache entry under
`locked`: tests/e2e/test_cache_lock.py."""

from __future__ import annotations

import pytest

from rose_ray.files import drop_cut_line, open_for_append, swap_in, temp_sibling


def test_temp_siblings_are_fresh_hidden_folders_beside_the_target(tmp_path):
    target = tmp_path / "cache" / "teacher"  # its parent is made
    a, b = temp_sibling(target), temp_sibling(target, "old")
    assert a != b and a.parent == b.parent == target.parent and a.is_dir() and not any(a.iterdir())
    assert a.name.startswith(".teacher.") and a.name.endswith(".tmp") and b.name.endswith(".old")


def test_swap_in_replaces_a_folder_and_leaves_nothing_aside(tmp_path):
    target = tmp_path / "model"
    for content in ("first", "second"):  # into nothing, then over a full folder
        new = temp_sibling(target)
        (new / "weights").write_text(content)
        swap_in(new, target)
        assert (target / "weights").read_text() == content and not new.exists()
    target.joinpath("weights").unlink()  # an empty folder is replaced directly
    new = temp_sibling(target)
    (new / "weights").write_text("third")
    swap_in(new, target)
    assert (target / "weights").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_swap_that_fails_puts_the_old_folder_back(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    with pytest.raises(FileNotFoundError):
        swap_in(tmp_path / "gone", target)  # the new folder vanished before its rename
    assert (target / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


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
