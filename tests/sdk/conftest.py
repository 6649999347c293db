"""Starts real `splash serve` processes on loopback ports for the SDK tests.

The binary comes from $SPLASH_BIN (set by crates/splash-cli/tests/sdk.rs, which `cargo test`
runs), else target/release/splash.
"""

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SPLASH_BIN", str(ROOT / "target" / "release" / "splash"))


class Server:
    """A running `splash serve`; `url` is its base URL, `log` what it printed."""

    def __init__(self, *args, env=None):
        self.args = ["serve", "--model", "demo", "--port", "0", *args]
        self.proc = subprocess.Popen(
            [BIN, *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines = []
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"Ready: (http://\S+)", line)
                if m:
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or not hasattr(self, "url"):
            self.stop()
            raise RuntimeError("splash did not become ready:\n" + self.log)
        self.port = int(self.url.rsplit(":", 1)[1])

    @property
    def log(self):
        return "".join(self.lines)

    def client(self, **kw):
        return httpx.Client(base_url=self.url, timeout=60, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def server():
    s = Server("--served-model-name", "splash-alias")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def keyed_server():
    s = Server("--api-key", "sekret-key", "--allowed-origin", "http://app.example:3000")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def small_server():
    s = Server("--max-context", "64")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def busy_server():
    s = Server("--queue-size", "0")
    yield s
    s.stop()


def wait_until(pred, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False
