"""Requests to the system account: ``$SYS.REQ.SERVER.PING[.KIND]`` and by server id.

A client bound to the system account asks every server (``PING``) or one server
(``$SYS.REQ.SERVER.<id>.<KIND>``) for its monitoring data; each server answers on the
reply subject with ``{"server": {...}, "data": {...}}`` (``statsz`` for the plain
PING and STATSZ), the shapes of nats-server's server/events.go (ServerAPIResponse,
ServerStatsMsg).  The handlers are internal subscriptions in the system account, so
the request reaches them through the same sublist as client traffic.

As in events.go zReq, a request may carry the EventFilterOptions (``server_name``,
``cluster``, ``host``, ``exact_match``, ``tags``, ``domain``): a server they do not
match stays silent, and so does a server that is not the meta leader when ``JSZ``
asks for ``leader_only``.  The admin CLI (``natsjs server ...``) relies on both.
"""
from __future__ import annotations

import json
import time

from natsjs import NATS_VERSION


def _server_info(server) -> dict:
    server._sys_seq += 1
    return {
        "name": server.name,
        "host": server.opts.host,
        "id": server.server_id,
        "cluster": server.cluster.name if getattr(server, "cluster", None) is not None else "",
        "ver": NATS_VERSION,
        "jetstream": server.jetstream is not None,
        "flags": 0,
        "seq": server._sys_seq,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
    }


def _route_stats(server) -> tuple[list, int]:
    """statsz ``routes`` (one per route connection, as RouteStat) and how many servers
    are known: the distinct peers plus this one (events.go ActiveServers)."""
    routes, peers = [], set()
    for r in server.routes:
        name = getattr(r, "remote_name", "") or ""
        peers.add(getattr(r, "remote_id", "") or name)
        routes.append({"rid": r.cid, "name": name,
                       "sent": {"msgs": getattr(r, "out_msgs", 0) or 0,
                                "bytes": getattr(r, "out_bytes", 0) or 0},
                       "received": {"msgs": getattr(r, "in_msgs", 0) or 0,
                                    "bytes": getattr(r, "in_bytes", 0) or 0},
                       "pending": 0})
    peers.discard("")
    return routes, len(peers) + 1


def statsz(server) -> dict:
    v = server.varz()
    routes, active = _route_stats(server)
    return {
        "start": v["start"],
        "mem": v["mem"],
        "cores": v["cores"],
        "cpu": v["cpu"],
        "connections": v["connections"],
        "total_connections": v["total_connections"],
        "active_accounts": sum(1 for a in server.accounts.values() if a.client_count),
        "subscriptions": v["subscriptions"],
        "sent": {"msgs": v["out_msgs"], "bytes": v["out_bytes"]},
        "received": {"msgs": v["in_msgs"], "bytes": v["in_bytes"]},
        "slow_consumers": v["slow_consumers"],
        "routes": routes,
        "active_servers": active,
    }


def _monitor(path):
    def get(server, query):
        from natsjs import monitor
        handler = monitor.ENDPOINTS.get(path)
        if handler is None:
            return None
        status, body = handler(server, query)
        return body if status == 200 else {"error": body}
    return get


def _healthz(server, query):
    # The health status is the answer whether healthy or not (events.go HEALTHZ), with
    # the status code that /healthz gives as the HTTP status (monitor.go healthz:
    # only HandleHealthz leaves it out of the JSON).
    from natsjs import monitor
    if "acc" in query:          # HealthzOptions' "account" is /healthz's ?account=
        query = dict(query, account=query.pop("acc"))
    status, body = monitor.ENDPOINTS["/healthz"](server, query)
    if isinstance(body, dict):
        body = dict(body, status_code=status)
    return body


def _idz(server, query):
    return {"name": server.name, "host": server.opts.host, "id": server.server_id}


KINDS = {
    "VARZ": lambda server, q: server.varz(),
    "STATSZ": lambda server, q: statsz(server),
    "HEALTHZ": _healthz,
    "IDZ": _idz,
    "CONNZ": _monitor("/connz"),
    "SUBSZ": _monitor("/subsz"),
    "ACCOUNTZ": _monitor("/accountz"),
    "ROUTEZ": _monitor("/routez"),
    "GATEWAYZ": _monitor("/gatewayz"),
    "LEAFZ": _monitor("/leafz"),
    "JSZ": _monitor("/jsz"),
}


