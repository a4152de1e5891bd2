"""``natsjs account info``: who the connection is and what JetStream allows the account
(natscli's account info: connection facts, then usage and limits per tier)."""
from __future__ import annotations

import time

from natsjs.admin.args import json_flag
from natsjs.admin.errors import APIError, CLIError
from natsjs.admin.jsapi import gather, server_requests
from natsjs.admin.render import Columns, Table, comma, go_duration, ibytes, print_json, NS
from natsjs.admin.server import render_connections


def register(top) -> None:
    g = top.group("account", "Account information and status", aliases=["a"])
    p = g.command("info", "Account information", info, aliases=["nfo"])
    json_flag(p)
    r = g.group("report", "Report on account metrics", aliases=["rep"])
    p = r.command("connections", "Report on connections", report_connections,
                  aliases=["conn", "connz", "conns"])
    p.add_argument("--sort", default="subs", choices=["in-bytes", "out-bytes", "in-msgs",
                                                      "out-msgs", "uptime", "cid", "subs"],
                   help="Sort by a specific property")
    p.add_argument("--top", type=int, default=1000, help="Limit results to the top results")
    p.add_argument("--subject", default="",
                   help="Limits responses only to those connections with matching "
                        "subscription interest")
    p.add_argument("--username", default="", help="Limits responses only to those "
                                                  "connections for a specific username")
    p.add_argument("-R", "--reverse", action="store_true", help="Reverse sort connections")
    p.add_argument("--state", default="open", choices=["open", "closed", "all"],
                   help="Limits responses only to those connections in a specific state")
    json_flag(p)
    r.command("statistics", "Report on server statistics", report_statistics,
              aliases=["stats", "statsz"])


def _tier(c: Columns, name: str, tier: dict) -> None:
    lim = tier.get("limits") or {}
    c.title("Tier: %s" % name)
    c.row("Stream Requires Max Bytes Set", bool(lim.get("max_bytes_required")))
    mp = lim.get("max_ack_pending", 0)
    c.row("Consumer Maximum Ack Pending", "Unlimited" if mp <= 0 else mp)
    mm, ms = lim.get("max_memory", -1), lim.get("max_storage", -1)
    c.row("Memory", "%s of %s" % (ibytes(tier.get("memory", 0)),
                                  "Unlimited" if mm == -1 else ibytes(mm)))
    c.row("Storage", "%s of %s" % (ibytes(tier.get("storage", 0)),
                                   "Unlimited" if ms == -1 else ibytes(ms)))
    st = lim.get("max_streams", -1)
    c.row("Streams", "%s of %s" % (comma(tier.get("streams", 0)),
                                   "Unlimited" if st == -1 else comma(st)))
    mc = lim.get("max_consumers", -1)
    c.row("Consumers", "Unlimited" if mc == -1 else "Maximum %s per stream" % comma(mc))


