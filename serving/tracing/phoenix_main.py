"""Runs `phoenix serve` with its OTLP gRPC server on loopback. Run by the Phoenix venv's Python
by file path (serving/tracing/backend.py), never imported by the platform: Phoenix lives in its
own venv (.venv/tools/phoenix) and this file needs nothing of `serving`.

Why the wrapper: Phoenix 20.26 binds its gRPC receiver to every interface, hard-coded
(phoenix/server/grpc_server.py: `server.add_insecure_port(f"[::]:{port}")`), while PHOENIX_HOST
only moves the HTTP server. The platform listens on loopback only, so the gRPC server Phoenix
makes (it calls `grpc.aio.server` when it starts) gets its addresses rewritten to 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"


def loopback_address(address: str) -> str:
    """`[::]:4317` or `0.0.0.0:4317` -> `127.0.0.1:4317`; other hosts are kept."""
    host, _, port = address.rpartition(":")
    return f"{LOOPBACK}:{port}" if host in ("[::]", "0.0.0.0", "") else address


def on_loopback(make_server: Any) -> Any:
    """A grpc.aio.server factory whose servers' add_insecure_port / add_secure_port bind
    loopback."""

    def make(*args: Any, **kwargs: Any) -> Any:
        server = make_server(*args, **kwargs)
        add_insecure, add_secure = server.add_insecure_port, server.add_secure_port
        server.add_insecure_port = lambda address: add_insecure(loopback_address(address))
        server.add_secure_port = lambda address, *rest: add_secure(loopback_address(address), *rest)
        return server

    return make


def main() -> None:
    # Run as a script, this file's folder is sys.path[0], and its neighbour phoenix.py (the
    # platform's span reader) would shadow the `phoenix` package.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import grpc.aio
    from phoenix.server.main import main as phoenix_main

    grpc.aio.server = on_loopback(grpc.aio.server)
    sys.argv = ["phoenix", "serve"]
    phoenix_main()


if __name__ == "__main__":
    main()
