"""The ``natsjs`` admin CLI, run as a user runs it: a subprocess per command against a
real five-server natsjs cluster that ``natsjs cluster up`` started (the documentation's
JetStream clustering administration section, command by command), and the read
commands again against a cluster of the reference nats-server started the same way,
to show that both give the same screens.

One cluster of each kind is shared by the module; tests that change leadership or
membership use their own streams so they do not disturb the others.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from functools import partial

import pytest

from conftest import reference_server_binary
from jscluster import DOC_HASH, DOC_PASS, JSCluster
import helpers

CLI = [sys.executable, "-m", "natsjs.admin"]
SIZE = 5
wait_until = partial(helpers.wait_until, interval=0.1)


def run_cli(env, *args, input=None, check=True, timeout=60):
    p = subprocess.run(CLI + list(args), input=input, capture_output=True, text=True,
                       env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL if input is None else None)
    if check and p.returncode != 0:
        raise AssertionError("natsjs %s failed (%d):\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


class Cluster:
    """A cluster started by ``natsjs cluster up --background`` and the environment
    (a private config folder holding its contexts) to reach it."""

    def __init__(self, base, name, size, binary=""):
        self.data = str(base / name)
        self.env = dict(os.environ, XDG_CONFIG_HOME=str(base / (name + "-config")),
                        NO_COLOR="1")
        for k in list(self.env):
            if k.startswith("NATS_"):
                del self.env[k]
        args = ["cluster", "up", "--size", str(size), "--jetstream", "--data", self.data,
                "--port", "0", "--background", "--name", "c", "--wait", "90"]
        if binary:
            args += ["--server-binary", binary]
        self.up = run_cli(self.env, *args, timeout=120)
        with open(os.path.join(self.data, "cluster.json")) as f:
            self.state = json.load(f)

    def cli(self, *args, **kw):
        return run_cli(self.env, "--context", "c", *args, **kw)

    def sys(self, *args, **kw):
        return run_cli(self.env, "--context", "c-sys", *args, **kw)

    def down(self):
        run_cli(self.env, "cluster", "down", "--data", self.data, check=False, timeout=60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("admin"), "natsjs", SIZE)
    yield c
    c.down()


@pytest.fixture(scope="module")
def ref_cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("admin-ref"), "reference", 3,
                binary=reference_server_binary())
    yield c
    c.down()


def labels(screen: str) -> list[str]:
    """The row labels and section titles of an info screen, in order."""
    out = []
    for line in screen.splitlines():
        m = re.match(r"^\s*([A-Z][\w .'/-]*?):(?: |$)", line)
        if m:
            out.append(m.group(1))
    return out


def cells(table: str, starts: str) -> list[str]:
    """The cells of the first table row that starts with ``starts``."""
    row = [line for line in table.splitlines() if line.startswith(starts)][0]
    return [c.strip() for c in row.strip("|").split("|")]


def stream_json(c, name):
    return json.loads(c.cli("stream", "info", name, "--json").stdout)


def wait_current(c, name, replicas):
    """Until every follower of the stream is current (as the documentation shows)."""
    def ok():
        cl = stream_json(c, name).get("cluster") or {}
        reps = cl.get("replicas") or []
        return cl.get("leader") and len(reps) == replicas - 1 and \
            all(r.get("current") and r.get("active") for r in reps)
    wait_until(ok, what="current replicas of %s" % name)


# ---- cluster up / down --------------------------------------------------------------------


def test_cluster_up_writes_the_documentation_configuration(cluster):
    out = cluster.up.stdout
    assert "Cluster C1 is up: 5 servers with JetStream, meta leader n" in out
    for i in range(1, SIZE + 1):
        assert re.search(r"^  n%d-c1  nats://127\.0\.0\.1:\d+" % i, out, re.M)
    with open(os.path.join(cluster.data, "n2-c1.conf")) as f:
        conf = f.read()
    assert "server_name: n2-c1" in conf
    assert re.search(r"\$SYS \{\s+users = \[\s+\{ user: \"admin\",\s+pass: \"\$2[aby]\$11\$",
                     conf)
    assert "name: C1" in conf and conf.count("nats://127.0.0.1:") == SIZE
    status = run_cli(cluster.env, "cluster", "status", "--data", cluster.data).stdout
    assert status.count("| yes ") == SIZE


def test_cluster_up_returns_when_an_r5_stream_can_be_created(cluster):
    """Issue 20: the first thing a user types once ``cluster up`` has returned works
    the first time (it returns once the meta leader counts five servers online, and
    the servers hold meta requests until they can act on them)."""
    cluster.cli("stream", "add", "FIRST", "--subjects", "FIRST.*", "--replicas", "5",
                "--defaults")
    cluster.cli("stream", "rm", "FIRST", "-f")


def test_cluster_down_stops_every_server(tmp_path):
    c = Cluster(tmp_path, "small", 1)
    pids = [s["pid"] for s in c.state["servers"]]
    assert pids and all(os.path.exists("/proc/%d" % p) for p in pids)
    out = run_cli(c.env, "cluster", "down", "--data", c.data).stdout
    assert "Stopped 1 of 1 servers" in out

    def gone():
        return all(not os.path.exists("/proc/%d" % p) or
                   open("/proc/%d/stat" % p).read().split(")")[-1].split()[0] == "Z"
                   for p in pids)
    wait_until(gone, what="servers to exit")
    again = run_cli(c.env, "cluster", "down", "--data", c.data, check=False)
    assert again.returncode == 1 and again.stderr.startswith("natsjs: error: no cluster")


def test_cluster_up_in_the_foreground_stops_on_ctrl_c(tmp_path):
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    data = str(tmp_path / "fg")
    proc = subprocess.Popen(CLI + ["cluster", "up", "--size", "2", "--data", data, "--port",
                                   "0", "--wait", "90"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    try:
        lines = []
        while not lines or lines[-1] != "Press Ctrl-C to stop the cluster\n":
            line = proc.stdout.readline()
            assert line, "cluster up ended early: %s %s" % ("".join(lines), proc.stderr.read())
            lines.append(line)
        assert lines[0] == "Cluster C1 is up: 2 servers, full mesh\n"
        with open(os.path.join(data, "cluster.json")) as f:
            pids = [srv["pid"] for srv in json.load(f)["servers"]]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Stopping 2 servers" in out
    assert not os.path.exists(os.path.join(data, "cluster.json"))
    for pid in pids:
        assert not os.path.exists("/proc/%d" % pid) or \
            open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0] == "Z"


# ---- connection options and contexts ------------------------------------------------------


def test_contexts_add_select_ls_info_rm(cluster, tmp_path):
    env = dict(cluster.env, XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    url = "nats://127.0.0.1:%d" % cluster.state["servers"][1]["port"]
    out = run_cli(env, "context", "add", "two", "--server", url, "--user", "app",
                  "--password", "app", "--description", "second server").stdout
    assert 'NATS Configuration Context "two"' in out and "Server URLs: " + url in out
    assert "Password: ***" in out
    run_cli(env, "context", "add", "other", "-s", "nats://127.0.0.1:1")
    ls = run_cli(env, "context", "ls").stdout
    assert "| two " in ls and "| other " in ls and "*" not in ls
    run_cli(env, "context", "select", "two")
    ls = run_cli(env, "context", "ls").stdout
    assert "| two*" in ls
    names = run_cli(env, "context", "ls", "--names").stdout.split()
    assert names == ["other", "two"]
    with open(tmp_path / "cfg" / "natsjs" / "context" / "two.json") as f:
        saved = json.load(f)
    assert saved["url"] == url and saved["user"] == "app" and saved["password"] == "app"
    # the selected context is used with no flags at all
    info = run_cli(env, "account", "info", "--json")
    assert json.loads(info.stdout)["type"].endswith("account_info_response")
    # a flag beats the context, the environment beats the context, --context picks one
    bad = run_cli(env, "-s", "nats://127.0.0.1:1", "stream", "ls", check=False)
    assert bad.returncode == 1 and "could not connect to nats://127.0.0.1:1" in bad.stderr
    bad = run_cli(dict(env, NATS_URL="nats://127.0.0.1:1"), "stream", "ls", check=False)
    assert bad.returncode == 1 and "nats://127.0.0.1:1" in bad.stderr
    bad = run_cli(env, "--context", "other", "stream", "ls", check=False)
    assert bad.returncode == 1
    ok = run_cli(dict(env, NATS_CONTEXT="two"), "stream", "ls")
    assert ok.returncode == 0
    # removing the selected context needs --force
    rm = run_cli(env, "context", "rm", "two", check=False)
    assert rm.returncode == 1 and "cannot remove the selected context" in rm.stderr
    run_cli(env, "context", "rm", "two", "--force")
    assert run_cli(env, "context", "ls", "--names").stdout.split() == ["other"]
    unknown = run_cli(env, "--context", "nope", "stream", "ls", check=False)
    assert unknown.returncode == 1 and 'unknown context "nope"' in unknown.stderr


def test_user_password_and_env_credentials(cluster):
    url = "nats://127.0.0.1:%d" % cluster.state["servers"][0]["port"]
    pw = cluster.state["sys_password"]
    env = dict(cluster.env)
    out = run_cli(env, "-s", url, "--user", "admin", "--password", pw, "server", "ls", "5")
    assert "n1-c1" in out.stdout
    out = run_cli(dict(env, NATS_URL=url, NATS_USER="admin", NATS_PASSWORD=pw),
                  "server", "ls", "5")
    assert "n5-c1" in out.stdout
    bad = run_cli(env, "-s", url, "--user", "admin", "--password", "wrong", "server", "ls",
                  check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip().count("\n") == 0 and "Authorization Violation" in bad.stderr


def test_the_documentations_system_user(cluster, tmp_path):
    """``--user admin --password 'a very long s3cr3t! password'`` -- the documentation's
    system user -- administers a 'cluster up' cluster and a cluster configured from the
    documentation's text, for natsjs as for nats-server."""
    with open(os.path.join(cluster.data, "n1-c1.conf")) as f:
        assert 'pass: "%s"' % DOC_HASH in f.read()
    assert "--user admin --password 'a very long s3cr3t! password'" in cluster.up.stdout
    url = "nats://127.0.0.1:%d" % cluster.state["servers"][2]["port"]
    doc = ["--user", "admin", "--password", DOC_PASS]
    out = run_cli(cluster.env, "-s", url, *doc, "server", "report", "jetstream").stdout
    assert len(re.findall(r"^\| n\d-c1\*? +\| C1 ", out, re.M)) == SIZE
    reports = {}
    for kind in ("natsjs", "reference"):
        folder = tmp_path / kind
        folder.mkdir()
        doc_cluster = JSCluster(folder, 3, reference=kind == "reference", doc=True)
        try:
            doc_cluster.start()
            args = ["--no-context", "-s", ",".join(doc_cluster.urls), *doc]

            def formed():
                p = run_cli(cluster.env, *args, "server", "report", "jetstream", check=False)
                rows = re.findall(r"^\| (n\d-c1\*?) +\| C1 ", p.stdout, re.M)
                return p.returncode == 0 and len(rows) == 3 and \
                    sum(r.endswith("*") for r in rows) == 1 and p.stdout
            reports[kind] = wait_until(formed, timeout=60, interval=0.5,
                                       what="the documentation's %s cluster" % kind)
            ls = run_cli(cluster.env, *args, "server", "ls").stdout
            assert len(re.findall(r"^\| n\d-c1 +\| C1 ", ls, re.M)) == 3
            wrong = run_cli(cluster.env, "--no-context", "-s", doc_cluster.urls[0], "--user",
                            "admin", "--password", "a very long secret password", "server",
                            "ls", check=False)
            assert wrong.returncode == 1 and "Authorization Violation" in wrong.stderr
        finally:
            doc_cluster.close()
    for starts in ("| Server", "| Name"):
        assert cells(reports["natsjs"], starts) == cells(reports["reference"], starts)


