"""``natsjs server ...``: the system user's view of the servers, natscli's commands.

Every server answers ``$SYS.REQ.SERVER.PING[.<KIND>]``; the CLI first learns how many
servers there are (``active_servers`` in one STATSZ answer) and then waits for that
many answers, so the reports are complete without guessing at timeouts.  ``report
jetstream`` prints the documentation's two tables (JetStream Summary, RAFT Meta Group
Information); ``cluster step-down`` and ``cluster peer-remove`` act on the meta group
(``server raft ...`` is the older spelling the documentation also uses).
"""
from __future__ import annotations

import asyncio
import json
import time

from natsjs.admin import prompt, server_report
from natsjs.admin.args import json_flag
from natsjs.admin.errors import CLIError, q
from natsjs.admin.jsapi import gather, server_requests
from natsjs.admin.render import (Columns, Table, duration, go_duration, ibytes, local_time,
                                 log, parse_duration, parse_time, print_json, seconds2, since, NS)


def register(top) -> None:
    g = top.group("server", "Server information", aliases=["srv", "sys", "svr", "system"])

    p = g.command("ls", "List known servers", ls, aliases=["list"])
    p.add_argument("expect", nargs="?", type=int, default=0, help="How many servers to expect")
    p.add_argument("--sort", default="rtt", choices=["name", "cluster", "conns", "subs",
                                                     "routes", "mem", "cpu", "uptime", "rtt"],
                   help="Sort servers by a specific key")
    p.add_argument("-R", "--reverse", action="store_true", help="Reverse sort servers")
    json_flag(p)

    p = g.command("ping", "Ping all servers", ping)
    p.add_argument("expect", nargs="?", type=int, default=0, help="How many servers to expect")
    p.add_argument("--id", action="store_true", help="Include the Server ID in the output")

    p = g.command("info", "Show information about a single server", info, aliases=["i"])
    p.add_argument("server_id", metavar="server", nargs="?", default="",
                   help="Server ID or Name to inspect")
    json_flag(p)

    c = g.group("check", "Health check for NATS servers")
    for sub in (c,):
        sub.parser.add_argument("--format", choices=["nagios", "json", "text"],
                                default="nagios", help="Render the check in a format")
    p = c.command("connection", "Checks basic server connection", check_connection,
                  aliases=["conn"])
    _check_format(p)
    for flag, dflt in (("connect-warn", "500ms"), ("connect-critical", "1s"),
                       ("rtt-warn", "500ms"), ("rtt-critical", "1s"),
                       ("req-warn", "500ms"), ("req-critical", "1s")):
        p.add_argument("--" + flag, default=dflt, help="Threshold (duration)")
    p = c.command("jetstream", "Check JetStream account state", check_jetstream,
                  aliases=["js"])
    _check_format(p)
    p.add_argument("--mem-warn", type=int, default=75)
    p.add_argument("--mem-critical", type=int, default=90)
    p.add_argument("--store-warn", type=int, default=75)
    p.add_argument("--store-critical", type=int, default=90)
    p.add_argument("--streams-warn", type=int, default=-1)
    p.add_argument("--streams-critical", type=int, default=-1)
    p.add_argument("--consumers-warn", type=int, default=-1)
    p.add_argument("--consumers-critical", type=int, default=-1)
    p.add_argument("--replicas", action=__import__("argparse").BooleanOptionalAction,
                   default=True, help="Checks if all streams have healthy replicas")
    p.add_argument("--replica-seen-critical", default="5s")
    p.add_argument("--replica-lag-critical", type=int, default=200)
    p = c.command("stream", "Checks the health of mirrored streams, streams with sources or "
                  "clustered streams", check_stream)
    _check_format(p)
    p.add_argument("--stream", required=True, help="The stream to check")
    p.add_argument("--peer-expect", type=int, default=None, help="Cluster replicas to expect")
    p.add_argument("--peer-lag-critical", type=int, default=None)
    p.add_argument("--peer-seen-critical", default="")
    p.add_argument("--lag-critical", type=int, default=None, help="Source/mirror lag")
    p.add_argument("--seen-critical", default="", help="Source/mirror last seen")
    p.add_argument("--msgs-warn", type=int, default=None)
    p.add_argument("--msgs-critical", type=int, default=None)
    p = c.command("meta", "Check JetStream cluster state", check_meta, aliases=["raft"])
    _check_format(p)
    p.add_argument("--expect", type=int, required=True, help="Number of servers to expect")
    p.add_argument("--lag-critical", type=int, required=True)
    p.add_argument("--seen-critical", required=True)

    r = g.group("report", "Report on various server metrics", aliases=["rep"])
    p = r.command("jetstream", "Report on JetStream activity", report_jetstream,
                  aliases=["jsz", "js"])
    p.add_argument("limit", nargs="?", type=int, default=0,
                   help="Limit the responses to a certain amount of servers")
    p.add_argument("--account", default="", help="Produce the report for a specific account")
    p.add_argument("--sort", default="name", choices=["name", "cluster", "streams",
                                                      "consumers", "msgs", "mbytes", "mem",
                                                      "file", "api", "err"])
    json_flag(p)
    p = r.command("connections", "Report on connections", report_connections,
                  aliases=["conn", "connz", "conns"])
    p.add_argument("limit", nargs="?", type=int, default=0)
    p.add_argument("--account", default="", help="Limit report to a specific account")
    p.add_argument("--sort", default="subs", choices=["in-bytes", "out-bytes", "in-msgs",
                                                      "out-msgs", "uptime", "cid", "subs"])
    p.add_argument("--top", type=int, default=1000, help="Limit results to the top results")
    p.add_argument("--subject", default="", help="Only connections interested in a subject")
    p.add_argument("--username", default="", help="Only connections of a username")
    p.add_argument("--state", default="open", choices=["open", "closed", "all"])
    json_flag(p)
    p = r.command("accounts", "Report on account activity", report_accounts, aliases=["acct"])
    p.add_argument("account", nargs="?", default="", help="Account to produce a report for")
    p.add_argument("--sort", default="subs", choices=["in-bytes", "out-bytes", "in-msgs",
                                                      "out-msgs", "conns", "subs"])
    p.add_argument("--top", type=int, default=1000)
    json_flag(p)

    server_report.register(r)

    q_ = g.group("request", "Request monitoring data from a specific server", aliases=["req"])
    for name, kind, aliases, help_ in (
            ("jetstream", "JSZ", ["jsz", "js"], "Show JetStream details"),
            ("subscriptions", "SUBSZ", ["sub", "subsz"], "Show subscription information"),
            ("variables", "VARZ", ["var", "varz"], "Show runtime variables"),
            ("connections", "CONNZ", ["conn", "connz"], "Show connection details"),
            ("routes", "ROUTEZ", ["route", "routez"], "Show route details"),
            ("gateways", "GATEWAYZ", ["gateway", "gwy", "gatewayz"], "Show gateway details"),
            ("leafnodes", "LEAFZ", ["leaf", "leafz"], "Show leafnode details"),
            ("accounts", "ACCOUNTZ", ["accountz", "acct"], "Show account details"),
            ("jetstream-health", "HEALTHZ", ["healthz"], "Request JetStream health status")):
        p = q_.command(name, help_, request, aliases=aliases)
        p.set_defaults(kind=kind)
        p.add_argument("wait", nargs="?", type=int, default=0,
                       help="Wait for a certain number of responses")
        p.add_argument("--limit", type=int, default=2048)
        p.add_argument("--offset", type=int, default=0)
        p.add_argument("--name", default="", help="Limit to servers matching a server name")
        p.add_argument("--host", default="", help="Limit to servers matching a host name")
        p.add_argument("--cluster", default="", help="Limit to servers matching a cluster")
        if kind == "JSZ":
            p.add_argument("--account", default="")
            p.add_argument("--accounts", action="store_true")
            p.add_argument("--streams", action="store_true")
            p.add_argument("--consumer", action="store_true")
            p.add_argument("--config", action="store_true")
            p.add_argument("--leader", action="store_true",
                           help="Request a response from the Meta-group leader only")
            p.add_argument("--all", action="store_true")
        if kind in ("CONNZ", "ROUTEZ", "LEAFZ"):
            p.add_argument("--subscriptions", action="store_true")
        if kind == "SUBSZ":
            p.add_argument("--detail", action="store_true")
        if kind == "ACCOUNTZ":
            p.add_argument("--account", default="")

    for name, aliases in (("cluster", ["r"]), ("raft", [])):
        cl = g.group(name, "Manage JetStream Clustering", aliases=aliases)
        p = cl.command("step-down", "Force a new leader election by standing down the "
                       "current meta leader", meta_step_down,
                       aliases=["stepdown", "sd", "elect", "down", "d"])
        p.add_argument("--host", default="", help="Request placement of the leader on a node")
        p.add_argument("-f", "--force", action="store_true", help="Force leader step down")
        json_flag(p)
        p = cl.command("peer-remove", "Removes a server from a JetStream cluster",
                       meta_peer_remove, aliases=["rm", "pr"])
        p.add_argument("name", help="The Server Name or ID to remove from the cluster")
        p.add_argument("-f", "--force", action="store_true", help="Force removal")
        json_flag(p)


