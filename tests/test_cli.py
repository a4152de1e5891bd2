"""The command line as a user runs it: ``python -m natsjs`` and ``natsjs-server``.

Servers are real processes; nothing sleeps to synchronise: the tests wait for log
lines (``ServerProcess.wait_for``), socket reads with timeouts, process exit, or a
condition on /proc with a deadline.
"""
from __future__ import annotations

import datetime
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

from conftest import ServerProcess, reference_server_binary, start_natsjs, start_reference

BIN = os.path.dirname(sys.executable)
SCRIPT = os.path.join(BIN, "natsjs-server")
MODULE = [sys.executable, "-m", "natsjs"]
RUN_TIMEOUT = 30

LOG_LINE_RE = re.compile(
    r"^\[(\d+)\] \d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{6} \[(INF|WRN|ERR|FTL|DBG|TRC)\] ")
READY_RE = re.compile(rb"Server is ready")
EXIT_RE = re.compile(rb"Server Exiting\.\.")


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL,
                          **kw)


def start_script(*args: str) -> ServerProcess:
    """``natsjs-server`` (the console script) on a free port."""
    args = ["-a", "127.0.0.1", "-p", "-1", *args]
    return ServerProcess([SCRIPT] + list(args), args=list(args)).start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Raw:
    """Minimal raw client: INFO on connect, PING/PONG, read to EOF."""

    def __init__(self, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.info = json.loads(self.read_until(b"\r\n")[5:])

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(self.buf)
            self.buf += data
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def ping(self) -> bytes:
        self.send(b"PING\r\n")
        return self.read_until(b"PONG\r\n")

    def read_until_eof(self) -> bytes:
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                out, self.buf = self.buf, b""
                return out
            self.buf += data

    def close(self) -> None:
        self.sock.close()


def catches_sigterm(pid: int) -> bool:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def wait_signal_handlers(s: ServerProcess, timeout: float = 10.0) -> None:
    """Block until the process has installed its SIGTERM handler (/proc SigCgt)."""
    deadline = time.monotonic() + timeout
    while not catches_sigterm(s.proc.pid):
        assert s.alive(), s.text()
        assert time.monotonic() < deadline, "SIGTERM is never caught:\n" + s.text()
        time.sleep(0.005)


def http_get(port: int, path: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read()


# ---------------------------------------------------------------------------
# -v, -h, unknown flags
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [MODULE + ["-v"], MODULE + ["--version"], [SCRIPT, "-v"],
                                  [SCRIPT, "--version"]],
                         ids=["module-v", "module--version", "script-v", "script--version"])
def test_version(argv):
    p = run(argv)
    assert p.returncode == 0, p.stderr
    out = (p.stdout + p.stderr).decode()
    assert re.search(r"v?\d+\.\d+\.\d+", out), out
    assert "Traceback" not in out


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(flag):
    p = run(MODULE + [flag])
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert "Usage" in out and "--port" in out, out
    for opt in ("--addr", "--http_port", "--config", "--pid", "--log", "--debug", "--trace",
                "--version", "--help"):
        assert opt in out, opt


@pytest.mark.parametrize("argv", [["--bogus"], ["-Z"], ["-p", "notaport"]])
def test_bad_flags_exit_non_zero_with_usage(argv):
    p = run(MODULE + argv)
    assert p.returncode != 0
    err = (p.stderr + p.stdout).decode()
    assert "Usage" in err, err
    assert "Traceback" not in err, err
    # (the reference prints its usage too, but exits 0)


# ---------------------------------------------------------------------------
# Starting: -p -1, the log format, -D, -V, -DV
# ---------------------------------------------------------------------------

def test_random_port_and_log_format():
    s = start_script()
    try:
        text = s.text()
        assert "Listening for client connections on 127.0.0.1:%d" % s.port in text
        assert "Server is ready" in text
        lines = text.splitlines()
        assert lines
        for line in lines:
            m = LOG_LINE_RE.match(line)
            assert m, line
            assert int(m.group(1)) == s.proc.pid, line
        c = Raw(s.port)
        assert c.info["port"] == s.port
        assert c.ping() == b"PONG\r\n"
        c.close()
        wait_signal_handlers(s)  # see test_signal_right_after_listening
    finally:
        rc = s.stop()
    assert rc == 0, s.text()


def test_log_timestamps_are_now():
    s = start_natsjs()
    try:
        line = next(l for l in s.text().splitlines() if "Server is ready" in l)
        stamp = re.match(r"^\[\d+\] (\S+ \S+) ", line).group(1)
        t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f")
        assert abs((datetime.datetime.now() - t).total_seconds()) < 120
    finally:
        s.stop()


CREATED_RE = re.compile(rb"\[DBG\] 127\.0\.0\.1:(\d+) - cid:(\d+) - Client connection created")
CLOSED_RE = re.compile(rb"\[DBG\] 127\.0\.0\.1:\d+ - cid:\d+ - .*Client connection closed")


@pytest.mark.parametrize("which", ["natsjs", "reference"])
def test_debug_shows_client_connections(which):
    s = (start_natsjs if which == "natsjs" else start_reference)("-D")
    try:
        c = Raw(s.port)
        c.ping()
        local_port = c.sock.getsockname()[1]
        m = s.wait_for(CREATED_RE, timeout=10)
        assert int(m.group(1)) == local_port
        assert int(m.group(2)) == c.info["client_id"]
        c.close()
        s.wait_for(CLOSED_RE, timeout=10)
        assert b"[TRC]" not in s.log
    finally:
        s.stop()


TRACE_PUB_RE = re.compile(
    rb"\[TRC\] 127\.0\.0\.1:\d+ - cid:\d+ - (?:\"[^\"]*\" - )?<<- \[PUB cli\.t 2\]")


@pytest.mark.parametrize("flags", [["-V"], ["--trace"], ["-DV"], ["-D", "-V"]],
                         ids=["V", "trace", "DV", "D-V"])
def test_trace_shows_protocol(flags):
    s = start_natsjs(*flags)
    try:
        c = Raw(s.port)
        c.send(b'CONNECT {"verbose":false}\r\nSUB cli.t 1\r\nPUB cli.t 2\r\nhi\r\n')
        c.ping()
        s.wait_for(TRACE_PUB_RE, timeout=10)
        s.wait_for(re.compile(rb"\[TRC\] .*<<- \[SUB cli\.t 1\]"), timeout=10)
        s.wait_for(re.compile(rb"\[TRC\] .*<<- \[PING\]"), timeout=10)
        debug = "-D" in flags or "-DV" in flags
        if debug:
            s.wait_for(CREATED_RE, timeout=10)
        else:
            assert b"[DBG]" not in s.log
        c.close()
    finally:
        s.stop()


def test_reference_trace_format_matches():
    """The regex the trace test uses also matches the reference's trace line."""
    s = start_reference("-V")
    try:
        c = Raw(s.port)
        c.send(b'CONNECT {"verbose":false}\r\nPUB cli.t 2\r\nhi\r\n')
        c.ping()
        s.wait_for(TRACE_PUB_RE, timeout=10)
        c.close()
    finally:
        s.stop()


@pytest.mark.parametrize("which", [
    "reference",
    "natsjs",
])
def test_trace_payloads_and_outbound(which):
    s = (start_natsjs if which == "natsjs" else start_reference)("-V")
    try:
        c = Raw(s.port)
        c.send(b'CONNECT {"verbose":false}\r\nSUB cli.t 1\r\nPUB cli.t 2\r\nhi\r\n')
        c.ping()
        s.wait_for(re.compile(rb"\[TRC\] .*<<- \[PING\]"), timeout=10)
        c.close()
    finally:
        s.stop()
    log = s.text()
    for want in ('<<- MSG_PAYLOAD: ["hi"]', "->> [MSG cli.t 1 2]", '->> MSG_PAYLOAD: ["hi"]',
                 "->> [PONG]"):
        assert want in log, want


# ---------------------------------------------------------------------------
# Port in use
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["natsjs", "reference"])
def test_port_in_use_is_fatal(which):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        exe = MODULE if which == "natsjs" else [reference_server_binary()]
        p = run(exe + ["-a", "127.0.0.1", "-p", str(port)])
    assert p.returncode != 0
    err = p.stderr.decode() + p.stdout.decode()
    ftl = [l for l in err.splitlines() if "[FTL]" in l]
    assert ftl, err
    assert LOG_LINE_RE.match(ftl[0]), ftl[0]
    assert str(port) in ftl[0]
    assert "Traceback" not in err


