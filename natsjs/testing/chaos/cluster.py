"""The cluster under test: N server processes on their own loopback addresses.

Node i (0-based) is server ``n<i+1>`` on ``127.0.<b>.<i+1>``, where ``b`` is drawn from the
run's seed and checked free, with its client, cluster and monitoring ports and a
JetStream store of its own.  Its routes go through the relays of ``netproxy`` (one per
ordered pair of nodes) so that partitions can be made without privileges; the store may
sit on a ``lossyfs`` mount so that a power loss can be simulated.  The configuration is
written in the syntax both servers read, so the same ``ChaosCluster`` runs natsjs and the
reference nats-server: only ``server_cmd`` differs.

Every process this module starts (servers, the relay process, file systems) is recorded,
and ``close()`` ends exactly those, resuming paused ones first; nothing is ever looked up
or killed by name.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from natsjs.testing.chaos.netproxy import ChaosNet

SYS_USER = "admin"
SYS_PASS = "chaos"
APP_USER = "app"
READY = b"Server is ready"


def _free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports free on ``host`` (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pick_subnet(rng: random.Random, tries: int = 50) -> int:
    """A third octet ``b`` whose 127.0.b.1 can be bound (loopback is all of 127/8)."""
    for _ in range(tries):
        b = rng.randrange(64, 250)
        try:
            _free_ports("127.0.%d.1" % b, 1)
            return b
        except OSError:
            continue
    raise RuntimeError("no usable 127.0.x.1 address")


@dataclass
class Node:
    index: int
    host: str
    port: int
    cluster_port: int
    http_port: int
    dead_port: int              # advertised route port where nothing listens
    data_dir: str               # the backing directory of the store
    conf: str = ""
    log: str = ""
    proc: subprocess.Popen | None = None
    paused: bool = False
    starts: int = 0
    log_offset: int = 0         # where the log of the current start begins
    fs: object | None = None    # a lossyfs.Mount when power loss is simulated
    extra_env: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "n%d" % (self.index + 1)

    @property
    def url(self) -> str:
        return "nats://%s:%d" % (self.host, self.port)

    @property
    def store_dir(self) -> str:
        """Where the server keeps its store: the mount when there is one."""
        return self.fs.mountpoint if self.fs is not None else self.data_dir

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ChaosCluster:
    def __init__(self, server_cmd: list[str], workdir: str, nodes: int = 3, seed: int = 0,
                 lossy: bool = False, extra_conf: str = "", start_timeout: float = 60.0):
        self.server_cmd = list(server_cmd)
        self.workdir = os.path.abspath(workdir)
        self.size = nodes
        self.lossy = lossy
        self.extra_conf = extra_conf
        self.start_timeout = start_timeout
        self.rng = random.Random(seed)
        os.makedirs(self.workdir, exist_ok=True)
        b = pick_subnet(self.rng)
        self.nodes: list[Node] = []
        for i in range(nodes):
            host = "127.0.%d.%d" % (b, i + 1)
            self.nodes.append(Node(i, host, *_free_ports(host, 4),
                                   os.path.join(self.workdir, "n%d" % (i + 1))))
        # The relays towards node j listen on an address of their own, 127.0.b.(101+j), so
        # they never take a port the servers were given.
        spec = [(i, j, self.relay_host(j), self.nodes[j].host, self.nodes[j].cluster_port)
                for i in range(nodes) for j in range(nodes) if i != j]
        self.net = ChaosNet(spec)
        self.subnet = b
        self.recorded_pids: list[int] = [self.net.pid]
        for nd in self.nodes:
            os.makedirs(nd.data_dir, exist_ok=True)
            nd.log = os.path.join(self.workdir, "%s.log" % nd.name)
            if lossy:
                from natsjs.testing.chaos.lossyfs import Mount
                nd.fs = Mount(nd.data_dir, os.path.join(self.workdir, "mnt-%s" % nd.name),
                              os.path.join(self.workdir, "%s-fs.log" % nd.name))
            nd.conf = self._write_conf(nd)

    # ---- configuration ------------------------------------------------------------------

    def relay_host(self, j: int) -> str:
        return "127.0.%d.%d" % (int(self.nodes[j].host.split(".")[2]), 101 + j)

    def _write_conf(self, nd: Node) -> str:
        routes = "\n".join("    nats-route://%s:%d" % (self.relay_host(j), self.net.ports[(nd.index, j)])
                           for j in range(self.size) if j != nd.index)
        text = """server_name: %(name)s
