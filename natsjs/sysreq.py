"""Requests to the system account: ``$SYS.REQ.SERVER.PING[.KIND]`` and by server id.

A client bound to the system account asks every server (``PING``) or one server
(``$SYS.REQ.SERVER.<id>.<KIND>``) for its monitoring data; each server answers on the
reply subject with ``{"server": {...}, "data": {...}}`` (``statsz`` for the plain
PING), the shapes of nats-server's server/events.go (ServerAPIResponse,
ServerStatsMsg).  The handlers are internal subscriptions in the system account, so
the request reaches them through the same sublist as client traffic.
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
        "ver": NATS_VERSION,
        "jetstream": server.jetstream is not None,
        "flags": 0,
        "seq": server._sys_seq,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
    }


def statsz(server) -> dict:
    v = server.varz()
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


KINDS = {
    "VARZ": lambda server, q: server.varz(),
    "STATSZ": lambda server, q: statsz(server),
    "HEALTHZ": lambda server, q: {"status": "ok"},
    "CONNZ": _monitor("/connz"),
    "SUBSZ": _monitor("/subsz"),
    "ACCOUNTZ": _monitor("/accountz"),
    "ROUTEZ": _monitor("/routez"),
    "JSZ": _monitor("/jsz"),
}


# The JSON option names of $SYS requests (server/monitor.go ConnzOptions and friends)
# -> the HTTP query the monitor handlers take.
_STATES = {0: "open", 1: "closed", 2: "all"}


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
        elif isinstance(v, bool):
            query[k] = "true" if v else "false"
        elif v is not None:
            query[k] = str(v)
    return query


def _handler(server, kind):
    def on_request(sub, subject, reply, hdr, msg):
        if not reply:
            return
        query = {}
        body = msg[hdr:] if hdr and hdr > 0 else msg
        if body.strip():
            try:
                opts = json.loads(body)
                if isinstance(opts, dict):
                    query = _query_from_options(opts)
            except ValueError:
                pass
        if kind is None:
            resp = {"server": _server_info(server), "statsz": statsz(server)}
        else:
            resp = {"server": _server_info(server), "data": KINDS[kind](server, query)}
        server.deliver(server.system_account, reply, None,
                       json.dumps(resp, separators=(",", ":")).encode())
    return on_request


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
