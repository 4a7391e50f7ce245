"""A real Prometheus (Debian package) on loopback, scraping the test platform's metrics endpoint."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import httpx
import yaml


def scrape_config(metrics_url: str) -> dict:
    target = urlparse(metrics_url)
    return {
        # Ray exports every 2 s (serving.config.ray_env.ray_env): scraping faster gains nothing, and a 1 s
        # scrape timeout can miss Ray's endpoint while the rest of the suite loads both cores.
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": "ray",
                "metrics_path": target.path,
                "static_configs": [{"targets": [target.netloc]}],
            }
        ],
    }


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict]:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The first sample's value, or None when the series does not exist (yet)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def series_names(self) -> set[str]:
        body = httpx.get(f"{self.url}/api/v1/label/__name__/values", timeout=10).json()
        return set(body["data"])


@contextmanager
def running_prometheus(metrics_url: str, workdir: Path, port: int) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (the Makefile's system-deps installs it)"
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(metrics_url)))
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield Prometheus(url)
    finally:
        process.terminate()
        process.wait(timeout=30)
