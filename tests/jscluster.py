"""JetStream clusters of real server processes for tests, configured as the documentation
configures them: server names n1-c1.., cluster C1, every server routing to every
other, a JetStream store each, and a system account user for administration.

``JSCluster(tmp_path, size).start()`` writes the configurations, starts the servers
(natsjs by default; ``binary=`` for the reference) and waits until a meta leader is
known through /healthz.  ``kill``/``stop``/``restart`` one server; ``leader_of`` asks
the cluster who leads a stream.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
import urllib.request

from conftest import ServerProcess, reference_server_binary

SYS_USER = "admin"
SYS_PASS = "s3cr3t"
# The documentation's system user: its bcrypt hash of "a very long s3cr3t! password".
DOC_PASS = "a very long s3cr3t! password"
DOC_HASH = "$2a$11$DRh4C0KNbNnD8K/hb/buWe1zPxEHrLEiDmuq1Mi0rRJiH/W25Qidm"


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class JSCluster:
    def __init__(self, tmp_path, size: int = 3, reference: bool = False, extra: str = "",
                 js_nodes=None, reference_nodes=(), doc: bool = False, accounts: str = ""):
        self.dir = str(tmp_path)
        # ``accounts``: more accounts, written inside the accounts block beside APP.
        self.accounts = accounts
        self.size = size
        self.reference = reference
        self.extra = extra
        # ``doc``: the documentation's configuration as written (key=value lines, only the
        # $SYS account with its bcrypt user; clients without credentials get the global
        # account), with local ports and a monitoring port added.
        self.doc = doc
        self.sys_pass = DOC_PASS if doc else SYS_PASS
        self.js_nodes = set(range(size)) if js_nodes is None else set(js_nodes)
        # Servers run by the reference binary (all of them with ``reference``).
        self.reference_nodes = set(range(size)) if reference else set(reference_nodes)
        self.hosts = ["127.0.0.1"] * size
        ports = free_ports(3 * size)
        self.ports = ports[:size]
        self.cluster_ports = ports[size:2 * size]
        self.http_ports = ports[2 * size:]
        self.procs: list[ServerProcess | None] = [None] * size
        # More environment for one server's next (re)start: {index: {name: value}}.
        self.env: dict[int, dict[str, str]] = {}
        self.confs = [self._write_conf(i) for i in range(size)]

    def name(self, i: int) -> str:
        return "n%d-c1" % (i + 1)

    def _write_conf(self, i: int) -> str:
        if self.doc:
            return self._write_doc_conf(i)
        routes = "\n".join("    nats-route://%s:%d" % hp
                           for hp in zip(self.hosts, self.cluster_ports))
        js = ""
        if i in self.js_nodes:
            js = "jetstream { store_dir: %s }" % json.dumps(os.path.join(self.dir, "n%d" % (i + 1)))
        text = """server_name: %(name)s
listen: %(host)s:%(port)d
http: %(host)s:%(http)d
%(js)s
cluster {
  name: C1
  listen: %(host)s:%(cport)d
  routes: [
%(routes)s
  ]
}
accounts {
  $SYS { users = [ { user: %(user)s, pass: %(pw)s } ] }
  APP { jetstream: enabled, users = [ { user: app, pass: app } ] }
%(accounts)s
}
no_auth_user: app
%(extra)s
""" % {"host": self.hosts[i], "name": self.name(i), "port": self.ports[i], "http": self.http_ports[i], "js": js,
       "cport": self.cluster_ports[i], "routes": routes, "user": SYS_USER, "pw": SYS_PASS,
       "extra": self.extra, "accounts": self.accounts}
        path = os.path.join(self.dir, "n%d.conf" % (i + 1))
        with open(path, "w") as f:
            f.write(text)
        return path

    def _write_doc_conf(self, i: int) -> str:
        routes = "\n".join("    nats://%s:%d" % hp for j, hp in
                           enumerate(zip(self.hosts, self.cluster_ports)) if j != i)
        text = """server_name=%(name)s
listen=%(host)s:%(port)d
http=%(host)s:%(http)d

accounts {
  $SYS {
    users = [
      { user: "admin",
        pass: "%(hash)s"
      }
    ]
  }
}

jetstream {
   store_dir=%(dir)s
}