listen: %(host)s:%(port)d
http: %(host)s:%(http)d
jetstream { store_dir: %(store)s }
cluster {
  name: chaos
  listen: %(host)s:%(cport)d
  advertise: "%(host)s:%(dead)d"
  routes: [
%(routes)s
  ]
}
accounts {
  $SYS { users = [ { user: %(suser)s, pass: %(spass)s } ] }
  APP { jetstream: enabled, users = [ { user: %(app)s, pass: %(app)s } ] }
}
no_auth_user: %(app)s
%(extra)s
""" % {"name": nd.name, "host": nd.host, "port": nd.port, "http": nd.http_port,
       "store": json.dumps(nd.store_dir), "cport": nd.cluster_port, "dead": nd.dead_port,
       "routes": routes, "suser": SYS_USER, "spass": SYS_PASS, "app": APP_USER,
       "extra": self.extra_conf}
        path = os.path.join(self.workdir, "%s.conf" % nd.name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # ---- processes ----------------------------------------------------------------------

    def start(self, i: int, wait: bool = True) -> None:
        nd = self.nodes[i]
        if nd.alive():
            return
        if nd.fs is not None and not nd.fs.mounted:
            nd.fs.mount()
            self.recorded_pids.append(nd.fs.pid)
        nd.starts += 1
        with open(nd.log, "ab") as logf:
            logf.write(b"---- chaos: start %d ----\n" % nd.starts)
            nd.log_offset = logf.tell()
        env = dict(os.environ, **nd.extra_env)
        with open(nd.log, "ab") as logf:
            nd.proc = subprocess.Popen(self.server_cmd + ["-c", nd.conf], stdin=subprocess.DEVNULL,
                                       stdout=logf, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        nd.paused = False
        self.recorded_pids.append(nd.proc.pid)
        if wait:
            self.wait_started(i)

    def wait_started(self, i: int) -> None:
        """Until the node's current start logged that it is ready."""
        nd = self.nodes[i]
        offset = nd.log_offset
        deadline = time.monotonic() + self.start_timeout
        while True:
            with open(nd.log, "rb") as f:
                f.seek(offset)
                if READY in f.read():
                    return
            if not nd.alive():
                raise RuntimeError("%s exited (%s) while starting: %s (log %s)"
                                   % (nd.name, nd.proc.returncode, self.last_error(i), nd.log))
            if time.monotonic() > deadline:
                raise TimeoutError("%s not ready after %gs; see %s"
                                   % (nd.name, self.start_timeout, nd.log))
            time.sleep(0.05)

    def last_error(self, i: int) -> str:
        """The last line of the node's current start that looks like an error."""
        nd = self.nodes[i]
        with open(nd.log, "rb") as f:
            f.seek(nd.log_offset)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
        for ln in reversed(lines):
            ln = ln.strip("|+- ")
            if ln and ("Error" in ln or "[FTL]" in ln or "[ERR]" in ln):
                return ln[:200]
        return lines[-1][:200] if lines else ""

    def start_all(self) -> None:
        for i in range(self.size):
            self.start(i, wait=False)
        for i in range(self.size):
            self.wait_started(i)

    def signal(self, i: int, sig: int) -> None:
        nd = self.nodes[i]
        if nd.alive():
            nd.proc.send_signal(sig)

    def kill(self, i: int) -> None:
        """SIGKILL: the process ends at once, with whatever the kernel already had."""
        nd = self.nodes[i]
        if nd.paused:
            self.resume(i)
        if nd.alive():
            nd.proc.kill()
            nd.proc.wait()

    def stop(self, i: int, timeout: float = 20.0) -> None:
        """SIGTERM, and SIGKILL after ``timeout``: a clean shutdown."""
        nd = self.nodes[i]
        if nd.paused:
            self.resume(i)
        if nd.alive():
            nd.proc.terminate()
            try:
                nd.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                nd.proc.kill()
                nd.proc.wait()

    def pause(self, i: int) -> None:
        nd = self.nodes[i]
        if nd.alive() and not nd.paused:
            nd.proc.send_signal(signal.SIGSTOP)
            nd.paused = True

    def resume(self, i: int) -> None:
        nd = self.nodes[i]
        if nd.paused:
            if nd.alive():
                nd.proc.send_signal(signal.SIGCONT)
            nd.paused = False

    def alive(self) -> list[int]:
        return [nd.index for nd in self.nodes if nd.alive()]

    # ---- monitoring ---------------------------------------------------------------------

    def http(self, i: int, path: str, timeout: float = 2.0):
        nd = self.nodes[i]
        try:
            with urllib.request.urlopen("http://%s:%d%s" % (nd.host, nd.http_port, path),
                                        timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                return json.loads(e.read())
            except ValueError:
                return None
        except (OSError, ValueError):
            return None

    def meta_leader(self, nodes=None) -> str | None:
        """The meta leader every given (default: running, unpaused) node agrees on."""
        nodes = [i for i in (nodes if nodes is not None else self.alive())
                 if not self.nodes[i].paused]
        seen = set()
        for i in nodes:
            jsz = self.http(i, "/jsz") or {}
            seen.add((jsz.get("meta_cluster") or {}).get("leader"))
        if len(seen) == 1 and None not in seen:
            return seen.pop()
        return None

    def wait_meta(self, timeout: float = 60.0) -> str:
        """Until every running node names the same meta leader and it sees all peers current."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.meta_leader()
            if leader is not None:
                li = self.index_of(leader)
                mc = (self.http(li, "/jsz") or {}).get("meta_cluster") or {}
                current = [r for r in mc.get("replicas") or [] if r.get("current")]
                if len(current) >= len(self.alive()) - 1:
                    return leader
            time.sleep(0.2)
        raise TimeoutError("no meta leader agreed by %s" % self.alive())

    def clock_offset(self, i: int) -> float | None:
        """How far the node's wall clock is from ours: its /varz ``now`` (RFC 3339)."""
        import datetime as dt
        before = time.time()
        now = (self.http(i, "/varz") or {}).get("now")
        if not now:
            return None
        head, _, frac = now.rstrip("Z").partition(".")
        tz = ""
        for sep in ("+", "-"):
            if sep in frac:
                frac, tz = frac.split(sep, 1)[0], sep + frac.split(sep, 1)[1]
        try:
            t = dt.datetime.fromisoformat(head + ("." + frac[:6] if frac else "") + (tz or "+00:00"))
        except ValueError:
            return None
        return t.timestamp() - (before + time.time()) / 2

    def index_of(self, name: str) -> int:
        return int(name.lstrip("n")) - 1

    # ---- the end ------------------------------------------------------------------------

    def close(self) -> None:
        """End every process this cluster started (and nothing else)."""
        for nd in self.nodes:
            if nd.paused and nd.alive():
                nd.proc.send_signal(signal.SIGCONT)
            nd.paused = False
            if nd.alive():
                nd.proc.kill()
                nd.proc.wait()
        for nd in self.nodes:
            if nd.fs is not None:
                nd.fs.unmount()
        self.net.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