def _check_format(p) -> None:
    p.add_argument("--format", dest="check_format", choices=["nagios", "json", "text"],
                   default=None, help="Render the check in a specific format")


# ---- gathering answers --------------------------------------------------------------------


def _filters(a) -> dict:
    out = {}
    for key, attr in (("server_name", "name"), ("host", "host"), ("cluster", "cluster")):
        v = getattr(a, attr, "")
        if v:
            out[key] = v
    return out


# ---- ls / ping / info ---------------------------------------------------------------------


async def ls(rt) -> None:
    a = rt.args
    nc = await rt.conn()
    got = await server_requests(nc, "$SYS.REQ.SERVER.PING", None, a.expect, rt.timeout,
                                rt.settings.trace, with_rtt=True, expect_from_stats=not a.expect)
    if a.json:
        print_json([dict(r, rtt=int(t * NS)) for r, t in got])
        return
    key = {
        "name": lambda x: x[0]["server"]["name"],
        "cluster": lambda x: (x[0]["server"].get("cluster", ""), x[0]["server"]["name"]),
        "conns": lambda x: x[0]["statsz"].get("connections", 0),
        "subs": lambda x: x[0]["statsz"].get("subscriptions", 0),
        "routes": lambda x: len(x[0]["statsz"].get("routes") or []),
        "mem": lambda x: x[0]["statsz"].get("mem", 0),
        "cpu": lambda x: x[0]["statsz"].get("cpu", 0),
        "uptime": lambda x: x[0]["statsz"].get("start", ""),
        "rtt": lambda x: x[1],
    }[a.sort]
    got.sort(key=key, reverse=a.reverse)
    t = Table("Server Overview", ["Name", "Cluster", "Host", "Version", "JS", "Conns", "Subs",
                                  "Routes", "GWs", "Mem", "CPU %", "Cores", "Slow", "Uptime",
                                  "RTT"])
    clusters: dict[str, dict] = {}
    totals = {"conns": 0, "subs": 0, "mem": 0, "slow": 0, "js": 0}
    for r, rtt in got:
        srv, st = r.get("server") or {}, r.get("statsz") or {}
        cl = srv.get("cluster", "")
        if cl:
            info_ = clusters.setdefault(cl, {"nodes": 0, "conns": 0, "gw_out": 0, "gw_in": 0})
            info_["nodes"] += 1
            info_["conns"] += st.get("connections", 0)
            info_["gw_out"] += len(st.get("gateways") or [])
        totals["conns"] += st.get("connections", 0)
        totals["subs"] += st.get("subscriptions", 0)
        totals["mem"] += st.get("mem", 0)
        totals["slow"] += st.get("slow_consumers", 0)
        totals["js"] += 1 if srv.get("jetstream") else 0
        up = since(st.get("start"), _server_time(srv))
        t.add(srv.get("name", ""), cl, srv.get("host", ""), srv.get("ver", ""),
              "yes" if srv.get("jetstream") else "no", st.get("connections", 0),
              st.get("subscriptions", 0), len(st.get("routes") or []),
              len(st.get("gateways") or []), ibytes(st.get("mem", 0)),
              "%.0f" % st.get("cpu", 0), str(st.get("cores", 0)), st.get("slow_consumers", 0),
              duration(up), duration(int(round(rtt, 3) * NS)))
    t.set_footer("", len(clusters), len(got), "", totals["js"], totals["conns"],
                 totals["subs"], "", "", ibytes(totals["mem"]), "", "", totals["slow"], "", "")
    t.print()
    if clusters:
        print()
        t = Table("Cluster Overview", ["Cluster", "Node Count", "Outgoing Gateways",
                                       "Incoming Gateways", "Connections"])
        for name, c in sorted(clusters.items(), key=lambda kv: kv[1]["conns"]):
            t.add(name, c["nodes"], c["gw_out"], c["gw_in"], c["conns"])
        t.set_footer("", sum(c["nodes"] for c in clusters.values()),
                     sum(c["gw_out"] for c in clusters.values()),
                     sum(c["gw_in"] for c in clusters.values()),
                     sum(c["conns"] for c in clusters.values()))
        t.print()


