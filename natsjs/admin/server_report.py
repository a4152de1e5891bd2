"""``natsjs server report cpu|mem|routes|gateways|leafnodes|health``: natscli's reports
built from every server's answer to ``$SYS.REQ.SERVER.PING.<KIND>`` (STATSZ, ROUTEZ,
GATEWAYZ, LEAFZ, HEALTHZ), with natscli's filters (``--host`` is a server name,
``--cluster``, ``--tags``, all exact) and ``--watch SECONDS`` to redraw until
interrupted.  ``cpu`` and ``mem`` draw natscli's bar graph; the others its tables.
(``jetstream``, ``connections`` and ``accounts`` live in ``server``.)
"""
from __future__ import annotations

import asyncio
import json
import sys

from natsjs.admin.errors import CLIError
from natsjs.admin.jsapi import gather
from natsjs.admin.render import Table, comma, duration, ibytes, parse_duration, parse_time


def register(r) -> None:
    def command(name, help_, func, aliases=(), limit=True, json_=False):
        p = r.command(name, help_, func, aliases=list(aliases))
        if limit:
            p.add_argument("limit", nargs="?", type=int, default=0,
                           help="Limit the responses to a certain amount of servers")
        p.add_argument("--host", default="", help="Limit the report to a specific NATS server")
        p.add_argument("--cluster", default="", help="Limit the report to a specific Cluster")
        p.add_argument("--tags", action="append", default=[],
                       help="Limit the report to nodes matching certain tags")
        p.add_argument("--watch", type=int, default=0,
                       help="Display the results and update it every (WATCH) seconds")
        p.add_argument("-R", "--reverse", action="store_true", help="Reverse sort")
        if json_:
            p.add_argument("-j", "--json", action="store_true", help="Produce JSON output")
        return p

    command("cpu", "Report on CPU usage", cpu, json_=True)
    command("mem", "Report on Memory usage", mem, json_=True)
    p = command("routes", "Report on Route (Cluster) connections", routes, aliases=["route"])
    p.add_argument("--sort", default="", choices=["server", "cluster", "name", "account",
                                                  "subs", "in-bytes", "out-bytes"],
                   help="Sort by a specific property")
    p = command("gateways", "Repost on Gateway (Super Cluster) connections", gateways,
                aliases=["super", "gateway"])
    p.add_argument("--filter-name", default="", help="Limits responses to a certain name")
    p.add_argument("--sort", default="cluster", choices=["server", "cluster"],
                   help="Sorts by a specific property")
    p = command("leafnodes", "Report on Leafnode connections", leafnodes,
                aliases=["leaf", "leafz"])
    p.add_argument("--account", default="", help="Produce the report for a specific account")
    p.add_argument("--sort", default="", choices=["server", "name", "account", "subs",
                                                  "in-bytes", "out-bytes", "in-msgs",
                                                  "out-msgs"],
                   help="Sort by a specific property")
    p = command("health", "Report on Server health", health)
    p.add_argument("-J", "--js-enabled", action="store_true",
                   help="Checks that JetStream should be enabled on all servers")
    p.add_argument("-S", "--server-only", action="store_true",
                   help="Restricts the health check to the JetStream server only")
    p.add_argument("--account", default="", help="Check only a specific Account")
    p.add_argument("--stream", default="", help="Check only a specific Stream")
    p.add_argument("--consumer", default="", help="Check only a specific Consumer")


# ---- gathering ----------------------------------------------------------------------------


def _filter(a) -> dict:
    """natscli reqFilter: exact matches on server name, cluster and tags."""
    out = {}
    if a.host:
        out["server_name"] = a.host
    if a.cluster:
        out["cluster"] = a.cluster
    if a.tags:
        out["tags"] = a.tags
    if out:
        out["exact_match"] = True
    return out


async def _answers(rt, kind: str, body: dict | None = None) -> list:
    a = rt.args
    req = dict(body or {}, **_filter(a))
    got = await gather(rt, kind, req or None, wait_for=a.limit, filtered=bool(_filter(a)))
    for r in got:
        if r.get("error"):
            err = r["error"]
            raise CLIError(err.get("description", str(err)) if isinstance(err, dict)
                           else str(err))
    return got


