"""HTTP monitoring endpoints (natsjs/monitor.py) against the reference nats-server.

Each end-to-end test runs the same scenario (nats-py clients, subscriptions, a known
number of messages) on a natsjs server and on the reference nats-server, both with
``-m -1``, then compares the JSON: key sets, JSON types, counts, paging and sorting,
and the plain-text 400 answers to bad parameters.  ``settle(nc)`` (two flushes, see
there) after subscribing or publishing is the synchronisation: the server has
processed everything before its PONG.

Known, normalised differences: the reference has internal connections and
subscriptions (its system account's and $G's service imports), so cids are compared
by connection name and subscription counts as deltas or filtered to our cids; rtt is
measured by the reference only; the reference has extra keys we do not have (e.g.
varz's ``git_commit``, accountz's ``imports``), so some checks use a core key subset.

The last tests run the handlers in-process against a fake server to pin the hooks
(closed connections, routes, JetStream) and the never-crash behaviour.
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import types
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

import nats
import pytest

from natsjs import monitor
from helpers import run

TIMEOUT = 10


def start_pair(natsjs_server, reference_server):
    return natsjs_server("-m", "-1"), reference_server("-m", "-1")


def get(server, path):
    """(status, content type, body bytes) of GET path on the server's monitor port."""
    url = "http://127.0.0.1:%d%s" % (server.http_port, path)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def getj(server, path):
    status, ctype, body = get(server, path)
    assert status == 200, (path, status, body)
    assert ctype == "application/json", (path, ctype)
    return json.loads(body)


