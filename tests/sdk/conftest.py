"""Real `splash serve` processes on loopback ports for the SDK tests (`splash_server.Server`)."""

import time

import pytest

from splash_server import BIN, ROOT, Server  # noqa: F401 (BIN and ROOT: used by the tests)


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
