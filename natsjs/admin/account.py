"""``natsjs account info``: who the connection is and what JetStream allows the account
(natscli's account info: connection facts, then usage and limits per tier)."""
from __future__ import annotations

import time

from natsjs.admin.app import json_flag
from natsjs.admin.errors import APIError, CLIError
from natsjs.admin.render import Columns, comma, go_duration, ibytes, print_json, NS


def register(top) -> None:
    g = top.group("account", "Account information and status", aliases=["a"])
    p = g.command("info", "Account information", info, aliases=["nfo"])
    json_flag(p)


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
