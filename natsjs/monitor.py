"""HTTP monitoring: /varz, /connz, /subsz, /accountz, /routez, /jsz, /healthz, ...

A small HTTP/1.1 server on trio with h11 doing the protocol.  Every endpoint is a
function of the server's live state, rendered with nats-server's JSON field names,
types, defaults and error responses (server/monitor.go, monitor_sort_opts.go) so
existing dashboards, exporters and test harnesses read it unchanged:

* ``/varz``              server.varz()
* ``/connz``             connections; ``offset``, ``limit`` (1024), ``sort``, ``cid``,
                         ``state`` (open/closed/all), ``subs`` (1 or ``detail``),
                         ``auth``, ``user``, ``acc``, ``mqtt_client``
* ``/subsz``             sublist statistics (alias ``/subscriptionsz``); ``subs``,
                         ``offset``, ``limit``, ``test`` (a publish subject), ``acc``
* ``/accountz``          account names; ``acc=NAME`` for one account's detail
* ``/routez``            routes; ``subs`` (1 or ``detail``)
* ``/jsz``               JetStream (``disabled: true`` until JetStream lands)
* ``/leafz``, ``/gatewayz``  empty shells (no leaf nodes or gateways yet)
* ``/healthz``           ``{"status":"ok"}``
* ``/``                  an index page

Bad parameters get HTTP 400 with nats-server's plain-text message; an exception in
a handler gets a 500 and an error log line, never a dead server.  ``callback=NAME``
wraps any JSON answer in ``NAME(...)`` (JSONP; nats-server dropped this, we keep it);
NAME must be a dotted JavaScript name, anything else is a 400.

Hooks
-----
Everything is read from attributes that exist today; features still being built
plug in through these optional attributes (looked up with ``getattr``, so nothing
breaks while they are absent).  Times called "trio time" are ``trio.current_time()``
values, like ``Client.start``; "wall time" is ``time.time()``.

Server
  ``server.accounts``        dict name -> Account (``.name``, ``.sublist``); merged
                             with ``server.account`` (``$G``).  Feeds /accountz,
                             /subsz and /connz ``acc=``.
  ``server.system_account``  Account or name; /accountz ``system_account`` (omitted
                             while absent, as nats-server omits an empty one).
  ``server.closed_clients``  sequence (oldest first, e.g. a bounded deque; nats-server
                             keeps 10000) of closed connections for
                             ``/connz?state=closed|all``.  Each entry is a Client (or
                             any object with the same attributes) plus ``stop`` (trio
                             time of the close), ``closed_reason`` and ``subs`` as they
                             were at close time; counters from ``.core`` or from
                             plain ``in_msgs``/``out_msgs``/``in_bytes``/``out_bytes``
                             attributes.  While absent, those states answer 400.
  ``server.routes``          dict or list of route connections for /routez, each
                             with ``cid``, ``remote_id``, ``remote_name``,
                             ``did_solicit``, ``is_configured``, ``host``, ``port``,
                             ``start``/``last_activity`` (trio time), ``rtt``,
                             ``core`` (counters and ``out``), ``subs``, ``account``,
                             ``compression`` (all optional but ``cid``).
  ``server.jetstream``       object with ``enabled`` (bool, default True),
                             ``jsz(options: dict) -> dict`` (the JSInfo body without
                             ``server_id``/``now``) and optionally
                             ``healthz(options: dict) -> (status_code, dict)``.

Client (and closed entries)
  ``client.rtt``             seconds (float) of the last PING/PONG round trip;
                             rendered like Go's Duration ("668µs"); "0s" while absent.
  ``client.account``         the Account the client is bound to (default $G).
  ``client.user``            authorized user name (``auth=1``, ``user=`` filter).
  ``client.stalls``          times this client was stalled (omitted when 0).
  ``client.kind`` / ``client.client_type``  default "Client" / "nats".

Account
  ``account.name_tag``       defaults to the name.
  ``account.update_time``    wall time of the last update (default server start).
  ``account.jetstream``      truthy when JetStream is enabled for the account.
  ``account.monitor_detail()``  dict merged into /accountz account_detail
                             (``mappings``, ``exports``, ``imports``, ``jwt``, ...).
  ``account.sublist.stats()`` may add ``max_fanout``/``avg_fanout`` (0 until then).
"""
from __future__ import annotations

import json
import operator
import re
import time
from urllib.parse import parse_qsl, urlsplit

import h11
import trio

from natsjs._core.sublist import subject_matches, valid_literal_subject
from natsjs.jetstream.jstime import go_duration as go_duration_ns
from natsjs.jetstream.jstime import go_uptime  # noqa: F401  (server.py takes it from here)

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT = 10.0

