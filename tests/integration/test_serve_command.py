"""The slow half of tests/unit/inference/test_server.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import os
import sys

import pytest

from tests.served import free_port, start_server
from tests.unit.inference.test_server import KEY, NAME, post


@pytest.mark.slow
def test_rose_ray_serve_command(tiny_models, tmp_path):
    """The CLI end to end: a subprocess serving on a free port, with a key (vLLM's own server,
    which `serve --backend vllm` names: tests/integration/test_vllm_server.py)."""
    port = free_port()
    env = {**os.environ, "ROSE_RAY_API_KEY": KEY}
    cmd = [sys.executable, "-m", "rose_ray.cli", "serve", str(tiny_models["student"]), "--port", str(port),
           "--served-model-name", NAME, "--threads", "1", "--dtype", "float32"]
    srv = start_server(cmd, tmp_path / "serve.log", env, port, timeout_s=300)
    try:
        status, out = post(srv.url + "/completions", {"model": NAME, "prompt": "look", "max_tokens": 3,
                                                      "temperature": 0})
        assert status == 200 and len(out["choices"][0]["token_ids"]) == 3
        status, scored = post(srv.url + "/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 1,
                                                         "prompt_logprobs": 0})
        lps = [next(iter(e.values()))["logprob"] for e in scored["choices"][0]["prompt_logprobs"][1:]]
        assert status == 200 and len(lps) == 3 and all(lp < 0 for lp in lps)
        assert post(srv.url + "/completions", {"prompt": "look"}, key="nope")[0] == 401
    finally:
        srv.stop()
    assert "with the hf backend" in srv.log.read_text()
