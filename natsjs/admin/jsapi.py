"""The JetStream API and the system account's server requests, as JSON over nats-py.

``JSApi.request("STREAM.INFO.ORDERS")`` sends to ``$JS.API.STREAM.INFO.ORDERS`` (or the
domain's / prefix's subject) and returns the decoded answer, raising ``APIError`` for
an ``error`` answer; the CLI keeps the server's JSON as it came so ``--json`` prints
exactly what the server said.  ``server_requests`` gathers the answers of every server
to a ``$SYS.REQ.SERVER.PING.<KIND>`` request the way jsm.go's serverdata does: until the
expected count arrived, or 300 ms after the last answer (the first may take the whole
timeout).
"""
from __future__ import annotations

import asyncio
import json
import sys

from natsjs.admin.errors import APIError, CLIError

SYS_NO_RESPONDERS = ("server request failed, ensure the account used has system privileges "
                     "and appropriate permissions")


def _trace(on: bool, text: str) -> None:
    if on:
        sys.stderr.write(text + "\n")


class JSApi:
    def __init__(self, nc, prefix: str = "$JS.API", timeout: float = 5.0,
                 trace: bool = False):
        self.nc = nc
        self.prefix = prefix
        self.timeout = timeout
        self.trace = trace

    async def request(self, op: str, body=None, doing: str = "", timeout=None,
                      raw: bytes | None = None) -> dict:
        import nats.errors

        subject = "%s.%s" % (self.prefix, op)
        data = raw if raw is not None else (
            b"" if body is None else json.dumps(body).encode())
        _trace(self.trace, ">>> %s\n%s" % (subject, data.decode(errors="replace")))
        try:
            msg = await self.nc.request(subject, data, timeout=timeout or self.timeout)
        except nats.errors.NoRespondersError:
            raise CLIError("%sJetStream is not available: no responders on %s "
                           "(is JetStream enabled for this account?)"
                           % (doing + ": " if doing else "", subject)) from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            raise CLIError("%scontext deadline exceeded waiting for %s"
                           % (doing + ": " if doing else "", subject)) from None
        _trace(self.trace, "<<< %s" % msg.data.decode(errors="replace"))
        try:
            resp = json.loads(msg.data)
        except ValueError:
            raise CLIError("invalid JSON answer on %s" % subject) from None
        if isinstance(resp, dict) and resp.get("error"):
            raise APIError(resp["error"], doing)
        return resp

    async def paged(self, op: str, key: str, body=None) -> tuple[list, dict]:
        """Every item of a paged list (STREAM.NAMES, STREAM.LIST, CONSUMER.LIST...);
        the last answer comes back too for its ``missing``/``offline`` fields."""
        items: list = []
        offset = 0
        last: dict = {}
        while True:
            req = dict(body or {})
            req["offset"] = offset
            last = await self.request(op, req)
            page = last.get(key) or []
            items.extend(page)
            offset += len(page)
            if not page or offset >= last.get("total", 0):
                return items, last

    # ---- the calls the commands share --------------------------------------------------

    async def stream_names(self, subject: str = "") -> list[str]:
        body = {"subject": subject} if subject else None
        names, _ = await self.paged("STREAM.NAMES", "streams", body)
        return sorted(names)

    async def stream_info(self, name: str, **opts) -> dict:
        return await self.request("STREAM.INFO." + name, opts or None,
                                  doing="could not load stream %s" % name)

    async def consumer_names(self, stream: str) -> list[str]:
        names, _ = await self.paged("CONSUMER.NAMES." + stream, "consumers")
        return sorted(names)

    async def consumer_info(self, stream: str, consumer: str) -> dict:
        return await self.request("CONSUMER.INFO.%s.%s" % (stream, consumer),
                                  doing="could not load consumer %s > %s" % (stream, consumer))

    async def account_info(self) -> dict:
        return await self.request("INFO", doing="could not obtain account information")


async def server_requests(nc, subject: str, body=None, wait_for: int = 0,
                          timeout: float = 5.0, trace: bool = False, with_rtt: bool = False,
                          expect_from_stats: bool = False, on_each=None) -> list:
    """Answers of every server to a system request, decoded (with their arrival time
    in seconds when ``with_rtt``).  ``expect_from_stats``: a STATSZ answer's
    ``active_servers`` sets how many to wait for, as natscli's ``server ping`` does."""
    data = b"" if body is None else json.dumps(body).encode()
    inbox = nc.new_inbox()
    got: list = []
    done = asyncio.Event()
    state = {"no_responders": False, "expect": wait_for}
    loop = asyncio.get_running_loop()
    start = loop.time()
    finisher = [loop.call_later(timeout, done.set)]

    async def on_msg(msg):
        if done.is_set():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            state["no_responders"] = True
            done.set()
            return
        _trace(trace, "<<< %s" % msg.data.decode(errors="replace"))
        try:
            resp = json.loads(msg.data)
        except ValueError:
            return
        rtt = loop.time() - start
        got.append((resp, rtt) if with_rtt else resp)
        if on_each is not None:
            on_each(resp, rtt)
        if expect_from_stats and not state["expect"] and isinstance(resp, dict):
            state["expect"] = int((resp.get("statsz") or {}).get("active_servers") or 0)
        if state["expect"]:
            if len(got) >= state["expect"]:
                done.set()
        else:
            # adaptive: stop 300 ms after the last answer (jsm.go serverdata)
            finisher[0].cancel()
            finisher[0] = loop.call_later(0.3, done.set)

    sub = await nc.subscribe(inbox, cb=on_msg)
    try:
        _trace(trace, ">>> %s\n%s" % (subject, data.decode()))
        await nc.publish(subject, data, reply=inbox)
        await nc.flush(timeout=timeout)
        await done.wait()
    finally:
        finisher[0].cancel()
        await sub.unsubscribe()
    if state["no_responders"] and not got:
        raise CLIError(SYS_NO_RESPONDERS)
    if not got:
        raise CLIError("no results received, ensure the account used has system privileges "
                       "and appropriate permissions")
    return got


async def active_servers(nc, timeout: float, trace: bool = False) -> int:
    """How many servers the cluster has, from one server's STATSZ (``active_servers``);
    0 when the server does not say, so callers fall back to the adaptive wait."""
    try:
        first = await server_requests(nc, "$SYS.REQ.SERVER.PING", None, 1, timeout, trace)
    except CLIError:
        raise
    stats = first[0].get("statsz") or {}
    return int(stats.get("active_servers") or 0)
