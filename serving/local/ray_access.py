"""Who can reach a local platform's Ray head: its addresses and Ray's token auth.

A Ray head runs whatever a connected driver or a submitted job asks (the attack behind
CVE-2023-48022), so `up` closes it two ways. On a loopback `http.host` every Ray process binds
127.0.0.1: `--node-ip-address` alone is not enough, as Ray maps a loopback node address to the
machine's network address unless it runs single-machine (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0,
`ray/_private/services.py` resolve_ip_for_localhost); HAProxy's stats and exporter ports, bound
to every interface by Ray's template, are moved to loopback by `serving.local.haproxy_loopback`. And
Ray's token auth is always on: the GCS, the dashboard, the job API and the Ray client refuse a
caller without the token, generated once per install under the platform's state directory."""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import sys
from pathlib import Path

from serving.models import cache_root

TOKEN_FILE = "ray-auth-token"
# Ray's switch between single-machine and cluster addressing (`ray/_private/ray_constants.py`).
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(host: str) -> bool:
    """`localhost` or an address in 127.0.0.0/8 or ::1 (an IPv4-mapped one too)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def token_path() -> Path:
    return cache_root() / TOKEN_FILE


def ensure_token() -> Path:
    """The install's Ray token file, generated (readable by its owner only) when missing."""
    path = token_path()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return path


def auth_env() -> dict[str, str]:
    """Ray's token auth for a process that starts or joins the platform's Ray head."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(ensure_token())}


def use_token_auth() -> None:
    """This process talks to the platform's Ray head with its token (ray.init, Ray's state API
    and `ray_auth_headers` read these variables)."""
    os.environ.update(auth_env())
    if "ray._raylet" in sys.modules:  # Ray already read its config here: reload it, as Ray does
        from ray._raylet import (  # type: ignore[attr-defined]  # Cython module, no stubs
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def single_machine() -> None:
    """This process sees its node at 127.0.0.1, as a loopback head does: else `ray.init` maps
    the head's loopback address to the network address and never reaches the GCS."""
    os.environ[SINGLE_MACHINE_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray read the variable when imported: tell it too
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010  # a module, not typed


def running_head_is_loopback() -> bool:
    """Whether the Ray head this machine runs (Ray's own address file) is on loopback."""
    from ray._private.utils import read_ray_address

    address = read_ray_address()
    return bool(address) and is_loopback(address.rsplit(":", 1)[0])


def ray_auth_headers() -> dict[str, str]:
    """Ray's cluster token as an HTTP header: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH
    names, else the platform's token, else Ray's default ~/.ray/auth_token; {} when none is."""
    token = os.environ.get("RAY_AUTH_TOKEN", "")
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    paths = [Path(named)] if named else [token_path(), Path.home() / ".ray" / "auth_token"]
    found = next((path for path in paths if path.is_file()), None)
    if not token and found is not None:
        token = found.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def haproxy_wrapper() -> str:
    """The `llm-serving-haproxy` script installed beside this Python (or on PATH)."""
    beside = Path(sys.executable).with_name("llm-serving-haproxy")
    return str(beside) if beside.exists() else (shutil.which("llm-serving-haproxy") or "")


def loopback_env() -> dict[str, str]:
    """Environment of a Ray head whose every process binds loopback only."""
    env = {SINGLE_MACHINE_ENV: "0"}
    wrapper = haproxy_wrapper()
    if wrapper:
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = wrapper
    return env


def head_args(http_host: str) -> list[str]:
    """`ray start` arguments for the node address: loopback when the platform serves loopback."""
    return ["--node-ip-address=127.0.0.1"] if is_loopback(http_host) else []


def head_env(http_host: str) -> dict[str, str]:
    """Environment of `ray start --head` (and so of every Ray process it starts)."""
    return {**auth_env(), **(loopback_env() if is_loopback(http_host) else {})}