def test_errors_are_one_line_without_traceback(cluster):
    for args in (["stream", "info", "NOPE"], ["-s", "nats://127.0.0.1:1", "stream", "ls"],
                 ["--timeout", "bogus", "stream", "ls"], ["stream", "add"],
                 ["consumer", "info", "NOPE", "X"], ["stream", "frobnicate"]):
        p = cluster.cli(*args, check=False)
        assert p.returncode != 0, args
        assert "Traceback" not in p.stderr, args
        assert len(p.stderr.strip().splitlines()) == 1 or args == ["stream", "add"], \
            (args, p.stderr)
        assert p.stderr.strip().splitlines()[-1].startswith("natsjs: error: "), (args, p.stderr)
    p = cluster.cli("stream", "info", "NOPE", check=False)
    assert p.stderr == "natsjs: error: could not request Stream info: stream not found " \
                       "(10059)\n"


# ---- streams: the administration section --------------------------------------------------

REPLICA_RE = re.compile(r"^              Replica: n\d-c1, current, seen \d+\.\d\ds ago$", re.M)


def test_stream_add_with_replicas_shows_cluster_information(cluster):
    out = cluster.cli("stream", "add", "ORDERS", "--subjects", "ORDERS.*", "--replicas", "3",
                      "--defaults").stdout
    assert out.startswith("Stream ORDERS was created\n\nInformation for Stream ORDERS created ")
    assert re.search(r"created \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d\n", out)
    assert "\nConfiguration:\n\n" in out
    assert "\n             Replicas: 3\n" in out
    assert "\nCluster Information:\n\n                 Name: C1\n" in out
    assert re.search(r"^               Leader: n\d-c1$", out, re.M)
    wait_current(cluster, "ORDERS", 3)
    info = cluster.cli("stream", "info", "ORDERS").stdout
    assert len(REPLICA_RE.findall(info)) == 2, info
    leader = re.search(r"Leader: (n\d-c1)", info).group(1)
    replicas = re.findall(r"Replica: (n\d-c1)", info)
    assert len({leader, *replicas}) == 3
    # every label lines up as the documentation prints them
    for line in info.splitlines():
        if ": " in line and not line.startswith("Information"):
            assert line.index(": ") == 21, line


def test_stream_add_asks_what_its_flags_leave_out(cluster):
    answers = "PROMPTED.>\nmemory\n3\nInterest\nNew\n100\n-1\n1MB\n1h\n-1\n1m\ny\nn\ny\n"
    p = cluster.cli("stream", "add", "PROMPTED", input=answers)
    for q_ in ("? Subjects", "? Storage", "? Replication", "? Retention Policy",
               "? Discard Policy", "? Stream Messages Limit", "? Message TTL",
               "? Duplicate tracking time window", "? Allow message Roll-ups"):
        assert q_ in p.stderr, q_
    cfg = stream_json(cluster, "PROMPTED")["config"]
    assert cfg["subjects"] == ["PROMPTED.>"] and cfg["storage"] == "memory"
    assert cfg["num_replicas"] == 3 and cfg["retention"] == "interest"
    assert cfg["discard"] == "new" and cfg["max_msgs"] == 100
    assert cfg["max_bytes"] == 1000 * 1000 and cfg["max_age"] == 3600 * 10 ** 9
    assert cfg["duplicate_window"] == 60 * 10 ** 9
    assert cfg["allow_rollup_hdrs"] is True and cfg["deny_delete"] is True
    assert cfg["deny_purge"] is False
    cluster.cli("stream", "rm", "PROMPTED", "-f")


def test_stream_info_json_is_the_servers_answer(cluster):
    cluster.cli("stream", "add", "JSONS", "--subjects", "jsons.>", "--defaults")
    info = stream_json(cluster, "JSONS")
    assert info["type"] == "io.nats.jetstream.api.v1.stream_info_response"
    assert info["config"]["name"] == "JSONS" and "state" in info and "created" in info
    names = json.loads(cluster.cli("stream", "ls", "--json").stdout)
    assert "JSONS" in names
    assert "JSONS" in cluster.cli("stream", "ls", "--names").stdout.split()