DEFAULT_CONN_LIST_SIZE = 1024
DEFAULT_SUB_LIST_SIZE = 1024
GLOBAL_ACCOUNT = "$G"

# /connz sort options (server/monitor_sort_opts.go).
SORT_OPTIONS = frozenset((
    "", "cid", "start", "subs", "pending", "msgs_to", "msgs_from", "bytes_to",
    "bytes_from", "last", "idle", "uptime", "stop", "reason", "rtt"))

STATE_OPEN, STATE_CLOSED, STATE_ALL = 0, 1, 2

# Connection kinds whose subscriptions are remote interest, not listed by /subsz.
_REMOTE_KINDS = frozenset(("Router", "Gateway", "Leafnode"))

_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_UINT_RE = re.compile(r"[0-9]+\Z")
_GO_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_GO_FALSE = frozenset(("0", "f", "F", "FALSE", "false", "False"))


class HTTPError(Exception):
    """An error answer: plain text, as nats-server writes them with w.Write."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ---- query decoding (strconv semantics and messages) ------------------------------


def _go_quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _param(query: dict, name: str) -> str:
    return query.get(name, "")


def decode_bool(query: dict, name: str) -> bool:
    s = _param(query, name)
    if s == "":
        return False
    if s in _GO_TRUE:
        return True
    if s in _GO_FALSE:
        return False
    raise HTTPError(400, "Error decoding boolean for '%s': strconv.ParseBool: parsing %s: "
                         "invalid syntax" % (name, _go_quote(s)))


def decode_int(query: dict, name: str) -> int:
    s = _param(query, name)
    if s == "":
        return 0
    if not _INT_RE.match(s):
        raise HTTPError(400, "Error decoding int for '%s': strconv.Atoi: parsing %s: "
                             "invalid syntax" % (name, _go_quote(s)))
    v = int(s)
    if not -_INT64_MAX - 1 <= v <= _INT64_MAX:
        raise HTTPError(400, "Error decoding int for '%s': strconv.Atoi: parsing %s: "
                             "value out of range" % (name, _go_quote(s)))
    return v


def decode_uint(query: dict, name: str) -> int:
    s = _param(query, name)
    if s == "":
        return 0
    if not _UINT_RE.match(s):
        raise HTTPError(400, "Error decoding uint64 for '%s': strconv.ParseUint: parsing %s: "
                             "invalid syntax" % (name, _go_quote(s)))
    v = int(s)
    if v > _UINT64_MAX:
        raise HTTPError(400, "Error decoding uint64 for '%s': strconv.ParseUint: parsing %s: "
                             "value out of range" % (name, _go_quote(s)))
    return v


def decode_state(query: dict) -> int:
    s = _param(query, "state")
    if s == "":
        return STATE_OPEN
    low = s.lower()
    if low == "open":
        return STATE_OPEN
    if low == "closed":
        return STATE_CLOSED
    if low in ("any", "all"):
        return STATE_ALL
    raise HTTPError(400, "Error decoding state for %s" % s)


def decode_subs(query: dict) -> tuple[bool, bool]:
    """(subs, subs_detail): ``subs=detail`` or a boolean."""
    if _param(query, "subs").lower() == "detail":
        return False, True
    return decode_bool(query, "subs"), False


# ---- formatting ----------------------------------------------------------------


class Clock:
    """One request's notion of now, to turn trio times into wall-clock times."""

    __slots__ = ("wall", "mono")

    def __init__(self, wall: float | None = None, mono: float | None = None):
        self.wall = time.time() if wall is None else wall
        if mono is None:
            try:
                mono = trio.current_time()
            except RuntimeError:  # outside trio (unit tests); clients use trio time
                mono = time.monotonic()
        self.mono = mono

    def to_wall(self, t: float) -> float:
        return self.wall - (self.mono - t)


def rfc3339(ts: float) -> str:
    """Go's RFC3339Nano in UTC (trailing zeros of the fraction trimmed)."""
    sec = int(ts // 1)
    us = int(round((ts - sec) * 1e6))
    if us >= 1000000:
        sec, us = sec + 1, us - 1000000
    out = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    if us:
        out += ("." + "%06d" % us).rstrip("0")
    return out + "Z"


def go_duration(seconds: float | None) -> str:
    """Go's time.Duration.String() of a time in seconds."""
    return go_duration_ns(int(round((seconds or 0) * 1e9)))


def rtt_string(rtt: float | None) -> str:
    """A client's RTT as nats-server shows it (microsecond precision under 1ms)."""
    if not rtt:
        return "0s"
    ns = int(rtt * 1e9)
    if 1000 < ns < 1000000:
        ns -= ns % 1000
    return go_duration(ns / 1e9)


def go_float(x: float):
    """Go prints a float64 with an integral value without a fraction (2, not 2.0)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e21:
        return int(x)
    return x


def to_json(body, compact: bool = False) -> bytes:
    """encoding/json's output: MarshalIndent(v, "", "  ") and HTML-safe escapes."""
    if compact:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps(body, ensure_ascii=False, indent=2)
    # Only string contents can hold these characters, so this is exact.
    text = (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))
    return text.encode("utf-8", "surrogatepass")