async def info(rt) -> None:
    nc = await rt.conn()
    js = await rt.js()
    acct, err = None, None
    try:
        acct = await js.account_info()
    except APIError as e:
        err = str(e)
    except CLIError as e:
        err = str(e)
    if rt.args.json:
        if acct is None:
            raise CLIError(err or "no account information")
        print_json(acct)
        return
    t0 = time.monotonic()
    await nc.flush(timeout=rt.timeout)
    rtt = time.monotonic() - t0
    si = nc._server_info or {}
    c = Columns("Account Information")
    c.row("Client ID", si.get("client_id", 0))
    c.row("Client IP", si.get("client_ip", ""))
    c.row("RTT", go_duration(int(rtt * NS)))
    c.row("Headers Supported", bool(si.get("headers")))
    c.row("Maximum Payload", ibytes(nc.max_payload))
    c.row_nonempty("Connected Cluster", si.get("cluster", ""))
    url = nc.connected_url
    c.row("Connected URL", url.geturl() if url else "")
    c.row("Connected Address", "%s:%s" % (url.hostname, url.port) if url else "")
    c.row("Connected Server ID", si.get("server_id", ""))
    c.row("Connected Server Version", si.get("version", ""))
    c.row_if("Connected Server Name", si.get("server_name", ""),
             si.get("server_name") and si.get("server_name") != si.get("server_id"))
    c.row("TLS Connection", "yes" if si.get("tls_required") else "no")
    if acct is None:
        c.title("JetStream Account Information")
        c.row("Status", "JetStream is not supported in this account" if "not enabled" in
              (err or "") or "not available" in (err or "") else
              "Could not obtain account information: %s" % err)
        c.print()
        return
    c.title("JetStream Account Information" + (" for domain %s" % acct["domain"]
                                                if acct.get("domain") else ""))
    c.title("Account Usage")
    c.row_nonempty("Domain", acct.get("domain", ""))
    c.row("Storage", ibytes(acct.get("storage", 0)))
    c.row("Memory", ibytes(acct.get("memory", 0)))
    c.row("Streams", acct.get("streams", 0))
    c.row("Consumers", acct.get("consumers", 0))
    c.title("Account Limits")
    c.row("Max Message Payload", ibytes(nc.max_payload))
    tiers = acct.get("tiers") or {}
    if tiers:
        for name in sorted(tiers):
            _tier(c, name, tiers[name])
    else:
        _tier(c, "Default", acct)
    c.print()


# ---- report: the account's own view through the system account's imports ----------------


async def report_connections(rt) -> None:
    """The account's connections on every server: $SYS.REQ.SERVER.PING.CONNZ, which an
    account imports from the system account (answers gathered until they stop)."""
    a = rt.args
    body = {"subscriptions": True, "username": True, "limit": 1024,
            "state": {"open": 0, "closed": 1, "all": 2}[a.state]}
    if a.subject:
        body["filter_subject"] = a.subject
    if a.username:
        body["user"] = a.username
    got = [r for r in await gather(rt, "CONNZ", body, filtered=True) if r.get("data")]
    if not got:
        raise CLIError("did not get results from any servers")
    render_connections(a, got)


async def report_statistics(rt) -> None:
    """natscli reportServerStats: the account's traffic on every server
    ($SYS.REQ.ACCOUNT.PING.STATZ)."""
    nc = await rt.conn()
    res = await server_requests(nc, "$SYS.REQ.ACCOUNT.PING.STATZ", None, 0, rt.timeout,
                                rt.settings.trace)
    t = Table("Server Statistics", ["Server", "Cluster", "Version", "Tags", "Connections",
                                    "Subscriptions", "Leafnodes", "Sent Bytes",
                                    "Sent Messages", "Received Bytes", "Received Messages",
                                    "Slow Consumers"])
    tot = [0] * 8
    for r in res:
        if r.get("error"):
            raise CLIError("invalid response received: %s"
                           % (r["error"] or {}).get("description", r["error"]))
        if "data" not in r:
            raise CLIError("no data received in response")
        stats = (r["data"] or {}).get("account_statz") or []
        if not stats:
            continue
        st, srv = stats[0], r.get("server") or {}
        sent, recv = st.get("sent") or {}, st.get("received") or {}
        vals = [st.get("conns", 0), st.get("num_subscriptions", 0), st.get("leafnodes", 0),
                sent.get("bytes", 0), sent.get("msgs", 0), recv.get("bytes", 0),
                recv.get("msgs", 0), st.get("slow_consumers", 0)]
        tot = [x + y for x, y in zip(tot, vals)]
        t.add(srv.get("host", ""), srv.get("cluster", ""), srv.get("ver", ""),
              ", ".join(srv.get("tags") or []), comma(vals[0]), comma(vals[1]), comma(vals[2]),
              ibytes(vals[3]), comma(vals[4]), ibytes(vals[5]), comma(vals[6]), comma(vals[7]))
    t.set_footer(comma(len(res)), "", "", "", comma(tot[0]), comma(tot[1]), comma(tot[2]),
                 ibytes(tot[3]), comma(tot[4]), ibytes(tot[5]), comma(tot[6]), comma(tot[7]))
    t.print()
    print()
