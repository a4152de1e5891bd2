"""A differential harness for the JetStream API: the same steps against natsjs and nats-server.

A scenario is an ``async def scenario(s: Session)`` that talks to one fresh server
(started with ``-js -sd <tmp>``) through nats-py: API requests with JSON or raw bodies,
publishes with headers, pull requests, acks, and subscriptions whose messages it
collects (advisories, push deliveries). Every step is recorded as it happened on the
wire: subjects, reply subjects, the status line and headers of each message, and its
payload (parsed when it is JSON). ``run_scenario`` then normalizes the transcript, so
two runs, against the same server or against the two servers, compare equal exactly
when the servers behaved the same.

Normalizing is deliberately short (``Normalizer``); everything not listed there is
compared as it is, and *missing*, ``null``, ``0`` and ``""`` are all different:

- RFC 3339 timestamps become ``"<time>"``, except Go's zero time
  (``0001-01-01T00:00:00Z``), which means "never" and is compared;
- the server's id and name become ``"<server>"``;
- ``_nats.ver`` (the server's release, in stream and consumer metadata) becomes
  ``"<version>"``; ``_nats.level`` (the API level) is compared;
- durations counted from now (``pause_remaining``) become ``"<duration>"``;
- random tokens in subjects and strings: NUIDs (inboxes, nats-py request tokens,
  advisory ids, object store chunk ids) become ``<nuid:N>``, ephemeral consumer names
  (learned from consumer info replies) ``<ephemeral:N>``, numbered by first appearance so
  that "the same inbox again" is still checked; a list holding an ephemeral name is sorted
  (the server orders listings by name, and made-up names fall anywhere);
- in ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` the
  ``<ts>`` token, and the random last token of ``$JS.FC.<stream>.<consumer>.<rand>``;
- in client info blocks of advisories, the fields that describe this connection and this
  machine (``CLIENT_VOLATILE``).

How a message is written down (not normalizing, just a format): headers as a sorted
list of ``[name, value]`` (their order on the wire is not compared; the status line is,
exactly), payloads as JSON when they parse, else text, else hex, and above ``LARGE``
bytes as size and digest.

Transcripts are JSON: ``{"scenario", "about", "steps": [...]}``. A step recorded with
``"unchecked": true`` is for reading only (``checked`` leaves it out of comparisons).
``compare`` lists the differences path by path
(``steps[3].reply.json.config.max_age: 0 != missing``).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field

import nats.aio.client

WAIT = 5.0                  # how long a reply that should come may take
SCENARIO_TIMEOUT = 90.0     # a whole scenario, servers excluded
CAPTURE_ENV = "JSDIFF_CAPTURE"

SORT_MARK = "_sort"


# -- the client ----------------------------------------------------------------------------

class RawHeaders(dict):
    """nats-py's parsed headers plus the header block as it came off the wire."""

    raw: bytes = b""


class Client(nats.aio.client.Client):
    """nats-py, keeping each message's raw header block so status lines are exact."""

    async def _process_headers(self, headers):
        parsed = await super()._process_headers(headers)
        if not headers:
            return parsed
        out = RawHeaders(parsed or {})
        out.raw = bytes(headers)
        return out


def split_header_block(raw: bytes) -> tuple[str | None, list[list[str]]]:
    """(status line or None when it is a bare ``NATS/1.0``, [[name, value], ...])."""
    lines = raw.decode("utf-8", "replace").split("\r\n")
    first, rest = lines[0], lines[1:]
    status = first if first.strip() != "NATS/1.0" else None
    pairs = []
    for line in rest:
        if not line:
            continue
        name, _, value = line.partition(":")
        pairs.append([name, value.strip()])
    return status, pairs


@dataclass
class Reply:
    """One message a scenario received, for its own logic (the record is kept apart)."""

    subject: str
    reply: str
    data: bytes
    status_line: str | None
    headers: list[list[str]]

    @property
    def status(self) -> int | None:
        if not self.status_line:
            return None
        parts = self.status_line.split()
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    @property
    def json(self):
        try:
            return json.loads(self.data)
        except ValueError:
            return None

    def record(self) -> dict:
        rec: dict = {"subject": self.subject}
        if self.reply:
            rec["reply"] = self.reply
        if self.status_line is not None:
            rec["status"] = self.status_line
        if self.headers:
            rec["headers"] = sorted(self.headers)
        rec.update(payload_record(self.data))
        return rec