def _text(b) -> str:
    if isinstance(b, (bytes, bytearray)):
        return b.decode("utf-8", "replace")
    return "" if b is None else str(b)


# ---- model access (duck-typed over Client, closed entries and routes) -------------


def _accounts(server) -> dict:
    accs = {}
    glob = getattr(server, "account", None)
    if glob is not None:
        accs[glob.name] = glob
    extra = getattr(server, "accounts", None)
    if isinstance(extra, dict):
        accs.update(extra)
    elif extra:
        for acc in extra:
            accs[acc.name] = acc
    return accs


def _system_account_name(server) -> str:
    sacc = getattr(server, "system_account", None)
    if sacc is None:
        return ""
    return sacc if isinstance(sacc, str) else getattr(sacc, "name", "")


def _account_of(server, c):
    acc = getattr(c, "account", None)
    return acc if acc is not None else getattr(server, "account", None)


def _account_name(acc) -> str:
    if acc is None:
        return GLOBAL_ACCOUNT
    return acc if isinstance(acc, str) else getattr(acc, "name", GLOBAL_ACCOUNT)


def _name_tag(acc) -> str:
    if acc is None or isinstance(acc, str):
        return _account_name(acc)
    return getattr(acc, "name_tag", "") or _account_name(acc)


def _counter(c, name: str) -> int:
    core = getattr(c, "core", None)
    if core is not None:
        return getattr(core, name, 0)
    return getattr(c, name, 0) or 0


def _pending(c) -> int:
    core = getattr(c, "core", None)
    out = getattr(core, "out", None) if core is not None else None
    if out is not None:
        return len(out)
    return getattr(c, "pending_bytes", 0) or 0


def _subs_of(c) -> list:
    subs = getattr(c, "subs", None)
    if not subs:
        return []
    return list(subs.values()) if isinstance(subs, dict) else list(subs)


def _num_subs(c) -> int:
    subs = getattr(c, "subs", None)
    return len(subs) if subs else 0


def _user(c, server=None) -> str:
    """nats-server's getRawAuthUser: nkey, else user name, else "[REDACTED]" for a token."""
    u = getattr(c, "user", None)
    if not u:
        return ""
    if isinstance(u, str):
        return u
    name = getattr(u, "nkey", "") or getattr(u, "username", "") or ""
    if not name and server is not None:
        auth = getattr(getattr(server, "opts", None), "auth", None)
        if getattr(auth, "token", ""):
            return "[REDACTED]"
    return name


def _sub_cid(sub) -> int:
    owner = getattr(sub, "client", None)
    conn = getattr(owner, "conn", owner)
    return getattr(conn, "cid", 0) or 0


def _client_sub_detail(sub, cid: int) -> dict:
    d = {"subject": _text(sub.subject)}
    if sub.queue:
        d["qgroup"] = _text(sub.queue)
    d["sid"] = _text(sub.sid)
    d["msgs"] = sub.nmsgs
    if sub.max_msgs:
        d["max"] = sub.max_msgs
    d["cid"] = cid
    return d


# A connection to list is a (client, closed) pair; closed ones carry ``stop``.


def _stop(row):
    return getattr(row[0], "stop", None) if row[1] else None


def _sort_by(rows: list, key, fast=None, reverse: bool = False) -> None:
    """Stable sort; ``fast`` is the plain-attribute key that open Clients allow."""
    if fast is not None:
        try:
            rows.sort(key=fast, reverse=reverse)
            return
        except AttributeError:  # a closed record or a hook object without .core
            pass
    rows.sort(key=key, reverse=reverse)


