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


class StoredMsg:
    """A message read from a stream by ``ordered_read``: its subject, body, headers
    and the delivery facts from its ack subject."""

    __slots__ = ("subject", "data", "headers", "seq", "pending", "time_ns")

    def __init__(self, subject, data, headers, seq, pending, time_ns):
        self.subject, self.data, self.headers = subject, data, headers or {}
        self.seq, self.pending, self.time_ns = seq, pending, time_ns


def ack_facts(reply: str) -> tuple[int, int, int] | None:
    """(stream sequence, pending, timestamp ns) from a JetStream ack subject
    ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>, or the
    longer form with domain and account hash)."""
    if not reply or not reply.startswith("$JS.ACK."):
        return None
    parts = reply.split(".")
    base = 2 if len(parts) == 9 else 4 if len(parts) >= 12 else None
    if base is None:
        return None
    try:
        return int(parts[base + 3]), int(parts[base + 6]), int(parts[base + 5])
    except (ValueError, IndexError):
        return None


async def ordered_read(js: JSApi, stream: str, subjects=None, deliver: str = "all",
                       start_seq: int = 0, headers_only: bool = False, follow: bool = False,
                       on_msg=None, limit: int = 0) -> list:
    """Read a stream through an ephemeral push consumer without acks, in order: every
    message on ``subjects`` (a list; all when empty) from ``deliver`` ("all", "new",
    "last", "last_per_subject" or a ``start_seq``).  Without ``follow`` it returns once
    the consumer has nothing pending; with it, it calls ``on_msg`` until cancelled (or
    ``limit`` messages)."""
    nc = js.nc
    inbox = nc.new_inbox()
    out: list = []
    seen = [0]
    done = asyncio.Event()
    cfg = {"deliver_subject": inbox, "ack_policy": "none", "max_deliver": 1,
           "flow_control": True, "idle_heartbeat": 5 * 10 ** 9, "mem_storage": True,
           "num_replicas": 1, "inactive_threshold": 5 * 10 ** 9, "replay_policy": "instant",
           "headers_only": headers_only}
    if start_seq:
        cfg.update(deliver_policy="by_start_sequence", opt_start_seq=start_seq)
    else:
        cfg["deliver_policy"] = deliver
    subjects = [s for s in (subjects or []) if s]
    if len(subjects) == 1:
        cfg["filter_subject"] = subjects[0]
    elif subjects:
        cfg["filter_subjects"] = subjects

    async def on_delivery(msg):
        hdrs = msg.headers or {}
        if not msg.reply or not msg.reply.startswith("$JS.ACK."):
            if hdrs.get("Status") == "100" and msg.reply:   # flow control
                await nc.publish(msg.reply, b"")
            return
        facts = ack_facts(msg.reply) or (0, 0, 0)
        m = StoredMsg(msg.subject, msg.data, dict(hdrs), facts[0], facts[1], facts[2])
        if on_msg is not None:
            await on_msg(m)
        else:
            out.append(m)
        seen[0] += 1
        if limit and seen[0] >= limit:
            done.set()
        if not follow and m.pending == 0:
            done.set()

    sub = await nc.subscribe(inbox, cb=on_delivery)
    try:
        await nc.flush()
        ci = await js.request("CONSUMER.CREATE." + stream,
                              {"stream_name": stream, "config": cfg},
                              doing="could not read stream %s" % stream)
        if not follow and not ci.get("num_pending"):
            return out
        await done.wait()
        return out
    finally:
        await sub.unsubscribe()


async def gather(rt, kind: str | None, body: dict | None = None, wait_for: int = 0,
                 filtered: bool = False, with_rtt: bool = False) -> list:
    """Every server's answer to a system request: ``wait_for`` of them, else as many as
    the cluster has (unless a filter makes that unknown; then 300 ms after the last)."""
    nc = await rt.conn()
    if not wait_for and not filtered:
        wait_for = await active_servers(nc, rt.timeout, rt.settings.trace)
    subject = "$SYS.REQ.SERVER.PING" + ("." + kind if kind else "")
    return await server_requests(nc, subject, body, wait_for, rt.timeout, rt.settings.trace,
                                 with_rtt=with_rtt)