def reply_of(msg) -> Reply:
    raw = getattr(msg.headers, "raw", b"") if msg.headers is not None else b""
    status, pairs = split_header_block(raw) if raw else (None, [])
    return Reply(msg.subject, msg.reply or "", bytes(msg.data), status, pairs)


LARGE = 4096     # payloads above this are recorded by size and digest


def payload_record(data: bytes) -> dict:
    """A payload as a transcript shows it: JSON when it parses, else text, else hex;
    a large one by its size and SHA-256 (enough to tell it apart, short to read)."""
    if not data:
        return {}
    if len(data) > LARGE:
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()[:16]}
    try:
        return {"json": json.loads(data)}
    except ValueError:
        pass
    try:
        return {"data": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": data.hex()}


def encode_body(body) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body, separators=(",", ":")).encode()


def body_record(body) -> dict:
    if body is None or body == b"":
        return {}
    if isinstance(body, (dict, list)):
        return {"body": body}
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    return {"body_raw": body}


class Watch:
    """Messages on a subscription, collected by the scenario when it expects them."""

    def __init__(self, sub, subject: str):
        self.sub = sub
        self.subject = subject

    async def take(self, count: int, timeout: float = WAIT, *, stop_on_status=False) -> list[Reply]:
        """Up to ``count`` messages (fewer if they do not come within ``timeout``).

        With ``stop_on_status``, a status message other than a 100 (heartbeats and flow
        control) ends the collection: it is how a pull request says it is over.
        """
        out: list[Reply] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(out) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                msg = await self.sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            r = reply_of(msg)
            out.append(r)
            if stop_on_status and r.status not in (None, 100):
                break
        return out

    def queued(self) -> list[Reply]:
        """Messages that already arrived and nobody took: extras a step did not expect."""
        out = []
        q = self.sub._pending_queue
        while not q.empty():
            out.append(reply_of(q.get_nowait()))
            q.task_done()
        return out


# -- a scenario's view of one server ------------------------------------------------------

