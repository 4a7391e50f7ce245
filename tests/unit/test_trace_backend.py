"""The local trace backend's pieces that need no Phoenix: the deployed config's tracing URLs, a
busy port, a missing Phoenix venv (one error line naming `make install-tracing`), the launcher's
loopback rewrite. A real Phoenix: tests/integration/test_trace_cli.py."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from serving.cli import main
from serving.config import PlatformConfig
from serving.tracing import backend
from serving.tracing.backend import BackendError, Phoenix, check_port_free, with_local_tracing
from serving.tracing.phoenix_main import loopback_address, on_loopback

SERVER = Phoenix(pid=1, port=16006, grpc_port=14317, working_dir="/tmp/unused")


def test_tracing_goes_to_the_local_phoenix_when_the_config_names_none() -> None:
    tracing = with_local_tracing(PlatformConfig(), SERVER).tracing
    assert tracing.otlp_endpoint == "http://127.0.0.1:16006/v1/traces"
    assert tracing.query_url == "http://127.0.0.1:16006"
    assert tracing.enabled


def test_the_configs_own_endpoint_and_query_url_are_kept() -> None:
    own = {"otlp_endpoint": "http://127.0.0.1:4318/v1/traces", "query_url": "http://127.0.0.1:7"}
    config = PlatformConfig.model_validate({"tracing": own})
    assert with_local_tracing(config, SERVER).tracing.model_dump(include=set(own)) == own


def test_a_grpc_exporter_gets_phoenixs_grpc_port() -> None:
    config = PlatformConfig.model_validate({"tracing": {"protocol": "grpc", "sample_ratio": 0.5}})
    tracing = with_local_tracing(config, SERVER).tracing
    assert tracing.otlp_endpoint == "http://127.0.0.1:14317"
    assert tracing.sample_ratio == 0.5  # the rest of the section stays as set


def test_only_what_was_set_stays_set() -> None:
    """Serve hashes each app's args: `apply` of the same file must write what `up` wrote."""
    dumped = with_local_tracing(PlatformConfig(), SERVER).model_dump(exclude_unset=True)
    assert set(dumped) == {"tracing"}
    assert set(dumped["tracing"]) == {"otlp_endpoint", "query_url"}


def test_a_busy_port_names_the_option_that_moves_it() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(BackendError, match=f"port {port} .* in use .* --tracing-port"):
            check_port_free(port, "Phoenix's UI", "--tracing-port")


def test_without_the_phoenix_venv_up_tracing_is_one_line_naming_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    monkeypatch.setattr(backend, "phoenix_python", lambda: tmp_path / "no-venv" / "python")
    result = CliRunner().invoke(main, ["up", "--tracing", "--model", "tiny-qwen2"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert result.output.startswith("error: Phoenix is not installed")
    assert "make install-tracing" in result.output
    assert "Traceback" not in result.output


def test_no_local_phoenix_without_a_state_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    assert backend.running_local() is None
    assert backend.stop_local() is False


def test_a_stale_pid_is_not_taken_for_phoenix(tmp_path: Path, monkeypatch) -> None:
    """The state names our own pid (alive, but not the launcher): not Phoenix, not stopped."""
    import os

    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    backend.local_dir().mkdir()
    backend.state_file().write_text(
        f'{{"pid": {os.getpid()}, "port": 1, "grpc_port": 2, "working_dir": "{tmp_path}"}}'
    )
    assert backend.running_local() is None
    assert backend.stop_local() is False
    assert not backend.state_file().exists()


@pytest.mark.parametrize(
    ("given", "bound"),
    [
        ("[::]:4317", "127.0.0.1:4317"),
        ("0.0.0.0:4317", "127.0.0.1:4317"),
        ("127.0.0.1:4317", "127.0.0.1:4317"),
        ("localhost:9", "localhost:9"),
    ],
)
def test_the_launcher_binds_phoenixs_grpc_server_to_loopback(given: str, bound: str) -> None:
    assert loopback_address(given) == bound


def test_the_launchers_grpc_servers_rewrite_both_port_calls() -> None:
    calls = []

    def make_server(**_: object) -> SimpleNamespace:
        return SimpleNamespace(
            add_insecure_port=lambda address: calls.append(("insecure", address)),
            add_secure_port=lambda address, creds: calls.append(("secure", address, creds)),
        )

    server = on_loopback(make_server)(options=())
    server.add_insecure_port("[::]:4317")
    server.add_secure_port("[::]:4318", "creds")
    assert calls == [("insecure", "127.0.0.1:4317"), ("secure", "127.0.0.1:4318", "creds")]
