"""`bash launch/rehearse.sh`: the seed's ROSE config on a two-raylet cluster on this host (8
fake GPUs: no GPU exists here), as shipped but for configs/rehearse.overrides, downloads its
models from a local hub (launch/hub_server.py) into an empty Hugging Face cache, reaches learner
step 3 with the weights published, says where each actor went, and leaves none of its Ray
processes behind."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_overrides_leave_placement_tp_engines_and_learner_as_shipped():
    keys = {line.split("=", 1)[0] for line in (ROOT / "configs/rehearse.overrides").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    shipped = ("resources.", "tensor_parallel_size", "learner.ranks", "learner.zero_stage",
               "learner.gpus_per_rank", "algorithm")
    # An engine's backend stays the one shipped (`X.backend` or `X.backend.name`); its own sizes
    # (`X.backend.kv_cache_mb`: this CPU's KV cache) may change.
    chosen_backend = [k for k in keys if k.endswith((".backend", ".backend.name"))]
    assert not chosen_backend and not [k for k in keys if any(s in k for s in shipped)], keys
