"""Debian's headless Chromium driven over its DevTools protocol (one websocket, `websockets` from
the dev dependencies): open a page, wait for what its scripts draw, type and click as a person
would, read values back and take screenshots. No network but loopback: the pages must draw offline."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

CHROMIUM = "/usr/bin/chromium"
# Everything but loopback fails to resolve: a page that needs a CDN shows it at once.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
START_TIMEOUT_S = 60.0


class BrowserError(RuntimeError):
    """A DevTools command failed, or the page's script threw."""


class Page:
    """One tab. Commands are sent one at a time; events in between are skipped."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.last_id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        self.socket.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=120))
            if message.get("id") == self.last_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message["result"]

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The expression's value (promises awaited), as JSON-able data."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details["text"])
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 120.0) -> Any:
        """Poll until the expression is truthy; its value. Fails with the page's messages."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(BrowserError):  # the page may still be loading
                value = self.evaluate(expression)
                if value:
                    return value
            time.sleep(0.2)
        messages = self.evaluate(
            "[...document.querySelectorAll('.message')].map(m => m.textContent)"
        )
        raise AssertionError(f"timed out waiting for {expression}; page messages: {messages}")

    def type_into(self, selector: str, text: str) -> None:
        """Replace a field's text by typing: the page gets the input events a keyboard sends."""
        self.evaluate(
            f"(e => {{ e.focus(); e.value = ''; }})(document.querySelector({json.dumps(selector)}))"
        )
        self.send("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def screenshot(self, selector: str, path: Path) -> Path:
        """A PNG of one element, whole even where it reaches below the window."""
        rect = self.evaluate(
            f"(r => ({{x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}}))"
            f"(document.querySelector({json.dumps(selector)}).getBoundingClientRect())"
        )
        shot = self.send(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={**rect, "scale": 1},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


def devtools_port(profile: Path, process: subprocess.Popen) -> int:
    """Chromium writes the port it picked (--remote-debugging-port=0) into the profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrowserError(f"chromium exited with {process.returncode} at start")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(marker.read_text().splitlines()[0])
        time.sleep(0.1)
    raise BrowserError("chromium did not open its DevTools port")


def page_socket_url(port: int) -> str:
    targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


def chromium_command(profile: Path, width: int, height: int) -> list[str]:
    browser = shutil.which("chromium") or CHROMIUM
    if not Path(browser).exists():
        pytest.fail("chromium is not installed; `make system-deps` installs Debian's package")
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        OFFLINE,
        "--remote-debugging-port=0",
        f"--window-size={width},{height}",
        "about:blank",
    ]


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM to the browser and its helpers, SIGKILL to whatever is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Page]:
    """A headless Chromium with one tab, closed (and its profile removed) afterwards."""
    # Chromium's helpers (renderer, crashpad) can still write into the profile for a moment after
    # the browser exits: kill its whole process group, and let a late file not fail the test.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile_dir:
        profile = Path(profile_dir)
        process = subprocess.Popen(
            chromium_command(profile, width, height),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = page_socket_url(devtools_port(profile, process))
            with connect(url, max_size=None, open_timeout=30) as socket:
                page = Page(socket)
                page.send("Page.enable")
                yield page
        finally:
            stop_process_group(process)
