"""What a shared cluster's other users can reach: the local Ray cluster a command starts, the
ScienceWorld JVMs' gateways, `rose-ray serve`, and what a run writes down (issue 36)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(home: Path) -> dict[str, str]:
    """This environment without any Ray address or auth setting (as a user's shell has), and a
    HOME of the test's own (so ~/.ray/auth_token is the test's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


def test_the_local_cluster_a_command_starts_refuses_connections_without_its_token(tmp_path):
    # The cluster's ports listen on every interface (Ray 2.60 binds GCS and raylet to ::), so
    # what keeps other users out is the token: a GCS call without it (auth off, or a wrong
    # token) is refused, one with it is answered, and the token is written nowhere on disk.
    script = textwrap.dedent("""
        import json, os, subprocess, sys
        import ray
        from rose_ray.rollout.actors import init_ray

        init_ray()
        gcs = ray.get_runtime_context().gcs_address
        ran = ray.get(ray.remote(lambda: 1 + 1).remote())
        probe = ("from ray._raylet import GcsClient; "
                 "print('ANSWERED', GcsClient(address=%r).internal_kv_keys(b'', None, timeout=30))" % gcs)
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        tries = {"no auth": {"RAY_AUTH_MODE": "disabled"},
                 "wrong token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
                 "its token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN", "")}}
        answered = {name: "ANSWERED" in subprocess.run([sys.executable, "-c", probe], env={**base, **extra},
                                                       capture_output=True, text=True, timeout=120).stdout
                    for name, extra in tries.items()}
        print("RESULT " + json.dumps({"ran": ran, "mode": os.environ.get("RAY_AUTH_MODE"), "answered": answered}))
        ray.shutdown()
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=clean_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["ran"] == 2 and result["mode"] == "token"
    assert result["answered"] == {"no auth": False, "wrong token": False, "its token": True}
    assert not (tmp_path / ".ray" / "auth_token").exists()  # the token lived in the environment only