def _server_time(srv: dict):
    return parse_time(srv.get("time"))


async def ping(rt) -> None:
    a = rt.args
    nc = await rt.conn()
    start = time.monotonic()
    times = []
    try:
        got = await server_requests(nc, "$SYS.REQ.SERVER.PING", None, a.expect, rt.timeout,
                                    rt.settings.trace, with_rtt=True,
                                    expect_from_stats=not a.expect,
                                    on_each=lambda r, t: _ping_line(r, t, a.id, times))
    except CLIError:
        got = []
    print()
    print("---- ping statistics ----")
    if times:
        print("%d replies max: %.2f min: %.2f avg: %.2f" % (
            len(times), max(times), min(times), sum(times) / len(times)))
    else:
        print("no responses received")
    expect = a.expect or (got[0][0].get("statsz", {}).get("active_servers", 0) if got else 0)
    if expect and expect != len(times):
        print("\nMissing %d server(s)" % (expect - len(times)))
    _ = start


def _ping_line(r: dict, t: float, show_id: bool, times: list) -> None:
    srv = r.get("server") or {}
    times.append(t * 1000)
    rtt = go_duration(int(t * NS))
    if show_id:
        print("%s %-60s rtt=%s" % (srv.get("id", ""), srv.get("name", ""), rtt))
    else:
        print("%-60s rtt=%s" % (srv.get("name", ""), rtt))


async def info(rt) -> None:
    a = rt.args
    nc = await rt.conn()
    who = a.server_id
    if len(who) == 56 and who.upper() == who:
        subject, body = "$SYS.REQ.SERVER.%s.VARZ" % who, {}
    else:
        subject = "$SYS.REQ.SERVER.PING.VARZ"
        body = {"server_name": who, "exact_match": True} if who else {}
    got = await server_requests(nc, subject, body, 1, rt.timeout, rt.settings.trace)
    resp = got[0]
    if resp.get("error"):
        raise CLIError("invalid response received: %s" % json.dumps(resp["error"]))
    v = resp.get("data") or {}
    if a.json:
        print_json(v)
        return
    sid, name = v.get("server_id", ""), v.get("server_name", "")
    c = Columns("Server information for %s" % sid if sid == name
                else "Server information for %s (%s)" % (name, sid))
    c.title("Process Details")
    c.row("Version", v.get("version", ""))
    c.row("Git Commit", v.get("git_commit", ""))
    c.row("Go Version", v.get("go", ""))
    c.row("Start Time", local_time(v.get("start")))
    c.row("Configuration Load Time", local_time(v.get("config_load_time")))
    c.row("Uptime", v.get("uptime", ""))
    c.title("Connection Details")
    c.row("Auth Required", bool(v.get("auth_required")))
    c.row("TLS Required", bool(v.get("tls_required")))
    c.row("Host", "%s:%d" % (v.get("host", ""), v.get("port", 0)))
    for i, u in enumerate(v.get("connect_urls") or []):
        c.row("Client URLs" if i == 0 else "", u)
    js = v.get("jetstream") or {}
    jcfg, jstats = js.get("config") or {}, js.get("stats") or {}
    if jcfg.get("store_dir"):
        c.title("JetStream")
        c.row("Domain", jcfg.get("domain", ""))
        c.row("API Support Level", (jstats.get("api") or {}).get("level", 0))
        c.row("Storage Directory", jcfg["store_dir"])
        c.row("Active Accounts", jstats.get("accounts", 0))
        c.row("Memory In Use", ibytes(jstats.get("memory", 0)))
        c.row("File In Use", ibytes(jstats.get("storage", 0)))
        c.row("API Requests", (jstats.get("api") or {}).get("total", 0))
        c.row("API Errors", (jstats.get("api") or {}).get("errors", 0))
        c.row("Maximum Memory Storage", ibytes(jcfg.get("max_memory", 0)))
        c.row("Maximum File Storage", ibytes(jcfg.get("max_storage", 0)))
    c.title("Limits")
    c.row("Maximum Connections", v.get("max_connections", 0))
    c.row("Maximum Subscriptions", v.get("max_subscriptions", 0))
    c.row("Maximum Payload", ibytes(v.get("max_payload", 0)))
    c.row("TLS Timeout", go_duration(int((v.get("tls_timeout") or 0) * NS)))
    c.row("Write Deadline", duration(v.get("write_deadline") or 0))
    c.title("Statistics")
    c.row("CPU Cores", "%d %.2f%%" % (v.get("cores", 0), v.get("cpu", 0)))
    c.row("Memory", ibytes(v.get("mem", 0)))
    c.row("Connections", v.get("connections", 0))
    c.row("Subscriptions", v.get("subscriptions", 0))
    c.row("Messages", "%s in %s out" % ("{:,}".format(v.get("in_msgs", 0)),
                                        "{:,}".format(v.get("out_msgs", 0))))
    c.row("Bytes", "%s in %s out" % (ibytes(v.get("in_bytes", 0)), ibytes(v.get("out_bytes", 0))))
    c.row("Slow Consumers", v.get("slow_consumers", 0))
    cl = v.get("cluster") or {}
    if cl.get("urls"):
        c.title("Cluster")
        c.row("Name", cl.get("name", ""))
        c.row("Host", "%s:%d" % (cl.get("addr", ""), cl.get("cluster_port", 0)))
        for i, u in enumerate(cl["urls"]):
            c.row("URLs" if i == 0 else "", u)
    c.print()