# ---------------------------------------------------------------------------
# -P pidfile, -l logfile
# ---------------------------------------------------------------------------

def test_pidfile_written_and_removed(tmp_path):
    pidfile = tmp_path / "natsjs.pid"
    s = start_natsjs("-P", str(pidfile))
    try:
        assert pidfile.read_text().strip() == str(s.proc.pid)
        wait_signal_handlers(s)
    finally:
        rc = s.stop(signal.SIGTERM)
    assert rc == 0, s.text()
    assert not pidfile.exists()


def _wait_file(path, pattern: re.Pattern, proc, timeout=20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        m = pattern.search(text)
        if m:
            return text
        assert proc.poll() is None, "exited %s: %s" % (proc.returncode, text)
        assert time.monotonic() < deadline, "no %r in %s:\n%s" % (pattern.pattern, path, text)
        time.sleep(0.01)


@pytest.mark.parametrize("flag", ["-l", "--log"])
def test_logfile(tmp_path, flag):
    logfile = tmp_path / "natsjs.log"
    proc = subprocess.Popen(MODULE + ["-a", "127.0.0.1", "-p", "-1", flag, str(logfile)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        text = _wait_file(logfile, re.compile(r"Listening for client connections on "
                                              r"127\.0\.0\.1:(\d+)[\s\S]*Server is ready"), proc)
        port = int(re.search(r"127\.0\.0\.1:(\d+)", text).group(1))
        c = Raw(port)
        assert c.ping() == b"PONG\r\n"
        c.close()
        for line in text.splitlines():
            assert LOG_LINE_RE.match(line), line
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    # nothing but the log file got the log
    assert b"Server is ready" not in err + out
    assert "Server is ready" in logfile.read_text()


# ---------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_graceful_shutdown(sig):
    s = start_natsjs()
    c = None
    try:
        c = Raw(s.port)
        c.send(b'CONNECT {"verbose":false}\r\nSUB sig.a 1\r\n')
        assert c.ping() == b"PONG\r\n"
        wait_signal_handlers(s)
        s.proc.send_signal(sig)
        # the server closes the client connection
        assert c.read_until_eof() == b""
        assert s.proc.wait(20) == 0, s.text()
    finally:
        if c is not None:
            c.close()
        s.stop()
    s.wait_for(EXIT_RE, timeout=5)
    text = s.text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text


def _signal_at_listening(argv: list[str], sig: int) -> tuple[int, bytes]:
    """Start a server and signal it the moment it logs that it listens for clients.

    The log is read straight from the pipe in this thread, so the signal follows the
    line by microseconds: the server accepts connections from that line on.
    """
    p = subprocess.Popen(argv + ["-a", "127.0.0.1", "-p", "-1"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        log = b""
        while b"Listening for client connections" not in log:
            data = os.read(p.stdout.fileno(), 65536)
            if not data:
                break
            log += data
        p.send_signal(sig)
        out, _ = p.communicate(timeout=20)
        return p.returncode, log + out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("which", [
    "reference",
    "natsjs",
])
def test_signal_right_after_listening(which):
    """A signal sent as soon as the server listens is handled gracefully (exit 0).

    Without handlers in place in time each attempt fails ~3 times out of 4, so ten
    attempts make a pass with such a gap practically impossible.
    """
    argv = MODULE if which == "natsjs" else [reference_server_binary()]
    for attempt in range(10):
        sig = signal.SIGTERM if attempt % 2 == 0 else signal.SIGINT
        rc, log = _signal_at_listening(argv, sig)
        assert rc == 0, (signal.Signals(sig).name, rc, log.decode(errors="replace")[-2000:])
        assert b"Server Exiting.." in log and b"Traceback" not in log


# ---------------------------------------------------------------------------
# Monitoring: /varz, /healthz
# ---------------------------------------------------------------------------

VARZ_CORE = ["server_id", "server_name", "version", "proto", "host", "port", "max_connections",
             "ping_interval", "ping_max", "http_host", "http_port", "max_control_line",
             "max_payload", "max_pending", "tls_timeout", "write_deadline", "start", "now",
             "uptime", "mem", "cores", "cpu", "connections", "total_connections", "routes",
             "remotes", "leafnodes", "in_msgs", "out_msgs", "in_bytes", "out_bytes",
             "slow_consumers", "subscriptions"]
# Values both servers must agree on for a default configuration.
VARZ_SAME = ["proto", "host", "max_connections", "ping_interval", "ping_max", "http_host",
             "max_control_line", "max_payload", "max_pending", "tls_timeout", "write_deadline",
             "routes", "remotes", "leafnodes"]


def _kind(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


@pytest.fixture(scope="module")
def monitored():
    """natsjs with -m on a port we chose, and the reference with -m too."""
    n = start_natsjs("-m", str(free_port()))
    try:
        r = start_reference("-m", str(free_port()))
    except BaseException:
        n.stop()
        raise
    yield n, r
    n.stop()
    r.stop()


def test_varz_keys_and_types_match_reference(monitored):
    n, r = monitored
    status, ctype, body = http_get(n.http_port, "/varz")
    assert status == 200 and "application/json" in ctype
    got = json.loads(body)
    want = json.loads(http_get(r.http_port, "/varz")[2])
    missing = [k for k in VARZ_CORE if k not in got]
    assert not missing, missing
    assert all(k in want for k in VARZ_CORE)
    kinds = {k: (_kind(got[k]), _kind(want[k])) for k in VARZ_CORE}
    assert {k: v for k, v in kinds.items() if v[0] != v[1]} == {}
    for k in VARZ_SAME:
        assert got[k] == want[k], (k, got[k], want[k])
    assert got["port"] == n.port and got["http_port"] == n.http_port
    for k in ("start", "now"):
        datetime.datetime.fromisoformat(got[k].replace("Z", "+00:00"))
    assert re.fullmatch(r"(\d+[ydhms])+", got["uptime"]), got["uptime"]
    version = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", got["version"]).groups())
    assert version >= (2, 10), got["version"]


def test_varz_counts(monitored):
    n, _ = monitored
    before = json.loads(http_get(n.http_port, "/varz")[2])
    c = Raw(n.port)
    c.send(b'CONNECT {"verbose":false}\r\nSUB cnt.a 1\r\n'
           b"PUB cnt.a 3\r\nabc\r\nPUB cnt.a 2\r\nde\r\n")
    got = c.ping()
    assert got.count(b"MSG cnt.a 1 ") == 2
    v = json.loads(http_get(n.http_port, "/varz")[2])
    assert v["connections"] == before["connections"] + 1
    assert v["total_connections"] == before["total_connections"] + 1
    assert v["in_msgs"] == before["in_msgs"] + 2
    assert v["out_msgs"] == before["out_msgs"] + 2
    assert v["in_bytes"] == before["in_bytes"] + 5
    assert v["out_bytes"] == before["out_bytes"] + 5
    assert v["subscriptions"] == before["subscriptions"] + 1
    c.close()
    # once the server has seen the close, the totals stay and the gauges drop
    deadline = time.monotonic() + 10
    while True:
        after = json.loads(http_get(n.http_port, "/varz")[2])
        if after["connections"] == before["connections"]:
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.01)
    assert after["in_msgs"] == v["in_msgs"] and after["out_bytes"] == v["out_bytes"]
    assert after["subscriptions"] == before["subscriptions"]
    assert after["total_connections"] == v["total_connections"]


def test_healthz(monitored):
    n, r = monitored
    status, ctype, body = http_get(n.http_port, "/healthz")
    assert status == 200 and "application/json" in ctype
    assert json.loads(body) == {"status": "ok"}
    assert json.loads(http_get(r.http_port, "/healthz")[2]) == {"status": "ok"}


def test_monitor_log_line(monitored):
    n, _ = monitored
    assert "Starting http monitor on 127.0.0.1:%d" % n.http_port in n.text()


# ---------------------------------------------------------------------------
# -c config file, --max_payload, -n
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["natsjs", "reference"])
def test_config_file(tmp_path, which):
    port = free_port()
    conf = tmp_path / "server.conf"
    conf.write_text("# a config file\nport: %d\nserver_name: cli-test-server\n"
                    "max_payload: 512KB\n" % port)
    exe = MODULE if which == "natsjs" else [reference_server_binary()]
    args = ["-a", "127.0.0.1", "-c", str(conf)]
    s = ServerProcess(exe + args, args=args).start()
    try:
        assert s.port == port
        c = Raw(port)
        assert c.info["server_name"] == "cli-test-server"
        assert c.info["max_payload"] == 512 * 1024
        assert c.info["port"] == port
        c.send(b"PUB cfg.a %d\r\n" % (512 * 1024 + 1))
        assert c.read_until(b"\r\n") == b"-ERR 'Maximum Payload Violation'\r\n"
        c.close()
    finally:
        s.stop()


def test_flags_override_config_file(tmp_path):
    conf = tmp_path / "server.conf"
    conf.write_text("port: 1\nserver_name: from-file\n")
    s = start_natsjs("-c", str(conf), "-n", "from-flag")  # conftest adds -p -1
    try:
        c = Raw(s.port)
        assert c.info["server_name"] == "from-flag"
        c.close()
    finally:
        s.stop()


@pytest.mark.parametrize("value,size", [("1000", 1000), ("2KB", 2048)])
def test_max_payload_flag(value, size):
    s = start_natsjs("--max_payload", value)
    try:
        c = Raw(s.port)
        assert c.info["max_payload"] == size
        c.send(b'CONNECT {"verbose":false}\r\nSUB mp.a 1\r\nPUB mp.a %d\r\n%s\r\n'
               % (size, b"x" * size))
        assert c.ping().startswith(b"MSG mp.a 1 %d\r\n" % size)
        c.send(b"PUB mp.a %d\r\n" % (size + 1))
        assert c.read_until_eof() == b"-ERR 'Maximum Payload Violation'\r\n"
        c.close()
    finally:
        s.stop()


def test_server_name_flag():
    s = start_script("-n", "named-by-flag")
    try:
        c = Raw(s.port)
        assert c.info["server_name"] == "named-by-flag"
        c.close()
    finally:
        s.stop()


def test_invalid_config_file_exits_non_zero(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("port: {\n")
    p = run(MODULE + ["-c", str(conf)])
    assert p.returncode != 0
    assert "Traceback" not in p.stderr.decode(), p.stderr.decode()