def test_stream_report_shows_placement(cluster):
    cluster.cli("stream", "add", "REPORTED", "--subjects", "reported.>", "--replicas", "3",
                "--defaults")
    for i in range(3):
        cluster.cli("pub", "-J", "reported.x", "m%d" % i)
    out = cluster.cli("stream", "report").stdout
    assert out.startswith("Obtaining Stream stats\n+")
    assert "| Stream " in out and "| Consumers | Messages | Bytes " in out
    assert "| Storage | Lost | Deleted | Cluster " in out
    row = cells(out, "| REPORTED ")
    assert row[1:3] == ["0", "3"] and row[4] == "File"
    nodes = row[7].split(", ")
    assert len(nodes) == 3 and sum(n.endswith("*") for n in nodes) == 1
    assert nodes == sorted(nodes)
    report = json.loads(cluster.cli("stream", "report", "--json").stdout)
    assert {s["name"]: s["msgs"] for s in report}["REPORTED"] == 3


def test_stream_cluster_step_down(cluster):
    cluster.cli("stream", "add", "STEPPED", "--subjects", "stepped.>", "--replicas", "3",
                "--defaults")
    wait_current(cluster, "STEPPED", 3)
    before = stream_json(cluster, "STEPPED")["cluster"]["leader"]
    p = cluster.cli("stream", "cluster", "step-down", "STEPPED")
    assert re.search(r'^\d\d:\d\d:\d\d Requesting leader step down of "%s" in a 3 peer RAFT '
                     r'group$' % before, p.stderr, re.M)
    m = re.search(r'^\d\d:\d\d:\d\d New leader elected "(n\d-c1)"$', p.stderr, re.M)
    assert m and m.group(1) != before
    assert "\nCluster Information:\n" in p.stdout
    assert re.search(r"^               Leader: %s$" % m.group(1), p.stdout, re.M)
    assert stream_json(cluster, "STEPPED")["cluster"]["leader"] == m.group(1)


def test_stream_cluster_peer_remove_asks_for_the_peer(cluster):
    cluster.cli("stream", "add", "EVICT", "--subjects", "evict.>", "--replicas", "3",
                "--defaults")
    wait_current(cluster, "EVICT", 3)
    cl = stream_json(cluster, "EVICT")["cluster"]
    peers = [cl["leader"]] + [r["name"] for r in cl["replicas"]]
    victim = peers[1]
    p = cluster.cli("s", "cluster", "peer-remove", "EVICT", input="2\n")
    assert "? Select a Peer %s" % victim in p.stderr
    assert re.search(r'^\d\d:\d\d:\d\d Removing peer "%s"$' % victim, p.stderr, re.M)
    assert re.search(r'^\d\d:\d\d:\d\d Requested removal of peer "%s"$' % victim, p.stderr,
                     re.M)

    def replaced():
        c = stream_json(cluster, "EVICT").get("cluster") or {}
        now = [c.get("leader")] + [r["name"] for r in c.get("replicas") or []]
        return None not in now and len(now) == 3 and victim not in now and now
    now = wait_until(replaced, what="a new peer in place of %s" % victim)
    assert len(set(now) - set(peers)) == 1
    info = cluster.cli("stream", "info", "EVICT").stdout
    assert len(re.findall(r"^              Replica: n\d-c1, (current|outdated), ", info,
                          re.M)) == 2


def test_stream_edit_purge_get_view_rmm_rm(cluster):
    cluster.cli("stream", "add", "EDITED", "--subjects", "edited.>", "--defaults")
    for i in range(1, 6):
        cluster.cli("pub", "-J", "edited.%d" % (i % 2), "body %d" % i, "-H", "K:v%d" % i)
    p = cluster.cli("stream", "edit", "EDITED", "--max-msgs", "100", "--description", "d",
                    "-f")
    assert "Differences (-old +new):" in p.stdout and '+  "max_msgs": 100' in p.stdout
    assert "Stream EDITED was updated" in p.stdout
    assert "Maximum Messages: 100" in p.stdout
    same = cluster.cli("stream", "edit", "EDITED", "--max-msgs", "100", "-f")
    assert "No difference in configuration" in same.stdout
    get = cluster.cli("stream", "get", "EDITED", "2").stdout
    assert re.match(r"Item: EDITED#2 received \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(.*\) on "
                    r"Subject edited\.0\n", get)
    assert "Headers:\n  K: v2\n" in get and "body 2" in get
    last = json.loads(cluster.cli("stream", "get", "EDITED", "-S", "edited.1",
                                  "--json").stdout)
    assert last["seq"] == 5
    view = cluster.cli("stream", "view", "EDITED", "--subject", "edited.1")
    assert re.findall(r"^\[(\d+)\] Subject: edited\.1", view.stdout, re.M) == ["1", "3", "5"]
    assert "Reached apparent end of data" in view.stderr
    cluster.cli("stream", "rmm", "EDITED", "3", "-f")
    purge = cluster.cli("stream", "purge", "EDITED", "--subject", "edited.0", "-f").stdout
    assert purge.startswith("Purged 2 messages from EDITED\n\nState for Stream EDITED")
    st = stream_json(cluster, "EDITED")["state"]
    assert st["messages"] == 2
    cluster.cli("stream", "rm", "EDITED", "-f")
    assert "EDITED" not in cluster.cli("stream", "ls", "--names").stdout.split()


# ---- consumers ----------------------------------------------------------------------------


def test_consumer_add_info_next_report_step_down_rm(cluster):
    cluster.cli("stream", "add", "WORK", "--subjects", "work.>", "--replicas", "3",
                "--defaults")
    info = cluster.cli("consumer", "add", "WORK", "NEW", "--pull", "--defaults",
                       "--filter", "work.new").stdout
    assert info.startswith("Information for Consumer WORK > NEW created ")
    assert "           Pull Mode: true" in info or "Pull Mode: true" in info
    assert "\nCluster Information:\n" in info
    for i in range(3):
        cluster.cli("pub", "-J", "work.new", "job %d" % i)
    nxt = cluster.cli("consumer", "next", "WORK", "NEW", "--count", "2").stdout
    assert re.findall(r"subj: work\.new / tries: 1 / cons seq: (\d) / str seq: \d / "
                      r"pending: (\d)", nxt) == [("1", "2"), ("2", "1")]
    assert nxt.count("Acknowledged message") == 2

    def acked():
        ci = json.loads(cluster.cli("consumer", "info", "WORK", "NEW", "--json").stdout)
        return ci["ack_floor"]["stream_seq"] == 2 and ci["num_pending"] == 1
    wait_until(acked, what="the acks to land")
    report = cluster.cli("consumer", "report", "WORK").stdout
    row = cells(report, "| NEW ")
    assert row[1:3] == ["Pull", "Explicit"] and row[6] == "1 / 33%"
    assert len(row[8].split(", ")) == 3
    assert "NEW" in cluster.cli("consumer", "ls", "WORK", "--names").stdout.split()

    def consumer_current():
        cl = json.loads(cluster.cli("consumer", "info", "WORK", "NEW",
                                    "--json").stdout)["cluster"]
        return cl.get("leader") and all(r.get("current") for r in cl.get("replicas") or [])
    wait_until(consumer_current, what="current consumer replicas")
    before = json.loads(cluster.cli("consumer", "info", "WORK", "NEW",
                                    "--json").stdout)["cluster"]["leader"]
    sd = cluster.cli("consumer", "cluster", "step-down", "WORK", "NEW")
    assert 'Requesting leader step down of "%s" in a 3 peer RAFT group' % before in sd.stderr
    m = re.search(r'New leader elected "(n\d-c1)"', sd.stderr)
    assert m and m.group(1) != before
    assert "Information for Consumer WORK > NEW" in sd.stdout
    cluster.cli("consumer", "rm", "WORK", "NEW", "-f")
    assert cluster.cli("consumer", "ls", "WORK").stdout.strip() == "No Consumers defined"