# ---- checks (nagios-style results, as jsm.go's monitor package renders them) -------------


class Check:
    def __init__(self, name: str, fmt: str | None):
        self.name, self.fmt = name, fmt or "nagios"
        self.oks: list[str] = []
        self.warnings: list[str] = []
        self.criticals: list[str] = []
        self.perf: list[dict] = []

    def ok(self, msg):
        self.oks.append(msg)

    def warn(self, msg):
        self.warnings.append(msg)

    def crit(self, msg):
        self.criticals.append(msg)

    def pd(self, name, value, unit="", warn=0, crit=0):
        self.perf.append({"name": name, "value": value, "unit": unit, "warning": warn,
                          "critical": crit})

    @property
    def status(self) -> str:
        return "CRITICAL" if self.criticals else "WARNING" if self.warnings else "OK"

    def _perf_text(self) -> str:
        out = []
        for p in self.perf:
            vf = "%0.4f" if p["unit"] == "s" else "%0.0f"
            item = ("%s=" + vf) % (p["name"], p["value"]) + p["unit"]
            if p["warning"] or p["critical"]:
                item += (";" + vf) % p["warning"] if p["warning"] else ";"
                if p["critical"]:
                    item += (";" + vf) % p["critical"]
            out.append(item)
        return " ".join(out)

    def render(self) -> int:
        if self.fmt == "json":
            print_json({"name": self.name, "status": self.status, "check_suffix": "",
                        "warning": self.warnings, "critical": self.criticals, "ok": self.oks,
                        "perf_data": self.perf})
        elif self.fmt == "text":
            print("%s: %s\n" % (self.name, self.status))
            t = Table("", ["Status", "Message"])
            for kind, items in (("OK", self.oks), ("Warning", self.warnings),
                                ("Critical", self.criticals)):
                for m in items:
                    t.add(kind, m)
            if t.rows:
                print("Status Detail\n")
                t.print()
        else:
            parts = [self.name] + ["Crit:%s" % c for c in self.criticals] + \
                ["Warn:%s" % w for w in self.warnings] + ["OK:%s" % o for o in self.oks]
            line = "%s %s" % (self.status, " ".join(parts))
            if self.perf:
                line += " | " + self._perf_text()
            print(line)
        return {"OK": 0, "WARNING": 1, "CRITICAL": 2}[self.status]


def _fmt(rt):
    return getattr(rt.args, "check_format", None) or getattr(rt.args, "format", None)


def _secs(text: str) -> float:
    return parse_duration(text) / NS if text else 0.0


async def check_connection(rt) -> int:
    import nats.errors
    a = rt.args
    chk = Check("Connection", _fmt(rt))
    start = time.monotonic()
    try:
        nc = await rt.conn()
    except CLIError as e:
        chk.crit("connection failed: %s" % e)
        return chk.render()
    ct = time.monotonic() - start
    cw, cc = _secs(a.connect_warn), _secs(a.connect_critical)
    chk.pd("connect_time", ct, "s", cw, cc)
    url = str(nc.connected_url.geturl()) if nc.connected_url else ""
    if cc and ct >= cc:
        chk.crit("connected to %s, connect time exceeded %s" % (url, a.connect_critical))
    elif cw and ct >= cw:
        chk.warn("connected to %s, connect time exceeded %s" % (url, a.connect_warn))
    else:
        chk.ok("connected to %s in %s" % (url, go_duration(int(ct * NS))))
    t0 = time.monotonic()
    await nc.flush(timeout=rt.timeout)
    rtt = time.monotonic() - t0
    rw, rc = _secs(a.rtt_warn), _secs(a.rtt_critical)
    chk.pd("rtt", rtt, "s", rw, rc)
    if rc and rtt >= rc:
        chk.crit("rtt time exceeded %s" % a.rtt_critical)
    elif rw and rtt >= rw:
        chk.warn("rtt time exceeded %s" % a.rtt_warn)
    else:
        chk.ok("rtt time %s" % go_duration(int(rtt * NS)))
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    t0 = time.monotonic()
    await nc.publish(inbox, b"ping")
    try:
        await sub.next_msg(timeout=rt.timeout)
        rq = time.monotonic() - t0
        qw, qc = _secs(a.req_warn), _secs(a.req_critical)
        chk.pd("request_time", rq, "s", qw, qc)
        if qc and rq >= qc:
            chk.crit("round trip request took %s" % go_duration(int(rq * NS)))
        elif qw and rq >= qw:
            chk.warn("round trip request took %s" % go_duration(int(rq * NS)))
        else:
            chk.ok("round trip took %.4fs" % rq)
    except (nats.errors.TimeoutError, asyncio.TimeoutError):
        chk.crit("did not receive from %s: timeout" % inbox)
    return chk.render()