async def _watching(rt, draw) -> None:
    """natscli withWatcher: once, or every --watch seconds until interrupted."""
    a = rt.args
    if a.watch <= 0:
        await draw()
        return
    while True:
        sys.stdout.write("\033[2J\033[H")     # iu.ClearScreen
        await draw()
        sys.stdout.flush()
        await asyncio.sleep(a.watch)


# ---- cpu and mem ----------------------------------------------------------------------------


def commaf(v: float) -> str:
    """go-humanize Commaf: the shortest decimal form of ``v`` with thousands commas."""
    text = repr(float(v))
    if "e" in text or "inf" in text or "nan" in text:
        text = "%f" % v
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0") if frac else ""
    sign = "-" if whole.startswith("-") else ""
    whole = "{:,}".format(int(whole.lstrip("-")))
    return sign + whole + ("." + frac if frac else "")


def bar_graph(data: dict, caption: str, width: int, as_bytes: bool) -> str:
    """natscli iu.BarGraph: one bar per key, smallest first, scaled between the
    smallest and the largest value."""
    out = []
    if caption:
        out += [caption, ""]
    if not data:
        return "\n".join(out) + "\n"
    keys = sorted(data, key=lambda k: data[k])
    lo, hi = min(data.values()), max(data.values())
    longest = max(len(k) for k in keys)
    steps = (hi / width) if hi == lo else (hi - lo) / width
    for k in keys:
        v = data[k]
        if v == 0:
            blocks = 0
        elif len(keys) == 1 or lo == hi:
            blocks = width
        else:
            blocks = int((v - lo) / steps)
        h = ibytes(int(v)) if as_bytes else commaf(v)
        bar = "█" * blocks if blocks else "▏"
        out.append("%s%s: %s (%s)" % (" " * (longest - len(k) + 2), k, bar, h))
    return "\n".join(out) + "\n"


