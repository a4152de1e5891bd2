"""``natsjs pub|sub|request|reply``: core NATS messaging as natscli does it.

Bodies and subjects take natscli's templates (``{{Count}}``, ``{{ID}}``, ``{{Time}}``,
``{{TimeStamp}}``, ``{{Unix}}``, ``{{UnixNano}}``, ``{{Random 10 100}}``); ``pub
--jetstream`` waits for each PubAck.  ``sub`` and ``reply`` log their 'Subscribing on'
/ 'Listening on' line only once the server has the subscription, so a script that
waits for that line can publish right away.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import re
import shlex
import subprocess
import sys
import time

from natsjs.admin.args import pairs_arg
from natsjs.admin.errors import CLIError, q
from natsjs.admin.jsapi import ordered_read
from natsjs.admin.render import comma, go_duration, log, parse_duration, NS


def register(top) -> None:
    p = top.command("pub", "Generic data publish utility", pub, aliases=["publish"])
    p.add_argument("subject", help="Subject to publish to")
    p.add_argument("body", nargs="?", default=None, help="Message body")
    p.add_argument("--reply", default="", help="Sets a custom reply to subject")
    p.add_argument("-H", "--header", action="append", help="Adds headers using K:V format")
    p.add_argument("--count", type=int, default=1, help="Publish multiple messages")
    p.add_argument("--sleep", default="", help="Sleep between publishes")
    p.add_argument("-J", "--jetstream", action="store_true", help="Publish messages to JetStream")
    p.add_argument("-q", "--quiet", action="store_true", help="Show just the output received")
    p.add_argument("--force-stdin", action="store_true", help="Force reading from stdin")
    p.add_argument("--no-templates", dest="templates", action="store_false",
                   help="Disable template functions in the body and subject")

    p = top.command("sub", "Generic subscription client", sub, aliases=["subscribe"])
    p.add_argument("subjects", nargs="*", help="Subjects to subscribe to")
    p.add_argument("--queue", default="", help="Subscribe to a named queue group")
    p.add_argument("-r", "--raw", action="store_true", help="Show the raw data received")
    p.add_argument("-i", "--inbox", action="store_true", help="Subscribes to a generated inbox")
    p.add_argument("--count", type=int, default=0, help="Quit after receiving this many messages")
    p.add_argument("--headers-only", action="store_true", help="Shows only headers")
    p.add_argument("--subjects-only", action="store_true", help="Prints only the subjects")
    p.add_argument("-t", "--timestamp", action="store_true", help="Show timestamps in output")
    p.add_argument("--wait", default="", help="Unsubscribe after this long without traffic")
    p.add_argument("--ack", action="store_true", help="Acknowledge JetStream messages")
    p.add_argument("--stream", default="", help="Subscribe to a specific stream (JetStream)")
    p.add_argument("--all", action="store_true", help="Deliver all messages of the stream")
    p.add_argument("--new", action="store_true", help="Deliver only future messages")
    p.add_argument("--last", action="store_true", help="Deliver the most recent message on")
    p.add_argument("--start-sequence", type=int, default=0, help="Start at a stream sequence")

    p = top.command("request", "Generic request-reply request utility", request,
                    aliases=["req"])
    p.add_argument("subject", help="Subject to send the request to")
    p.add_argument("body", nargs="?", default=None, help="Message body")
    p.add_argument("-r", "--raw", action="store_true", help="Show just the output received")
    p.add_argument("-H", "--header", action="append", help="Adds headers using K:V format")
    p.add_argument("--count", type=int, default=1, help="Send multiple requests")
    p.add_argument("--replies", type=int, default=1,
                   help="Wait for multiple replies, 0 waits until timeout")
    p.add_argument("--reply-timeout", default="300ms",
                   help="Maximum time between replies when waiting for more than one")
    p.add_argument("--force-stdin", action="store_true", help="Force reading from stdin")
    p.add_argument("--no-templates", dest="templates", action="store_false",
                   help="Disable template functions in the body and subject")

    p = top.command("reply", "Generic service reply utility", reply)
    p.add_argument("subject", help="Subject to subscribe to")
    p.add_argument("body", nargs="?", default=None, help="Reply body")
    p.add_argument("--echo", action="store_true", help="Echo back what is received")
    p.add_argument("--command", default="", help="Run a command and reply with its output")
    p.add_argument("-q", "--queue", default="NATS-RPLY-22", help="Queue group name")
    p.add_argument("-H", "--header", action="append", help="Adds headers using K:V format")
    p.add_argument("--count", type=int, default=0, help="Quit after this many requests")


# ---- templates and messages ---------------------------------------------------------------

_TEMPLATE_RE = re.compile(r"\{\{\s*(\w+)((?:\s+[^}\s]+)*)\s*\}\}")


def render_template(text: str, count: int) -> str:
    from nats.nuid import NUID

    def sub(m):
        fn, args = m.group(1), m.group(2).split()
        now = time.time()
        if fn == "Count":
            return str(count)
        if fn == "ID":
            return NUID().next().decode()
        if fn == "Time":
            return dt.datetime.now().strftime("%H:%M:%S")
        if fn == "TimeStamp":
            return dt.datetime.now(dt.timezone.utc).astimezone().isoformat()
        if fn == "Unix":
            return str(int(now))
        if fn == "UnixNano":
            return str(time.time_ns())
        if fn == "Random":
            lo, hi = (int(args[0]), int(args[1])) if len(args) == 2 else (0, 10)
            n = random.randint(min(lo, hi), max(lo, hi))
            return "".join(random.choice("abcdefghijklmnopqrstuvwxyz0123456789")
                           for _ in range(n))
        return m.group(0)

    return _TEMPLATE_RE.sub(sub, text)


def parse_headers(values) -> dict:
    """``--header K:V`` flags (repeated) as a map, trimmed."""
    return pairs_arg(values, ":", "header", "K:V", strip=True)


def _body(a) -> bytes:
    """The body argument, else stdin when it is not a terminal (natscli reads it then)."""
    if a.body is not None and not a.force_stdin:
        return a.body.encode()
    if a.force_stdin or (sys.stdin is not None and not sys.stdin.isatty()):
        log("Reading payload from STDIN")
        return sys.stdin.buffer.read()
    return b""


def messages(a):
    """(n, subject, body) for each of ``--count`` messages, templates applied."""
    body = _body(a)
    for i in range(1, max(1, a.count) + 1):
        if not a.templates:
            yield i, a.subject, body
            continue
        text = render_template(body.decode(errors="surrogateescape"), i)
        yield i, render_template(a.subject, i), text.encode(errors="surrogateescape")


def print_msg(msg, headers_only: bool = False) -> None:
    """natscli's prettyPrintMsg: headers, the data, a blank line."""
    if msg.headers:
        for k, v in msg.headers.items():
            print("%s: %s" % (k, v))
        print()
    if not headers_only:
        text = msg.data.decode(errors="replace")
        if not msg.data:
            print("nil body")
        else:
            print(text)
        print()