class Session:
    """What a scenario calls; each call appends one step to the transcript."""

    def __init__(self, server, nc: Client):
        self.server = server
        self.nc = nc
        self.steps: list[dict] = []
        self._extra: list = []

    async def connect(self, cls=Client, **kw) -> nats.aio.client.Client:
        """Another connection to the same server (closed when the scenario ends)."""
        nc = cls()
        kw.setdefault("allow_reconnect", False)
        await nc.connect(self.server.url, **kw)
        self._extra.append(nc)
        return nc

    async def subscribe(self, subject: str, nc=None) -> Watch:
        nc = nc or self.nc
        sub = await nc.subscribe(subject)
        await nc.flush()
        return Watch(sub, subject)

    async def request(self, subject: str, body=None, *, headers=None, timeout: float = WAIT,
                      note: str | None = None) -> Reply | None:
        """One request, one reply (``None`` when none came: recorded as ``"reply": null``)."""
        replies = await self._exchange(subject, body, headers, 1, timeout, False, note,
                                       single=True)
        return replies[0] if replies else None

    async def requests(self, subject: str, body=None, *, count: int, headers=None,
                       timeout: float = WAIT, stop_on_status: bool = True,
                       note: str | None = None) -> list[Reply]:
        """One request, up to ``count`` replies (pull requests, batched direct gets)."""
        return await self._exchange(subject, body, headers, count, timeout, stop_on_status,
                                    note, single=False)

    async def poll(self, subject: str, body=None, *, until, timeout: float = WAIT,
                   note: str | None = None) -> Reply | None:
        """Repeat a request until ``until(reply)`` holds; only the last one is recorded.

        For states the server reaches on its own clock (a message's TTL running out):
        the number of tries depends on timing, the state it ends in does not.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            inbox, replies, extra = await self._roundtrip(subject, body, None, 1, WAIT, False)
            if (replies and until(replies[0])) or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)       # a polling interval, not a synchronisation
        self._record_exchange(subject, body, None, note, inbox, replies, extra, True)
        return replies[0] if replies else None

    async def _roundtrip(self, subject, body, headers, count, timeout, stop_on_status):
        inbox = self.nc.new_inbox()
        watch = await self.subscribe(inbox)
        await self.nc.publish(subject, encode_body(body), reply=inbox, headers=headers)
        replies = await watch.take(count, timeout, stop_on_status=stop_on_status)
        await self.nc.flush()
        extra = watch.queued()
        await watch.sub.unsubscribe()
        return inbox, replies, extra

    async def _exchange(self, subject, body, headers, count, timeout, stop_on_status, note,
                        single):
        inbox, replies, extra = await self._roundtrip(subject, body, headers, count, timeout,
                                                      stop_on_status)
        self._record_exchange(subject, body, headers, note, inbox, replies, extra, single)
        return replies

    def _record_exchange(self, subject, body, headers, note, inbox, replies, extra, single):
        step = self._step("request", subject, body, headers, note)
        step["inbox"] = inbox
        if single:
            step["reply"] = replies[0].record() if replies else None
        else:
            step["replies"] = [r.record() for r in replies]
        if extra:
            step["unexpected"] = [r.record() for r in extra]
        self.steps.append(step)

    async def publish(self, subject: str, data=b"", *, headers=None, reply: str = "",
                      note: str | None = None) -> None:
        """A publish nobody answers (or whose answer a Watch collects)."""
        await self.nc.publish(subject, encode_body(data), reply=reply, headers=headers)
        step = self._step("publish", subject, data, headers, note)
        if reply:
            step["reply_to"] = reply
        self.steps.append(step)

    async def collect(self, watch: Watch, count: int, *, timeout: float = WAIT,
                      stop_on_status: bool = False, sort: bool = False, more: bool = False,
                      note: str | None = None) -> list[Reply]:
        """Record the next ``count`` messages of a subscription.

        ``sort`` orders them by subject and payload, for messages the server sends from
        independent places (advisories of different objects) whose order is not defined.
        Messages beyond ``count`` that already arrived are recorded as ``unexpected``,
        unless ``more`` says the scenario collects them in a later step.
        """
        got = await watch.take(count, timeout, stop_on_status=stop_on_status)
        extra = []
        if not more:
            await self.nc.flush()
            extra = watch.queued()
        step: dict = {"op": "collect", "subject": watch.subject,
                      "messages": [r.record() for r in got]}
        if sort:
            step[SORT_MARK] = True      # sorted once normalized (see sort_marked)
        if note:
            step["note"] = note
        if extra:
            step["unexpected"] = [r.record() for r in extra]
        self.steps.append(step)
        return got

    def record(self, op: str, **fields) -> None:
        """A step the scenario observed by other means (a client library call)."""
        self.steps.append({"op": op, **fields})

    @staticmethod
    def _step(op, subject, body, headers, note) -> dict:
        step: dict = {"op": op, "subject": subject}
        if note:
            step["note"] = note
        step.update(body_record(body))
        if headers:
            step["headers"] = dict(headers)
        return step

    async def close(self) -> None:
        for nc in [*self._extra, self.nc]:
            if not nc.is_closed:
                await nc.close()


# -- normalizing --------------------------------------------------------------------------

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
NUID = re.compile(r"^[0-9A-Za-z]{22}([0-9a-f]{4})?$")
GENERATED_NAME = re.compile(r"^[0-9A-Za-z_-]{8}$")     # scenarios never pick 8 characters
# Durations measured from now.
DURATIONS_FROM_NOW = {"pause_remaining"}
# Client info (advisories' "client" object, server/events.go ClientInfo) that describes
# this connection on this machine rather than the server's behaviour.
CLIENT_VOLATILE = {"start", "host", "id", "rtt", "port", "lang", "ver", "cid"}


def _ephemeral(v) -> bool:
    return isinstance(v, str) and v.startswith("<ephemeral:")


class Normalizer:
    """Replaces what legitimately differs between runs; see the module docstring."""

    def __init__(self, server_info: dict):
        self.aliases: dict[str, str] = {}
        for key in ("server_id", "server_name"):
            if server_info.get(key):
                self.aliases[server_info[key]] = "<server>"
        self.counts: dict[str, int] = {}

    def alias(self, value: str, kind: str) -> str:
        if value not in self.aliases:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.aliases[value] = "<%s:%d>" % (kind, self.counts[kind])
        return self.aliases[value]

    def learn(self, obj) -> None:
        """Find the made-up names in a whole transcript before replacing anything, so a
        name is replaced even where it shows up before the reply that introduces it (an
        advisory can overtake the API response)."""
        if isinstance(obj, dict):
            self._learn(obj)
            for v in obj.values():
                self.learn(v)
        elif isinstance(obj, list):
            for v in obj:
                self.learn(v)

    def __call__(self, obj, key: str | None = None):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if key == "client" and k in CLIENT_VOLATILE:
                    out[k] = "<%s>" % k
                elif k == "_nats.ver":
                    out[k] = "<version>"
                elif k in DURATIONS_FROM_NOW and isinstance(v, int):
                    out[k] = "<duration>"
                else:
                    out[k] = self(v, k)
            return out
        if isinstance(obj, list):
            out = [self(v, key) for v in obj]
            # The server sorts name lists and listings by name; made-up names sort at
            # random, so such a list is compared in an order of its own.
            if any(_ephemeral(v) or (isinstance(v, dict) and _ephemeral(v.get("name")))
                   for v in out):
                out.sort(key=lambda v: json.dumps(v, sort_keys=True))
            return out
        if isinstance(obj, str):
            return self.text(obj)
        return obj

    def _learn(self, d: dict) -> None:
        # A consumer info (or create reply) with no durable name and a name of the form
        # the server makes up (8 characters of a hash, server/consumer.go
        # createConsumerName) is an ephemeral consumer with a generated name.
        cfg = d.get("config")
        name = d.get("name")
        if (isinstance(cfg, dict) and "stream_name" in d and isinstance(name, str)
                and not cfg.get("durable_name") and GENERATED_NAME.match(name)):
            self.alias(name, "ephemeral")

    def text(self, s: str) -> str:
        if s in self.aliases:
            return self.aliases[s]
        if RFC3339.match(s):
            return s if s == GO_ZERO_TIME else "<time>"
        if NUID.match(s):
            return self.alias(s, "nuid")
        if "." not in s or " " in s:
            return s
        tokens = s.split(".")
        if s.startswith("$JS.ACK.") and len(tokens) == 9:
            tokens[7] = "<ts>"
        elif s.startswith("$JS.FC.") and len(tokens) == 5:
            tokens[4] = "<rand>"
        out = []
        for t in tokens:
            if t in self.aliases:
                out.append(self.aliases[t])
            elif NUID.match(t):
                out.append(self.alias(t, "nuid"))
            else:
                out.append(t)
        return ".".join(out)


# -- running ------------------------------------------------------------------------------

@dataclass
class Scenario:
    name: str
    fn: object
    about: str = ""
    args: tuple = field(default_factory=tuple)      # extra server arguments
    # Notes of ``collect`` steps whose message nats-server itself loses now and then (a
    # race of its own): its run is repeated, up to REFERENCE_RUNS in all, until none is.
    reference_loses: tuple = field(default_factory=tuple)


REFERENCE_RUNS = 4

API = "$JS.API."


def registry(scenarios: dict):
    """A decorator that records a scenario function in ``scenarios`` under its name,
    with its docstring as what it is about: ``@scenario``, or ``@scenario(*args)`` for
    a scenario whose servers start with extra arguments."""
    def record(fn, args=()):
        scenarios[fn.__name__] = Scenario(fn.__name__, fn, (fn.__doc__ or "").strip(),
                                          args=tuple(args))
        return fn

    def scenario(*args):
        if len(args) == 1 and callable(args[0]):
            return record(args[0])
        return lambda fn: record(fn, args)
    return scenario


def api(s, what: str, body=None, **kw):
    """A JetStream API request: ``what`` follows ``$JS.API.``."""
    return s.request(API + what, body, **kw)


async def add_stream(s, name: str, note: str | None = None, **cfg):
    return await api(s, "STREAM.CREATE." + name, {"name": name, **cfg}, note=note)


def start_server(kind: str, store_dir: str, *args: str):
    import conftest
    start = conftest.start_reference if kind == "reference" else conftest.start_natsjs
    return start("-js", "-sd", store_dir, *args)


async def _drive(scenario: Scenario, server) -> list[dict]:
    nc = Client()
    await nc.connect(server.url, allow_reconnect=False)
    s = Session(server, nc)
    try:
        await scenario.fn(s)
    finally:
        await s.close()
    norm = Normalizer(nc._server_info)
    norm.learn(s.steps)
    return sort_marked(norm(s.steps))


def sort_marked(steps: list[dict]) -> list[dict]:
    """Order the messages of steps marked for it, by their normalized form."""
    for step in steps:
        if step.pop(SORT_MARK, False):
            step["messages"].sort(key=lambda r: json.dumps(r, sort_keys=True))
    return steps


def run_scenario(scenario: Scenario, kind: str = "reference") -> dict:
    """Run ``scenario`` against a fresh server of ``kind``; the normalized transcript."""
    runs = REFERENCE_RUNS if kind == "reference" and scenario.reference_loses else 1
    for _ in range(runs):
        transcript = _run_once(scenario, kind)
        if not any(step.get("note") in scenario.reference_loses and not step["messages"]
                   for step in transcript["steps"]):
            break
    return transcript


def _run_once(scenario: Scenario, kind: str) -> dict:
    store = tempfile.mkdtemp(prefix="jsdiff-")
    server = start_server(kind, store, *scenario.args)
    try:
        steps = asyncio.run(asyncio.wait_for(_drive(scenario, server), SCENARIO_TIMEOUT))
    finally:
        server.stop()
        shutil.rmtree(store, ignore_errors=True)
    return {"scenario": scenario.name, "about": scenario.about, "steps": steps}


def server_has_jetstream(kind: str) -> bool:
    """Whether a server of ``kind`` started with ``-js`` says so in its INFO."""
    async def ask(server):
        nc = Client()
        await nc.connect(server.url, allow_reconnect=False)
        try:
            return bool(nc._server_info.get("jetstream"))
        finally:
            await nc.close()

    store = tempfile.mkdtemp(prefix="jsdiff-")
    server = start_server(kind, store)
    try:
        return asyncio.run(asyncio.wait_for(ask(server), 30))
    finally:
        server.stop()
        shutil.rmtree(store, ignore_errors=True)


def write_transcript(folder: str, transcript: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, transcript["scenario"] + ".json")
    with open(path, "w") as f:
        json.dump(transcript, f, indent=2, sort_keys=False)
        f.write("\n")
    return path


def checked(transcript: dict) -> dict:
    """The part of a transcript that comparisons look at: steps recorded with
    ``unchecked=True`` (kept for reading, their order varies) are left out."""
    return {**transcript, "steps": [st for st in transcript["steps"] if not st.get("unchecked")]}


_MISSING = object()


def compare(expected, actual, path: str = "") -> list[str]:
    """Differences between two normalized transcripts, one line each (empty: equal)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in list(expected) + [k for k in actual if k not in expected]:
            out += compare(expected.get(k, _MISSING), actual.get(k, _MISSING),
                           "%s.%s" % (path, k) if path else k)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        out = []
        for i in range(max(len(expected), len(actual))):
            out += compare(expected[i] if i < len(expected) else _MISSING,
                           actual[i] if i < len(actual) else _MISSING, "%s[%d]" % (path, i))
        return out
    if expected is _MISSING or actual is _MISSING or expected != actual \
            or type(expected) is not type(actual):
        show = lambda v: "missing" if v is _MISSING else json.dumps(v)   # noqa: E731
        return ["%s: %s != %s" % (path, show(expected), show(actual))]
    return []