def _sort_rows(rows: list, sort: str, clock: Clock) -> None:
    rows.sort(key=lambda r: r[0].cid)  # also the tie order for the stable sorts below
    if sort in ("", "cid", "start"):
        return
    mono = clock.mono
    if sort == "subs":
        _sort_by(rows, lambda r: _num_subs(r[0]), lambda r: len(r[0].subs), True)
    elif sort == "pending":
        _sort_by(rows, lambda r: _pending(r[0]), lambda r: len(r[0].core.out), True)
    elif sort in ("msgs_to", "msgs_from", "bytes_to", "bytes_from"):
        attr = {"msgs_to": "out_msgs", "msgs_from": "in_msgs",
                "bytes_to": "out_bytes", "bytes_from": "in_bytes"}[sort]
        get = operator.attrgetter("core." + attr)
        _sort_by(rows, lambda r: _counter(r[0], attr), lambda r: get(r[0]), True)
    elif sort == "last":
        _sort_by(rows, lambda r: r[0].last_activity, reverse=True)
    elif sort == "idle":
        _sort_by(rows, lambda r: mono - r[0].last_activity, reverse=True)
    elif sort == "uptime":
        def uptime(r):
            stop = _stop(r)
            return (stop if stop is not None else mono) - r[0].start
        _sort_by(rows, uptime)
    elif sort == "stop":
        _sort_by(rows, lambda r: _stop(r) or 0.0, reverse=True)
    elif sort == "reason":
        _sort_by(rows, lambda r: getattr(r[0], "closed_reason", "") or "")
    elif sort == "rtt":
        _sort_by(rows, lambda r: getattr(r[0], "rtt", 0) or 0, reverse=True)


def conn_info(server, row: tuple, clock: Clock, subs: bool, subs_detail: bool,
              auth: bool) -> dict:
    """One ConnInfo, in nats-server's field order and omitempty rules."""
    c, closed = row
    stop = _stop(row)
    end = stop if stop is not None else clock.mono
    start = c.start
    last = getattr(c, "last_activity", start)
    ci = {
        "cid": c.cid,
        "kind": getattr(c, "kind", "Client") or "Client",
        "type": getattr(c, "client_type", "nats") or "nats",
    }
    port = getattr(c, "port", 0) or 0
    ci["ip"] = (getattr(c, "host", "") or "") if port else ""
    ci["port"] = port
    ci["start"] = rfc3339(clock.to_wall(start))
    ci["last_activity"] = rfc3339(clock.to_wall(last))
    if closed:
        if stop is not None:
            ci["stop"] = rfc3339(clock.to_wall(stop))
        reason = getattr(c, "closed_reason", "") or ""
        if reason:
            ci["reason"] = reason
    ci["rtt"] = rtt_string(getattr(c, "rtt", 0))
    ci["uptime"] = go_uptime(end - start)
    ci["idle"] = go_uptime(end - last)
    ci["pending_bytes"] = _pending(c)
    ci["in_msgs"] = _counter(c, "in_msgs")
    ci["out_msgs"] = _counter(c, "out_msgs")
    ci["in_bytes"] = _counter(c, "in_bytes")
    ci["out_bytes"] = _counter(c, "out_bytes")
    stalls = getattr(c, "stalls", 0)
    if stalls:
        ci["stalls"] = stalls
    ci["subscriptions"] = _num_subs(c)
    for key in ("name", "lang", "version"):
        v = getattr(c, key, "")
        if v:
            ci[key] = v
    acc = _account_of(server, c)
    if auth:
        user = _user(c, server)
        if user:
            ci["authorized_user"] = user
        name = _account_name(acc)
        if name != GLOBAL_ACCOUNT:
            ci["account"] = name
    sl = _subs_of(c) if (subs or subs_detail) else ()
    if sl:
        if subs_detail:
            ci["subscriptions_list_detail"] = [_client_sub_detail(s, c.cid) for s in sl]
        else:
            ci["subscriptions_list"] = [_text(s.subject) for s in sl]
    if auth:
        for key in ("jwt", "issuer_key"):
            v = getattr(c, key, "")
            if v:
                ci[key] = v
        ci["name_tag"] = _name_tag(acc)
    return ci


# ---- endpoints -------------------------------------------------------------------


def _healthz(server, query):
    for name in ("js-enabled", "js-enabled-only", "js-server-only", "js-meta-only", "details"):
        decode_bool(query, name)
    account, stream = _param(query, "account"), _param(query, "stream")
    details = decode_bool(query, "details")
    if not account and stream:
        msg = '"account" must not be empty when checking stream health'
        if details:
            body = {"status": "error", "errors": [{"type": "BAD_REQUEST", "error": msg}]}
        else:
            body = {"status": "error", "error": msg}
        return 400, body
    js = getattr(server, "jetstream", None)
    hook = getattr(js, "healthz", None) if js is not None else None
    if hook is not None and getattr(js, "enabled", True):
        status, body = hook(dict(query))
        return status, body
    return 200, {"status": "ok"}


def _varz(server, query):
    v = dict(server.varz())
    if "cpu" in v:
        v["cpu"] = go_float(v["cpu"])
    return 200, v