# ---- servers (the system user) ------------------------------------------------------------


def test_server_ls_ping_info(cluster):
    ls = cluster.sys("server", "ls").stdout
    names = re.findall(r"^\| (n\d-c1) +\| C1 ", ls, re.M)
    assert sorted(names) == ["n%d-c1" % i for i in range(1, SIZE + 1)]
    assert "Cluster Overview" in ls and re.search(r"^\| C1 +\| 5 +\|", ls, re.M)
    ping = cluster.sys("server", "ping").stdout
    assert len(re.findall(r"^n\d-c1 +rtt=", ping, re.M)) == SIZE
    assert "---- ping statistics ----\n5 replies max: " in ping
    info = cluster.sys("server", "info", "n2-c1").stdout
    assert info.startswith("Server information for n2-c1 (N")
    for title in ("Process Details:", "Connection Details:", "JetStream:", "Limits:",
                  "Statistics:", "Cluster:"):
        assert "\n%s\n" % title in info
    assert json.loads(cluster.sys("server", "info", "n3-c1", "--json").stdout)[
        "server_name"] == "n3-c1"
    # without the system user the server requests are refused in one line
    p = cluster.cli("server", "ls", check=False)
    assert p.returncode == 1 and p.stderr.startswith("natsjs: error: ")


def test_server_report_jetstream(cluster):
    out = cluster.sys("server", "report", "jetstream").stdout
    lines = out.splitlines()
    assert re.match(r"^\| +JetStream Summary +\|$", lines[1])
    assert cells(out, "| Server") == ["Server", "Cluster", "Streams", "Consumers", "Messages",
                                      "Bytes", "Memory", "File", "API Req", "API Err"]
    rows = re.findall(r"^\| (n\d-c1\*?) +\| C1 ", out, re.M)
    assert len(rows) == SIZE and sum(r.endswith("*") for r in rows) == 1
    leader = [r for r in rows if r.endswith("*")][0][:-1]
    assert re.search(r"^\| +RAFT Meta Group Information +\|$", out, re.M)
    assert cells(out, "| Name") == ["Name", "Leader", "Current", "Offline", "Active", "Lag"]
    meta = re.findall(r"^\| (n\d-c1) +\| (yes)? +\| (true|false) +\| (true|false) +\| "
                      r"(\d+\.\d\ds) +\| (\d+) +\|$", out, re.M)
    assert len(meta) == SIZE and [m[0] for m in meta if m[1] == "yes"] == [leader]
    acct = cluster.sys("server", "report", "jetstream", "--account", "APP").stdout
    assert "JetStream Summary for Account APP" in acct
    js = json.loads(cluster.sys("server", "report", "jetstream", "--json").stdout)
    assert len(js) == SIZE
    # the raw data the documentation points at: /jsz over NATS, from the leader only
    req = cluster.sys("server", "request", "jetstream", "--leader").stdout.splitlines()
    assert len(req) == 1
    data = json.loads(req[0])
    assert data["server"]["name"] == data["data"]["meta_cluster"]["leader"] == leader


def test_server_requests(cluster):
    for kind in ("variables", "subscriptions", "connections", "routes", "gateways",
                 "leafnodes", "accounts", "jetstream", "jetstream-health"):
        lines = cluster.sys("server", "request", kind).stdout.splitlines()
        assert len(lines) == SIZE, kind
        names = sorted(json.loads(line)["server"]["name"] for line in lines)
        assert names == ["n%d-c1" % i for i in range(1, SIZE + 1)], kind
    one = cluster.sys("server", "req", "varz", "--name", "n3-c1").stdout.splitlines()
    assert [json.loads(line)["server"]["name"] for line in one] == ["n3-c1"]
    routes = json.loads(cluster.sys("server", "req", "routes", "1").stdout)
    assert len({r["remote_name"] for r in routes["data"]["routes"]}) == SIZE - 1


def test_server_check_and_reports(cluster):
    p = cluster.sys("server", "check", "connection")
    assert p.stdout.startswith("OK Connection OK:connected to nats://127.0.0.1:")
    assert "| connect_time=" in p.stdout
    p = cluster.cli("server", "check", "jetstream")
    assert p.stdout.startswith("OK JetStream") and "replicas_ok=" in p.stdout
    p = cluster.sys("server", "check", "meta", "--expect", "5", "--lag-critical", "100",
                    "--seen-critical", "10s")
    assert p.stdout.startswith("OK JetStream Meta Cluster OK:5 peers led by n")
    bad = cluster.sys("server", "check", "meta", "--expect", "7", "--lag-critical", "100",
                      "--seen-critical", "10s", check=False)
    assert bad.returncode == 2 and bad.stdout.startswith("CRITICAL ")
    cluster.cli("stream", "add", "CHECKED", "--subjects", "checked", "--replicas", "3",
                "--defaults")
    wait_current(cluster, "CHECKED", 3)
    p = cluster.cli("server", "check", "stream", "--stream", "CHECKED", "--peer-expect", "3")
    assert p.stdout.startswith("OK CHECKED OK:2 current replicas")
    conns = cluster.sys("server", "report", "connections").stdout
    assert "Connections per server" in conns and "| CID " in conns
    accts = cluster.sys("server", "report", "accounts").stdout
    assert re.search(r"\d+ Accounts Overview", accts)


def test_server_cluster_step_down(cluster):
    before = json.loads(cluster.sys("server", "req", "jetstream", "--leader").stdout)
    old = before["server"]["name"]
    p = cluster.sys("server", "cluster", "step-down")
    assert re.search(r'^\d\d:\d\d:\d\d Requesting leader step down of "%s" in a 5 peer RAFT '
                     r'group$' % old, p.stderr, re.M)
    new = re.search(r'New leader elected "(n\d-c1)"', p.stderr).group(1)
    assert new != old
    # the documentation's older spelling
    p = cluster.sys("server", "raft", "step-down")
    assert re.search(r'Requesting leader step down of "%s"' % new, p.stderr)


def test_server_cluster_peer_remove(tmp_path):
    """A server that will never return leaves the meta group (its own small cluster:
    the shared one keeps its five servers)."""
    c = Cluster(tmp_path, "removal", 3)
    try:
        victim = c.state["servers"][2]
        os.kill(victim["pid"], 9)

        def offline():
            out = c.sys("server", "report", "jetstream", check=False).stdout
            return re.search(r"^\| n3-c1 +\| +\| \w+ +\| true ", out, re.M)
        wait_until(offline, timeout=60, what="n3-c1 to show offline")
        p = c.sys("server", "cluster", "peer-remove", "n3-c1", input="y\n")
        assert "Removing peers is intended for peers that will not come back" in p.stdout
        assert "Really remove offline peer n3-c1" in p.stderr
        assert 'Removed peer "n3-c1"' in p.stderr

        def gone():
            out = c.sys("server", "report", "jetstream", check=False).stdout
            return "| n3-c1 " not in out.split("RAFT Meta Group Information")[-1]
        wait_until(gone, what="n3-c1 to leave the meta group")
        missing = c.sys("server", "cluster", "peer-remove", "n9-c1", "-f", check=False)
        assert missing.returncode == 1 and "did not find a replica named n9-c1" in missing.stderr
    finally:
        c.down()


def test_account_info(cluster):
    out = cluster.cli("account", "info").stdout
    assert out.startswith("Account Information\n")
    for label in ("Client ID", "Connected URL", "Connected Server Name"):
        assert re.search(r"^ +%s: " % label, out, re.M)
    assert "\nJetStream Account Information:\n" in out and "\nTier: Default:\n" in out
    assert re.search(r"^ +Streams: \d+ of Unlimited$", out, re.M)
    sys_out = cluster.sys("account", "info").stdout
    assert "JetStream is not supported in this account" in sys_out


# ---- core messaging -----------------------------------------------------------------------


