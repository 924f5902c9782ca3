"""Outputs never replace what the user did not ask to replace: `sft --out` refuses a folder
that is not empty, `--overwrite` replaces only a model folder rose_ray wrote, and a model
folder is swapped in whole (rename-aside), never deleted first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rose_ray.cli import main
from rose_ray.errors import InputError
from rose_ray.rows import write_jsonl

ROW = {"item_id": "sciworld_0", "task": "boil", "conversations": [
    {"role": "user", "content": "You are an agent."}, {"role": "assistant", "content": "OK"},
    {"role": "user", "content": "You see a stove."}, {"role": "assistant", "content": "Action: look"}]}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_sft_out_at_a_folder_of_the_users_exits_2_and_leaves_it(tmp_path, tiny_models, capsys, overwrite):
    data = tmp_path / "d.jsonl"
    write_jsonl(data, [ROW])
    mine = tmp_path / "my_models"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "plan.txt").write_text("a week of work")
    (mine / "config.json").write_text("{}")  # looks like a model folder, but rose_ray did not write it
    before = snapshot(mine)
    code = main(["sft", "--data", str(data), "--model", str(tiny_models["student"]), "--out", str(mine)]
                + (["--overwrite"] if overwrite else []))
    assert code == 2
    err = capsys.readouterr().err
    assert f"--out {mine}: " in err
    assert ("not a model folder rose-ray wrote" if overwrite else "already exists and is not an empty folder") in err
    assert snapshot(mine) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "my_models"]  # no temp folder left


def test_a_model_folder_is_replaced_only_when_rose_ray_wrote_it(tmp_path, tiny_models):
    """What `sft --overwrite` and a run's `<run_dir>/model/` do at the end: the new folder is
    swapped in by rename-aside; another folder at that path is refused and left as it is."""
    from rose_ray.files import FOLDER_MARKER
    from rose_ray.learner.export import check_model_out, write_hf_folder
    from rose_ray.models import load_model

    state = dict(load_model(tiny_models["student"]).state_dict())
    out = tmp_path / "model"
    first = write_hf_folder(state, str(tiny_models["student"]), str(out), "float32", {"round.txt": "1"})
    assert first["path"] == str(out) and json.loads((out / FOLDER_MARKER).read_text())["written_by"] == "rose_ray"
    (out / "stale.bin").write_text("x")
    write_hf_folder(state, str(tiny_models["student"]), str(out), "float32", {"round.txt": "2"})
    assert (out / "round.txt").read_text() == "2" and not (out / "stale.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the old copy and the temp one are gone
    with pytest.raises(InputError, match="already exists"):
        check_model_out(out, overwrite=False)
    check_model_out(out, overwrite=True)

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data.csv").write_text("1,2\n")
    with pytest.raises(InputError, match=f"--out {theirs}: not a model folder rose-ray wrote"):
        write_hf_folder(state, str(tiny_models["student"]), str(theirs), "float32")
    assert snapshot(theirs) == {"data.csv": b"1,2\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "theirs"]


def test_a_named_run_dir_with_a_model_folder_of_the_users_is_refused_before_the_run(tmp_path):
    """`train run_dir=X` writes the student to X/model/ when it ends: a folder of the user's
    there is refused at the start, not replaced (nor refused) hours later."""
    from rose_ray.cli import main as cli

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.npy").write_text("mine")
    assert cli(["train", f"run_dir={tmp_path}"]) == 2
    assert (tmp_path / "model" / "weights.npy").read_text() == "mine"


def test_a_symlink_as_out_is_written_through_or_refused_before_any_work(tmp_path, tiny_models):
    """`--out LINK` (sft, export) or a run's `model/` as a symlink: the folder it points to is
    what is checked and written, resolved before any work. (Before, the check passed and the
    final rename met the link: NotADirectoryError after training, the new weights deleted.)"""
    from rose_ray.learner.export import check_model_out, write_hf_folder
    from rose_ray.models import load_model

    state = dict(load_model(tiny_models["student"]).state_dict())
    for points_to in ("empty", "missing"):
        real, link = tmp_path / points_to / "model", tmp_path / f"link_to_{points_to}"
        if points_to == "empty":
            real.mkdir(parents=True)
        else:
            real.parent.mkdir()
        link.symlink_to(real)
        check_model_out(link, overwrite=False)
        result = write_hf_folder(state, str(tiny_models["student"]), str(link), "float32")
        assert result["path"] == str(real.resolve()) and link.is_symlink()
        assert (real / "model.safetensors").is_file() and sorted(p.name for p in real.parent.iterdir()) == ["model"]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data.csv").write_text("1,2\n")
    (tmp_path / "link_to_theirs").symlink_to(theirs)
    with pytest.raises(InputError, match=f"--out {theirs}: not a model folder rose-ray wrote"):
        check_model_out(tmp_path / "link_to_theirs", overwrite=True)
    assert snapshot(theirs) == {"data.csv": b"1,2\n"}