# ---- commands -----------------------------------------------------------------------------


async def pub(rt) -> None:
    import nats.errors

    a = rt.args
    nc = await rt.conn()
    hdrs = parse_headers(a.header)
    sleep = parse_duration(a.sleep) / NS if a.sleep else 0
    for _i, subj, data in messages(a):
        start = time.monotonic()
        if a.jetstream:
            if not a.quiet:
                log("Published %d bytes to %s" % (len(data), q(subj)))
            try:
                resp = await nc.request(subj, data, timeout=rt.timeout, headers=hdrs or None)
            except nats.errors.NoRespondersError:
                raise CLIError("no responders available for request: is a stream "
                               "listening on %s?" % subj) from None
            try:
                ack = json.loads(resp.data)
            except ValueError:
                raise CLIError("invalid PubAck: %r" % resp.data[:100]) from None
            if ack.get("error"):
                e = ack["error"]
                raise CLIError("%s (%d)" % (e.get("description"), e.get("err_code", 0)))
            if not a.quiet:
                line = "Stored in Stream: %s Sequence: %s" % (ack.get("stream"),
                                                              comma(ack.get("seq", 0)))
                if ack.get("domain"):
                    line += " Domain: %s" % q(ack["domain"])
                if ack.get("duplicate"):
                    line += " Duplicate: true"
                log(line)
        else:
            await nc.publish(subj, data, reply=a.reply, headers=hdrs or None)
            if not a.quiet:
                log("Published %d bytes to %s" % (len(data), q(subj)))
        if a.count > 1 and sleep:
            left = sleep - (time.monotonic() - start)
            if left > 0:
                await asyncio.sleep(left)
    await nc.flush(timeout=rt.timeout)


async def sub(rt) -> None:
    a = rt.args
    nc = await rt.conn()
    subjects = list(a.subjects)
    if a.inbox:
        subjects = [nc.new_inbox()]
    if a.stream:
        await _sub_stream(rt, nc, subjects)
        return
    if not subjects:
        raise CLIError("subject is required")
    done = asyncio.Event()
    counter = {"n": 0}
    last = {"t": time.monotonic()}

    async def on_msg(msg):
        if done.is_set():
            return
        counter["n"] += 1
        last["t"] = time.monotonic()
        _show(a, msg, counter["n"])
        if a.ack and msg.reply and msg.reply.startswith("$JS.ACK."):
            await nc.publish(msg.reply, b"+ACK")
        if a.count and counter["n"] >= a.count:
            done.set()

    for s in subjects:
        await nc.subscribe(s, queue=a.queue, cb=on_msg)
    await nc.flush(timeout=rt.timeout)
    log("Subscribing on %s" % ", ".join(subjects) + (" in group %s" % q(a.queue)
                                                     if a.queue else ""))
    await _wait(a, done, last)


