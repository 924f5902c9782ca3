"""The half of tests/unit/test_trust.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from py4j.protocol import Py4JError

from rose_ray.envs.worlds import get_world
from tests.unit.test_trust import ROOT


def clean_env(home: Path) -> dict[str, str]:
    """This environment without any Ray address or auth setting (as a user's shell has), and a
    HOME of the test's own (so ~/.ray/auth_token is the test's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return {**env, "HOME": str(home), "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("mode", [None, "token"])
def test_the_local_cluster_a_command_starts_refuses_connections_without_its_token(tmp_path, mode):
    # The cluster's ports listen on every interface (Ray 2.60 binds GCS and raylet to ::), so
    # what keeps other users out is the token: a GCS call without it (auth off, or a wrong
    # token) is refused, one with it is answered, and the token is written nowhere on disk (with
    # RAY_AUTH_MODE=token and no token, Ray itself would write ~/.ray/auth_token, umask's mode).
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
    env = {**clean_env(tmp_path), **({"RAY_AUTH_MODE": mode} if mode else {})}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["ran"] == 2 and result["mode"] == "token"
    assert result["answered"] == {"no auth": False, "wrong token": False, "its token": True}
    assert not (tmp_path / ".ray" / "auth_token").exists()  # the token lived in the environment only


def test_a_scienceworld_jvm_refuses_a_gateway_connection_without_its_token():
    import psutil
    from py4j.java_gateway import GatewayParameters, JavaGateway

    from rose_ray.envs.sciworld.game import SciWorldGame

    game = SciWorldGame()
    try:
        listening = [c.laddr for c in psutil.Process(game.pid).net_connections() if c.status == "LISTEN"]
        assert len(listening) == 1
        port = listening[0].port
        assert all(a.ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for a in listening), listening
        for token in (None, "0" * 40):  # another local user: no token, or a guessed one
            intruder = JavaGateway(gateway_parameters=GatewayParameters(port=port, read_timeout=10,
                                                                        auth_token=token))
            try:
                with pytest.raises(Py4JError):
                    intruder.jvm.java.lang.System.getProperty("user.name")
            finally:
                intruder.close()
        first = game.load(get_world("sciworld").catalogue(None).game("sciworld_0"))  # its own connection works
        assert first.observation.startswith("Your task is to boil water.")
        assert game.step("open door to kitchen").turn == 1
    finally:
        game.close()
