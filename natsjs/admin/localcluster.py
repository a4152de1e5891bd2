"""``natsjs cluster up|down|status``: a local cluster configured as the documentation
configures one (JetStream clustering, Configuration).

``up --size 5 --jetstream`` writes one configuration per server -- server names
``n1-c1``..``n5-c1``, cluster ``C1``, every server routing to every other, a ``$SYS``
account with an ``admin`` user (bcrypt-hashed password, as the documentation shows) and
a JetStream account for everyone else -- starts the servers, waits until they have
formed the cluster (with JetStream: until every server names the same meta leader),
prints the client URLs and the contexts to use, and stops them all on Ctrl-C.  With
``--background`` it returns once the cluster is up; ``down`` stops it.  ``cluster.json``
in the data folder records what ``down`` and ``status`` need.

The default ports are the documentation's (clients 4222.., routes 6222.., monitoring
8222..), so ``natsjs stream add ...`` reaches ``n1-c1`` with no flags at all;
``--port 0`` picks free ports instead.
"""
from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from natsjs.admin.connect import ContextStore
from natsjs.admin.errors import CLIError
from natsjs.admin.render import Table

STATE_FILE = "cluster.json"
SYS_USER = "admin"
APP_USER = "app"
CLUSTER_NAME = "C1"
# The documentation's system user: its configuration's bcrypt hash is of this password
# (JetStream clustering, "Server password configuration"), so what an administrator
# types from the documentation -- --user admin --password 'a very long s3cr3t!
# password' -- works against a cluster that 'cluster up' started.
DOC_SYS_PASSWORD = "a very long s3cr3t! password"
DOC_SYS_HASH = "$2a$11$DRh4C0KNbNnD8K/hb/buWe1zPxEHrLEiDmuq1Mi0rRJiH/W25Qidm"


def default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"),
                                                           ".local", "share")
    return os.path.join(base, "natsjs", "cluster")


def register(top) -> None:
    g = top.group("cluster", "Run a local natsjs cluster (natsjs only)")
    p = g.command("up", "Start a local cluster configured as the documentation shows", up)
    p.add_argument("--size", type=int, default=3, help="How many servers (default 3)")
    p.add_argument("--jetstream", action="store_true", help="Enable JetStream on every server")
    p.add_argument("--data", default="", help="Folder for configurations, logs and storage "
                                              "(default %s)" % default_data_dir())
    p.add_argument("--port", type=int, default=4222,
                   help="First client port; routes use 6222.., monitoring 8222.. "
                        "(0 picks free ports)")
    p.add_argument("--name", default="natsjs-cluster",
                   help="Context names to save: NAME and NAME-sys (default natsjs-cluster)")
    p.add_argument("--sys-password", default="",
                   help="Password of the $SYS admin user (default: the documentation's, "
                        "%r; 'random' for a random one)" % DOC_SYS_PASSWORD)
    p.add_argument("--background", "-d", action="store_true",
                   help="Return once the cluster is up; stop it with 'natsjs cluster down'")
    p.add_argument("--server-binary", default="",
                   help="Run this server executable instead of natsjs-server "
                        "(e.g. nats-server)")
    p.add_argument("--wait", default=60.0, type=float,
                   help="Seconds to wait for the cluster to form (default 60)")
    p = g.command("down", "Stop a local cluster started with --background", down)
    p.add_argument("--data", default="", help="The folder given to 'cluster up'")
    p.add_argument("--clean", action="store_true", help="Also delete its data folder")
    p = g.command("status", "Show the servers of a local cluster", status)
    p.add_argument("--data", default="", help="The folder given to 'cluster up'")


# ---- configuration ------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def plan_ports(size: int, base: int) -> dict:
    if base == 0:
        ports = _free_ports(3 * size)
        return {"client": ports[:size], "cluster": ports[size:2 * size],
                "http": ports[2 * size:]}
    plan = {"client": [base + i for i in range(size)],
            "cluster": [base + 2000 + i for i in range(size)],
            "http": [base + 4000 + i for i in range(size)]}
    busy = [p for group in plan.values() for p in group if _port_busy(p)]
    if busy:
        raise CLIError("port %d is in use (is a cluster already running? 'natsjs cluster "
                       "down', or pass --port 0 for free ports)" % busy[0])
    return plan


def server_name(i: int) -> str:
    return "n%d-c1" % (i + 1)