async def _wait(a, done: asyncio.Event, last: dict) -> None:
    idle = parse_duration(a.wait) / NS if a.wait else 0
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), timeout=idle or 3600)
        except asyncio.TimeoutError:
            if idle and time.monotonic() - last["t"] >= idle:
                return
    sys.stdout.flush()


def _show(a, msg, n: int) -> None:
    if a.raw:
        print(msg.data.decode(errors="replace"))
        sys.stdout.flush()
        return
    ts = " @ %s" % dt.datetime.now().strftime("%b %d %H:%M:%S.%f") if a.timestamp else ""
    line = "[#%d]%s Received on %s" % (n, ts, q(msg.subject))
    if msg.reply:
        line += " with reply %s" % q(msg.reply)
    print(line)
    if not a.subjects_only:
        print_msg(msg, a.headers_only)
    sys.stdout.flush()


async def _sub_stream(rt, nc, subjects) -> None:
    """``sub --stream S``: the stream's messages in order, through an ephemeral consumer."""
    a = rt.args
    js = await rt.js()
    deliver = "new" if a.new else "last" if a.last else "all"
    counter = {"n": 0}
    log("Subscribing to JetStream Stream %s holding messages with subject %s"
        % (q(a.stream), ", ".join(subjects) or ">"))

    async def on_msg(m):
        counter["n"] += 1
        _show(a, _Msg(m.subject, m.data, m.headers), counter["n"])

    await ordered_read(js, a.stream, subjects, deliver, a.start_sequence, follow=True,
                       on_msg=on_msg, limit=a.count)


class _Msg:
    """What ``_show`` prints, for a message read from a stream."""

    def __init__(self, subject, data, headers):
        self.subject, self.data, self.headers, self.reply = subject, data, headers, ""


async def request(rt) -> None:
    import nats.errors

    a = rt.args
    nc = await rt.conn()
    hdrs = parse_headers(a.header)
    gap = parse_duration(a.reply_timeout) / NS if a.reply_timeout else 0.3
    for _i, subj, data in messages(a):
        if not a.raw:
            log("Sending request on %s" % q(subj))
        inbox = nc.new_inbox()
        sub_ = await nc.subscribe(inbox)
        await nc.publish(subj, data, reply=inbox, headers=hdrs or None)
        start = time.monotonic()
        got = 0
        timeout = rt.timeout
        while True:
            try:
                m = await sub_.next_msg(timeout=timeout)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                if got == 0:
                    await sub_.unsubscribe()
                    raise CLIError("nats: timeout") from None
                break
            if m.headers and m.headers.get("Status") == "503":
                log("No responders are available")
                await sub_.unsubscribe()
                return
            got += 1
            if a.raw:
                print(m.data.decode(errors="replace"))
            else:
                log("Received with rtt %s" % _rtt(time.monotonic() - start))
                if m.headers:
                    for k, v in m.headers.items():
                        log("%s: %s" % (k, v))
                    log("")
                print(m.data.decode(errors="replace") if m.data else "nil body")
                print()
            sys.stdout.flush()
            if a.replies and got >= a.replies:
                break
            timeout = gap
        await sub_.unsubscribe()


def _rtt(seconds: float) -> str:
    return go_duration(int(seconds * NS))


async def reply(rt) -> None:
    a = rt.args
    nc = await rt.conn()
    hdrs = parse_headers(a.header)
    echo = a.echo
    if a.body is None and not a.command and not echo:
        log("No body or command supplied, enabling echo mode")
        echo = True
    done = asyncio.Event()
    counter = {"n": 0}

    async def on_msg(msg):
        if done.is_set():
            return
        counter["n"] += 1
        n = counter["n"]
        log("[#%d] Received on subject %s:" % (n, q(msg.subject)))
        for k, v in (msg.headers or {}).items():
            log("%s: %s" % (k, v))
        print()
        print(msg.data.decode(errors="replace"))
        sys.stdout.flush()
        if echo:
            out, out_hdrs = msg.data, dict(msg.headers or {})
            out_hdrs.update(hdrs)
        elif a.command:
            cmd = render_template(a.command, n)
            try:
                res = subprocess.run(shlex.split(cmd), input=msg.data, capture_output=True,
                                     timeout=60)
                out = res.stdout if res.returncode == 0 else \
                    ("error: %s" % res.stderr.decode(errors="replace").strip()).encode()
            except (OSError, subprocess.TimeoutExpired) as e:
                log("Command %s failed to run: %s" % (q(cmd), e))
                out = ("error: %s" % e).encode()
            out_hdrs = hdrs
        else:
            out, out_hdrs = render_template(a.body, n).encode(), hdrs
        if msg.reply:
            await nc.publish(msg.reply, out, headers=out_hdrs or None)
            await nc.flush()
        if a.count and n >= a.count:
            done.set()

    await nc.subscribe(a.subject, queue=a.queue, cb=on_msg)
    await nc.flush(timeout=rt.timeout)
    log("Listening on %s in group %s" % (q(a.subject), q(a.queue)))
    await done.wait()