def _connz(server, query):
    # Parameter decoding in HandleConnz's order, so the first bad one is reported.
    sort = _param(query, "sort")
    auth = decode_bool(query, "auth")
    subs, subs_detail = decode_subs(query)
    offset = decode_int(query, "offset")
    limit = decode_int(query, "limit")
    cid = decode_uint(query, "cid")
    state = decode_state(query)
    user = _param(query, "user")
    acc_name = _param(query, "acc")
    mqtt_client = _param(query, "mqtt_client")

    if sort not in SORT_OPTIONS:
        raise HTTPError(400, "invalid sorting option: %s" % sort)
    offset = max(offset, 0)
    if limit <= 0:
        limit = DEFAULT_CONN_LIST_SIZE
    if sort == "stop" and state != STATE_CLOSED:
        raise HTTPError(400, "sort by stop only valid on closed connections")
    if sort == "reason" and state != STATE_CLOSED:
        raise HTTPError(400, "sort by reason only valid on closed connections")
    if cid > 0:
        limit = 1

    clock = Clock()
    out = {"server_id": server.server_id, "now": rfc3339(clock.wall),
           "num_connections": 0, "total": 0, "offset": offset, "limit": limit,
           "connections": []}

    closed = None
    if state != STATE_OPEN:
        closed = getattr(server, "closed_clients", None)
        if closed is None:
            raise HTTPError(400, "Error decoding state for %s: closed connections are not "
                                 "recorded by this server" % _param(query, "state"))
        closed = list(closed)

    clients = list(server.clients.values())
    clients.extend(getattr(server, "leafs", {}).values())
    if acc_name:
        if acc_name not in _accounts(server):
            # nats-server returns before filling in its id (monitor.go Connz).
            out["server_id"] = ""
            out["connections"] = None
            return 200, out
        clients = [c for c in clients if _account_name(_account_of(server, c)) == acc_name]

    total = 0
    if state in (STATE_OPEN, STATE_ALL):
        total += len(clients)
    if closed is not None:
        if acc_name:
            closed = [c for c in closed if _account_name(_account_of(server, c)) == acc_name]
        total += len(closed)
    out["total"] = total

    rows = []
    if cid > 0:
        if state in (STATE_OPEN, STATE_ALL):
            c = server.clients.get(cid)
            if c is not None:
                rows.append((c, False))
        if not rows and closed:
            rows.extend((c, True) for c in closed if c.cid == cid)
            rows = rows[:1]
    else:
        if state in (STATE_OPEN, STATE_ALL):
            rows = [(c, False) for c in clients]
        if closed:
            rows.extend((c, True) for c in closed)
        if user or mqtt_client:
            rows = [r for r in rows
                    if (not user or _user(r[0], server) == user)
                    and (not mqtt_client or getattr(r[0], "mqtt_client", "") == mqtt_client)]

    if not rows:
        return 200, out
    _sort_rows(rows, sort, clock)
    n = len(rows)
    lo = min(offset, n)
    hi = lo + min(limit, n - lo)
    page = [conn_info(server, r, clock, subs, subs_detail, auth) for r in rows[lo:hi]]
    out["num_connections"] = len(page)
    out["connections"] = page
    return 200, out


def _sublist_stats(sublists) -> dict:
    """SublistStats summed over accounts, as SublistStats.add does."""
    num_subs = num_cache = inserts = removes = matches = max_fanout = 0
    hits = tot_fanout = 0.0
    for sl in sublists:
        st = sl.stats()
        num_subs += st.get("num_subscriptions", 0)
        nc = st.get("num_cache", 0)
        num_cache += nc
        inserts += st.get("num_inserts", 0)
        removes += st.get("num_removes", 0)
        m = st.get("num_matches", 0)
        matches += m
        h = getattr(sl, "cache_hits", None)
        hits += h if h is not None else st.get("cache_hit_rate", 0.0) * m
        max_fanout = max(max_fanout, st.get("max_fanout", 0))
        tot_fanout += st.get("avg_fanout", 0.0) * nc
    return {
        "num_subscriptions": num_subs,
        "num_cache": num_cache,
        "num_inserts": inserts,
        "num_removes": removes,
        "num_matches": matches,
        "cache_hit_rate": go_float(hits / matches) if matches else 0,
        "max_fanout": max_fanout,
        "avg_fanout": go_float(tot_fanout / num_cache) if tot_fanout and num_cache else 0,
    }