def _spawn(c, *args):
    return subprocess.Popen(CLI + ["--context", "c", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=c.env)


def _wait_line(proc, pattern):
    """Read stderr until a line matches (the command logs it once it is subscribed)."""
    seen = []
    while True:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError("process ended before %r: %s" % (pattern, "".join(seen)))
        seen.append(line)
        if re.search(pattern, line):
            return line


def test_pub_sub_request_reply(cluster):
    sub = _spawn(cluster, "sub", "greet.>", "--count", "2")
    try:
        _wait_line(sub, r"Subscribing on greet\.>")
        pub = cluster.cli("pub", "greet.a", "hello {{Count}}", "--count", "2", "-H", "X:1")
        assert pub.stderr.count('Published 7 bytes to "greet.a"') == 2
        out, _ = sub.communicate(timeout=30)
    finally:
        sub.kill()
    assert '[#1] Received on "greet.a"\nX: 1\n\nhello 1\n' in out
    assert '[#2] Received on "greet.a"' in out and "hello 2" in out
    rep = _spawn(cluster, "reply", "svc.echo", "pong {{Count}}", "--count", "1")
    try:
        _wait_line(rep, r'Listening on "svc\.echo" in group "NATS-RPLY-22"')
        req = cluster.cli("request", "svc.echo", "ping")
        assert req.stdout == "pong 1\n\n" and "Received with rtt" in req.stderr
        rep.communicate(timeout=30)
    finally:
        rep.kill()
    none = cluster.cli("request", "nobody.here", "x")
    assert "No responders are available" in none.stderr


# ---- key-value and object stores, backups -------------------------------------------------


def test_kv_add_put_get_del_history_watch_ls(cluster):
    info = cluster.cli("kv", "add", "CFG", "--history", "5", "--replicas", "3").stdout
    assert info.startswith("Information for Key-Value Store Bucket CFG created ")
    assert re.search(r"^ +History Kept: 5$", info, re.M)
    assert "\nCluster Information:\n" in info
    watcher = _spawn(cluster, "kv", "watch", "CFG", "--updates", "--count", "2")
    try:
        # the watch is live once its consumer exists
        wait_until(lambda: json.loads(cluster.cli("consumer", "report", "KV_CFG",
                                                  "--json").stdout),
                   what="the watch consumer")
        assert cluster.cli("kv", "put", "CFG", "a", "1").stdout == "1\n"
        cluster.cli("kv", "put", "CFG", "a", "2")
        out, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert re.findall(r"^\[.*\] PUT CFG > a: (\d)$", out, re.M) == ["1", "2"]
    cluster.cli("kv", "put", "CFG", "b", "x")
    get = cluster.cli("kv", "get", "CFG", "a").stdout
    assert re.match(r"CFG > a revision: 2 created @ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\n\n2\n\n$",
                    get)
    assert cluster.cli("kv", "get", "CFG", "a", "--raw").stdout == "2\n"
    assert cluster.cli("kv", "get", "CFG", "a", "--revision", "1", "--raw").stdout == "1\n"
    cluster.cli("kv", "del", "CFG", "b", "-f")
    gone = cluster.cli("kv", "get", "CFG", "b", check=False)
    assert gone.returncode == 1 and gone.stderr == "natsjs: error: nats: key not found\n"
    assert json.loads(cluster.cli("kv", "ls", "CFG", "--json").stdout) == ["a"]
    hist = cluster.cli("kv", "history", "CFG", "a").stdout
    assert re.findall(r"^\| a +\| (\d) +\| PUT ", hist, re.M) == ["1", "2"]
    exists = cluster.cli("kv", "create", "CFG", "a", "z", check=False)
    assert exists.returncode == 1 and "key exists" in exists.stderr
    cluster.cli("kv", "create", "CFG", "b", "again")
    cluster.cli("kv", "update", "CFG", "a", "3", "2")
    stale = cluster.cli("kv", "update", "CFG", "a", "4", "2", check=False)
    assert stale.returncode == 1 and "wrong last sequence" in stale.stderr
    buckets = cluster.cli("kv", "ls").stdout
    assert re.search(r"^\| CFG +\| ", buckets, re.M)
    cluster.cli("kv", "del", "CFG", "-f")
    assert "KV_CFG" not in cluster.cli("stream", "ls", "--names", "-a").stdout.split()


def test_object_put_get_ls_rm(cluster, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(300000))
    info = cluster.cli("object", "add", "FILES", "--replicas", "3").stdout
    assert info.startswith("Information for Object Store Bucket FILES created ")
    put = cluster.cli("object", "put", "FILES", str(src), "--name", "blob").stdout
    assert "Object information for FILES > blob" in put and re.search(r"Chunks: 3$", put, re.M)
    out = tmp_path / "copy.bin"
    got = cluster.cli("object", "get", "FILES", "blob", "-O", str(out)).stdout
    assert got.startswith("Wrote: 293 KiB to %s in " % out)
    assert out.read_bytes() == src.read_bytes()
    ls = cluster.cli("object", "ls", "FILES").stdout
    assert re.search(r"^\| blob +\| 293 KiB +\| ", ls, re.M)
    meta = json.loads(cluster.cli("object", "info", "FILES", "blob", "--json").stdout)
    assert meta["size"] == 300000 and meta["digest"].startswith("SHA-256=")
    assert cluster.cli("object", "rm", "FILES", "blob", "-f").stdout == "Removed FILES > blob\n"
    assert cluster.cli("object", "ls", "FILES").stdout == "No entries found\n"
    missing = cluster.cli("object", "get", "FILES", "blob", check=False)
    assert missing.returncode == 1 and "object not found" in missing.stderr


def replica_states(c, stream):
    """Each server's own view of ``stream`` (its replica's state and consumers), from
    its monitoring port: what the server stores, not what the leader says."""
    import urllib.request
    out = {}
    for srv in c.state["servers"]:
        url = "http://127.0.0.1:%d/jsz?accounts=true&streams=true&consumers=true" % srv["http"]
        with urllib.request.urlopen(url, timeout=10) as r:
            jsz = json.loads(r.read())
        for acc in jsz.get("account_details") or []:
            for sd in acc.get("stream_detail") or []:
                if sd["name"] == stream:
                    st = sd["state"]
                    out[srv["name"]] = (
                        {k: st.get(k) for k in ("messages", "bytes", "first_seq", "last_seq",
                                                 "num_deleted")},
                        sorted((cd["name"], cd["delivered"]["stream_seq"],
                                cd["ack_floor"]["stream_seq"])
                               for cd in sd.get("consumer_detail") or []))
    return out


def test_stream_backup_and_restore(cluster, tmp_path):
    """A backup of an R3 stream restored into another natsjs cluster: every replica
    holds the same messages and consumer state (the leader takes the archive, the
    followers catch up from it), survives leadership moving, and takes new messages;
    the same backup also restores into a single server."""
    from conftest import start_natsjs
    cluster.cli("stream", "add", "KEPT", "--subjects", "kept.>", "--replicas", "3",
                "--defaults")
    cluster.cli("pub", "-J", "kept.{{Count}}", "body {{Count}}", "--count", "20", "-q")
    cluster.cli("stream", "rmm", "KEPT", "5", "-f")
    cluster.cli("consumer", "add", "KEPT", "READER", "--pull", "--defaults")
    cluster.cli("consumer", "next", "KEPT", "READER", "--count", "3")
    target = tmp_path / "backup"
    out = cluster.cli("stream", "backup", "KEPT", str(target)).stdout
    assert out.startswith('Starting backup of Stream "KEPT" with ')
    assert re.search(r'Received .* compressed data in \d+ chunks for stream "KEPT" in ', out)
    assert sorted(os.listdir(target)) == ["backup.json", "stream.tar.s2"]
    source = stream_json(cluster, "KEPT")["state"]

    other = Cluster(tmp_path, "restored", 3)
    try:
        out = other.cli("stream", "restore", str(target)).stdout
        assert out.startswith('Starting restore of Stream "KEPT" from file ')
        assert 'Restored stream "KEPT" in ' in out
        assert "\nCluster Information:\n" in out
        info = stream_json(other, "KEPT")
        assert info["config"]["num_replicas"] == 3
        st = info["state"]
        assert (st["messages"], st["first_seq"], st["last_seq"], st["num_deleted"],
                st["consumer_count"]) == (19, 1, 20, 1, 1)
        assert st["bytes"] == source["bytes"]
        wait_current(other, "KEPT", 3)
        want = ({"messages": 19, "bytes": source["bytes"], "first_seq": 1, "last_seq": 20,
                 "num_deleted": 1}, [("READER", 3, 3)])

        def same_everywhere():
            got = replica_states(other, "KEPT")
            return len(got) == 3 and all(v == want for v in got.values())
        wait_until(same_everywhere, what="every replica to hold the restored stream")
        # a former follower leads: the messages it serves are its own copy
        p = other.cli("stream", "cluster", "step-down", "KEPT")
        new = re.search(r'New leader elected "(n\d-c1)"', p.stderr).group(1)
        got = json.loads(other.cli("stream", "get", "KEPT", "7", "--json").stdout)
        assert got["subject"] == "kept.7" and base64.b64decode(got["data"]) == b"body 7"
        gone = other.cli("stream", "get", "KEPT", "5", check=False)
        assert gone.returncode == 1 and "no message found" in gone.stderr
        nxt = other.cli("consumer", "next", "KEPT", "READER").stdout
        assert re.search(r"cons seq: 4 / str seq: 4 / pending: 15", nxt), nxt
        other.cli("pub", "-J", "kept.new", "after")
        want = ({"messages": 20, "bytes": None, "first_seq": 1, "last_seq": 21,
                 "num_deleted": 1}, [("READER", 4, 4)])

        def grown():
            got = replica_states(other, "KEPT")
            return len(got) == 3 and all(
                dict(v[0], bytes=None) == want[0] and v[1] == want[1] for v in got.values())
        wait_until(grown, what="every replica to take the new message")
        assert stream_json(other, "KEPT")["cluster"]["leader"] == new
        # the name is taken now; a damaged archive leaves no stream behind
        again = other.cli("stream", "restore", str(target), check=False)
        assert again.returncode == 1 and "stream name already in use" in again.stderr
        broken = tmp_path / "broken"
        shutil.copytree(target, broken)
        meta = json.loads((broken / "backup.json").read_text())
        meta["config"].update(name="BROKEN", subjects=["broken.>"])
        (broken / "backup.json").write_text(json.dumps(meta))
        data = bytearray((broken / "stream.tar.s2").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (broken / "stream.tar.s2").write_bytes(bytes(data))
        bad = other.cli("stream", "restore", str(broken), check=False)
        assert bad.returncode == 1 and "restore failed" in bad.stderr
        wait_until(lambda: "BROKEN" not in other.cli("stream", "ls", "--names").stdout,
                   what="the failed restore's stream to go")
    finally:
        other.down()

    single = start_natsjs("-js", "-sd", str(tmp_path / "single"))
    try:
        env = dict(cluster.env)
        url = ["--no-context", "-s", single.url]
        out = run_cli(env, *url, "stream", "restore", str(target), "--replicas", "1").stdout
        assert out.startswith('Starting restore of Stream "KEPT" from file ')
        assert 'Restored stream "KEPT" in ' in out
        st = json.loads(run_cli(env, *url, "stream", "info", "KEPT", "--json").stdout)["state"]
        assert st["messages"] == 19 and st["consumer_count"] == 1
        got = run_cli(env, *url, "stream", "get", "KEPT", "7", "--json").stdout
        assert json.loads(got)["subject"] == "kept.7"
    finally:
        single.stop()


def test_sub_from_a_stream(cluster):
    cluster.cli("stream", "add", "FEED", "--subjects", "feed.>", "--defaults")
    for i in range(3):
        cluster.cli("pub", "-J", "feed.%d" % i, "item %d" % i)
    out = cluster.cli("sub", "--stream", "FEED", "feed.>", "--count", "3").stdout
    assert re.findall(r'^\[#\d\] Received on "(feed\.\d)"$', out, re.M) == \
        ["feed.0", "feed.1", "feed.2"]


def test_bench_core_and_jetstream(cluster, tmp_path):
    sub = _spawn(cluster, "bench", "sub", "bench.core", "--msgs", "2000", "--clients", "2")
    try:
        _wait_line(sub, r"Waiting for 2,000 messages on bench\.core")
        p = cluster.cli("bench", "pub", "bench.core", "--msgs", "2000", "--size", "64")
        out, _ = sub.communicate(timeout=60)
    finally:
        sub.kill()
    assert re.search(r"Starting Core NATS publisher benchmark \[clients=1, msg-size=64 B, "
                     r"msgs=2,000, sleep=0s, subject=bench\.core\]", p.stderr)
    assert re.match(r"\nNATS Core NATS publisher stats: [\d,]+ msgs/sec ~ [\d.]+ \w?i?B/sec\n",
                    p.stdout)
    assert len(re.findall(r"^  \[\d\] [\d,]+ msgs/sec .* \(2,000 msgs\)$", out, re.M)) == 2
    assert "NATS Core NATS subscriber aggregated stats: " in out
    csv = tmp_path / "sync.csv"
    p = cluster.cli("bench", "js", "pub", "sync", "bench.js", "--create", "--replicas", "3",
                    "--msgs", "200", "--purge", "--csv", str(csv))
    assert "NATS JetStream synchronous publisher stats: " in p.stdout and " ~ P99: " in p.stdout
    assert csv.read_text().count("\n") == 2
    p = cluster.cli("bench", "js", "pub", "async", "bench.js", "--msgs", "1000", "--batch",
                    "100", "--clients", "2")
    assert "NATS JetStream asynchronous publisher aggregated stats: " in p.stdout
    assert json.loads(cluster.cli("stream", "info", "benchstream", "--json").stdout)[
        "state"]["messages"] == 1200
    p = cluster.cli("bench", "js", "ordered", "--msgs", "1200")
    assert "NATS JetStream ordered ephemeral consumer stats: " in p.stdout


# ---- the same screens from the reference nats-server --------------------------------------


def test_reference_stream_and_consumer_screens_match(cluster, ref_cluster):
    screens = {}
    for name, c in (("natsjs", cluster), ("reference", ref_cluster)):
        c.cli("stream", "add", "SHAPE", "--subjects", "shape.>", "--replicas", "3",
              "--defaults")
        c.cli("pub", "-J", "shape.a", "x")
        c.cli("consumer", "add", "SHAPE", "C", "--pull", "--defaults")
        wait_current(c, "SHAPE", 3)
        screens[name] = {
            "info": c.cli("stream", "info", "SHAPE").stdout,
            "report": c.cli("stream", "report").stdout,
            "consumer": c.cli("consumer", "info", "SHAPE", "C").stdout,
            "ls": c.cli("stream", "ls").stdout,
        }
    ours, ref = screens["natsjs"], screens["reference"]
    assert labels(ours["info"]) == labels(ref["info"])
    assert len(REPLICA_RE.findall(ref["info"])) == 2
    assert labels(ours["consumer"]) == labels(ref["consumer"])
    assert cells(ours["report"], "| Stream") == cells(ref["report"], "| Stream")
    row = [line for line in ref["report"].splitlines() if line.startswith("| SHAPE ")][0]
    assert re.search(r"\| n\d-c1\*?, n\d-c1\*?, n\d-c1\*? +\|$", row)
    assert cells(ours["ls"], "| Name") == cells(ref["ls"], "| Name")
    rep = {name: c.sys("server", "report", "jetstream").stdout
           for name, c in (("natsjs", cluster), ("reference", ref_cluster))}
    for starts in ("| Server", "| Name"):
        assert cells(rep["natsjs"], starts) == cells(rep["reference"], starts)
    assert len(re.findall(r"^\| n\d-c1\* ", rep["reference"], re.M)) == 1
    acct = {name: c.cli("account", "info").stdout
            for name, c in (("natsjs", cluster), ("reference", ref_cluster))}
    assert labels(acct["natsjs"]) == labels(acct["reference"])
    ls = {name: c.sys("server", "ls").stdout
          for name, c in (("natsjs", cluster), ("reference", ref_cluster))}
    assert cells(ls["natsjs"], "| Name") == cells(ls["reference"], "| Name")
    assert len(re.findall(r"^\| n\d-c1 +\| C1 ", ls["reference"], re.M)) == 3
    srv = {name: c.sys("server", "info", "n1-c1").stdout
           for name, c in (("natsjs", cluster), ("reference", ref_cluster))}
    assert [x for x in labels(srv["natsjs"]) if x.endswith(("Details", "Limits"))] == \
        [x for x in labels(srv["reference"]) if x.endswith(("Details", "Limits"))]


# ---- stream find / subjects / gaps, consumer pause, kv revert, object watch, account and
# ---- server reports: each against natsjs and the reference, the same screens --------------

BOTH = (("natsjs", "cluster"), ("reference", "ref_cluster"))


def _both(request):
    return [(name, request.getfixturevalue(fx)) for name, fx in BOTH]


def test_stream_find_subjects_and_gaps(request):
    out = {}
    for name, c in _both(request):
        c.cli("stream", "add", "FINDME", "--subjects", "find.*", "--replicas", "3",
              "--defaults")
        c.cli("stream", "add", "FINDEMPTY", "--subjects", "findempty.>", "--defaults")
        for subj, n in (("find.a", 4), ("find.b", 2), ("find.c", 2)):
            c.cli("pub", "-J", subj, "x", "--count", str(n), "-q")
        for seq in (2, 3, 6):
            c.cli("stream", "rmm", "FINDME", str(seq), "-f")
        wait_current(c, "FINDME", 3)
        leader = stream_json(c, "FINDME")["cluster"]["leader"]
        names = {}
        for key, args in (
                ("empty", ["--empty"]), ("r1", ["--replicas", "1"]),
                ("r2-up", ["--replicas", "2", "--invert"]),
                ("subject", ["--subject", "find.>"]),
                ("leader", ["--leader", leader]),
                ("server", ["--server-name", "^%s$" % leader]),
                ("expr", ["--expression", 'state.messages >= 3 && "find.*" in config.subjects']),
                ("expr-not", ["--expression", '!(config.name startsWith "FIND") || '
                                              'len(config.subjects) != 1 || '
                                              'config.name contains "EMPTY"']),
                ("old", ["--created", "1h"]), ("idle", ["--idle", "1h"])):
            got = c.cli("stream", "find", "--names", *args).stdout.split()
            names[key] = [n for n in got if n.startswith("FIND")]
        table = c.cli("stream", "find", "--subject", "find.*").stdout
        subjects = c.cli("stream", "subjects", "FINDME").stdout
        out[name] = {
            "names": names, "table": table, "subjects": subjects,
            "subjects_json": json.loads(c.cli("stream", "subjects", "FINDME", "--json").stdout),
            "filtered": json.loads(c.cli("stream", "subjects", "FINDME", "find.a",
                                         "--json").stdout),
            "sorted": c.cli("stream", "subjects", "FINDME", "--names", "--sort",
                            "name").stdout.split(),
            "none": c.cli("stream", "subjects", "FINDEMPTY").stdout,
            "gaps": c.cli("stream", "gaps", "FINDME", "-f").stdout,
            "gaps_json": json.loads(c.cli("stream", "gaps", "FINDME", "-f", "--json").stdout),
        }
        bad = c.cli("stream", "find", "--expression", "state.messages >", check=False)
        assert bad.returncode == 1 and "invalid expression" in bad.stderr
    for name in ("natsjs", "reference"):
        o = out[name]
        n = o["names"]
        assert n["empty"] == ["FINDEMPTY"] and "FINDEMPTY" in n["r1"]
        assert "FINDME" not in n["r1"] and "FINDME" in n["r2-up"]
        assert "FINDEMPTY" not in n["r2-up"]
        assert n["subject"] == ["FINDME"] and "FINDME" in n["leader"]
        assert "FINDME" in n["server"] and n["expr"] == ["FINDME"]
        assert n["expr-not"] == ["FINDEMPTY"], (name, n)
        assert n["old"] == [] and n["idle"] == ["FINDEMPTY"]
        assert o["subjects_json"] == {"find.a": 2, "find.b": 1, "find.c": 2}
        assert o["filtered"] == {"find.a": 2}
        assert o["sorted"] == ["find.a", "find.b", "find.c"]
        assert "3 Subjects in stream FINDME" in o["subjects"]
        assert cells(o["subjects"], "| Subject") == ["Subject", "Count"] * 3
        assert o["none"] == "No subjects found matching >\n"
        assert o["gaps_json"] == [[2, 3], [6, 6]]
        assert "2 gaps found in Stream FINDME" in o["gaps"]
        assert re.findall(r"^\| (\d+) +\| (\d+) +\|$", o["gaps"], re.M) == \
            [("2", "3"), ("6", "6")]
        assert cells(o["table"], "| FINDME ")[3] == "5"
    assert cells(out["natsjs"]["table"], "| Name") == cells(out["reference"]["table"], "| Name")
    assert out["natsjs"]["subjects"] == out["reference"]["subjects"]
    assert out["natsjs"]["gaps"] == out["reference"]["gaps"]


def test_consumer_pause_and_resume(request):
    screens = {}
    for name, c in _both(request):
        c.cli("stream", "add", "PAUSING", "--subjects", "pausing", "--replicas", "3",
              "--defaults")
        c.cli("consumer", "add", "PAUSING", "HELD", "--pull", "--defaults")
        p = c.cli("consumer", "pause", "PAUSING", "HELD", "1h", "-f").stdout
        assert re.match(r"Paused PAUSING > HELD until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
                        r"\((1h0m0s|59m59s)\)\n$", p), (name, p)
        info = c.cli("consumer", "info", "PAUSING", "HELD").stdout
        assert re.search(r"^ +Paused Until Deadline: \d{4}-.* \((1h0m0s|59m5\ds) remaining\)$",
                         info, re.M), info
        assert re.search(r"^ +Paused Until: \d{4}-.* \((1h0m0s|59m5\ds) remaining\)$", info,
                         re.M), info
        assert json.loads(c.cli("consumer", "info", "PAUSING", "HELD", "--json").stdout)[
            "paused"] is True
        # the new leader is paused too
        c.cli("consumer", "cluster", "step-down", "PAUSING", "HELD")
        assert json.loads(c.cli("consumer", "info", "PAUSING", "HELD", "--json").stdout)[
            "paused"] is True
        r = c.cli("consumer", "resume", "PAUSING", "HELD", "-f").stdout
        assert re.match(r"Consumer PAUSING > HELD was resumed while previously paused until "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\n$", r), r
        after = c.cli("consumer", "info", "PAUSING", "HELD").stdout
        assert "Paused Until" not in after
        again = c.cli("consumer", "resume", "PAUSING", "HELD", "-f", check=False)
        assert again.returncode == 1 and again.stderr == \
            "natsjs: error: consumer is not paused\n"
        past = c.cli("consumer", "pause", "PAUSING", "HELD", "2001-01-01 00:00:00", "-f",
                     check=False)
        assert past.returncode == 1 and "perhaps due to a time in the past" in past.stderr
        assert "Paused Until Deadline: 2001-01-01" in \
            c.cli("consumer", "info", "PAUSING", "HELD").stdout
        garbage = c.cli("consumer", "pause", "PAUSING", "HELD", "soon", "-f", check=False)
        assert garbage.returncode == 1 and "either timestamp or duration" in garbage.stderr
        screens[name] = info
    assert labels(screens["natsjs"]) == labels(screens["reference"])


def test_kv_revert_and_object_watch(request, tmp_path):
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(200000))
    hist = {}
    for name, c in _both(request):
        c.cli("kv", "add", "REV", "--history", "5")
        for v in ("one", "two", "three"):
            c.cli("kv", "put", "REV", "k", v)
        out = c.cli("kv", "revert", "REV", "k", "1", "--force").stdout
        assert re.findall(r"^\| k +\| (\d) +\| PUT +\| .* \| (\w+) +\|$", out, re.M) == \
            [("1", "one"), ("2", "two"), ("3", "three"), ("4", "one")], out
        assert c.cli("kv", "get", "REV", "k", "--raw").stdout == "one\n"
        one = c.cli("kv", "revert", "REV", "k", "9", "--force", check=False)
        assert one.returncode == 1 and "key not found" in one.stderr
        c.cli("kv", "add", "ONCE")
        c.cli("kv", "put", "ONCE", "k", "v")
        single = c.cli("kv", "revert", "ONCE", "k", "1", "--force", check=False)
        assert single.returncode == 1 and \
            "cannot revert key in a bucket where history=1" in single.stderr
        hist[name] = out
        c.cli("object", "add", "WATCHED")
        c.cli("object", "put", "WATCHED", str(blob), "--name", "first", "-f")
        c.cli("object", "put", "WATCHED", str(blob), "--name", "gone", "-f")
        c.cli("object", "rm", "WATCHED", "gone", "-f")
        watcher = subprocess.Popen(CLI + ["--context", "c", "object", "watch", "WATCHED",
                                          "--count", "3"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True, env=c.env)
        try:
            # the history first (first, then gone's delete), then what changes
            lines = [watcher.stdout.readline(), watcher.stdout.readline()]
            c.cli("object", "put", "WATCHED", str(blob), "--name", "later", "-f")
            rest, _ = watcher.communicate(timeout=60)
        finally:
            watcher.kill()
        lines += rest.splitlines(True)
        pat = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "
        assert re.match(pat + r"PUT WATCHED > first: 195 KiB bytes in 2 chunks\n$", lines[0])
        assert re.match(pat + r"DEL WATCHED > gone\n$", lines[1]), lines
        assert re.match(pat + r"PUT WATCHED > later: 195 KiB bytes in 2 chunks\n$", lines[2])
    assert cells(hist["natsjs"], "| Key") == cells(hist["reference"], "| Key")


def test_account_report_connections_and_statistics(request):
    """An ordinary user's view of its own account (the system imports every account
    has): its connections and its traffic on each server."""
    shapes = {}
    for name, c in _both(request):
        sub = _spawn(c, "sub", "acct.report", "--count", "1")
        try:
            _wait_line(sub, r"Subscribing on acct\.report")
            conns = c.cli("account", "report", "connections").stdout
            stats = c.cli("account", "report", "statistics").stdout
            as_json = json.loads(c.cli("account", "report", "connections", "--json").stdout)
            c.cli("pub", "acct.report", "done")
            sub.communicate(timeout=30)
        finally:
            sub.kill()
        assert re.search(r"Top \d+ Connections out of \d+ by subs", conns)
        assert "NATSJS CLI Version" in conns and "Connections per server" in conns
        rows = [line for line in conns.splitlines() if re.match(r"^\| \d+ +\| ", line)]
        assert len(rows) >= 2 and all("$SYS" not in r for r in rows)
        assert len(as_json) >= 2 and all(x["server"]["name"] and x["cid"] for x in as_json)
        assert "Server Statistics" in stats
        # the footer: the servers that answered (those where the account has
        # connections), then the totals
        footer = [x.strip() for x in
                  [line for line in stats.splitlines() if line.startswith("| ")][-1]
                  .strip("|").split("|")]
        assert 1 <= int(footer[0]) <= len(c.state["servers"])
        assert int(footer[4].replace(",", "")) >= 2          # two connections at least
        shapes[name] = (conns, stats)
    for i in (0, 1):
        first = "| CID" if i == 0 else "| Server"
        assert cells(shapes["natsjs"][i], first) == cells(shapes["reference"][i], first)


def test_server_report_cpu_mem_routes_gateways_leafnodes_health(request):
    out = {}
    for name, c in _both(request):
        size = len(c.state["servers"])
        cpu = c.sys("server", "report", "cpu").stdout
        mem = c.sys("server", "report", "mem").stdout
        assert cpu.startswith("CPU Usage\n\n") and mem.startswith("Memory Usage\n\n")
        bars = re.findall(r"^  (n\d-c1): (?:█+|▏) \(([\d.,]+)\)$", cpu, re.M)
        assert len(bars) == size, cpu
        assert len(re.findall(r"^  n\d-c1: (?:█+|▏) \(\d+(\.\d)? MiB\)$", mem, re.M)) == size
        usage = json.loads(c.sys("server", "report", "mem", "--json").stdout)
        assert sorted(usage) == ["n%d-c1" % (i + 1) for i in range(size)]
        assert all(isinstance(v, int) and v > 0 for v in usage.values())
        one = c.sys("server", "report", "cpu", "--host", "n2-c1").stdout
        assert re.findall(r"^  (n\d-c1): ", one, re.M) == ["n2-c1"]
        routes = c.sys("server", "report", "routes").stdout
        footer = [line for line in routes.splitlines() if line.startswith("| %d " % size)]
        assert footer and cells(footer[0], "|")[1] == "1"
        assert re.search(r"^\| n1-c1 +\| C1 +\| n\d-c1 ", routes, re.M)
        gw = c.sys("server", "report", "gateways").stdout
        assert "Super Cluster Report" in gw
        leaf = c.sys("server", "report", "leafnodes").stdout
        assert "Leafnode Report" in leaf
        health = c.sys("server", "report", "health").stdout
        assert len(re.findall(r"^\| n\d-c1 +\| C1 +\| +\| ok \(200\) ", health, re.M)) == size
        assert "ok: %d / err: 0" % size in health
        out[name] = {"routes": routes, "gw": gw, "leaf": leaf, "health": health}
    for key, first in (("routes", "| Server"), ("gw", "| Server"), ("leaf", "| Server"),
                       ("health", "| Server")):
        assert cells(out["natsjs"][key], first) == cells(out["reference"][key], first), key


def test_find_expressions_and_helpers_in_process():
    from natsjs.admin.server_report import bar_graph, commaf
    from natsjs.admin.streamquery import Expression, gap_ranges, subject_is_subset_match
    info = {"config": {"name": "ORDERS", "subjects": ["js.in.orders_1", "x.*"],
                       "num_replicas": 3},
            "state": {"messages": 7}, "cluster": {"name": "lon", "leader": "n1"}}
    for text, want in (('state.messages < 10', True), ("state.messages > 10", False),
                       ('info.cluster.name in ["lon", "sfo"]', True),
                       ('"js.in.orders_1" in config.subjects', True),
                       ('config.name matches "^ORD" && !(state.messages == 7)', False),
                       ("config.name startsWith 'OR' and config.num_replicas == 3", True),
                       ("len(config.subjects) == 2 || nil", True),
                       ("config.missing == nil", True)):
        assert Expression(text).test(info) is want, text
    for bad in ("__import__('os')", "config.name.upper()", "state.messages >",
                "[x for x in config]", "lambda: 1"):
        with pytest.raises(Exception) as e:
            Expression(bad).test(info)
        assert "expression" in str(e.value)
    with pytest.raises(Exception):
        Expression("state.messages").test(info)          # not a boolean
    assert subject_is_subset_match("orders.new", "orders.*")
    assert subject_is_subset_match("orders.*", "orders.>")
    assert not subject_is_subset_match("orders.>", "orders.*")
    assert not subject_is_subset_match("orders", "orders.*")
    assert gap_ranges([9, 2, 3, 4, 7]) == [[2, 4], [7, 7], [9, 9]]
    assert commaf(1234.5) == "1,234.5" and commaf(3.0) == "3" and commaf(0.25) == "0.25"
    graph = bar_graph({"a": 1.0, "bb": 3.0, "c": 0.0}, "CPU Usage", 10, False)
    assert graph == ("CPU Usage\n\n   c: ▏ (0)\n   a: ███ (1)\n  bb: ██████████ (3)\n")
