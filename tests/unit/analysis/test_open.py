"""`llm-serving analyze open`: the console's URL from the running platform or a config, opened in
a browser where one exists, and a plain note (no traceback) where none does."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from serving.cli import main
from serving.local import platform as local


def analyze_open(*args: str) -> Result:
    return CliRunner().invoke(main, ["analyze", "open", *args])


def running(url: str | None) -> local.Endpoints:
    return local.Endpoints(
        api_url="",
        health_url="",
        dashboard_url="",
        metrics_url="",
        model="m",
        apps=[],
        analysis_url=url,
    )


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    urls: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: urls.append(url) or True)
    return urls


def test_prints_and_opens_the_running_platforms_console(
    monkeypatch: pytest.MonkeyPatch, opened: list[str]
) -> None:
    monkeypatch.setattr(local, "load_state", lambda: running("http://127.0.0.1:9100/analysis"))
    result = analyze_open()
    assert result.exit_code == 0 and result.output == "http://127.0.0.1:9100/analysis\n"
    assert opened == ["http://127.0.0.1:9100/analysis"]


def test_without_a_running_platform_the_default_configs_url(
    monkeypatch: pytest.MonkeyPatch, opened: list[str]
) -> None:
    monkeypatch.setattr(local, "load_state", lambda: None)
    result = analyze_open("--no-browser")
    assert result.exit_code == 0 and result.output == "http://127.0.0.1:8000/analysis\n"
    assert opened == []


def test_config_names_host_port_and_prefix(tmp_path: Path, opened: list[str]) -> None:
    config = tmp_path / "platform.yaml"
    config.write_text(
        yaml.safe_dump({"http": {"port": 8123}, "analysis": {"route_prefix": "/look/"}})
    )
    result = analyze_open("--config", str(config), "--no-browser")
    assert result.output == "http://127.0.0.1:8123/look\n"


@pytest.mark.parametrize("outcome", ["refused", "error"])
def test_no_browser_is_a_note_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    def no_browser(url: str) -> bool:
        if outcome == "error":
            raise webbrowser.Error("could not locate runnable browser")
        return False

    monkeypatch.setattr(local, "load_state", lambda: running("http://127.0.0.1:8000/analysis"))
    monkeypatch.setattr(webbrowser, "open", no_browser)
    result = analyze_open()
    assert result.exit_code == 0 and result.stdout == "http://127.0.0.1:8000/analysis\n"
    assert "no browser found here" in result.stderr and "Traceback" not in result.stderr


def test_analysis_off_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "load_state", lambda: running(None))
    result = analyze_open()
    assert result.exit_code == 2 and "analysis.enabled: false" in result.output