async def check_jetstream(rt) -> int:
    a = rt.args
    chk = Check("JetStream", _fmt(rt))
    try:
        js = await rt.js()
        acct = await js.account_info()
    except CLIError as e:
        chk.crit("JetStream not available: %s" % e)
        return chk.render()
    limits = acct.get("limits") or {}
    for item, unit, warn, crit, mx, cur in (
            ("memory", "B", a.mem_warn, a.mem_critical, limits.get("max_memory", -1),
             acct.get("memory", 0)),
            ("storage", "B", a.store_warn, a.store_critical, limits.get("max_storage", -1),
             acct.get("storage", 0)),
            ("streams", "", a.streams_warn, a.streams_critical, limits.get("max_streams", -1),
             acct.get("streams", 0)),
            ("consumers", "", a.consumers_warn, a.consumers_critical,
             limits.get("max_consumers", -1), acct.get("consumers", 0))):
        pct = int(cur / mx * 100) if mx and mx > 0 else 0
        chk.pd(item, cur, unit)
        chk.pd(item + "_pct", pct, "%", max(warn, 0), max(crit, 0))
        if warn != -1 and crit != -1 and warn >= crit:
            chk.crit("%s: invalid thresholds" % item)
        elif pct > 100:
            chk.crit("%s: exceed server limits" % item)
        elif warn >= 0 and crit >= 0:
            if pct > crit:
                chk.crit("%d%% %s" % (pct, item))
            elif pct > warn:
                chk.warn("%d%% %s" % (pct, item))
    if a.replicas:
        seen_crit = _secs(a.replica_seen_critical)
        counts = {"ok": 0, "no_leader": 0, "missing": 0, "lagged": 0, "not_seen": 0, "fail": 0}
        infos, _ = await js.paged("STREAM.LIST", "streams")
        for i in infos:
            replicas = (i.get("config") or {}).get("num_replicas", 1)
            cl = i.get("cluster")
            if replicas == 1:
                counts["ok"] += 1
            elif not cl:
                counts["fail"] += 1
            elif not cl.get("leader"):
                counts["no_leader"] += 1
            elif len(cl.get("replicas") or []) != replicas - 1:
                counts["missing"] += 1
            else:
                good = True
                for r in cl.get("replicas") or []:
                    if r.get("offline"):
                        counts["fail"] += 1
                        good = False
                    elif seen_crit and (r.get("active") or 0) > seen_crit * NS:
                        counts["not_seen"] += 1
                        good = False
                    elif a.replica_lag_critical and (r.get("lag") or 0) > a.replica_lag_critical:
                        counts["lagged"] += 1
                        good = False
                if good:
                    counts["ok"] += 1
        chk.pd("replicas_ok", counts["ok"])
        chk.pd("replicas_no_leader", counts["no_leader"])
        chk.pd("replicas_missing_replicas", counts["missing"])
        chk.pd("replicas_lagged", counts["lagged"], "", 0, a.replica_lag_critical)
        chk.pd("replicas_not_seen", counts["not_seen"], "s", 0, seen_crit)
        chk.pd("replicas_fail", counts["fail"])
        bad = sum(counts.values()) - counts["ok"]
        if bad:
            chk.crit("%d unhealthy streams" % bad)
    return chk.render()


async def check_stream(rt) -> int:
    a = rt.args
    chk = Check(a.stream, _fmt(rt))
    try:
        js = await rt.js()
        info_ = await js.stream_info(a.stream)
    except CLIError as e:
        chk.crit("could not load info: %s" % e)
        return chk.render()
    st = info_.get("state") or {}
    msgs = st.get("messages", 0)
    if a.msgs_warn is not None or a.msgs_critical is not None:
        chk.pd("messages", msgs, "", a.msgs_warn or 0, a.msgs_critical or 0)
        if a.msgs_critical is not None and msgs <= a.msgs_critical:
            chk.crit("%d messages" % msgs)
        elif a.msgs_warn is not None and msgs <= a.msgs_warn:
            chk.warn("%d messages" % msgs)
        else:
            chk.ok("%d messages" % msgs)
    cl = info_.get("cluster")
    if a.peer_expect is not None or a.peer_lag_critical is not None or a.peer_seen_critical:
        if not cl:
            chk.crit("no cluster information")
        else:
            reps = cl.get("replicas") or []
            peers = len(reps) + (1 if cl.get("leader") else 0)
            chk.pd("peers", peers, "", 0, a.peer_expect or 0)
            if not cl.get("leader"):
                chk.crit("No leader")
            if a.peer_expect is not None and peers != a.peer_expect:
                chk.crit("%d peers of expected %d" % (peers, a.peer_expect))
            seen = _secs(a.peer_seen_critical)
            offline = sum(1 for r in reps if r.get("offline"))
            lagged = sum(1 for r in reps if a.peer_lag_critical is not None and
                         (r.get("lag") or 0) >= a.peer_lag_critical)
            inactive = sum(1 for r in reps if seen and (r.get("active") or 0) >= seen * NS)
            chk.pd("peer_offline", offline)
            chk.pd("peer_not_current", sum(1 for r in reps if not r.get("current")))
            chk.pd("peer_inactive", inactive)
            chk.pd("peer_lagged", lagged)
            for n, what in ((offline, "offline"), (inactive, "inactive"), (lagged, "lagged")):
                if n:
                    chk.crit("%d replicas %s" % (n, what))
            if cl.get("leader") and not (offline or inactive or lagged) and \
                    (a.peer_expect is None or peers == a.peer_expect):
                chk.ok("%d current replicas" % len(reps))
    sources = ([info_["mirror"]] if info_.get("mirror") else []) + (info_.get("sources") or [])
    seen = _secs(a.seen_critical)
    for s in sources:
        if a.lag_critical is not None and (s.get("lag") or 0) >= a.lag_critical:
            chk.crit("%s lag %d" % (s.get("name"), s.get("lag") or 0))
        if seen and (s.get("active", -1) < 0 or s.get("active", 0) >= seen * NS):
            chk.crit("%s not seen for %s" % (s.get("name"), a.seen_critical))
    if not (chk.oks or chk.criticals or chk.warnings):
        chk.ok("stream %s is healthy" % a.stream)
    return chk.render()


