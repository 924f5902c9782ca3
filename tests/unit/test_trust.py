"""What a shared cluster's other users can reach: the local Ray cluster a command starts, the
ScienceWorld JVMs' gateways, `rose-ray serve`, and what a run writes down (issue 36)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_token_file_other_users_can_read_is_refused(tmp_path, monkeypatch):
    from rose_ray.errors import InputError
    from rose_ray.rollout.actors import private_token

    token = tmp_path / "token"
    token.write_text("0" * 64)
    token.chmod(0o644)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    with pytest.raises(InputError, match=f"other users can read this token \\(mode 644\\): chmod 600 {token}"):
        private_token()
    token.chmod(0o600)
    private_token()  # kept as the user gave it
    assert "RAY_AUTH_TOKEN" not in os.environ


def test_a_ray_without_token_auth_by_default_is_refused_unless_auth_is_off(monkeypatch):
    """Ray 2.58 and older start a local cluster without auth whatever token is set: refused
    before anything starts, naming the version, unless RAY_AUTH_MODE=disabled says it is meant."""
    import ray

    from rose_ray.errors import InputError
    from rose_ray.rollout.actors import check_ray_version, init_ray

    monkeypatch.setattr(ray, "__version__", "2.58.1")
    for mode in (None, "token"):
        if mode:
            monkeypatch.setenv("RAY_AUTH_MODE", mode)
        else:
            monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        with pytest.raises(InputError, match=r"ray 2\.58\.1 is installed; rose_ray needs ray >= 2\.59"):
            init_ray("local")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    check_ray_version()
    monkeypatch.setattr(ray, "__version__", "2.59.0")
    monkeypatch.delenv("RAY_AUTH_MODE")
    check_ray_version()


def test_pyproject_floors_ray_where_token_auth_is_on():
    from rose_ray.rollout.actors import RAY_TOKEN_AUTH_FLOOR

    floor = ".".join(map(str, RAY_TOKEN_AUTH_FLOOR))
    assert f'"ray[default]>={floor}' in (ROOT / "pyproject.toml").read_text()