cluster {
  name: C1
  listen: %(host)s:%(cport)d
  routes: [
%(routes)s
  ]
}
%(extra)s
""" % {"name": self.name(i), "host": self.hosts[i], "port": self.ports[i],
       "http": self.http_ports[i], "hash": DOC_HASH,
       "dir": json.dumps(os.path.join(self.dir, "n%d" % (i + 1))),
       "cport": self.cluster_ports[i], "routes": routes, "extra": self.extra}
        path = os.path.join(self.dir, "n%d.conf" % (i + 1))
        with open(path, "w") as f:
            f.write(text)
        return path

    def _argv(self, i: int) -> list[str]:
        if i in self.reference_nodes:
            return [reference_server_binary(), "-c", self.confs[i]]
        return [sys.executable, "-m", "natsjs", "-c", self.confs[i]]

    def start_one(self, i: int) -> ServerProcess:
        env = dict(os.environ, **self.env[i]) if i in self.env else None
        p = ServerProcess(self._argv(i), env=env, args=["-c", self.confs[i], "-m"])
        self.procs[i] = p
        return p

    def start(self, wait: bool = True) -> "JSCluster":
        """Start every node (and wait for a meta leader).  If any of it fails, the nodes
        already started are stopped before the error goes on: the caller never got the
        cluster, so nothing else would stop them."""
        try:
            for i in range(self.size):
                self.start_one(i)
            for p in self.procs:
                p.start()
            if wait:
                self.wait_meta_leader()
        except BaseException:
            self.close()
            raise
        return self

    def url(self, i: int) -> str:
        return "nats://%s:%d" % (self.hosts[i], self.ports[i])

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in range(self.size)]

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.alive()]

    def http(self, i: int, path: str):
        with urllib.request.urlopen("http://%s:%d%s" % (self.hosts[i], self.http_ports[i], path),
                                    timeout=2) as r:
            return json.loads(r.read())

    def healthz(self, i: int) -> int:
        try:
            with urllib.request.urlopen("http://%s:%d/healthz" % (self.hosts[i],
                                                                  self.http_ports[i]),
                                        timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def wait_meta_leader(self, timeout: float = 30.0, nodes=None) -> str:
        """Wait until every (given, JetStream) server reports the same meta leader."""
        nodes = [i for i in (nodes if nodes is not None else self.alive()) if i in self.js_nodes]
        deadline = time.monotonic() + timeout
        while True:
            leaders = set()
            for i in nodes:
                try:
                    jsz = self.http(i, "/jsz")
                    leaders.add((jsz.get("meta_cluster") or {}).get("leader"))
                except OSError:
                    leaders.add(None)
            if len(leaders) == 1 and None not in leaders:
                return leaders.pop()
            if time.monotonic() > deadline:
                logs = "\n".join("--- %s\n%s" % (self.name(i), "\n".join(
                    self.procs[i].text().splitlines()[-15:])) for i in nodes)
                raise TimeoutError("no common meta leader: %r\n%s" % (leaders, logs))
            time.sleep(0.05)

    def kill(self, i: int) -> None:
        self.procs[i].stop(signal.SIGKILL)

    def stop(self, i: int) -> None:
        self.procs[i].stop()

    def restart(self, i: int) -> ServerProcess:
        p = self.start_one(i)
        p.start()
        return p

    def index_of(self, name: str) -> int:
        return int(name.split("-")[0][1:]) - 1

    def leadership(self) -> str:
        """Each node's log lines about leaders, warnings and errors: printed when a test
        on the cluster fails, they say whether a Raft group changed leader meanwhile."""
        out = []
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            lines = p.log.decode(errors="replace").splitlines()
            out.append("--- %s" % self.name(i))
            out += [ln for ln in lines if "leader" in ln or "[WRN]" in ln or "[ERR]" in ln]
        return "\n".join(out)

    def close(self) -> None:
        for p in self.procs:
            if p is not None:
                p.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False



def answers_on_both(tmp_path, run, size: int = 3, timeout: float = 120) -> dict:
    """``run(cluster)`` (a coroutine function) on a fresh nats-server cluster and on a fresh
    natsjs cluster, one after the other: {"reference": .., "natsjs": ..}."""
    answers = {}
    for kind in ("reference", "natsjs"):
        (tmp_path / kind).mkdir()
        cluster = JSCluster(tmp_path / kind, size, reference=kind == "reference").start()
        try:
            answers[kind] = asyncio.run(asyncio.wait_for(run(cluster), timeout))
        finally:
            cluster.close()
    return answers
