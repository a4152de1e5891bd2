"""The single-file ``natsjs-server`` binary (packaging/, ``make binary``).

The module builds the binary once with PyInstaller from packaging/natsjs-server.spec,
into a temporary folder (so it neither needs nor touches dist/), then runs it as a
deployment would: with an empty environment (``env -i PATH=/usr/bin:/bin``) from a
folder outside the repository, so no venv, PYTHONPATH or source tree can help it.

Building takes about 20-40 s on the 2-core CI machine, so it runs on every ``make test``.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import natsjs
from conftest import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(REPO, "packaging", "natsjs-server.spec")
CORE = os.path.join(REPO, "natsjs", "_core")
BUILD_TIMEOUT = 280.0  # pytest's own timeout (pyproject) is 300 s per test
TIMEOUT = 20.0
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}

LISTEN_RE = re.compile(rb"Listening for client connections on 127\.0\.0\.1:(\d+)")
HTTP_RE = re.compile(rb"Starting http monitor on [^\s:]+:(\d+)")
READY_RE = re.compile(rb"Server is ready")
EXITING_RE = re.compile(rb"Server Exiting")
PID_RE = re.compile(rb"^\[(\d+)\] ", re.M)


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> str:
    """Build dist/natsjs-server into a temporary folder; its path."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        pytest.fail("PyInstaller is not installed: pip install -e '.[binary]' "
                    "(or `make binary`, which installs it)")
    root = tmp_path_factory.mktemp("pyinstaller")
    dist, work = root / "dist", root / "work"
    # Its own cache folder: a concurrent `make binary --clean` cannot empty it mid-build.
    env = dict(os.environ, PYINSTALLER_CONFIG_DIR=str(root / "cache"))
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
           "--distpath", str(dist), "--workpath", str(work), SPEC]
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=BUILD_TIMEOUT)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, "PyInstaller failed:\n" + out
    assert sorted(os.listdir(dist)) == ["natsjs-server"], "onefile: one file in dist/"
    path = str(dist / "natsjs-server")
    assert os.access(path, os.X_OK)
    return path


@pytest.fixture
def outside(tmp_path) -> str:
    """A working folder outside the repository (and so outside its source tree)."""
    d = tmp_path / "run"
    d.mkdir()
    assert not str(d).startswith(REPO + os.sep)
    return str(d)


def BinaryServer(binary: str, cwd: str, *args: str) -> ServerProcess:
    """The binary started with an empty environment, outside the repository."""
    return ServerProcess([binary, *args], env=CLEAN_ENV, args=list(args), cwd=cwd)


def run_binary(binary: str, cwd: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], cwd=cwd, env=CLEAN_ENV, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)


def read_until(sock: socket.socket, done, timeout: float = TIMEOUT) -> bytes:
    """Read from ``sock`` until ``done(data)`` is true; fail on timeout or EOF."""
    data = b""
    deadline = time.monotonic() + timeout
    while not done(data):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("timed out; read so far: %r" % data)
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("connection closed; read so far: %r" % data)
        data += chunk
    return data


def test_binary_contains_every_core_module_and_lazy_import(binary):
    from PyInstaller.archive.readers import CArchiveReader

    archive = CArchiveReader(binary)
    bundled = {name.split("/")[-1].split(".")[0] for name in archive.toc
               if name.startswith("natsjs/_core/") and name.endswith(".so")}
    pyx = {name[:-4] for name in os.listdir(CORE) if name.endswith(".pyx")}
    assert pyx >= {"parser", "sublist", "fanout", "s2"}
    assert bundled == pyx, "natsjs/_core/*.pyx %s, bundled extension modules %s" % (
        sorted(pyx), sorted(bundled))
    modules = set(archive.open_embedded_archive("PYZ.pyz").toc)
    for lazy in ("natsjs.server", "natsjs.monitor", "natsjs.config", "natsjs.conf",
                 "h11", "trio._core._io_epoll"):
        assert lazy in modules, lazy
    # Nothing from the venv's test and bench tools.
    assert not {m for m in modules if m.split(".")[0] in
                ("pytest", "_pytest", "hypothesis", "pyspark", "pandas", "numpy", "PIL")}


def test_version_with_empty_environment(binary, outside):
    r = run_binary(binary, outside, "-v")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "natsjs-server: v%s (NATS %s)\n" % (
        natsjs.__version__, natsjs.NATS_VERSION)


def test_config_file_is_parsed(binary, outside):
    """``-t -c`` loads natsjs.config and natsjs.conf, which only a config file imports."""
    good = os.path.join(outside, "good.conf")
    with open(good, "w") as f:
        f.write("# deployment\nport: 4333\nmax_payload: 2MB\n")
    r = run_binary(binary, outside, "-t", "-c", good)
    assert r.returncode == 0, r.stderr
    assert b"is valid" in r.stderr
    bad = os.path.join(outside, "bad.conf")
    with open(bad, "w") as f:
        f.write("port: {\n")
    r = run_binary(binary, outside, "-t", "-c", bad)
    assert r.returncode == 1, (r.stdout, r.stderr)


def test_serves_clients_and_monitoring_with_no_python_environment(binary, outside):
    server = BinaryServer(binary, outside, "-p", "-1", "-a", "127.0.0.1", "-m", "-1")
    try:
        port = int(server.wait_for(LISTEN_RE).group(1))
        http_port = int(server.wait_for(HTTP_RE).group(1))
        server.wait_for(READY_RE)

        # The Python that runs is the one unpacked from the binary, not the build
        # machine's: libpython is mapped from the onefile's extraction folder.
        child = int(PID_RE.search(server.log).group(1))
        with open("/proc/%d/maps" % child) as f:
            libpython = {line.split()[-1] for line in f if "libpython" in line}
        assert libpython, "no libpython mapped in the server process"
        (lib,) = libpython
        extracted = os.path.dirname(lib)
        assert os.path.basename(extracted).startswith("_MEI"), lib
        assert not lib.startswith(os.path.realpath(sys.prefix)), lib

        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            info = read_until(sock, lambda d: d.endswith(b"\r\n"))
            assert info.startswith(b"INFO {"), info
            assert json.loads(info[5:])["port"] == port
            sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n'
                         b"SUB deploy.check 1\r\n"
                         b"PUB deploy.check 5\r\nhello\r\n"
                         b"PING\r\n")
            data = read_until(sock, lambda d: b"PONG\r\n" in d)
            assert b"-ERR" not in data, data
            assert b"MSG deploy.check 1 5\r\nhello\r\n" in data, data
            assert data.index(b"MSG") < data.index(b"PONG"), data

        with urllib.request.urlopen("http://127.0.0.1:%d/varz" % http_port,
                                    timeout=TIMEOUT) as resp:
            assert resp.status == 200
            varz = json.loads(resp.read())
        assert varz["port"] == port
        assert varz["http_port"] == http_port
        assert varz["in_msgs"] >= 1

        assert server.stop(signal.SIGTERM) == 0, server.text()
        server.wait_for(EXITING_RE, timeout=1)
        assert not os.path.exists(extracted), "the onefile extraction folder is left behind"
    finally:
        server.stop(signal.SIGKILL)