# The JSON option names of $SYS requests (server/monitor.go ConnzOptions and friends)
# -> the HTTP query the monitor handlers take.
_STATES = {0: "open", 1: "closed", 2: "all"}
# JSON option names whose HTTP parameter is spelled otherwise (server/monitor.go
# JSzOptions json tags against the /jsz query parameters).
_RENAMED = {"consumer": "consumers", "leader_only": "leader-only", "raft": "raft",
            "stream_leader_only": "stream-leader-only", "direct_consumer": "direct-consumers"}
_FILTER_KEYS = ("server_name", "cluster", "host", "exact_match", "tags", "domain")


def _query_from_options(opts: dict) -> dict:
    query = {}
    for k, v in opts.items():
        if k == "subscriptions" and v:
            query.setdefault("subs", "1")
        elif k == "subscriptions_detail" and v:
            query["subs"] = "detail"
        elif k == "state" and isinstance(v, int):
            query["state"] = _STATES.get(v, str(v))
        elif k in ("account", "acc"):
            query["acc"] = str(v)
        elif k in _FILTER_KEYS:
            continue
        elif k in _RENAMED:
            query[_RENAMED[k]] = "true" if v is True else "false" if v is False else str(v)
        elif isinstance(v, bool):
            query[k] = "true" if v else "false"
        elif v is not None:
            query[k] = str(v)
    return query


def filtered(server, opts: dict) -> bool:
    """events.go filterRequest: True when the request's filters exclude this server."""
    name, host = server.name or "", server.opts.host or ""
    cluster = server.cluster.name if getattr(server, "cluster", None) is not None else ""
    want = [(opts.get("server_name") or "", name), (opts.get("host") or "", host),
            (opts.get("cluster") or "", cluster)]
    for given, mine in want:
        if given and (given != mine if opts.get("exact_match") else given not in mine):
            return True
    if opts.get("tags"):
        return True             # natsjs servers carry no tags
    if opts.get("domain"):
        return True             # nor a JetStream domain
    return False


def _not_leader(server) -> bool:
    js = getattr(server, "jetstream", None)
    cluster = getattr(js, "cluster", None) if js is not None else None
    if cluster is None or getattr(cluster, "meta", None) is None:
        return False
    return not cluster.meta.is_leader()


def _request_options(server, kind, hdr, msg):
    """A request's JSON options and the monitoring query they make, or None when its
    filters exclude this server (events.go zReq)."""
    body = msg[hdr:] if hdr and hdr > 0 else msg
    opts: dict = {}
    if body.strip():
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            if filtered(server, decoded):
                return None
            if kind == "JSZ" and decoded.get("leader_only") and _not_leader(server):
                return None
            opts = decoded
    return opts, _query_from_options(opts)


def _reply(server, reply: bytes, resp) -> None:
    server.deliver(server.system_account, reply, None,
                   json.dumps(resp, separators=(",", ":")).encode())


def _handler(server, kind):
    def on_request(sub, subject, reply, hdr, msg):
        if not reply:
            return
        parsed = _request_options(server, kind, hdr, msg)
        if parsed is None:
            return
        _opts, query = parsed
        if kind is None or kind == "STATSZ":
            # events.go statszReq: a ServerStatsMsg, for PING and PING.STATSZ alike
            resp = {"server": _server_info(server), "statsz": statsz(server)}
        elif kind == "IDZ":      # answered bare, not as a ServerAPIResponse
            resp = _idz(server, query)
        else:
            resp = {"server": _server_info(server), "data": KINDS[kind](server, query)}
        _reply(server, reply, resp)
    return on_request


# ---- an account's own view: $SYS.REQ.ACCOUNT.<account>.CONNZ|STATZ ------------------------
#
# events.go registerSystemImports: every account imports $SYS.REQ.SERVER.PING.CONNZ and
# $SYS.REQ.ACCOUNT.PING.CONNZ (as $SYS.REQ.ACCOUNT.<account>.CONNZ) and
# $SYS.REQ.ACCOUNT.PING.STATZ (as $SYS.REQ.ACCOUNT.<account>.STATZ) from the system
# account, so an ordinary user sees its own account's connections and statistics
# (natscli's account report).  Every server answers, so the answers stream back.

ACCOUNT_IMPORTS = ((b"$SYS.REQ.SERVER.PING.CONNZ", "CONNZ"),
                   (b"$SYS.REQ.ACCOUNT.PING.CONNZ", "CONNZ"),
                   (b"$SYS.REQ.ACCOUNT.PING.STATZ", "STATZ"))