def jtype(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if v is None:
        return "null"
    return type(v).__name__


def types_of(d, keys=None):
    return {k: jtype(d[k]) for k in (keys if keys is not None else d)}


async def settle(nc):
    """Return once the server has processed everything ``nc`` sent before.

    nats-py's ``flush()`` writes its PING straight to the socket while earlier
    commands (SUB, PUB) may still sit in its pending buffer for the flusher task, so
    one PONG does not prove the server saw them (a trace shows PING/PONG overtaking
    the SUBs).  The first flush has the flusher write them out before its PONG can be
    read; the second PING then follows them on the wire.
    """
    await nc.flush()
    await nc.flush()


async def connect(server, name=None):
    kw = {"allow_reconnect": False}
    if name:
        kw["name"] = name
    return await nats.connect(server.url, **kw)


def by_name(connz):
    return {c.get("name", ""): c for c in connz["connections"]}


def names(connz):
    return [c.get("name", "") for c in connz["connections"]]


RFC3339_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z\Z")
UPTIME_RE = re.compile(r"(\d+y)?(\d+d)?(\d+h)?(\d+m)?\d+s\Z")
DURATION_RE = re.compile(r"^(0s|[\d.]+(ns|µs|ms|s)|(\d+h)?(\d+m)?[\d.]+s)\Z")


def parse_ts(s):
    assert RFC3339_RE.match(s), s
    frac = s[20:-1] if len(s) > 20 else ""
    base = datetime.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")
    return (base - datetime(1970, 1, 1)).total_seconds() + (float("0." + frac) if frac else 0)


# ---- /connz ------------------------------------------------------------------------

CONN_KEYS = ["cid", "kind", "type", "ip", "port", "start", "last_activity", "rtt", "uptime",
             "idle", "pending_bytes", "in_msgs", "out_msgs", "in_bytes", "out_bytes",
             "subscriptions", "name", "lang", "version"]
CONNZ_KEYS = {"server_id", "now", "num_connections", "total", "offset", "limit",
              "connections"}


async def two_clients(server):
    """alpha: foo.> and bar (queue q); beta: foo.x and publishes 3 x 5 bytes on foo.x."""
    a = await connect(server, "alpha")
    b = await connect(server, "beta")
    await a.subscribe("foo.>")
    await a.subscribe("bar", queue="q")
    await settle(a)
    await b.subscribe("foo.x")
    for _ in range(3):
        await b.publish("foo.x", b"hello")
    await settle(b)
    return a, b


def test_connz_fields_and_counts_match_reference(natsjs_server, reference_server):
    ours, ref = start_pair(natsjs_server, reference_server)

    async def scenario(server):
        t0 = time.time()
        a, b = await two_clients(server)
        plain = getj(server, "/connz")
        detail = getj(server, "/connz?subs=detail")
        listed = getj(server, "/connz?subs=1&auth=1")
        t1 = time.time()
        await a.close()
        await b.close()
        return t0, t1, plain, detail, listed

    t0, t1, o_plain, o_detail, o_list = run(scenario(ours))
    _, _, r_plain, r_detail, r_list = run(scenario(ref))

    for o, r in ((o_plain, r_plain), (o_detail, r_detail), (o_list, r_list)):
        assert set(o) == set(r) == CONNZ_KEYS
        assert types_of(o) == types_of(r)
        for key in ("num_connections", "total", "offset", "limit"):
            assert o[key] == r[key], key
        assert o["num_connections"] == 2 and o["limit"] == 1024
        oc, rc = by_name(o), by_name(r)
        assert set(oc) == set(rc) == {"alpha", "beta"}
        for name in ("alpha", "beta"):
            assert set(CONN_KEYS) <= set(oc[name]), set(CONN_KEYS) - set(oc[name])
            assert types_of(oc[name], CONN_KEYS) == types_of(rc[name], CONN_KEYS)
            # (pending_bytes and uptime are timing: the reference flushes in the
            # background, and the two runs may straddle a second.)
            for key in ("kind", "type", "ip", "in_msgs", "out_msgs", "in_bytes",
                        "out_bytes", "subscriptions", "name", "lang", "version"):
                assert oc[name][key] == rc[name][key], (name, key)
        # Keys the reference omits when empty are omitted the same way.
        assert {k for c in o["connections"] for k in c} == \
            {k for c in r["connections"] for k in c}

    alpha, beta = by_name(o_plain)["alpha"], by_name(o_plain)["beta"]
    assert (alpha["out_msgs"], alpha["out_bytes"], alpha["in_msgs"]) == (3, 15, 0)
    assert (beta["in_msgs"], beta["in_bytes"], beta["out_msgs"]) == (3, 15, 3)
    assert (alpha["subscriptions"], beta["subscriptions"]) == (2, 1)
    for c in o_plain["connections"]:
        assert t0 - 1 <= parse_ts(c["start"]) <= parse_ts(c["last_activity"]) <= t1 + 1
        assert UPTIME_RE.match(c["uptime"]) and UPTIME_RE.match(c["idle"])
        assert DURATION_RE.match(c["rtt"]), c["rtt"]
    assert t0 - 1 <= parse_ts(o_plain["now"]) <= t1 + 1

    def sub_view(c):
        return sorted((d["subject"], d.get("qgroup"), d["sid"], d["msgs"], d.get("max"))
                      for d in c["subscriptions_list_detail"])

    for name in ("alpha", "beta"):
        oc, rc = by_name(o_detail)[name], by_name(r_detail)[name]
        assert sub_view(oc) == sub_view(rc)
        assert {d["cid"] for d in oc["subscriptions_list_detail"]} == {oc["cid"]}
        assert "subscriptions_list" not in oc
        assert sorted(by_name(o_list)[name]["subscriptions_list"]) == \
            sorted(by_name(r_list)[name]["subscriptions_list"])
        assert by_name(o_list)[name]["name_tag"] == by_name(r_list)[name]["name_tag"] == "$G"
    assert sub_view(by_name(o_detail)["alpha"]) == [("bar", "q", "2", 0, None),
                                                    ("foo.>", None, "1", 3, None)]


def test_connz_sorting_and_paging_match_reference(natsjs_server, reference_server):
    ours, ref = start_pair(natsjs_server, reference_server)
    queries = ["", "sort=cid", "sort=start", "sort=subs", "sort=msgs_to", "sort=msgs_from",
               "sort=bytes_to", "sort=bytes_from", "sort=uptime",
               "sort=subs&offset=1&limit=2", "sort=msgs_from&limit=1", "offset=3",
               "offset=10", "limit=-5&offset=-2", "sort=last", "sort=idle", "sort=pending",
               "sort=rtt"]

    async def scenario(server):
        # n<i> has i+1 subscriptions, receives 2*i messages and publishes a distinct
        # number of messages, so every numeric sort has one right answer.
        conns = [await connect(server, "n%d" % i) for i in range(4)]
        for i, nc in enumerate(conns):
            await nc.subscribe("t.%d" % i)
            for k in range(i):
                await nc.subscribe("s.%d.%d" % (i, k))
            await settle(nc)
        for i in (1, 2, 3):
            for _ in range(2 * i):
                await conns[0].publish("t.%d" % i, b"x" * 10)
        for i, count in ((1, 3), (2, 2), (3, 1)):
            for _ in range(count):
                await conns[i].publish("nobody", b"y")
        for nc in conns:
            await settle(nc)
        out = {q: getj(server, "/connz?" + q) for q in queries}
        cid2 = by_name(out[""])["n2"]["cid"]
        out["cid"] = getj(server, "/connz?cid=%d" % cid2)
        out["cid-missing"] = getj(server, "/connz?cid=999999")
        for nc in conns:
            await nc.close()
        return out

    o, r = run(scenario(ours)), run(scenario(ref))
    expected = {
        "": ["n0", "n1", "n2", "n3"],
        "sort=subs": ["n3", "n2", "n1", "n0"],
        "sort=msgs_to": ["n3", "n2", "n1", "n0"],
        "sort=bytes_to": ["n3", "n2", "n1", "n0"],
        "sort=msgs_from": ["n0", "n1", "n2", "n3"],
        "sort=bytes_from": ["n0", "n1", "n2", "n3"],
        "sort=uptime": ["n3", "n2", "n1", "n0"],
        "sort=subs&offset=1&limit=2": ["n2", "n1"],
        "sort=msgs_from&limit=1": ["n0"],
        "offset=3": ["n3"],
        "offset=10": [],
        "cid": ["n2"],
        "cid-missing": [],
    }
    for q in o:
        assert set(o[q]) == set(r[q]) == CONNZ_KEYS, q
        for key in ("num_connections", "total", "offset", "limit"):
            assert o[q][key] == r[q][key], (q, key, o[q][key], r[q][key])
        if q in expected:
            counts = {side: {c["name"]: (c["out_msgs"], c["in_msgs"], c["subscriptions"])
                             for c in res[""]["connections"]} for side, res in (("natsjs", o),
                                                                                ("ref", r))}
            assert names(o[q]) == expected[q], (q, counts)
            assert names(r[q]) == expected[q], (q, counts)
        else:
            assert sorted(names(o[q])) == sorted(names(r[q])), q
        assert o[q]["connections"] == [] or isinstance(o[q]["connections"][0], dict)
    assert o["cid"]["limit"] == 1 and o["cid"]["total"] == 4
    assert (o["sort=subs&offset=1&limit=2"]["offset"], o["limit=-5&offset=-2"]["offset"],
            o["limit=-5&offset=-2"]["limit"]) == (1, 0, 1024)
    assert o["offset=10"]["connections"] == [] and o["offset=10"]["num_connections"] == 0


BAD_QUERIES = [
    "/connz?sort=bogus", "/connz?sort=CID", "/connz?sort=stop", "/connz?sort=reason",
    "/connz?sort=bogus&sort=cid", "/connz?state=foo", "/connz?limit=x",
    "/connz?offset=1.5", "/connz?limit=99999999999999999999", "/connz?cid=-1",
    "/connz?cid=abc", "/connz?subs=maybe", "/connz?auth=2",
    "/subsz?test=foo.*", "/subsz?test=foo..bar", "/subsz?subs=x", "/subsz?offset=z",
    "/subscriptionsz?limit=1e3", "/accountz?acc=nope", "/routez?subs=bad",
    "/jsz?accounts=maybe", "/jsz?leader-only=true", "/jsz?limit=q",
    "/healthz?js-enabled-only=zz", "/healthz?details=nope",
    "/nothere", "/connz/",
]


def test_errors_match_reference(natsjs_server, reference_server):
    ours, ref = start_pair(natsjs_server, reference_server)
    for path in BAD_QUERIES:
        o, r = get(ours, path), get(ref, path)
        assert o[0] == r[0] and o[0] in (400, 404), (path, o, r)
        assert o[2] == r[2], (path, o[2], r[2])
        assert o[1] == r[1], (path, o[1], r[1])
    # A JSON error body for a stream health check without an account.
    o, r = get(ours, "/healthz?stream=x"), get(ref, "/healthz?stream=x")
    assert o[0] == r[0] == 400 and json.loads(o[2]) == json.loads(r[2])
    # The server is still fine.
    assert getj(ours, "/healthz") == {"status": "ok"}


def test_connz_closed_state(natsjs_server, reference_server):
    """state=closed/all: the reference lists closed connections; natsjs either does the
    same (once the server records them, see the monitor hooks) or says it cannot."""
    ours, ref = start_pair(natsjs_server, reference_server)

    async def scenario(server):
        a = await connect(server, "gone")
        await a.subscribe("x")
        await settle(a)
        await a.close()
        b = await connect(server, "stays")
        await settle(b)
        # The close is asynchronous on the server; a new connection after it does not
        # order it, so poll the open list until the closed one has left it.
        deadline = time.monotonic() + TIMEOUT
        while getj(server, "/connz")["num_connections"] != 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        res = {q: get(server, "/connz?" + q) for q in
               ("state=closed", "state=all", "state=any&sort=cid", "state=closed&sort=stop",
                "state=closed&sort=reason", "state=open")}
        await b.close()
        return res

    o, r = run(scenario(ours)), run(scenario(ref))
    assert json.loads(o["state=open"][2])["total"] == json.loads(r["state=open"][2])["total"] == 1
    rc = json.loads(r["state=closed"][2])
    assert [c["name"] for c in rc["connections"]] == ["gone"]
    assert rc["connections"][0]["reason"] == "Client Closed"
    if o["state=closed"][0] == 200:
        for q in o:
            oj, rj = json.loads(o[q][2]), json.loads(r[q][2])
            assert names(oj) == names(rj), q
            assert (oj["total"], oj["num_connections"]) == (rj["total"], rj["num_connections"])
            for oc, rc_ in zip(oj["connections"], rj["connections"]):
                assert set(oc) == set(rc_), q
                assert oc.get("reason") == rc_.get("reason")
    else:
        for q in ("state=closed", "state=all", "state=any&sort=cid", "state=closed&sort=stop"):
            status, ctype, body = o[q]
            assert status == 400 and ctype.startswith("text/plain"), (q, o[q])
            assert body.startswith(b"Error decoding state for "), body


# ---- /subsz, /accountz ---------------------------------------------------------------

SUBSZ_KEYS = {"server_id", "now", "num_subscriptions", "num_cache", "num_inserts",
              "num_removes", "num_matches", "cache_hit_rate", "max_fanout", "avg_fanout",
              "total", "offset", "limit"}
SUB_DETAIL_KEYS = {"account", "account_tag", "subject", "sid", "msgs", "cid"}


def test_subsz_matches_reference(natsjs_server, reference_server):
    ours, ref = start_pair(natsjs_server, reference_server)

    async def scenario(server):
        before = getj(server, "/subsz")
        alias = getj(server, "/subscriptionsz")
        a, b = await two_clients(server)
        cids = {c["cid"] for c in getj(server, "/connz")["connections"]}
        res = {
            "stats": getj(server, "/subsz"),
            "list": getj(server, "/subsz?subs=1"),
            "test": getj(server, "/subsz?subs=1&test=foo.x"),
            "test-nolist": getj(server, "/subsz?test=foo.x"),
            "acc": getj(server, "/subsz?subs=1&acc=$G&test=bar"),
            "nope": getj(server, "/subsz?acc=nope"),
        }
        await a.close()
        await b.close()
        return before, alias, cids, res

    o_before, o_alias, o_cids, o = run(scenario(ours))
    r_before, r_alias, r_cids, r = run(scenario(ref))
    assert set(o_before) == set(r_before) == set(o_alias) == SUBSZ_KEYS
    assert types_of(o_before) == types_of(r_before)
    for res in (o, r):
        assert set(res["stats"]) == SUBSZ_KEYS
        assert set(res["list"]) == SUBSZ_KEYS | {"subscriptions_list"}
    for key in ("num_subscriptions", "num_inserts", "num_removes"):
        assert o["stats"][key] - o_before[key] == r["stats"][key] - r_before[key], key
    assert o["stats"]["num_subscriptions"] - o_before["num_subscriptions"] == 3
    assert o["stats"]["total"] == 0 and o["list"]["limit"] == 1024

    def ours_only(res, cids):
        return sorted((d["subject"], d.get("qgroup", ""), d["sid"], d["msgs"])
                      for d in res.get("subscriptions_list", []) if d["cid"] in cids)

    for q in ("list", "test", "acc"):
        assert ours_only(o[q], o_cids) == ours_only(r[q], r_cids), q
        for d in o[q]["subscriptions_list"]:
            assert SUB_DETAIL_KEYS <= set(d)
            assert (d["account"], d["account_tag"]) == ("$G", "$G")
    assert ours_only(o["test"], o_cids) == [("foo.>", "", "1", 3), ("foo.x", "", "1", 3)]
    assert o["test"]["total"] == 2 and o["acc"]["total"] == 1
    assert "subscriptions_list" not in o["test-nolist"] and o["test-nolist"]["total"] == 0
    assert {k: v for k, v in o["nope"].items() if k not in ("server_id", "now")} == \
        {k: v for k, v in r["nope"].items() if k not in ("server_id", "now")}


def test_subsz_paging(natsjs_server):
    ours = natsjs_server("-m", "-1")

    async def scenario():
        nc = await connect(ours)
        for i in range(5):
            await nc.subscribe("p.%d" % i)
        await settle(nc)
        full = getj(ours, "/subsz?subs=1&acc=$G")
        page = getj(ours, "/subsz?subs=1&acc=$G&offset=1&limit=2")
        past = getj(ours, "/subsz?subs=1&acc=$G&offset=50")
        await nc.close()
        return full, page, past

    full, page, past = run(scenario())
    assert full["total"] == page["total"] == past["total"] == 5
    assert page["subscriptions_list"] == full["subscriptions_list"][1:3]
    assert (page["offset"], page["limit"]) == (1, 2)
    assert "subscriptions_list" not in past


ACCOUNT_DETAIL_KEYS = ["account_name", "update_time", "expired", "complete",
                       "jetstream_enabled", "leafnode_connections", "client_connections",
                       "subscriptions", "name_tag", "sublist_stats"]


def test_accountz_matches_reference(natsjs_server, reference_server):
    ours, ref = start_pair(natsjs_server, reference_server)

    async def scenario(server):
        a, b = await two_clients(server)
        res = (getj(server, "/accountz"), getj(server, "/accountz?acc=$G"),
               getj(server, "/accountz?acc="))
        await a.close()
        await b.close()
        return res

    (o_list, o_g, o_empty), (r_list, r_g, r_empty) = run(scenario(ours)), run(scenario(ref))
    assert set(o_list) == set(r_list) == {"server_id", "now", "system_account", "accounts"}
    assert sorted(o_list["accounts"]) == sorted(r_list["accounts"]) == ["$G", "$SYS"]
    assert o_list["system_account"] == r_list["system_account"] == "$SYS"
    assert set(o_empty) == set(r_empty) == set(o_list)
    assert set(o_g) == set(r_g) == {"server_id", "now", "system_account", "account_detail"}
    od, rd = o_g["account_detail"], r_g["account_detail"]
    assert set(ACCOUNT_DETAIL_KEYS) <= set(od) and set(ACCOUNT_DETAIL_KEYS) <= set(rd)
    assert types_of(od, ACCOUNT_DETAIL_KEYS) == types_of(rd, ACCOUNT_DETAIL_KEYS)
    for key in ("account_name", "expired", "complete", "jetstream_enabled",
                "leafnode_connections", "client_connections", "name_tag"):
        assert od[key] == rd[key], key
    assert od["client_connections"] == 2
    assert set(od["sublist_stats"]) == set(rd["sublist_stats"]) == SUBSZ_KEYS - {
        "server_id", "now", "total", "offset", "limit"}
    assert od["subscriptions"] == od["sublist_stats"]["num_subscriptions"] >= 3


# ---- /routez, /jsz, /healthz, /leafz, /gatewayz, / -------------------------------------


def without(d, *keys):
    return {k: v for k, v in d.items() if k not in keys}


def test_shells_match_reference(natsjs_server, reference_server):
    ours, ref = start_pair(natsjs_server, reference_server)
    for path in ("/routez", "/routez?subs=1", "/routez?subs=detail", "/jsz",
                 "/jsz?accounts=true", "/jsz?acc=foo&streams=1", "/leafz", "/gatewayz"):
        o, r = getj(ours, path), getj(ref, path)
        assert list(o) == list(r), path
        assert types_of(o) == types_of(r), path
        assert without(o, "server_id", "server_name", "now") == \
            without(r, "server_id", "server_name", "now"), path
        assert o["server_id"] == getj(ours, "/varz")["server_id"]
    for path in ("/connz?acc=nope", "/connz?acc=$G", "/connz?mqtt_client=x",
                 "/subsz?acc=nope"):
        o, r = getj(ours, path), getj(ref, path)
        assert list(o) == list(r), path
        # An unknown account: nats-server answers before filling in its id.
        assert without(o, "now") == without(r, "now") if "nope" in path and "connz" in path \
            else without(o, "server_id", "now") == without(r, "server_id", "now"), (path, o, r)
    o = getj(ours, "/routez")
    assert (o["num_routes"], o["routes"], o["server_name"]) == (0, [], o["server_id"])
    assert getj(ours, "/jsz")["disabled"] is True

    for path in ("/healthz", "/healthz?js-enabled-only=true", "/healthz?js-server-only=true",
                 "/healthz?details=true", "/healthz?js-enabled=1"):
        o, r = get(ours, path), get(ref, path)
        assert o == r, path
        assert o[2] == b'{"status":"ok"}'


def test_index_page_and_jsonp(natsjs_server):
    ours = natsjs_server("-m", "-1")
    status, ctype, body = get(ours, "/")
    assert status == 200 and ctype.startswith("text/html")
    links = re.findall(rb"href=\.(/\w+)", body)
    assert set(links) >= {b"/varz", b"/connz", b"/subsz", b"/accountz", b"/routez", b"/jsz",
                          b"/healthz"}
    for link in links:
        assert get(ours, link.decode())[0] == 200, link
    status, ctype, body = get(ours, "/connz?callback=cb")
    assert status == 200 and ctype == "application/javascript"
    assert body.startswith(b"cb(") and body.endswith(b")")
    assert set(json.loads(body[3:-1])) == CONNZ_KEYS
    # HEAD: headers only.
    req = urllib.request.Request("http://127.0.0.1:%d/varz" % ours.http_port, method="HEAD")
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        assert r.status == 200 and r.read() == b""


def test_garbage_requests_do_not_hurt_the_server(natsjs_server):
    ours = natsjs_server("-m", "-1")
    for junk in (b"GARBAGE\r\n\r\n", b"GET /varz HTTP/1.1\r\nHost: x\r\nBad header\r\n\r\n",
                 b"\x00\xff" * 100, b"GET /connz?" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
                 b"GET /connz HTTP/1.1\r\n"):
        with socket.create_connection(("127.0.0.1", ours.http_port), timeout=TIMEOUT) as s:
            try:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
            except OSError:
                pass
    # Keep-alive: two requests on one connection.
    with socket.create_connection(("127.0.0.1", ours.http_port), timeout=TIMEOUT) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.count(b'{"status":"ok"}') == 2
    assert getj(ours, "/varz")["connections"] == 0
    assert ours.alive()


# ---- in-process: hooks and the never-crash contract ---------------------------------


class FakeLog:
    def __init__(self):
        self.errors = []

    def error(self, msg, *args):
        self.errors.append(msg % args)

    info = warn = debug = trace = error


def fake_server(**extra):
    from natsjs._core.sublist import Sublist
    acc = types.SimpleNamespace(name="$G", sublist=Sublist())
    srv = types.SimpleNamespace(server_id="NTEST", name="test", start_time=time.time(),
                                clients={}, account=acc, log=FakeLog(),
                                opts=types.SimpleNamespace(auth=None),
                                varz=lambda: {"server_id": "NTEST", "cpu": 0.0})
    for k, v in extra.items():
        setattr(srv, k, v)
    return srv


def fake_conn(cid, start, **kw):
    core = types.SimpleNamespace(in_msgs=kw.pop("in_msgs", 0), in_bytes=0, out_msgs=0,
                                 out_bytes=0, out=bytearray(kw.pop("pending", 0)))
    c = types.SimpleNamespace(cid=cid, host="10.0.0.1", port=1000 + cid, start=start,
                              last_activity=start, name="", lang="go", version="1.0",
                              subs={}, core=core, closed_reason=None)
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def call(server, path, **query):
    status, payload, ctype = monitor.dispatch(server, path, {k: str(v) for k, v in query.items()})
    return status, (json.loads(payload) if ctype == "application/json" else payload)


def test_closed_connections_hook():
    from natsjs._core.sublist import Subscription
    now = time.monotonic()
    srv = fake_server()
    srv.clients[3] = fake_conn(3, now - 10)
    assert call(srv, "/connz", state="closed")[0] == 400
    gone = fake_conn(1, now - 65, stop=now - 5, closed_reason="Slow Consumer (Pending Bytes)",
                     in_msgs=7, rtt=0.0015)
    gone.subs = {b"1": Subscription(b"a.b", None, b"1", None)}
    gone2 = fake_conn(2, now - 30, stop=now - 1, closed_reason="Client Closed")
    srv.closed_clients = [gone, gone2]
    status, body = call(srv, "/connz", state="closed", subs="1")
    assert status == 200 and body["total"] == 2
    c1 = body["connections"][0]
    assert (c1["cid"], c1["reason"], c1["uptime"], c1["rtt"]) == (
        1, "Slow Consumer (Pending Bytes)", "1m0s", "1.5ms")
    assert c1["subscriptions_list"] == ["a.b"] and c1["in_msgs"] == 7
    assert list(c1)[7:9] == ["stop", "reason"]
    assert [c["cid"] for c in call(srv, "/connz", state="closed", sort="stop")[1]
            ["connections"]] == [2, 1]
    assert [c["cid"] for c in call(srv, "/connz", state="closed", sort="reason")[1]
            ["connections"]] == [2, 1]
    body = call(srv, "/connz", state="all")[1]
    assert body["total"] == 3 and [c["cid"] for c in body["connections"]] == [1, 2, 3]
    assert "stop" not in body["connections"][2]
    body = call(srv, "/connz", state="all", cid=2)[1]
    assert [c["cid"] for c in body["connections"]] == [2]


def test_routes_and_jetstream_hooks():
    now = time.monotonic()
    route = fake_conn(9, now - 3, remote_id="NREMOTE", remote_name="b", did_solicit=True,
                      compression="s2_auto")
    js = types.SimpleNamespace(
        enabled=True,
        jsz=lambda opts: {"memory": 1, "api": {"total": 2}, "streams": 3,
                          "seen_accounts": opts["accounts"]},
        healthz=lambda opts: (503, {"status": "unavailable"}))
    srv = fake_server(routes={"NREMOTE": route}, jetstream=js)
    status, body = call(srv, "/routez")
    assert status == 200 and body["num_routes"] == 1
    r = body["routes"][0]
    assert (r["rid"], r["remote_id"], r["did_solicit"], r["compression"], r["uptime"]) == (
        9, "NREMOTE", True, "s2_auto", "3s")
    assert list(monitor._route_info(route, monitor.Clock(), False, False))[:5] == [
        "rid", "remote_id", "remote_name", "did_solicit", "is_configured"]
    status, body = call(srv, "/jsz", accounts="true")
    assert status == 200 and list(body) == ["memory", "api", "server_id", "now", "streams",
                                            "seen_accounts"]
    assert body["seen_accounts"] is True
    assert call(srv, "/healthz") == (503, {"status": "unavailable"})


def test_handler_exception_is_a_500_and_logged():
    class Boom(dict):
        def values(self):
            raise RuntimeError("kaboom")

    srv = fake_server(clients=Boom())
    status, body = call(srv, "/connz")
    assert status == 500 and b"internal" in body
    assert any("kaboom" in e for e in srv.log.errors)
    # The (status, body) contract the system-account requests use.
    assert monitor.ENDPOINTS["/connz"](srv, {})[0] == 500
    assert monitor.ENDPOINTS["/connz"](fake_server(), {"sort": "bogus"}) == (
        400, "invalid sorting option: bogus")
    status, body = monitor.ENDPOINTS["/varz"](fake_server(), {})
    assert status == 200 and body["cpu"] == 0 and isinstance(body["cpu"], int)


@pytest.mark.parametrize("seconds,text", [
    (0, "0s"), (5e-7, "500ns"), (0.000668, "668µs"), (0.0015, "1.5ms"), (2.25, "2.25s"),
    (3723.5, "1h2m3.5s"), (120, "2m0s")])
def test_go_duration(seconds, text):
    assert monitor.go_duration(seconds) == text


def test_formats():
    assert monitor.go_uptime(3605) == "1h0m5s"
    assert monitor.go_uptime(86400 * 366 + 1) == "1y1d0h0m1s"
    assert monitor.go_uptime(59.9) == "59s"
    assert monitor.rfc3339(0.5) == "1970-01-01T00:00:00.5Z"
    assert monitor.rfc3339(1.0) == "1970-01-01T00:00:01Z"
    assert monitor.rtt_string(0.000668123) == "668µs"
    assert monitor.to_json({"s": "a<b>&c"}, compact=True) == b'{"s":"a\\u003cb\\u003e\\u0026c"}'
    assert monitor.parse_target("/connz?sort=a&sort=b&x=") == ("/connz", {"sort": "a", "x": ""})


def test_big_answers_are_encoded_off_the_event_loop():
    import trio
    now = time.monotonic()
    srv = fake_server()
    for i in range(1, monitor.THREAD_ENCODE_ITEMS + 50):
        srv.clients[i] = fake_conn(i, now - 1)

    async def main():
        clock_now = trio.current_time()
        for c in srv.clients.values():
            c.start = c.last_activity = clock_now - 1
        assert monitor._big(monitor.ENDPOINTS["/connz"](srv, {})[1])
        status, payload, ctype = await monitor.dispatch_async(srv, "/connz", {"callback": "f"})
        assert (status, ctype) == (200, "application/javascript")
        body = json.loads(payload[2:-1])
        assert body["num_connections"] == len(srv.clients)
        assert [c["cid"] for c in body["connections"]] == sorted(srv.clients)
        assert await monitor.dispatch_async(srv, "/nothere", {}) == (
            404, b"404 page not found\n", "text/plain; charset=utf-8")

    trio.run(main)


def test_jsonp_callback_must_be_a_javascript_name(natsjs_server):
    ours = natsjs_server("-m", "-1")
    for name in ("cb", "jQuery3610_1700000000", "$.handlers.on_varz", "_x1"):
        status, ctype, body = get(ours, "/varz?callback=" + urllib.parse.quote(name))
        assert status == 200 and ctype == "application/javascript", name
        assert body.startswith(name.encode() + b"(") and body.endswith(b")")
    for evil in ("alert(1)//", "x;fetch('//e.example')", "a b", "1abc", "a..b", "</script>",
                 "x\u2028y", "a" * 300):
        status, ctype, body = get(ours, "/connz?callback=" + urllib.parse.quote(evil))
        assert status == 400, evil
        assert ctype.startswith("text/plain")
        assert evil.encode() not in body


@pytest.mark.parametrize("which", ["natsjs", "reference"])
def test_monitor_port_in_use_is_one_fatal_line(which):
    """A busy monitoring port stops the server with nats-server's one FTL line, not a
    traceback."""
    import subprocess
    from conftest import natsjs_command, reference_server_binary
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    cmd = natsjs_command() if which == "natsjs" else [reference_server_binary()]
    try:
        p = subprocess.run(cmd + ["-a", "127.0.0.1", "-p", "-1", "-m", str(port)],
                           capture_output=True, text=True, timeout=30)
    finally:
        busy.close()
    assert p.returncode == 1
    assert ("[FTL] Can't start monitoring: can't listen to the monitor port: listen tcp "
            "127.0.0.1:%d: bind: address already in use" % port) in p.stderr
    assert "Traceback" not in p.stderr
