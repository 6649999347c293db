"""A `splash serve` process on a loopback port: for the SDK tests (conftest.py) and the
scripts under bench/ that drive a real server.

The binary comes from $SPLASH_BIN (set by crates/splash-cli/tests/sdk.rs, which `cargo test`
runs), else target/release/splash.
"""

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SPLASH_BIN", str(ROOT / "target" / "release" / "splash"))


class Server:
    """A running `splash serve --model MODEL --port 0 ARGS` (the demo unless `model` says);
    `url` is its base URL, `log` what it printed."""

    def __init__(self, *args, env=None, binary=None, ready_timeout=60, model="demo", argv=None):
        # `argv`: another command line instead of `serve --model MODEL` (serve-multi).
        self.args = [*(argv or ["serve", "--model", model]), "--port", "0", *args]
        self.proc = subprocess.Popen(
            [binary or BIN, *self.args],
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
                # At the start of a line: serve-multi relays its engines' lines after a prefix.
                m = re.match(r"Ready: (http://\S+)", line)
                if m and not ready.is_set():
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(ready_timeout) or not hasattr(self, "url"):
            self.stop()
            raise RuntimeError("splash did not become ready:\n" + self.log)
        self.port = int(self.url.rsplit(":", 1)[1])

    @property
    def log(self):
        return "".join(self.lines)

    def client(self, **kw):
        return httpx.Client(base_url=self.url, timeout=60, **kw)

    def alive(self):
        return self.proc.poll() is None

    def rss_mib(self):
        """The process's resident memory now."""
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