def write_configs(data: str, size: int, ports: dict, jetstream: bool, pw_hash: str) -> list:
    confs = []
    routes = "\n".join("    nats://127.0.0.1:%d" % p for p in ports["cluster"])
    for i in range(size):
        name = server_name(i)
        js = ""
        if jetstream:
            js = "jetstream {\n   store_dir: %s\n}\n" % json.dumps(os.path.join(data, name))
        text = (
            "server_name: %(name)s\n"
            "listen: 127.0.0.1:%(port)d\n"
            "http: 127.0.0.1:%(http)d\n"
            "\n"
            "accounts {\n"
            "  $SYS {\n"
            "    users = [\n"
            "      { user: \"%(sys)s\",\n"
            "        pass: \"%(hash)s\"\n"
            "      }\n"
            "    ]\n"
            "  }\n"
            "  APP {\n"
            "    %(appjs)s"
            "users = [ { user: \"%(app)s\", pass: \"%(app)s\" } ]\n"
            "  }\n"
            "}\n"
            "no_auth_user: %(app)s\n"
            "\n"
            "%(js)s"
            "\n"
            "cluster {\n"
            "  name: %(cluster)s\n"
            "  listen: 127.0.0.1:%(cport)d\n"
            "  routes: [\n"
            "%(routes)s\n"
            "  ]\n"
            "}\n"
        ) % {"name": name, "port": ports["client"][i], "http": ports["http"][i],
             "sys": SYS_USER, "hash": pw_hash, "app": APP_USER,
             "appjs": "jetstream: enabled\n    " if jetstream else "",
             "js": js, "cluster": CLUSTER_NAME, "cport": ports["cluster"][i],
             "routes": routes}
        path = os.path.join(data, name + ".conf")
        with open(path, "w") as f:
            f.write(text)
        confs.append(path)
    return confs


# ---- processes ----------------------------------------------------------------------------


def _server_argv(binary: str, conf: str) -> list[str]:
    if binary:
        return [binary, "-c", conf]
    return [sys.executable, "-m", "natsjs", "-c", conf]


def _http_json(port: int, path: str, timeout: float = 2.0):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                timeout=timeout) as r:
        return json.loads(r.read())


