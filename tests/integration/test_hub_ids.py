"""The half of tests/unit/test_hub_ids.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_hub_id_is_downloaded_once_into_an_empty_cache(hub_endpoint, tiny_models, capsys):
    from rose_ray.models import download_model, local_model

    folder = download_model("org/tiny-student", "train")
    out = capsys.readouterr().out
    assert f"train: org/tiny-student: downloading from {hub_endpoint.url} into " in out, out
    served = sorted(p.name for p in tiny_models["student"].iterdir())
    assert sorted(p.name for p in Path(folder).iterdir()) == served
    assert local_model("org/tiny-student") == folder  # what the engines and the learner then read
    assert hub_endpoint.file_downloads() == {("org/tiny-student", f): 1 for f in served}
    # Again, in a process of its own (the next run): the hub is asked whether `main` moved, no file is sent.
    code = "from rose_ray.models import download_model; print(download_model('org/tiny-student', 'train'))"
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == folder
    assert "in the Hugging Face cache; checking it against" in again.stdout
    assert hub_endpoint.file_downloads() == {("org/tiny-student", f): 1 for f in served}
    assert hub_endpoint.requests[-1] == ("GET", "/api/models/org/tiny-student/revision/main")
