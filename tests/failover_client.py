"""One client's view of a cluster losing its servers one after another.

Run by tests/test_failover.py, under the test's Python for nats-py and under a
Python 3.13 virtualenv for nats-core (PyPI ``nats-core``, which needs 3.13).  The
servers are already starting; this script

1. connects to the first one as soon as it accepts (``no_randomize``, no reconnect
   wait), as a test harness does right after starting a cluster;
2. waits until the client has been told every member's client URL (INFO
   ``connect_urls``, at connect or in async INFO while the mesh forms);
3. stops (SIGTERM) the server the client is on, waits for the client to report a
   reconnection, checks it is on a live server other than the stopped one and that
   a round trip works there; and again, until one server is left.

It prints one JSON line: ``{"ok": true, "steps": [...]}`` or ``{"ok": false,
"error": ...}``.  Arguments: ``py|core``, then ``port:pid`` per server, first the
one to connect to.
"""
import asyncio
import json
import os
import signal
import sys
import time

WAIT = 10.0


async def connect(kind: str, url: str):
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if kind == "core":
                from nats.client import connect as core_connect
                return await core_connect(url, no_randomize=True, reconnect_time_wait=0,
                                          reconnect_max_attempts=0, timeout=2)
            import nats
            return await nats.connect(url, dont_randomize=True, reconnect_time_wait=0,
                                      max_reconnect_attempts=-1, connect_timeout=2)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)


class View:
    """What the client believes, the same way for both libraries."""

    def __init__(self, kind: str, nc):
        self.kind = kind
        self.nc = nc
        self.reconnected = asyncio.Event()
        if kind == "core":
            nc.add_reconnected_callback(self.reconnected.set)
        else:
            async def on_reconnect():
                self.reconnected.set()
            nc._reconnected_cb = on_reconnect

    def known_ports(self) -> set[int]:
        if self.kind == "core":
            urls = list(self.nc._server_pool)
        else:
            urls = ["%s:%s" % (s.uri.hostname, s.uri.port) for s in self.nc._server_pool]
        return {int(u.rsplit(":", 1)[1]) for u in urls}

    def port(self) -> int:
        if self.kind == "core":
            return int(self.nc.server_info.port)
        return int(self.nc.connected_url.port)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.nc.close(), 2)
        except BaseException:
            pass


async def main(kind: str, servers: list[tuple[int, int]]) -> dict:
    pids = dict(servers)
    ports = [p for p, _ in servers]
    view = View(kind, await connect(kind, "nats://127.0.0.1:%d" % ports[0]))
    steps = []
    try:
        deadline = time.monotonic() + WAIT
        while not set(ports) <= view.known_ports():
            if time.monotonic() > deadline:
                return {"ok": False, "error": "never told about every server",
                        "known": sorted(view.known_ports()), "ports": ports}
            await asyncio.sleep(0.005)
        alive = set(ports)
        current = view.port()
        for _ in range(len(ports) - 1):
            view.reconnected.clear()
            os.kill(pids[current], signal.SIGTERM)
            alive.discard(current)
            started = time.monotonic()
            try:
                await asyncio.wait_for(view.reconnected.wait(), WAIT)
            except asyncio.TimeoutError:
                return {"ok": False, "error": "no reconnection within %gs" % WAIT,
                        "stopped": current, "steps": steps}
            took = time.monotonic() - started
            now = view.port()
            if now not in alive:
                return {"ok": False, "error": "reconnected, but shows server %d" % now,
                        "stopped": current, "alive": sorted(alive), "steps": steps}
            await asyncio.wait_for(view.nc.flush(), WAIT)
            steps.append({"from": current, "to": now, "seconds": round(took, 3)})
            current = now
        return {"ok": True, "steps": steps}
    finally:
        await view.close()


if __name__ == "__main__":
    kind = sys.argv[1]
    servers = [tuple(int(x) for x in a.split(":")) for a in sys.argv[2:]]
    try:
        result = asyncio.run(main(kind, servers))
    except Exception as exc:
        result = {"ok": False, "error": repr(exc)}
    print(json.dumps(result), flush=True)