def cluster_formed(state: dict) -> tuple[bool, str]:
    """(ready, what we wait for): every server answers, and with JetStream every one
    names the same meta leader, which counts enough members online for an R3 stream
    (R5 from five servers); without it every server has a route to every other."""
    size = len(state["servers"])
    leaders = set()
    metas = {}
    for srv in state["servers"]:
        try:
            if state["jetstream"]:
                jsz = _http_json(srv["http"], "/jsz")
                metas[srv["name"]] = jsz.get("meta_cluster") or {}
                leaders.add(metas[srv["name"]].get("leader"))
            else:
                routez = _http_json(srv["http"], "/routez")
                peers = {r.get("remote_name") or r.get("remote_id")
                         for r in routez.get("routes") or []}
                if len(peers) < size - 1:
                    return False, "%s has routes to %d of %d servers" % (
                        srv["name"], len(peers), size - 1)
        except (OSError, ValueError):
            return False, "%s is not answering yet" % srv["name"]
    if state["jetstream"]:
        if len(leaders) != 1 or None in leaders:
            return False, "the servers do not agree on a meta leader yet"
        leader = leaders.pop()
        # The cluster is up when it can place the streams users make first: R3 (R5 from
        # five servers), so the leader must count that many members online.
        want = size if size < 3 else 3 if size < 5 else 5
        online = 1 + sum(1 for r in metas.get(leader, {}).get("replicas") or []
                         if not r.get("offline"))
        if online < want:
            return False, "the meta leader %s knows %d of the %d servers an R%d stream " \
                "needs" % (leader, online, want, want)
        return True, "meta leader %s" % leader
    return True, "full mesh"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_our_server(pid: int, conf: str) -> bool:
    """The pid still runs the server we started (not a recycled pid)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return conf.encode() in f.read()
    except OSError:
        return _alive(pid)


def stop_servers(state: dict, timeout: float = 15.0, procs=None) -> None:
    pids = []
    for i, srv in enumerate(state["servers"]):
        pid = srv.get("pid")
        if pid and _is_our_server(pid, srv["conf"]):
            try:
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            if procs and pid in procs:
                if procs[pid].poll() is not None:
                    break
            elif not _alive(pid) or _zombie(pid):
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if procs:
        for p in procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _zombie(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def load_state(data: str) -> dict:
    path = os.path.join(data or default_data_dir(), STATE_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CLIError("no cluster was started in %s" % (data or default_data_dir())) from None
    except ValueError as e:
        raise CLIError("unreadable %s: %s" % (path, e)) from None


def _save_state(data: str, state: dict) -> None:
    path = os.path.join(data, STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=2)
    os.chmod(path + ".tmp", 0o600)
    os.replace(path + ".tmp", path)


def _save_contexts(state: dict) -> list[str]:
    store = ContextStore()
    urls = ",".join("nats://127.0.0.1:%d" % s["port"] for s in state["servers"])
    name = state["context"]
    store.save(name, {"description": "natsjs cluster up: %d servers in %s"
                                     % (len(state["servers"]), state["data"]),
                      "url": urls, "user": APP_USER, "password": APP_USER})
    store.save(name + "-sys", {"description": "natsjs cluster up: the system account",
                               "url": urls, "user": SYS_USER,
                               "password": state["sys_password"]})
    return [name, name + "-sys"]


async def up(rt) -> int:
    import bcrypt

    a = rt.args
    if a.size < 1:
        raise CLIError("--size must be at least 1")
    data = os.path.abspath(a.data or default_data_dir())
    os.makedirs(data, exist_ok=True)
    old = os.path.join(data, STATE_FILE)
    if os.path.exists(old):
        prev = load_state(data)
        if any(s.get("pid") and _is_our_server(s["pid"], s["conf"]) for s in prev["servers"]):
            raise CLIError("a cluster is already running from %s; 'natsjs cluster down "
                           "--data %s' first" % (data, data))
    ports = plan_ports(a.size, a.port)
    if not a.sys_password:
        password, pw_hash = DOC_SYS_PASSWORD, DOC_SYS_HASH
    else:
        password = a.sys_password
        if password == "random":
            password = "-"
            while password.startswith("-"):
                # (a generated one never starts with '-', which reads as an option
                # after --password)
                password = secrets.token_urlsafe(12)
        pw_hash = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=11)).decode()
    confs = write_configs(data, a.size, ports, a.jetstream, pw_hash)
    binary = a.server_binary
    state = {"data": data, "jetstream": a.jetstream, "binary": binary or "natsjs-server",
             "context": a.name, "sys_password": password, "servers": []}
    procs = {}
    for i, conf in enumerate(confs):
        logf = open(os.path.join(data, server_name(i) + ".log"), "ab")
        p = subprocess.Popen(_server_argv(binary, conf), stdin=subprocess.DEVNULL,
                             stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
        logf.close()
        procs[p.pid] = p
        state["servers"].append({"name": server_name(i), "conf": conf, "pid": p.pid,
                                 "port": ports["client"][i], "cluster_port": ports["cluster"][i],
                                 "http": ports["http"][i],
                                 "log": os.path.join(data, server_name(i) + ".log")})
    _save_state(data, state)
    try:
        deadline = time.monotonic() + a.wait
        while True:
            dead = [s["name"] for s, p in zip(state["servers"], procs.values())
                    if p.poll() is not None]
            if dead:
                raise CLIError("server %s exited, see %s" % (
                    dead[0], os.path.join(data, dead[0] + ".log")))
            ready, what = cluster_formed(state)
            if ready:
                break
            if time.monotonic() > deadline:
                raise CLIError("the cluster did not form within %gs: %s" % (a.wait, what))
            time.sleep(0.1)
        contexts = _save_contexts(state)
    except BaseException:
        stop_servers(state, procs=procs)
        os.unlink(os.path.join(data, STATE_FILE))
        raise
    print("Cluster %s is up: %d servers%s, %s" % (CLUSTER_NAME, a.size,
                                                   " with JetStream" if a.jetstream else "",
                                                   what))
    print()
    for s in state["servers"]:
        print("  %s  nats://127.0.0.1:%d  (routes %d, monitoring http://127.0.0.1:%d)"
              % (s["name"], s["port"], s["cluster_port"], s["http"]))
    print()
    print("Contexts saved: %s (account APP) and %s (system account user %s)"
          % (contexts[0], contexts[1], SYS_USER))
    print("  natsjs --context %s stream ls" % contexts[0])
    print("  natsjs --context %s server report jetstream" % contexts[1])
    print("  or: natsjs --user %s --password %s server report jetstream"
          % (SYS_USER, shlex.quote(password)))
    print("Data, configurations and logs: %s" % data)
    sys.stdout.flush()
    if a.background:
        print("Stop it with: natsjs cluster down --data %s" % data)
        for p in procs.values():
            p.returncode = 0      # detached: nothing waits for them here
        return 0
    stopping = {"flag": False}

    def on_signal(signum, frame):
        stopping["flag"] = True

    # The handlers first: a Ctrl-C right after the prompt must stop the cluster too.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print("Press Ctrl-C to stop the cluster")
    sys.stdout.flush()
    try:
        while not stopping["flag"]:
            if all(p.poll() is not None for p in procs.values()):
                break
            time.sleep(0.2)
    finally:
        print("\nStopping %d servers" % a.size)
        stop_servers(state, procs=procs)
        _unlink(os.path.join(data, STATE_FILE))
    return 0


async def down(rt) -> int:
    data = os.path.abspath(rt.args.data or default_data_dir())
    state = load_state(data)
    running = [s for s in state["servers"]
               if s.get("pid") and _is_our_server(s["pid"], s["conf"])]
    stop_servers(state)
    os.unlink(os.path.join(data, STATE_FILE))
    print("Stopped %d of %d servers of the cluster in %s" % (len(running),
                                                             len(state["servers"]), data))
    if rt.args.clean:
        import shutil
        for s in state["servers"]:
            shutil.rmtree(os.path.join(data, s["name"]), ignore_errors=True)
            for path in (s["conf"], s["log"]):
                _unlink(path)
        try:
            os.rmdir(data)
        except OSError:
            pass
    return 0


async def status(rt) -> int:
    data = os.path.abspath(rt.args.data or default_data_dir())
    state = load_state(data)
    t = Table("Local cluster in %s" % data, ["Name", "PID", "Client URL", "Monitoring",
                                             "Running"])
    for s in state["servers"]:
        t.add(s["name"], str(s["pid"]), "nats://127.0.0.1:%d" % s["port"],
              "http://127.0.0.1:%d" % s["http"],
              "yes" if _is_our_server(s["pid"], s["conf"]) else "no")
    t.print()
    return 0
