"""A real Phoenix (serving/tracing/backend.py, from the venv `make install-tracing` builds) on free
loopback ports in a temp working dir, stopped at the end: the trace backend of the tracing tests.
It needs no Ray platform, so it never collides with one."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from serving.tracing.backend import Phoenix, phoenix_python, start_phoenix, stop_phoenix


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_phoenix(working_dir: Path | None = None) -> Iterator[Phoenix]:
    """Phoenix, answering on its API; its spans live in `working_dir` (a fresh temp dir if not
    given). Fails (not skips) without the Phoenix venv: `make install-test` builds it."""
    assert phoenix_python().exists(), "Phoenix is not installed: run `make install-tracing`"
    with contextlib.ExitStack() as stack:
        folder = working_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = start_phoenix(free_port(), free_port(), folder)
        stack.callback(stop_phoenix, server)
        yield server


def listening_addresses(pid: int) -> list[str]:
    """`host:port` of every TCP socket `pid` listens on, as `ss -Hltnp` lists them."""
    lines = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in lines.splitlines() if f"pid={pid}," in line]


def is_loopback(address: str) -> bool:
    """`127.0.0.1:6006`, `[::1]:6006` or `[::ffff:127.0.0.1]:4317` (IPv4 loopback on a v6 socket)."""
    host = ipaddress.ip_address(address.rpartition(":")[0].strip("[]"))
    mapped = getattr(host, "ipv4_mapped", None)
    return (mapped or host).is_loopback