async def check_meta(rt) -> int:
    a = rt.args
    chk = Check("JetStream Meta Cluster", _fmt(rt))
    got = await gather(rt, "JSZ", {"leader_only": True}, wait_for=1)
    meta = (got[0].get("data") or {}).get("meta_cluster") or {}
    reps = meta.get("replicas") or []
    peers = len(reps) + 1
    chk.pd("peers", peers, "", 0, a.expect)
    if peers != a.expect:
        chk.crit("%d peers of expected %d" % (peers, a.expect))
    seen = _secs(a.seen_critical)
    offline = sum(1 for r in reps if r.get("offline"))
    lagged = sum(1 for r in reps if (r.get("lag") or 0) >= a.lag_critical > 0)
    inactive = sum(1 for r in reps if seen and (r.get("active") or 0) >= seen * NS)
    chk.pd("peer_offline", offline)
    chk.pd("peer_inactive", inactive)
    chk.pd("peer_lagged", lagged)
    for n, what in ((offline, "offline"), (inactive, "inactive"), (lagged, "lagged")):
        if n:
            chk.crit("%d replicas %s" % (n, what))
    if not chk.criticals:
        chk.ok("%d peers led by %s" % (peers, meta.get("leader", "")))
    return chk.render()


# ---- reports ------------------------------------------------------------------------------