def _graph_width() -> int:
    """natscli: half of iu.ProgressWidth() (the terminal less 30, 80 without one), at
    most 30."""
    import shutil
    if sys.stdout.isatty():
        cols = shutil.get_terminal_size((110, 24)).columns
        w = 10 if cols - 30 <= 10 else cols - 30
    else:
        w = 80
    return min(w // 2, 30)


def _json_number(v: float):
    return int(v) if float(v).is_integer() else v


async def _cpu_or_mem(rt, mem: bool) -> None:
    a = rt.args

    async def draw():
        got = await _answers(rt, "STATSZ")
        usage = {}
        for r in got:
            st = r.get("statsz") or r.get("data") or {}
            name = (r.get("server") or {}).get("name", "")
            usage[name] = float(st.get("mem", 0) if mem else st.get("cpu", 0))
        if a.json:
            print(json.dumps({k: _json_number(v) for k, v in sorted(usage.items())},
                             indent=2))
            return
        sys.stdout.write(bar_graph(usage, "Memory Usage" if mem else "CPU Usage",
                                   _graph_width(), mem))
    await _watching(rt, draw)


async def cpu(rt) -> None:
    await _cpu_or_mem(rt, False)


async def mem(rt) -> None:
    await _cpu_or_mem(rt, True)


# ---- routes -----------------------------------------------------------------------------


def _rtt(text: str) -> str:
    """natscli parseRtt: a Go duration shown as columns.F shows durations."""
    try:
        return duration(parse_duration(text))
    except (ValueError, TypeError):
        return text or ""


def _short_account(acct: str) -> str:
    return "%s...%s" % (acct[:10], acct[-10:]) if len(acct) > 23 else acct


async def routes(rt) -> None:
    a = rt.args

    async def draw():
        got = await _answers(rt, "ROUTEZ")
        rows = []
        for r in got:
            srv = r.get("server") or {}
            for route in (r.get("data") or {}).get("routes") or []:
                rows.append((srv, route))
        primary = {
            "cluster": lambda s, x: s.get("cluster", ""),
            "name": lambda s, x: x.get("remote_name", ""),
            "account": lambda s, x: x.get("account", ""),
            "subs": lambda s, x: x.get("subscriptions", 0),
            "in-bytes": lambda s, x: x.get("in_bytes", 0),
            "out-bytes": lambda s, x: x.get("out_bytes", 0),
        }.get(a.sort, lambda s, x: s.get("name", ""))
        rows.sort(key=lambda sr: (primary(*sr), sr[0].get("name", ""),
                                  sr[0].get("cluster", ""), sr[1].get("remote_name", ""),
                                  sr[1].get("account", "")), reverse=a.reverse)
        t = Table("Cluster Report", ["Server", "Cluster", "Name", "Account", "Address", "ID",
                                     "Uptime", "RTT", "Subs", "Bytes In", "Bytes Out"])
        last_server = last_cluster = last_remote = None
        servers, clusters = set(), set()
        subs = b_in = b_out = 0
        for srv, x in rows:
            sname, cname, rname = srv.get("name", ""), srv.get("cluster", ""), \
                x.get("remote_name", "")
            servers.add(sname)
            clusters.add(cname)
            if sname == last_server:
                show_s = ""
            else:
                show_s, last_remote, last_cluster = sname, None, None
            last_server = sname
            show_c = "" if cname == last_cluster else cname
            last_cluster = cname
            show_r = "" if rname == last_remote else rname
            last_remote = rname
            now, start = parse_time(srv.get("time")), parse_time(x.get("start"))
            uptime = duration(int((now - start).total_seconds() * 1e9)) if now and start \
                else ""
            subs += x.get("subscriptions", 0)
            b_in += x.get("in_bytes", 0)
            b_out += x.get("out_bytes", 0)
            t.add(show_s, show_c, show_r, _short_account(x.get("account", "")),
                  "%s:%d" % (x.get("ip", ""), x.get("port", 0)), "rid:%d" % x.get("rid", 0),
                  uptime, _rtt(x.get("rtt", "")), comma(x.get("subscriptions", 0)),
                  ibytes(x.get("in_bytes", 0)), ibytes(x.get("out_bytes", 0)))
        t.set_footer(comma(len(servers)), comma(len(clusters)), "", "", comma(len(rows)), "",
                     "", "", comma(subs), ibytes(b_in), ibytes(b_out))
        t.print()
    await _watching(rt, draw)


# ---- gateways and leafnodes -------------------------------------------------------------


async def gateways(rt) -> None:
    a = rt.args

    async def draw():
        body = {"accounts": True}
        if a.filter_name:
            body["name"] = a.filter_name
        got = await _answers(rt, "GATEWAYZ", body)
        if a.sort == "server":
            got.sort(key=lambda r: ((r.get("server") or {}).get("name", ""),
                                    (r.get("server") or {}).get("cluster", "")),
                     reverse=a.reverse)
        else:
            got.sort(key=lambda r: ((r.get("server") or {}).get("cluster", ""),
                                    (r.get("server") or {}).get("name", "")),
                     reverse=a.reverse)
        t = Table("Super Cluster Report", ["Server", "Name", "Port", "Kind", "Connection",
                                           "ID", "Uptime", "RTT", "Bytes", "Accounts"])
        last_server = None
        clusters = set()
        total_bytes = total_gateways = 0
        for r in got:
            srv, data = r.get("server") or {}, r.get("data") or {}
            sname = srv.get("name", "")
            show_s = "" if sname == last_server else sname
            last_server = sname
            cname = srv.get("cluster", "")
            clusters.add(cname)
            t.add(show_s, cname, str(data.get("port", 0)), "", "", "", "", "", "", "")
            last_dir = ""
            for gname, conns in sorted((data.get("inbound_gateways") or {}).items()):
                for conn in conns or []:
                    total_gateways += 1
                    direction = "" if last_dir == "Inbound" else "Inbound"
                    last_dir = "Inbound"
                    cx = conn.get("connection") or {}
                    total_bytes += cx.get("in_bytes", 0)
                    t.add("", "", "", direction, "%s %s:%d" % (gname, cx.get("ip", ""),
                                                                 cx.get("port", 0)),
                          "gid:%d" % cx.get("cid", 0), _rtt(cx.get("uptime", "")),
                          _rtt(cx.get("rtt", "")), ibytes(cx.get("in_bytes", 0)),
                          comma(len(conn.get("accounts") or [])))
            for gname, conn in sorted((data.get("outbound_gateways") or {}).items()):
                total_gateways += 1
                direction = "" if last_dir == "Outbound" else "Outbound"
                last_dir = "Outbound"
                cx = conn.get("connection") or {}
                total_bytes += cx.get("out_bytes", 0)
                t.add("", "", "", direction, "%s %s:%d" % (gname, cx.get("ip", ""),
                                                             cx.get("port", 0)),
                      "gid:%d" % cx.get("cid", 0), cx.get("uptime", ""),
                      _rtt(cx.get("rtt", "")), ibytes(cx.get("out_bytes", 0)),
                      comma(len(conn.get("accounts") or [])))
        t.set_footer(comma(len(got)), comma(len(clusters)), "", "", comma(total_gateways), "",
                     "", "", ibytes(total_bytes), "")
        t.print()
    await _watching(rt, draw)


async def leafnodes(rt) -> None:
    a = rt.args

    async def draw():
        got = await _answers(rt, "LEAFZ", {"account": a.account} if a.account else None)
        leafs = []
        for r in got:
            srv = r.get("server") or {}
            for leaf in (r.get("data") or {}).get("leafs") or []:
                leafs.append((srv, leaf))
        key = {"name": lambda s, x: x.get("name", ""),
               "account": lambda s, x: x.get("account", ""),
               "subs": lambda s, x: x.get("subscriptions", 0),
               "in-bytes": lambda s, x: x.get("in_bytes", 0),
               "out-bytes": lambda s, x: x.get("out_bytes", 0),
               "in-msgs": lambda s, x: x.get("in_msgs", 0),
               "out-msgs": lambda s, x: x.get("out_msgs", 0)}.get(
            a.sort, lambda s, x: s.get("name", ""))
        leafs.sort(key=lambda sx: key(*sx), reverse=a.reverse)
        t = Table("Leafnode Report", ["Server", "Name", "Account", "Address", "RTT", "Msgs In",
                                      "Msgs Out", "Bytes In", "Bytes Out", "Subs",
                                      "Compressed", "Spoke"])
        for srv, x in leafs:
            t.add(srv.get("name", ""), x.get("name", ""), _short_account(x.get("account", "")),
                  "%s:%d" % (x.get("ip", ""), x.get("port", 0)), x.get("rtt", ""),
                  comma(x.get("in_msgs", 0)), comma(x.get("out_msgs", 0)),
                  ibytes(x.get("in_bytes", 0)), ibytes(x.get("out_bytes", 0)),
                  comma(x.get("subscriptions", 0)), str(x.get("compression", "")),
                  "true" if x.get("is_spoke") else "false")
        t.print()
    await _watching(rt, draw)


# ---- health -------------------------------------------------------------------------------


async def health(rt) -> None:
    a = rt.args

    async def draw():
        body = {"details": True}
        for key, value in (("js-enabled-only", a.js_enabled),
                           ("js-server-only", a.server_only), ("account", a.account),
                           ("stream", a.stream), ("consumer", a.consumer)):
            if value:
                body[key] = value
        got = await _answers(rt, "HEALTHZ", body)
        got.sort(key=lambda r: (r.get("server") or {}).get("name", ""), reverse=a.reverse)
        t = Table("Health Report", ["Server", "Cluster", "Domain", "Status", "Type", "Error"])
        ok = bad = errors = 0
        clusters = set()
        for r in got:
            srv, data = r.get("server") or {}, r.get("data") or {}
            code = data.get("status_code") or (200 if data.get("status") == "ok" else 503)
            t.add(srv.get("name", ""), srv.get("cluster", ""), srv.get("domain", ""),
                  "%s (%d)" % (data.get("status", ""), code))
            if code == 200:
                ok += 1
            else:
                bad += 1
            clusters.add(srv.get("cluster", ""))
            errs = data.get("errors") or []
            errors += len(errs)
            show = 9 if len(errs) > 10 else len(errs)
            for e in errs[:show]:
                t.add("", "", "", "", str(e.get("type", "")), e.get("error", ""))
            if show != len(errs):
                t.add("", "", "", "%d more errors" % (len(errs) - show))
        t.set_footer(comma(len(got)), comma(len(clusters)), "",
                     "ok: %d / err: %d" % (ok, bad), "", comma(errors))
        t.print()
    await _watching(rt, draw)


__all__ = ["register", "bar_graph", "commaf"]
