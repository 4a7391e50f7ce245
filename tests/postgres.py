"""A real PostgreSQL server (Debian's `postgresql` package) for the networked store's tests: a
fresh cluster in a temp dir, on a free loopback port, with password (SCRAM) authentication for
one user, stopped at the end. initdb and postgres refuse to run as root (CI and these machines
run tests as root), so they run as `nobody` there."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

USER = "llm"
DATABASE = "llm"
UNPRIVILEGED = "nobody"
START_TIMEOUT_S = 60.0
# A test server: durability buys nothing, and fsync on a loaded CI disk costs seconds.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "100",
}


@dataclass(frozen=True)
class Postgres:
    port: int
    password: str

    @property
    def url(self) -> str:
        """A StateConfig.url: no password in it (the store reads it from password_env)."""
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def connect(self, dbname: str = DATABASE, autocommit: bool = False) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=USER,
            password=self.password,
            dbname=dbname,
            autocommit=autocommit,
        )


def bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name)
    )
    assert found, "PostgreSQL is not installed (the Makefile's system-deps installs it)"
    return found[-1].parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def as_unprivileged() -> dict[str, Any]:
    """Popen arguments that drop root (initdb and postgres exit at once as root)."""
    return {"user": UNPRIVILEGED, "group": "nogroup"} if os.geteuid() == 0 else {}


def make_workdir() -> Path:
    """A directory the server's user owns, under /tmp (pytest's tmp dirs are root's, mode 700)."""
    workdir = Path(tempfile.mkdtemp(prefix="llm-serving-pg-"))
    if os.geteuid() == 0:
        shutil.chown(workdir, UNPRIVILEGED, "nogroup")
    return workdir


def init_cluster(workdir: Path, password: str) -> Path:
    data = workdir / "data"
    pwfile = workdir / "pwfile"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, UNPRIVILEGED, "nogroup")
    subprocess.run(
        [
            str(bin_dir() / "initdb"),
            f"--pgdata={data}",
            f"--username={USER}",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        cwd=workdir,
        **as_unprivileged(),
    )
    pwfile.unlink()
    return data


def wait_until_ready(server: Postgres, process: subprocess.Popen, log: Path) -> None:
    """Poll until the server accepts the user's password, then create the store's database."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"postgres exited: {log.read_text()[-2000:]}"
        with (
            contextlib.suppress(psycopg.OperationalError),
            server.connect(dbname="postgres", autocommit=True) as conn,
        ):
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {USER}")
            return
        time.sleep(0.2)
    raise AssertionError(f"postgres not ready in {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def running_postgres() -> Iterator[Postgres]:
    """A fresh server for the block; stopped (fast shutdown) and its files removed after."""
    workdir = make_workdir()
    password = secrets.token_urlsafe(16)
    process = None
    try:
        data = init_cluster(workdir, password)
        server = Postgres(port=free_port(), password=password)
        settings = {**SETTINGS, "port": str(server.port), "unix_socket_directories": str(workdir)}
        log = workdir / "postgres.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(bin_dir() / "postgres"), "-D", str(data)]
                + [f"--{key}={value}" for key, value in settings.items()],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                **as_unprivileged(),
            )
        wait_until_ready(server, process, log)
        yield server
    finally:
        if process is not None:
            stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)  # fast shutdown: roll back open transactions, close
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
