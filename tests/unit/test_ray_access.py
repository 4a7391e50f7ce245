"""The local Ray head's addresses and token: which hosts count as loopback, the `ray start`
arguments and environment for each, the token file, and HAProxy's config rewritten to loopback."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from serving.local import haproxy_loopback, ray_access


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.2", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert ray_access.is_loopback(host) is loopback


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    return tmp_path


def test_token_is_generated_once_and_private(state_dir: Path) -> None:
    path = ray_access.ensure_token()
    assert path.parent == state_dir
    token = path.read_text()
    assert len(token) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ray_access.ensure_token().read_text() == token  # kept across starts


def test_a_loopback_head_binds_loopback_and_wants_the_token(state_dir: Path) -> None:
    env = ray_access.head_env("127.0.0.1")
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(state_dir / ray_access.TOKEN_FILE)
    assert env[ray_access.SINGLE_MACHINE_ENV] == "0"
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"].endswith("llm-serving-haproxy")
    assert ray_access.head_args("127.0.0.1") == ["--node-ip-address=127.0.0.1"]


def test_a_head_serving_every_interface_still_wants_the_token(state_dir: Path) -> None:
    env = ray_access.head_env("0.0.0.0")
    assert env["RAY_AUTH_MODE"] == "token"
    assert ray_access.SINGLE_MACHINE_ENV not in env
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in env
    assert ray_access.head_args("0.0.0.0") == []


def test_auth_headers_prefer_the_given_token_then_the_platforms(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HOME", str(state_dir / "home"))
    assert ray_access.ray_auth_headers() == {}
    token = ray_access.ensure_token().read_text()
    assert ray_access.ray_auth_headers() == {"Authorization": f"Bearer {token}"}
    (state_dir / "named").write_text("abc\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(state_dir / "named"))
    assert ray_access.ray_auth_headers() == {"Authorization": "Bearer abc"}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "xyz")
    assert ray_access.ray_auth_headers() == {"Authorization": "Bearer xyz"}


# The lines of Ray 2.60's template (ray/serve/_private/haproxy_templates.py) that the wrapper moves.
RAY_CONFIG = """global
    stats socket /tmp/haproxy-serve/n/admin.sock mode 666 level admin expose-fd listeners
frontend prometheus
    bind :9101
frontend http_frontend
    bind 127.0.0.1:8000
listen stats
  bind *:8404
"""


def test_haproxy_config_moves_every_interface_binds_to_loopback() -> None:
    text = haproxy_loopback.loopback_config(RAY_CONFIG)
    assert "    bind 127.0.0.1:9101\n" in text
    assert "  bind 127.0.0.1:8404\n" in text
    assert "    bind 127.0.0.1:8000\n" in text  # the frontend already binds http.host
    assert "admin.sock mode 600 level admin" in text
    assert haproxy_loopback.loopback_config(text) == text


def test_haproxy_config_path_is_the_file_after_f() -> None:
    assert haproxy_loopback.config_path(["-db", "-f", "/x/haproxy.cfg", "-sf", "12"]) == (
        "/x/haproxy.cfg"
    )
    assert haproxy_loopback.config_path(["-v"]) is None


def test_the_wrapper_execs_rays_haproxy_not_itself() -> None:
    # Ray's override names the wrapper, and the wheel's own lookup honours that override first.
    wrapper = ray_access.haproxy_wrapper()
    env = {**os.environ, "RAY_SERVE_HAPROXY_BINARY_PATH": wrapper}
    done = subprocess.run([wrapper, "-v"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("HAProxy version")
