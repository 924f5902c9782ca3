"""Tiny local models (rose_ray/provision/tiny.py) and model loading (rose_ray/models.py). The
chat-format token pieces: test_chat.py; the small CLI commands: test_cli.py."""

from __future__ import annotations

import pytest

from rose_ray.models import ModelNotAvailable, count_parameters, load_model, load_tokenizer
from rose_ray.provision.tiny import init_tiny


def test_tiny_models_are_real_qwen3_with_a_chat_template(tiny_models):
    student, teacher = load_model(tiny_models["student"]), load_model(tiny_models["teacher"])
    assert student.config.model_type == teacher.config.model_type == "qwen3"
    assert count_parameters(student) < count_parameters(teacher)
    tok = load_tokenizer(tiny_models["student"])
    assert tok.get_vocab() == load_tokenizer(tiny_models["teacher"]).get_vocab()
    text = "Your task is to boil water. This room is called the kitchen."
    assert len(tok(text)["input_ids"]) < len(text) / 3  # trained on ScienceWorld text
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (tiny_models["student"] / "model.safetensors").is_file()


def test_init_tiny_is_seeded_and_reused(tmp_path, tiny_models):
    import torch

    a = init_tiny(tmp_path / "a", seed=0)
    marker_time = (tmp_path / "a" / "rose_ray_tiny.json").stat().st_mtime
    assert init_tiny(tmp_path / "a", seed=0) == a
    assert (tmp_path / "a" / "rose_ray_tiny.json").stat().st_mtime == marker_time  # not rebuilt
    ours = load_model(a["student"]).state_dict()
    fixture = load_model(tiny_models["student"]).state_dict()
    assert all(torch.equal(ours[k], fixture[k]) for k in ours)  # same seed, same weights


def test_init_tiny_replaces_only_folders_it_wrote(tmp_path, capsys):
    """`init-tiny --out DIR` (and a run's `tiny_dir=DIR`) never replaces a `DIR/student` or
    `DIR/teacher` of the user's (before, it did, whatever was there); a build of an older
    rose_ray (its rose_ray_tiny.json, of other settings) is rebuilt."""
    import json

    from rose_ray.cli import main
    from rose_ray.files import FOLDER_MARKER

    mine = tmp_path / "mine"
    (mine / "teacher").mkdir(parents=True)
    (mine / "teacher" / "config.json").write_text("{}")
    (mine / "teacher" / "notes.txt").write_text("a month of work")
    assert main(["init-tiny", "--out", str(mine)]) == 2
    assert f"tiny model folder {mine / 'teacher'}: not a folder rose-ray wrote" in capsys.readouterr().err
    assert sorted(p.name for p in (mine / "teacher").iterdir()) == ["config.json", "notes.txt"]
    assert sorted(p.name for p in mine.iterdir()) == ["rose_ray_tiny.json.lock", "teacher"]  # nothing built

    older = tmp_path / "older"
    for role in ("student", "teacher"):
        (older / role).mkdir(parents=True)
        (older / role / "config.json").write_text("{}")
    (older / "rose_ray_tiny.json").write_text(json.dumps({"seed": 0, "vocab_size": 8192, "style": "plain"}))
    paths = init_tiny(older, seed=0)
    assert all((paths[role] / FOLDER_MARKER).is_file() and (paths[role] / "model.safetensors").is_file()
               for role in ("student", "teacher"))
    assert sorted(p.name for p in older.iterdir()) == ["rose_ray_tiny.json", "rose_ray_tiny.json.lock",
                                                       "student", "teacher"]


def test_missing_model_is_a_clear_error():
    with pytest.raises(ModelNotAvailable, match="init-tiny"):
        load_model("/nonexistent/model-folder")