def _subsz(server, query):
    subs = decode_bool(query, "subs")
    offset = decode_int(query, "offset")
    limit = decode_int(query, "limit")
    test = _param(query, "test")
    acc_filter = _param(query, "acc")
    offset = max(offset, 0)
    if limit <= 0:
        limit = DEFAULT_SUB_LIST_SIZE
    test_b = None
    if test:
        test_b = test.encode()
        if not valid_literal_subject(test_b):
            raise HTTPError(400, "invalid test subject, must be valid publish subject: %s" % test)

    accounts = [a for name, a in _accounts(server).items() if not acc_filter or name == acc_filter]
    out = {"server_id": server.server_id, "now": rfc3339(time.time())}
    out.update(_sublist_stats(a.sublist for a in accounts))
    out.update(total=0, offset=offset, limit=limit)
    if subs:
        details = []
        for acc in accounts:
            name, tag = acc.name, _name_tag(acc)
            for sub in acc.sublist.subscriptions():
                if test_b is not None and not subject_matches(sub.subject, test_b):
                    continue
                owner = sub.client
                if owner is None:
                    continue
                # Local interest only, as Sublist.localSubs: not a route's (or a
                # gateway's or leaf node's) remote subscriptions.
                if getattr(getattr(owner, "conn", None), "kind", "Client") in _REMOTE_KINDS:
                    continue
                d = {"account": name, "account_tag": tag}
                d.update(_client_sub_detail(sub, _sub_cid(sub)))
                details.append(d)
        n = len(details)
        lo = min(offset, n)
        hi = lo + min(limit, n - lo)
        out["total"] = n
        page = details[lo:hi]
        if page:
            out["subscriptions_list"] = page
    return 200, out


def _accountz(server, query):
    out = {"server_id": server.server_id, "now": rfc3339(time.time())}
    sys_name = _system_account_name(server)
    if sys_name:
        out["system_account"] = sys_name
    accounts = _accounts(server)
    name = _param(query, "acc")
    if not name:
        names = list(accounts)
        if sys_name and sys_name not in accounts:
            names.insert(0, sys_name)
        out["accounts"] = names
        return 200, out
    acc = accounts.get(name)
    if acc is None:
        raise HTTPError(400, "Account %s does not exist" % name)
    clients = getattr(acc, "client_count", None)
    if clients is None:
        clients = sum(1 for c in server.clients.values()
                      if _account_name(_account_of(server, c)) == name)
    leafs = sum(1 for c in getattr(server, "leafs", {}).values()
                if _account_name(_account_of(server, c)) == name)
    detail = {
        "account_name": name,
        "update_time": rfc3339(getattr(acc, "update_time", None) or server.start_time),
    }
    if name == sys_name or getattr(acc, "is_system", False):
        detail["is_system"] = True
    detail.update({
        "expired": False,
        "complete": True,
        "jetstream_enabled": bool(getattr(acc, "jetstream", False)),
        "leafnode_connections": leafs,
        "client_connections": clients,
        "subscriptions": acc.sublist.count,
    })
    hook = getattr(acc, "monitor_detail", None)
    if hook is not None:
        detail.update({k: v for k, v in hook().items() if v not in (None, "", [], {})})
    detail["name_tag"] = _name_tag(acc)
    detail["sublist_stats"] = _sublist_stats([acc.sublist])
    out["account_detail"] = detail
    return 200, out


def _route_info(r, clock: Clock, subs: bool, subs_detail: bool) -> dict:
    start = getattr(r, "start", clock.mono)
    last = getattr(r, "last_activity", start)
    ri = {
        "rid": r.cid,
        "remote_id": getattr(r, "remote_id", "") or "",
        "remote_name": getattr(r, "remote_name", "") or "",
        "did_solicit": bool(getattr(r, "did_solicit", False)),
        "is_configured": bool(getattr(r, "is_configured", False)),
        "ip": getattr(r, "host", "") or "",
        "port": getattr(r, "port", 0) or 0,
        "start": rfc3339(clock.to_wall(start)),
        "last_activity": rfc3339(clock.to_wall(last)),
        "rtt": rtt_string(getattr(r, "rtt", 0)),
        "uptime": go_uptime(clock.mono - start),
        "idle": go_uptime(clock.mono - last),
        "pending_size": _pending(r),
        "in_msgs": _counter(r, "in_msgs"),
        "out_msgs": _counter(r, "out_msgs"),
        "in_bytes": _counter(r, "in_bytes"),
        "out_bytes": _counter(r, "out_bytes"),
        "subscriptions": _num_subs(r),
    }
    sl = _subs_of(r) if (subs or subs_detail) else ()
    if sl:
        if subs_detail:
            ri["subscriptions_list_detail"] = [_client_sub_detail(s, r.cid) for s in sl]
        else:
            ri["subscriptions_list"] = [_text(s.subject) for s in sl]
    acc = getattr(r, "account", None)
    if acc:
        ri["account"] = _account_name(acc)
    elif getattr(r, "pool_idx", None) is not None and not getattr(r, "no_pool", False):
        # natsjs extension: which pool slot this connection is (nats-server does not say)
        ri["pool_idx"] = r.pool_idx
    comp = getattr(r, "compression", "")
    if comp:
        ri["compression"] = comp
    return ri