def account_statz(server, acc) -> dict:
    """events.go AccountStatz's entry for one account (its clients on this server)."""
    in_msgs, in_bytes, out_msgs, out_bytes = acc.closed_totals
    conns = 0
    for c in server.clients.values():
        if getattr(c, "account", None) is acc:
            conns += 1
            core = c.core
            in_msgs += core.in_msgs
            in_bytes += core.in_bytes
            out_msgs += core.out_msgs
            out_bytes += core.out_bytes
    return {"acc": acc.name, "name": acc.name, "conns": conns, "leafnodes": 0,
            "total_conns": conns, "num_subscriptions": acc.sublist.count,
            "sent": {"msgs": out_msgs, "bytes": out_bytes},
            "received": {"msgs": in_msgs, "bytes": in_bytes},
            "slow_consumers": acc.slow_consumers}


def _accounts_statz(server, names, include_unused: bool):
    """The AccountStatz answer for ``names`` (every account when empty), or None when no
    account qualifies (nats-server then stays silent)."""
    out = []
    for name in names or sorted(server.accounts):
        acc = server.accounts.get(name)
        if acc is None or (not names and acc.is_system):
            continue
        st = account_statz(server, acc)
        if st["conns"] or include_unused:
            out.append(st)
    if not out:
        return None
    return {"server_id": server.server_id,
            "now": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
            "account_statz": out}


def _account_handler(server, kind):
    """$SYS.REQ.ACCOUNT.<account>.<kind> in the system account."""
    def on_request(sub, subject, reply, hdr, msg):
        if not reply:
            return
        name = subject.split(b".")[3].decode(errors="replace")
        if name == "PING" or name not in server.accounts:
            return
        parsed = _request_options(server, kind, hdr, msg)
        if parsed is None:
            return
        opts, query = parsed
        if kind == "CONNZ":
            query["acc"] = name
            data = KINDS["CONNZ"](server, query)
        else:
            data = _accounts_statz(server, [name], bool(opts.get("include_unused")))
            if data is None:
                return
        _reply(server, reply, {"server": _server_info(server), "data": data})
    return on_request


def _accounts_ping(server):
    """$SYS.REQ.ACCOUNT.PING.STATZ from a system user: the accounts asked for."""
    def on_request(sub, subject, reply, hdr, msg):
        if not reply:
            return
        parsed = _request_options(server, "STATZ", hdr, msg)
        if parsed is None:
            return
        opts, _query = parsed
        data = _accounts_statz(server, list(opts.get("accounts") or []),
                               bool(opts.get("include_unused")))
        if data is not None:
            _reply(server, reply, {"server": _server_info(server), "data": data})
    return on_request


def _account_import(server, acc, kind: str):
    """In ``acc``: the request goes on to the system account as that account's own,
    and every server's answer comes back (a streamed response)."""
    sys_acc = server.system_account
    target = b"$SYS.REQ.ACCOUNT.%s.%s" % (acc.name.encode(), kind.encode())

    def request(sub, subject, reply, hdr, msg):
        mapped = sys_acc.map_reply(acc, reply, "stream") if reply else None
        server.deliver(sys_acc, target, mapped, msg, hdr)
    return request


class SysRequests:
    """The internal-subscription owner of the $SYS request handlers."""

    name = "$SYS requests"
    max_tasks = 0

    def install(self, server) -> None:
        acc = server.system_account
        sid = server.server_id.encode()
        server.subscribe_internal(acc, b"$SYS.REQ.SERVER.PING", _handler(server, None), self)
        for kind in KINDS:
            handler = _handler(server, kind)
            server.subscribe_internal(acc, b"$SYS.REQ.SERVER.PING." + kind.encode(), handler,
                                      self)
            server.subscribe_internal(acc, b"$SYS.REQ.SERVER.%s.%s" % (sid, kind.encode()),
                                      handler, self)
        for kind in ("CONNZ", "STATZ"):
            server.subscribe_internal(acc, b"$SYS.REQ.ACCOUNT.*.%s" % kind.encode(),
                                      _account_handler(server, kind), self)
        server.subscribe_internal(acc, b"$SYS.REQ.ACCOUNT.PING.STATZ", _accounts_ping(server),
                                  self)
        acc.ensure_response_sub(server, self)
        for other in list(server.accounts.values()):
            if other is acc:
                continue
            for subject, kind in ACCOUNT_IMPORTS:
                # Not routed: each server forwards its own clients' requests once.
                server.subscribe_internal(other, subject, _account_import(server, other, kind),
                                          self, route=False)
