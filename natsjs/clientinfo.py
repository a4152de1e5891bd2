"""What a server says about the client behind a request: server/events.go ``ClientInfo``.

A request that crosses a service import which shares it (the JetStream API's, from
every account into the system account) carries this as JSON in its
``Nats-Request-Info`` header, set by the requester's own server; the handler in the
exporting account learns from it whose request it is (``svc``, else ``acc``).  The
header survives routes, so any server of the cluster can answer for any account.
"""
from __future__ import annotations

import json

import trio

from natsjs.jetstream import headers as H
from natsjs.jetstream.jstime import now_ns, rfc3339_nano

REQUEST_INFO = H.REQUEST_INFO


def client_info(client, account_name: str, server) -> dict:
    """The ClientInfo of ``client`` (a client connection) as nats-server fills it for
    advisories (forAdvisory: no JWT, no alternates); for a publish from anything
    else (server code, a route), the account and this server only."""
    if client is None or getattr(client, "kind", "") != "Client":
        return {"acc": account_name, "server": server.name}
    # The connection's start is kept on trio's clock: shift it to the wall clock.
    started = now_ns() - int((trio.current_time() - client.start) * 1e9)
    out = {"start": rfc3339_nano(started), "host": client.host, "id": client.cid,
           "acc": client.account.name}
    user = client.user
    uname = (getattr(user, "username", "") or getattr(user, "nkey", "")) if user else ""
    if uname:
        out["user"] = uname
    if client.name:
        out["name"] = client.name
    if client.lang:
        out["lang"] = client.lang
    if client.version:
        out["ver"] = client.version
    if client.rtt:
        out["rtt"] = int(client.rtt * 1e9)
    out["server"] = server.name
    if server.cluster is not None:
        out["cluster"] = server.cluster.name
    out["kind"] = "Client"
    out["client_type"] = getattr(client, "client_type", "nats") or "nats"
    return out


def request_info_value(client, account_name: str, server) -> bytes:
    """``client_info`` as JSON for a ``Nats-Request-Info`` header.  A client's is kept
    on its connection until its RTT, account or name changes: a request through the
    JetStream import should not pay for building it each time."""
    if client is None or getattr(client, "kind", "") != "Client":
        return json.dumps(client_info(client, account_name, server),
                          separators=(",", ":")).encode()
    key = (client.rtt, client.account.name, client.name)
    cached = client.request_info
    if cached is not None and cached[0] == key:
        return cached[1]
    value = json.dumps(client_info(client, account_name, server),
                       separators=(",", ":")).encode()
    client.request_info = (key, value)
    return value


def with_request_info(hdr: int, msg: bytes, value: bytes) -> tuple[int, bytes]:
    """``msg`` (its header block ``hdr`` bytes long, or none when ``hdr`` <= 0) with
    its ``Nats-Request-Info`` set to ``value`` (JSON); whatever the publisher put there
    is replaced, as nats-server replaces it (server/client.go processServiceImport)."""
    if hdr <= 0:
        block = b"NATS/1.0\r\nNats-Request-Info: " + value + b"\r\n\r\n"
        return len(block), block + msg
    block = H.set(msg[:hdr], REQUEST_INFO, value)
    return len(block), block + msg[hdr:]


def request_info(hdr: bytes | None) -> dict | None:
    """The ClientInfo a request carries, or None when it has none (a request made in
    the system account itself) or it is not a JSON object.  Callers must not change
    the dict."""
    raw = H.get(hdr, REQUEST_INFO)
    if raw is None:
        return None
    info = _parsed.get(raw)
    if info is not None:
        return info
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(info, dict):
        return None
    if len(_parsed) >= _PARSED_MAX:
        _parsed.clear()
    _parsed[raw] = info
    return info


# A client's header is the same from one request to the next (request_info_value keeps
# it), so its parse is kept too: the dicts handed out are shared and never changed.
_PARSED_MAX = 4096
_parsed: dict[bytes, dict] = {}


def service_account(info: dict) -> str:
    """server/events.go serviceAccount: the account a request is made for."""
    svc = info.get("svc")
    if isinstance(svc, str) and svc:
        return svc
    acc = info.get("acc")
    return acc if isinstance(acc, str) else ""