def _routez(server, query):
    subs, subs_detail = decode_subs(query)
    clock = Clock()
    routes = getattr(server, "routes", None) or ()
    if isinstance(routes, dict):
        routes = routes.values()
    routes = sorted(routes, key=lambda r: r.cid)
    return 200, {
        "server_id": server.server_id,
        "server_name": getattr(server, "name", "") or server.server_id,
        "now": rfc3339(clock.wall),
        "num_routes": len(routes),
        "routes": [_route_info(r, clock, subs, subs_detail) for r in routes],
    }


JSZ_BOOL_PARAMS = ("accounts", "streams", "consumers", "direct-consumers", "config")


def _jsz(server, query):
    opts = {}
    for name in JSZ_BOOL_PARAMS:
        opts[name] = decode_bool(query, name)
    opts["offset"] = max(decode_int(query, "offset"), 0)
    opts["limit"] = decode_int(query, "limit") or 1024
    opts["leader-only"] = decode_bool(query, "leader-only")
    opts["raft"] = decode_bool(query, "raft")
    opts["stream-leader-only"] = decode_bool(query, "stream-leader-only")
    opts["acc"] = _param(query, "acc")
    head = {"server_id": server.server_id, "now": rfc3339(time.time())}
    js = getattr(server, "jetstream", None)
    if js is None or not getattr(js, "enabled", True):
        if opts["leader-only"]:
            raise HTTPError(400, "filtered response: not leader")
        return 200, {
            "memory": 0, "storage": 0, "reserved_memory": 0, "reserved_storage": 0,
            "accounts": 0, "ha_assets": 0, "api": {"level": 0, "total": 0, "errors": 0},
            **head,
            "disabled": True,
            "config": {"max_memory": 0, "max_storage": 0},
            "streams": 0, "consumers": 0, "messages": 0, "bytes": 0, "total": 0,
        }
    body = js.jsz(opts)
    out = {}
    for k, v in body.items():
        out[k] = v
        if k == "api":
            out.update(head)
    if "server_id" not in out:
        out = {**head, **out}
    return 200, out


def _leafz(server, query):
    decode_bool(query, "subs")
    return 200, {"server_id": server.server_id, "now": rfc3339(time.time()),
                 "leafnodes": 0, "leafs": []}


def _gatewayz(server, query):
    return 200, {"server_id": server.server_id, "now": rfc3339(time.time()),
                 "outbound_gateways": {}, "inbound_gateways": {}}


def _endpoint(fn):
    """Wrap a handler so it returns ``(status, body)`` and never raises.

    ``body`` is a dict (JSON) or, for an error, nats-server's plain-text message.
    The system-account request handlers (natsjs/sysreq.py) call these directly, from
    inside message delivery, so an exception must not escape.
    """
    def handler(server, query):
        try:
            return fn(server, query)
        except HTTPError as exc:
            return exc.status, exc.message
        except Exception as exc:
            try:
                server.log.error("Error handling monitoring request %s: %r", fn.__name__, exc)
            except Exception:
                pass
            return 500, "internal server error"
    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


ENDPOINTS = {
    "/varz": _endpoint(_varz),
    "/connz": _endpoint(_connz),
    "/routez": _endpoint(_routez),
    "/gatewayz": _endpoint(_gatewayz),
    "/leafz": _endpoint(_leafz),
    "/subsz": _endpoint(_subsz),
    "/subscriptionsz": _endpoint(_subsz),
    "/accountz": _endpoint(_accountz),
    "/jsz": _endpoint(_jsz),
    "/healthz": _endpoint(_healthz),
}
# json.Marshal (one line) rather than MarshalIndent, as nats-server answers these.
COMPACT = frozenset(("/healthz",))

_INDEX = (
    ("General", "/varz"), ("JetStream", "/jsz"), ("Connections", "/connz"),
    ("Accounts", "/accountz"), ("Subscriptions", "/subsz"), ("Routes", "/routez"),
    ("LeafNodes", "/leafz"), ("Gateways", "/gatewayz"), ("Health Probe", "/healthz"),
)


def root_page() -> str:
    from natsjs import __version__
    links = "\n".join('  <a href=.%s>%s<span class="endpoint"> %s</span></a><br/>' % (p, t, p)
                      for t, p in _INDEX)
    return ('<html lang="en">\n<head><title>natsjs</title></head>\n<body>\n'
            '  <h1>natsjs v%s</h1>\n%s\n</body>\n</html>\n' % (__version__, links))


TEXT = "text/plain; charset=utf-8"


# Answers with more list entries than this are JSON-encoded in a worker thread: the
# indenting encoder is pure Python, so it lets the event loop (and every client
# connection) run between its steps instead of stalling them for a big /connz.
THREAD_ENCODE_ITEMS = 512
_LISTS = ("connections", "subscriptions_list", "routes")


# A JSONP callback is echoed into a script: only a (dotted) JavaScript name, or the
# page that asks could be made to run whatever the query string says.
_JS_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*(?:\.[A-Za-z_$][A-Za-z0-9_$]*)*")
MAX_CALLBACK = 128


