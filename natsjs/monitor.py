"""HTTP monitoring: /varz, /healthz (and more as the operations issue lands).

A small HTTP/1.1 server on trio with h11 doing the protocol; every endpoint is a
function of the server's live counters, rendered as nats-server's JSON field names
so existing dashboards, exporters and test harnesses (which poll /varz to know a
server is up) read it unchanged.
"""
from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import h11
import trio

MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT = 10.0


def _healthz(server, query):
    return 200, {"status": "ok"}


def _varz(server, query):
    return 200, server.varz()


ENDPOINTS = {
    "/varz": _varz,
    "/healthz": _healthz,
}


def _root(server, query):
    links = "".join('<a href="%s">%s</a><br/>' % (p, p[1:]) for p in ENDPOINTS)
    return 200, "<html><body><h1>natsjs</h1>%s</body></html>" % links


async def serve(server, task_status=trio.TASK_STATUS_IGNORED):
    opts = server.opts
    host = opts.http_host or opts.host
    port = 0 if opts.http_port == -1 else opts.http_port
    listeners = await trio.open_tcp_listeners(port, host=host or None)
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
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _respond(server, conn, stream, request):
    url = urlsplit(request.target.decode("latin-1"))
    path = url.path.rstrip("/") or "/"
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if request.method not in (b"GET", b"HEAD"):
        status, body = 405, {"error": "method not allowed"}
    elif path == "/":
        status, body = _root(server, query)
    else:
        handler = ENDPOINTS.get(path)
        if handler is None:
            status, body = 404, {"error": "not found"}
        else:
            status, body = handler(server, query)
    if isinstance(body, str):
        payload, ctype = body.encode(), "text/html; charset=utf-8"
    else:
        payload = json.dumps(body, indent=2).encode()
        ctype = "application/json"
    callback = query.get("callback")
    if callback and ctype == "application/json":
        payload = callback.encode() + b"(" + payload + b")"
        ctype = "application/javascript"
    headers = [("Content-Type", ctype), ("Content-Length", str(len(payload))),
               ("Access-Control-Allow-Origin", "*")]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
    if request.method != b"HEAD":
        await stream.send_all(conn.send(h11.Data(data=payload)))
    await stream.send_all(conn.send(h11.EndOfMessage()))