async def report_jetstream(rt) -> None:
    a = rt.args
    body = {"raft": True}
    if a.account:
        body.update(account=a.account, streams=True, consumer=True, limit=10000)
    got = await gather(rt, "JSZ", body, wait_for=a.limit)
    got = [r for r in got if r.get("data") and not r.get("error")]
    if not got:
        raise CLIError("no results received, ensure the account used has system privileges "
                       "and appropriate permissions")
    if a.json:
        print_json(got)
        return
    rows = []
    meta_infos = []
    expected = 0
    for r in got:
        srv, d = r.get("server") or {}, r.get("data") or {}
        api = d.get("api") or {}
        mem, store = d.get("memory", 0), d.get("storage", 0)
        streams, consumers, msgs, nbytes = (d.get("streams", 0), d.get("consumers", 0),
                                            d.get("messages", 0), d.get("bytes", 0))
        if a.account:
            details = d.get("account_details") or []
            acc = details[0] if len(details) == 1 else None
            if acc is not None:
                api = acc.get("api") or {}
                mem, store = acc.get("memory", 0), acc.get("storage", 0)
                sds = acc.get("stream_detail") or []
                streams = len(sds)
                consumers = sum((s.get("state") or {}).get("consumer_count", 0) for s in sds)
                msgs = sum((s.get("state") or {}).get("messages", 0) for s in sds)
                nbytes = mem + store
            else:
                streams = consumers = msgs = nbytes = mem = store = 0
                api = {}
        meta = d.get("meta_cluster") or {}
        expected = max(expected, meta.get("cluster_size", 0))
        leader = meta.get("leader") == srv.get("name")
        if leader:
            meta_infos.append(meta)
        rows.append({"name": srv.get("name", ""), "cluster": srv.get("cluster", ""),
                     "leader": leader, "streams": streams, "consumers": consumers,
                     "msgs": msgs, "bytes": nbytes, "mem": mem, "file": store,
                     "api": api.get("total", 0), "err": api.get("errors", 0)})
    key = {"name": lambda x: x["name"], "cluster": lambda x: (x["cluster"], x["name"]),
           "streams": lambda x: (x["streams"], x["name"]),
           "consumers": lambda x: (x["consumers"], x["name"]), "msgs": lambda x: x["msgs"],
           "mbytes": lambda x: x["bytes"], "mem": lambda x: x["mem"],
           "file": lambda x: x["file"], "api": lambda x: x["api"],
           "err": lambda x: x["err"]}[a.sort]
    rows.sort(key=key)
    title = "JetStream Summary" + (" for Account %s" % a.account if a.account else "")
    t = Table(title, ["Server", "Cluster", "Streams", "Consumers", "Messages", "Bytes",
                      "Memory", "File", "API Req", "API Err"])
    for x in rows:
        t.add(x["name"] + ("*" if x["leader"] else ""), x["cluster"], x["streams"],
              x["consumers"], x["msgs"], ibytes(x["bytes"]), ibytes(x["mem"]),
              ibytes(x["file"]), x["api"], x["err"])
    t.set_footer("", "", sum(x["streams"] for x in rows), sum(x["consumers"] for x in rows),
                 sum(x["msgs"] for x in rows), ibytes(sum(x["bytes"] for x in rows)),
                 ibytes(sum(x["mem"] for x in rows)), ibytes(sum(x["file"] for x in rows)),
                 sum(x["api"] for x in rows), sum(x["err"] for x in rows))
    t.print()
    if expected and not meta_infos:
        print()
        print("WARNING: No cluster meta leader found. The cluster expects %d nodes but only %d "
              "responded. JetStream operation requires at least %d up nodes."
              % (expected, len(rows), expected // 2 + 1))
        return
    for meta in meta_infos:
        reps = list(meta.get("replicas") or [])
        reps.append({"name": meta.get("leader", ""), "current": True, "offline": False,
                     "active": 0, "lag": 0})
        reps.sort(key=lambda r: r.get("name", ""))
        t = Table("RAFT Meta Group Information", ["Name", "Leader", "Current", "Offline",
                                                  "Active", "Lag"])
        for r in reps:
            t.add(r.get("name", ""), "yes" if r.get("name") == meta.get("leader") else "",
                  bool(r.get("current")), bool(r.get("offline")),
                  seconds2(r.get("active") or 0), r.get("lag") or 0)
        t.print()


async def _connz(rt, body: dict) -> list[dict]:
    got = await gather(rt, "CONNZ", body)
    return [r for r in got if r.get("data")]


async def report_connections(rt) -> None:
    a = rt.args
    body = {"subscriptions": True, "limit": 10000,
            "state": {"open": 0, "closed": 1, "all": 2}[a.state]}
    if a.account:
        body["acc"] = a.account
    if a.subject:
        body["filter_subject"] = a.subject
    if a.username:
        body["user"] = a.username
    render_connections(a, await _connz(rt, body))


def _with_servers(got: list):
    for r in got:
        for c in (r.get("data") or {}).get("connections") or []:
            yield c, r.get("server") or {}


def render_connections(a, got: list) -> None:
    """natscli's renderConnections: the top connections of every server's CONNZ answer
    (``a.sort``, ``a.top``, ``a.json``, ``a.reverse``), then how many each server has."""
    if a.json:
        # natscli's connInfo: each connection with the server that holds it
        print_json([dict(c, server=srv) for c, srv in _with_servers(got)])
        return
    conns = [dict(c, _server=srv.get("name", ""), _cluster=srv.get("cluster", ""))
             for c, srv in _with_servers(got)]
    key = {"in-bytes": "in_bytes", "out-bytes": "out_bytes", "in-msgs": "in_msgs",
           "out-msgs": "out_msgs", "cid": "cid"}.get(a.sort)
    if key:
        conns.sort(key=lambda c: c.get(key, 0), reverse=key != "cid")
    elif a.sort == "uptime":
        conns.sort(key=lambda c: c.get("start", ""))
    else:
        conns.sort(key=lambda c: len(c.get("subscriptions_list") or []), reverse=True)
    if getattr(a, "reverse", False):
        conns.reverse()
    limit = min(a.top, len(conns)) if a.top > 0 else len(conns)
    t = Table("Top %d Connections out of %s by %s" % (limit, "{:,}".format(len(conns)), a.sort),
              ["CID", "Name", "Server", "Cluster", "IP", "Account", "Uptime", "In Msgs",
               "Out Msgs", "In Bytes", "Out Bytes", "Subs"])
    for c in conns[:limit]:
        name = c.get("name", "")
        t.add(str(c.get("cid", 0)), name[:40] + (" .." if len(name) > 40 else ""),
              c["_server"], c["_cluster"], "%s:%d" % (c.get("ip", ""), c.get("port", 0)),
              c.get("account", ""), c.get("uptime", ""), c.get("in_msgs", 0),
              c.get("out_msgs", 0), ibytes(c.get("in_bytes", 0)), ibytes(c.get("out_bytes", 0)),
              len(c.get("subscriptions_list") or []))
    if len(conns) > 1:
        t.set_footer("", "Totals for %s connections" % "{:,}".format(len(conns)), "", "", "", "",
                     "", sum(c.get("in_msgs", 0) for c in conns),
                     sum(c.get("out_msgs", 0) for c in conns),
                     ibytes(sum(c.get("in_bytes", 0) for c in conns)),
                     ibytes(sum(c.get("out_bytes", 0) for c in conns)),
                     sum(len(c.get("subscriptions_list") or []) for c in conns))
    t.print()
    per = {}
    for c in conns:
        per.setdefault(c["_server"], [c["_cluster"], 0])[1] += 1
    if per:
        print()
        t = Table("Connections per server", ["Server", "Cluster", "Connections"])
        for n, (cl, k) in sorted(per.items(), key=lambda kv: kv[1][1]):
            t.add(n, cl, k)
        t.print()


async def report_accounts(rt) -> None:
    a = rt.args
    got = await _connz(rt, {"subscriptions": True, "limit": 10000, "state": 0})
    accounts: dict[str, dict] = {}
    for r in got:
        for c in (r.get("data") or {}).get("connections") or []:
            name = c.get("account", "")
            acc = accounts.setdefault(name, {"account": name, "connections": 0, "in_msgs": 0,
                                             "out_msgs": 0, "in_bytes": 0, "out_bytes": 0,
                                             "subscriptions": 0})
            acc["connections"] += 1
            for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
                acc[k] += c.get(k, 0)
            acc["subscriptions"] += len(c.get("subscriptions_list") or [])
    if a.account:
        accounts = {k: v for k, v in accounts.items() if k == a.account}
        if not accounts:
            raise CLIError("did not receive any results for account %s" % a.account)
    rows = list(accounts.values())
    key = {"in-bytes": "in_bytes", "out-bytes": "out_bytes", "in-msgs": "in_msgs",
           "out-msgs": "out_msgs", "conns": "connections", "subs": "subscriptions"}[a.sort]
    rows.sort(key=lambda x: x[key])
    if a.top > 0:
        rows = rows[-a.top:]
    if a.json:
        print_json(rows)
        return
    t = Table("%d Accounts Overview" % len(rows), ["Account", "Connections", "In Msgs",
                                                   "Out Msgs", "In Bytes", "Out Bytes", "Subs"])
    for x in rows:
        t.add(x["account"], x["connections"], x["in_msgs"], x["out_msgs"],
              ibytes(x["in_bytes"]), ibytes(x["out_bytes"]), x["subscriptions"])
    t.print()


# ---- raw requests -------------------------------------------------------------------------


async def request(rt) -> None:
    a = rt.args
    kind = a.kind
    body = dict(_filters(a))
    if kind not in ("VARZ", "HEALTHZ"):
        body.update(limit=a.limit, offset=a.offset)
    wait = a.wait
    if kind == "JSZ":
        if a.account:
            body["account"] = a.account
        for flag, key in (("accounts", "accounts"), ("streams", "streams"),
                          ("consumer", "consumer"), ("config", "config")):
            if getattr(a, flag) or a.all:
                body[key] = True
        if a.leader:
            body["leader_only"] = True
            wait = 1
    if kind in ("CONNZ", "ROUTEZ", "LEAFZ") and a.subscriptions:
        body["subscriptions"] = True
    if kind == "SUBSZ" and a.detail:
        body["subscriptions"] = True
    if kind == "ACCOUNTZ" and a.account:
        body["account"] = a.account
    got = await gather(rt, kind, body, wait_for=wait, filtered=bool(_filters(a)))
    for r in got:
        print(json.dumps(r, separators=(",", ":")))


# ---- the meta group -----------------------------------------------------------------------


async def _meta_leader_info(rt) -> dict:
    got = await gather(rt, "JSZ", {})
    leaders = [r for r in got if (r.get("data") or {}).get("meta_cluster", {}).get("leader")
               == (r.get("server") or {}).get("name")]
    if not leaders:
        raise CLIError("did not receive a response from the meta leader, ensure the account "
                       "used has system privileges and appropriate permissions")
    if len(leaders) > 1:
        raise CLIError("found %d JetStream meta cluster leaders, unable to determine which "
                       "cluster to act on" % len(leaders))
    return leaders[0]["data"]["meta_cluster"]


async def _sys_api(rt, subject: str, body, doing: str) -> dict:
    import nats.errors
    nc = await rt.conn()
    try:
        msg = await nc.request(subject, json.dumps(body).encode() if body else b"",
                               timeout=rt.timeout)
    except nats.errors.NoRespondersError:
        raise CLIError("%s: no responders, ensure the account used has system privileges"
                       % doing) from None
    except (nats.errors.TimeoutError, asyncio.TimeoutError):
        raise CLIError("%s: context deadline exceeded" % doing) from None
    resp = json.loads(msg.data)
    if resp.get("error"):
        e = resp["error"]
        raise CLIError("%s: %s (%d)" % (doing, e.get("description"), e.get("err_code", 0)))
    return resp


async def meta_step_down(rt) -> int:
    a = rt.args
    meta = await _meta_leader_info(rt)
    leader = meta.get("leader", "")
    if not leader and not a.force:
        raise CLIError("cluster has no current leader")
    leader = leader or "<unknown>"
    log("Requesting leader step down of %s in a %d peer RAFT group"
        % (q(leader), len(meta.get("replicas") or []) + 1))
    body = {"placement": {"preferred": a.host}} if a.host else None
    await _sys_api(rt, "$JS.API.META.LEADER.STEPDOWN", body,
                   "could not step down the meta leader")
    for _ in range(20):
        await asyncio.sleep(0.5)
        try:
            meta = await _meta_leader_info(rt)
        except CLIError as e:
            log("Failed to retrieve Cluster State: %s" % e)
            continue
        if meta.get("leader") and meta["leader"] != leader:
            log("New leader elected %s" % q(meta["leader"]))
            if a.json:
                print_json(meta)
            return 0
    raise CLIError("the meta group did not elect a new leader in time")


REMOVE_WARNING = """\
Removing peers is intended for peers that will not come back, generally for peers that will remain
in the cluster removing the peer is not needed - simply do your maintenance with the peer shut down.

To return a removed peer to the cluster you have to restart the entire cluster or super-cluster first.
If the peer was online when it was removed you need to restart the removed peer last.

R1 streams on this peer will migrate to other peers but data will be lost, even if the
peer returns later.

R1 consumers on this peer will lose their state and revert to starting configuring
which may lead to duplicate deliveries.
"""


async def meta_peer_remove(rt) -> int:
    a = rt.args
    meta = await _meta_leader_info(rt)
    found = None
    for r in meta.get("replicas") or []:
        if a.name in (r.get("name"), r.get("peer")):
            found = r
    if found is None:
        raise CLIError("did not find a replica named %s" % a.name)
    state = "offline" if found.get("offline") else "online"
    if not a.force:
        print(REMOVE_WARNING)
        if not prompt.confirm("Really remove %s peer %s" % (state, found.get("name")), False):
            print("Removal canceled")
            return 0
    body = {"peer_id": found["peer"]} if found.get("peer") else {"peer": found.get("name")}
    resp = await _sys_api(rt, "$JS.API.SERVER.REMOVE", body,
                          "Could not remove %s" % found.get("name"))
    if a.json:
        print_json(resp)
    else:
        log("Removed peer %s" % q(found.get("name")))
    return 0