def _prepare(server, path: str, query: dict):
    """(status, body, content type); body is bytes, or a dict still to be encoded."""
    callback = query.get("callback")
    if callback and (len(callback) > MAX_CALLBACK or not _JS_NAME.fullmatch(callback)):
        return 400, b"invalid callback: must be a JavaScript name\n", TEXT
    if path == "/":
        return 200, root_page().encode(), "text/html; charset=utf-8"
    handler = ENDPOINTS.get(path)
    if handler is None:
        return 404, b"404 page not found\n", TEXT
    status, body = handler(server, query)
    if isinstance(body, str):
        return status, body.encode(), TEXT
    return status, body, "application/json"


def _encode(body, path: str, query: dict) -> tuple[bytes, str]:
    payload = to_json(body, path in COMPACT)
    callback = query.get("callback")
    if callback:
        return callback.encode() + b"(" + payload + b")", "application/javascript"
    return payload, "application/json"


def _big(body) -> bool:
    return isinstance(body, dict) and any(
        isinstance(body.get(k), list) and len(body[k]) > THREAD_ENCODE_ITEMS for k in _LISTS)


def _internal_error(server, path: str, exc: Exception):
    try:
        server.log.error("Error handling monitoring request %s: %r", path, exc)
    except Exception:
        pass
    return 500, b"internal server error", TEXT


def dispatch(server, path: str, query: dict) -> tuple[int, bytes, str]:
    """(status, payload, content type) for one GET; never raises."""
    try:
        status, body, ctype = _prepare(server, path, query)
        if not isinstance(body, bytes):
            body, ctype = _encode(body, path, query)
        return status, body, ctype
    except Exception as exc:
        return _internal_error(server, path, exc)


async def dispatch_async(server, path: str, query: dict) -> tuple[int, bytes, str]:
    """``dispatch``, with big answers encoded off the event loop."""
    try:
        status, body, ctype = _prepare(server, path, query)
        if not isinstance(body, bytes):
            if _big(body):
                body, ctype = await trio.to_thread.run_sync(_encode, body, path, query)
            else:
                body, ctype = _encode(body, path, query)
        return status, body, ctype
    except Exception as exc:
        return _internal_error(server, path, exc)


def parse_target(target: str) -> tuple[str, dict]:
    """Path and query of a request target; a repeated parameter keeps its first value."""
    url = urlsplit(target)
    query: dict[str, str] = {}
    for k, v in parse_qsl(url.query, keep_blank_values=True):
        query.setdefault(k, v)
    return url.path or "/", query


# ---- HTTP -------------------------------------------------------------------------


class MonitorListenError(Exception):
    """The monitoring port cannot be opened; the message is nats-server's."""


async def serve(server, task_status=trio.TASK_STATUS_IGNORED):
    opts = server.opts
    host = opts.http_host or opts.host
    port = 0 if opts.http_port == -1 else opts.http_port
    try:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
    except OSError as exc:
        raise MonitorListenError(
            "Can't start monitoring: can't listen to the monitor port: listen tcp %s:%d: "
            "bind: %s" % (host or "0.0.0.0", port, (exc.strerror or str(exc)).lower())) \
            from None
    server.http_port = listeners[0].socket.getsockname()[1]
    server.log.info("Starting http monitor on %s:%d", host or "0.0.0.0", server.http_port)
    task_status.started()
    await trio.serve_listeners(lambda stream: _handle(server, stream), listeners)


async def _handle(server, stream):
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
    try:
        with trio.move_on_after(REQUEST_TIMEOUT):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(8192)
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    await _respond(server, conn, stream, event)
                    if conn.our_state is h11.MUST_CLOSE:
                        return
                    continue
                if isinstance(event, h11.EndOfMessage):
                    if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                        conn.start_next_cycle()
                    continue
                if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
    except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    except Exception as exc:  # one bad request must not take the server down
        try:
            server.log.error("Error in http monitor connection: %r", exc)
        except Exception:
            pass
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _respond(server, conn, stream, request):
    if request.method not in (b"GET", b"HEAD"):
        status, payload, ctype = 405, b"method not allowed\n", "text/plain; charset=utf-8"
    else:
        path, query = parse_target(request.target.decode("latin-1"))
        status, payload, ctype = await dispatch_async(server, path, query)
    headers = [("Content-Type", ctype), ("Content-Length", str(len(payload)))]
    if status < 400 or ctype == "application/json":
        headers.append(("Access-Control-Allow-Origin", "*"))
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    if request.method != b"HEAD":
        await stream.send_all(conn.send(h11.Data(data=payload)))
    await stream.send_all(conn.send(h11.EndOfMessage()))
