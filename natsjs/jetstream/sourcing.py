"""Mirrors and sources: a stream filled from other streams.

Where it sits in a message's path: a message is stored in an origin stream and a
consumer of that stream delivers it (natsjs/jetstream/consumer.py, step 4 again) --
to a deliver subject this module subscribes to for the mirror or source.  What
arrives is queued on this stream's inbox with a handler in place of a reply subject
(``Stream.enqueue``), so the stream's ingest task processes it in order with
everything else, in the same batch and fsync: the tracking and gap checks here, then
``Stream.process_sourced`` (the normal checks, dedup, limits).  After it: this
stream's own consumers see the message like any other.

Everything follows server/stream.go (setupMirrorConsumer, trySetupSourceConsumer,
processInboundMirrorMsg, processInboundSourceMsg): the consumer on the origin is asked
for through the JetStream API like a client would, so an origin in another account or
JetStream domain is reached through ``external.api`` and delivers to
``external.deliver``.  It is a direct push consumer (memory only, no limits, hidden
from listings) with ack none, flow control and 1 s heartbeats, starting after the last
sequence already taken.  A mirror keeps the origin's sequence numbers; a source adds
the ``Nats-Stream-Source`` header from which a restart finds where each source stopped.
Heartbeats that report a delivery we did not see, a gap in the delivery sequence, or
10 s of silence make the consumer be set up again, throttled to once per 2 s and
backing off 10 s more per failure up to 2 minutes.
"""
from __future__ import annotations

import hashlib
import json
import random

import trio

from natsjs.accounts import split_js_delivery
from natsjs.jetstream import headers as H
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import rfc3339_nano
from natsjs.subject_transform import TransformError, new_transform

NS = 1_000_000_000
HEALTH_HB_NS = 1 * NS              # sourceHealthHB: the origin consumer's heartbeat
HEALTH_CHECK = 10.0                # sourceHealthCheckInterval: silence that means stalled
RETRY_THRESHOLD = 2.0              # sourceConsumerRetryThreshold
RETRY_BACKOFF = 5.0                # retryBackOff (times 2 per failure)
RETRY_MAX = 120.0                  # retryMaximum
CONSUMER_WAIT = 30.0               # srcConsumerWaitTime: no answer to a create request
DGET_CAUGHT_UP = 10                # dgetCaughtUpThresh: mirror direct gets from here on
ACK_WAIT_NS = 22 * 3600 * NS       # what the reference asks for (ack none ignores it)
API_PREFIX = "$JS.API"
ERR_IDENTITY_MISMATCH = 10225      # JSConsumerStreamIdentityMismatchF

_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def get_hash(name: str, size: int = 8) -> str:
    """server/events.go getHash: SHA-256 bytes mapped onto 62 characters."""
    b = hashlib.sha256(name.encode()).digest()
    return "".join(_DIGITS[b[i] % 62] for i in range(size))


def rand_token(size: int = 8) -> str:
    return "".join(random.choice(_DIGITS) for _ in range(size))


def stream_identity(created_ns: int) -> str:
    """server/stream.go identity: a stream recreated under the same name differs."""
    return get_hash(rfc3339_nano(created_ns))


def index_name(src: dict) -> str:
    """server/stream.go composeIName: what tells two sources apart (and tags their
    messages): ``<name>[:<api hash>] <filter or >> <destination or >>``."""
    iname = src.get("name") or ""
    ext = src.get("external") or {}
    if ext:
        iname += ":" + get_hash(ext.get("api") or "")
    cons = src.get("consumer") or {}
    if cons:
        iname += ":C=" + get_hash(cons.get("name") or "")
    trs = src.get("subject_transforms") or []
    if not trs:
        source, dest = src.get("filter_subject") or ">", ">"
    else:
        source = "\f".join(t.get("src") or ">" for t in trs)
        dest = "\f".join(t.get("dest") or ">" for t in trs)
    return " ".join((iname, source, dest))


def parse_source_header(value: str):
    """server/stream.go streamAndSeq: (stream, index name, sequence, identity) of a
    ``Nats-Stream-Source`` value ``<stream> <seq> <filter> <dest> <subject>[ <ident>]``
    (the old form, an ack reply subject, gives no index name)."""
    if value.startswith("$JS.ACK."):
        info = ack_reply_info(value.encode())
        if info is None:
            return "", "", 0, ""
        return info[6], "", info[0], ""
    fields = value.split(" ")
    n = len(fields)
    if n != 2 and n <= 3:
        return "", "", 0, ""
    seq = int(fields[1]) if fields[1].isdigit() else 0
    if n >= 4:
        ident = fields[5] if n >= 6 else ""
        return fields[0], " ".join((fields[0], fields[2], fields[3])), seq, ident
    return fields[0], "", seq, ""


def ack_reply_info(reply: bytes | None):
    """(stream seq, delivery seq, delivery count, timestamp, pending, consumer, stream)
    from a consumer's ack reply subject, in either of nats-server's token layouts
    (server/consumer.go ackReplyInfo); None for anything else."""
    if not reply or not reply.startswith(b"$JS.ACK."):
        return None
    toks = reply.split(b".")
    n = len(toks)
    if n == 9:
        off = 2
    elif n >= 11:
        off = 4
    else:
        return None
    try:
        dc, sseq, dseq, ts, pending = (int(t) for t in toks[off + 2:off + 7])
    except ValueError:
        return None
    return (sseq, dseq, dc, ts, pending, toks[off + 1].decode("utf-8", "replace"),
            toks[off].decode("utf-8", "replace"))


def retry_backoff(fails: int) -> float:
    """server/stream.go calculateRetryBackoff."""
    return min(RETRY_BACKOFF * fails * 2, RETRY_MAX)


def _remove_prefixed(hdr: bytes | None, prefix: bytes) -> bytes | None:
    """A header block without the keys starting with ``prefix`` (None if empty)."""
    if not hdr or prefix not in hdr:
        return hdr
    lines = hdr.split(H.CRLF)
    kept = [ln for i, ln in enumerate(lines) if i == 0 or not ln.startswith(prefix)]
    out = H.CRLF.join(kept)
    return out if len(out) > len(H.HDR_LINE) + 2 else None


class SourceInfo:
    """One mirror or source: where it stands and its current consumer on the origin
    (server/stream.go sourceInfo)."""

    __slots__ = ("name", "iname", "cfg", "mirror", "cname", "ident", "sub", "sseq", "dseq",
                 "lag", "err", "fails", "last", "lreq", "sip", "rc", "sf", "sfs", "trs",
                 "ext", "due", "next_seq", "next_time", "gen", "req_sub", "req_deadline",
                 "resp", "taken")

    def __init__(self, src: dict, mirror: bool):
        self.name = src.get("name") or ""
        self.iname = index_name(src)
        self.cfg = src
        self.mirror = mirror
        self.cname = ""          # the origin consumer we take messages from
        self.ident = ""          # the origin stream's identity (a recreation changes it)
        self.sub = None          # subscription on the deliver subject
        self.sseq = 0            # last origin sequence taken
        self.dseq = 0            # last delivery sequence seen from the consumer
        self.lag = 0
        self.err = None          # the API error of the last failed setup (a dict)
        self.fails = 0
        self.last = 0.0          # trio time of the last message or heartbeat; 0: never
        self.lreq = 0.0          # trio time of the last setup request
        self.sip = False         # a setup request is waiting for its answer
        self.rc = False          # the origin was recreated: start over
        self.sf = src.get("filter_subject") or ""
        trs = src.get("subject_transforms") or []
        self.sfs = [t.get("src") or "" for t in trs]
        self.trs = []
        for t in trs:
            try:
                self.trs.append(new_transform(t.get("src") or "", t.get("dest") or ""))
            except TransformError:   # checked with the configuration; never here
                self.trs.append(None)
        self.ext = src.get("external") or None
        self.due = None          # trio time at which to set the consumer up
        self.next_seq = 0
        self.next_time = 0
        self.gen = 0             # bumped at every setup: older deliveries are ignored
        self.req_sub = None
        self.req_deadline = 0.0
        self.resp = None
        self.taken = False       # something arrived since the consumer was set up

    def transform(self, subject: bytes) -> bytes:
        if not self.trs:
            return subject
        s = subject.decode("utf-8", "replace")
        for tr in self.trs:
            if tr is None:
                continue
            try:
                return tr.match(s).encode()
            except TransformError:
                continue
        return subject

    def source_header(self, subject: bytes, sseq: int) -> bytes:
        """server/stream.go genSourceHeader."""
        parts = self.iname.split(" ")
        out = "%s %d %s %s %s" % (parts[0], sseq, parts[1], parts[2],
                                  subject.decode("utf-8", "replace"))
        if self.ident:
            out += " " + self.ident
        return out.encode()


class Inbound:
    """Stands in for the reply subject of a delivery queued on the stream's inbox; the
    ingest task calls it to process the delivery in order."""

    __slots__ = ("owner", "si", "gen", "reply")

    def __init__(self, owner, si: SourceInfo, gen: int, reply: bytes | None):
        self.owner = owner
        self.si = si
        self.gen = gen
        self.reply = reply

    def __call__(self, subject: bytes, hdr: bytes | None, msg: bytes) -> None:
        self.owner.inbound(self, subject, hdr, msg)


def for_stream(stream):
    """The mirror or sources of a stream that has any, else None."""
    cfg = stream.cfg
    if cfg["mirror"] is None and not cfg["sources"]:
        return None
    return Sourcing(stream)


def update_for_stream(stream, old_cfg: dict):
    """After a configuration update: what the stream's sourcing is now."""
    cur = stream.sourcing
    cfg = stream.cfg
    if cfg["mirror"] == old_cfg["mirror"] and cfg["sources"] == old_cfg["sources"]:
        return cur
    if cur is not None and cfg["mirror"] is None and cfg["sources"] and \
            old_cfg["mirror"] is None:
        cur.reconfigure()
        return cur
    if cur is not None:
        cur.stop()
    new = for_stream(stream)
    nursery = getattr(stream, "_nursery", None)
    if new is not None and nursery is not None:
        nursery.start_soon(new.run)
    return new


class Sourcing:
    """The mirror or the sources of one stream, and the task that keeps them going."""

    def __init__(self, stream):
        self.stream = stream
        self.js = stream.js
        self.server = stream.server
        self.account = stream.jsa.account
        self.log = stream.server.log
        self.closed = False
        self._wake = trio.lowlevel.ParkingLot()
        self._health_at = 0.0
        self._mdirect_subs: list = []
        cfg = stream.cfg
        self.mirror = SourceInfo(cfg["mirror"], True) if cfg["mirror"] is not None else None
        self.sources: dict[str, SourceInfo] = {}
        for src in cfg["sources"] or []:
            si = SourceInfo(src, False)
            self.sources[si.iname] = si

    # ---- lifecycle -----------------------------------------------------------------------

    def all(self) -> list[SourceInfo]:
        if self.mirror is not None:
            return [self.mirror]
        return list(self.sources.values())

    async def run(self) -> None:
        """Set the consumers up, then answer to replies, timeouts and stalls."""
        if self.closed:
            return
        self._health_at = trio.current_time() + HEALTH_CHECK
        if self.mirror is not None:
            self.schedule(self.mirror)
        else:
            self._starting_sequences(list(self.sources.values()))
            for si in self.sources.values():
                self.schedule(si, si.sseq + 1)
        while not self.closed:
            now = trio.current_time()
            nxt = self._tick(now)
            with trio.move_on_at(nxt):
                await self._wake.park()

    def stop(self) -> None:
        if self.closed:
            return
        self.closed = True
        for si in self.all():
            self._cancel(si)
            si.due = None
        self._unsubscribe_mirror_direct()
        self._wake.unpark_all()

    def delete_origin_durables(self) -> None:
        """The stream is being deleted: the durable consumers it has on interest or work
        queue origins would keep their messages forever, so ask the origins to delete
        them (server/stream.go tryDeleteSourcingConsumer; best effort, no answer
        awaited).  Direct consumers go away by themselves."""
        for si in self.all():
            stable = "JS_%s_%s" % ("MIRROR" if si.mirror else "SRC", self._consumer_hash(si))
            if si.cname != stable:
                continue
            subject = "%s.CONSUMER.DELETE.%s.%s" % (API_PREFIX, si.name, stable)
            ext = si.ext or {}
            if ext.get("api"):
                subject = subject.replace(API_PREFIX, ext["api"], 1).replace("..", ".")
            self.server.deliver(self.account, subject.encode(), None, b"")

    def reconfigure(self) -> None:
        """The sources changed: drop the ones gone, start the new ones where their
        messages in the stream end (server/stream.go update, setStartingSequenceForSources)."""
        want = {}
        for src in self.stream.cfg["sources"] or []:
            want[index_name(src)] = src
        for iname in [n for n in self.sources if n not in want]:
            self._cancel(self.sources.pop(iname))
        added = []
        for iname, src in want.items():
            if iname not in self.sources:
                si = SourceInfo(src, False)
                self.sources[iname] = si
                added.append(si)
            else:
                self.sources[iname].cfg = src
        if added:
            self._starting_sequences(added)
            for si in added:
                self.schedule(si, si.sseq + 1)

    def origin_created(self, name: str) -> None:
        """A stream of this account was created: a mirror or source waiting for it need
        not sit out its backoff, and one still attached to a consumer of an earlier
        stream of that name (deleted since) need not wait to notice the silence."""
        for si in self.all():
            if si.name == name and si.ext is None and not si.sip:
                si.fails = 0
                self.retry(si, si.sseq + 1)

    # ---- scheduling --------------------------------------------------------------------

    def schedule(self, si: SourceInfo, seq: int = 0, start_time: int = 0) -> None:
        """server/stream.go setupSourceConsumer / scheduleSetupMirrorConsumerRetry: at
        most one request per 2 s, plus the backoff for failures, plus jitter."""
        if self.closed or si.sip:
            return
        if si.due is not None and not si.mirror:
            return
        now = trio.current_time()
        delay = 0.0
        if si.lreq:
            since = now - si.lreq
            if since < RETRY_THRESHOLD:
                delay = RETRY_THRESHOLD - since
        if si.fails:
            delay += retry_backoff(si.fails)
        delay += 0.1 + random.random() * 0.1
        si.due = now + delay
        si.next_seq = seq
        si.next_time = start_time
        self._wake.unpark_all()

    def retry(self, si: SourceInfo, seq: int = 0) -> None:
        """Give up on the current consumer and ask for a new one."""
        self._cancel(si)
        si.due = None
        self.schedule(si, seq)

    def _tick(self, now: float) -> float:
        """Everything due by ``now``; the time of the next thing due."""
        nxt = self._health_at
        for si in self.all():
            if si.resp is not None:
                resp, si.resp = si.resp, None
                self._on_response(si, *resp)
            elif si.sip and now >= si.req_deadline:
                self._on_timeout(si)
            if si.due is not None and now >= si.due and not si.sip:
                si.due = None
                self._setup(si)
            if si.due is not None:
                nxt = min(nxt, si.due)
            if si.sip:
                nxt = min(nxt, si.req_deadline)
        if now >= self._health_at:
            self._health_at = now + HEALTH_CHECK
            nxt = min(nxt, self._health_at)
            for si in self.all():
                if si.sub is not None and not si.sip and now - si.last > HEALTH_CHECK:
                    self.log.debug("JetStream %s '%s > %s' from %r stalled, retrying",
                                   "mirror" if si.mirror else "source", self.account.name,
                                   self.stream.name, si.name)
                    self.retry(si, si.sseq + 1)
                    if si.due is not None:
                        nxt = min(nxt, si.due)
        return nxt

    # ---- asking the origin for a consumer ------------------------------------------------

    def _cancel(self, si: SourceInfo) -> None:
        """server/stream.go cancelSourceInfo: stop listening; the origin's consumer goes
        away by itself after its inactive threshold."""
        si.gen += 1
        if si.sub is not None:
            self.js.unsubscribe(self.account, si.sub)
            si.sub = None
        if si.req_sub is not None:
            self.js.unsubscribe(self.account, si.req_sub)
            si.req_sub = None
        si.sip = False
        si.resp = None
        si.cname = ""

    def _consumer_hash(self, si: SourceInfo) -> str:
        """server/consumer.go createStableConsumerHash / createSourcingConsumerHash."""
        base = "%s %s" % (self.stream.name, self.account.name)
        if self.js.domain:
            base += " " + self.js.domain
        h = get_hash(base)
        if si.mirror:
            return h
        if sum(1 for s in self.stream.cfg["sources"] or [] if s.get("name") == si.name) > 1:
            h = "%s %s" % (h, si.iname)
        return get_hash(h)

    def _request(self, si: SourceInfo) -> tuple[str, dict, bytes]:
        """The consumer create request for ``si``: (subject, body, headers)."""
        stream = self.stream
        store = stream.store
        ext = si.ext or {}
        kind = "M" if si.mirror else "S"
        if ext.get("deliver"):
            deliver = (ext["deliver"] + ".%s.%s" % (kind, rand_token())).replace("..", ".")
        else:
            deliver = "$JS.%s.%s" % (kind, rand_token())
        key = "mirror" if si.mirror else "src"
        md = {"_nats.%s.stream" % key: stream.name, "_nats.%s.acc" % key: self.account.name}
        if self.js.domain:
            md["_nats.%s.domain" % key] = self.js.domain
        cfg = {"name": "JS_%s_%s" % ("MIRROR" if si.mirror else "SRC", self._consumer_hash(si)),
               "deliver_subject": deliver, "deliver_policy": "all", "ack_policy": "none",
               "ack_wait": ACK_WAIT_NS, "max_deliver": 1, "idle_heartbeat": HEALTH_HB_NS,
               "flow_control": True, "direct": True, "sourcing": True,
               "inactive_threshold": int(HEALTH_CHECK * NS), "metadata": md}
        src = si.cfg
        if si.mirror:
            cfg["deliver_policy"] = "by_start_sequence"
            cfg["opt_start_seq"] = store.last_seq + 1
            if store.msgs == 0 and store.last_seq == 0:
                # Only a mirror that never had anything honours the start options.
                cfg["opt_start_seq"] = 0
                if src.get("opt_start_seq"):
                    cfg["opt_start_seq"] = src["opt_start_seq"]
                elif src.get("opt_start_time"):
                    cfg["opt_start_time"] = src["opt_start_time"]
                    cfg["deliver_policy"] = "by_start_time"
            if not cfg.get("opt_start_seq") and not cfg.get("opt_start_time"):
                cfg["deliver_policy"] = "all"
                cfg.pop("opt_start_seq", None)
        else:
            seq, start_time = si.next_seq, si.next_time
            if start_time and seq > 1:
                cfg["opt_start_time"] = rfc3339_nano(start_time)
                cfg["deliver_policy"] = "by_start_time"
            elif seq <= 1:
                st = store.state()
                if src.get("opt_start_seq"):
                    cfg["opt_start_seq"] = src["opt_start_seq"]
                    cfg["deliver_policy"] = "by_start_sequence"
                elif src.get("opt_start_time"):
                    cfg["opt_start_time"] = src["opt_start_time"]
                    if st["last_ts"] and self._before(src["opt_start_time"], st["last_ts"]):
                        cfg["opt_start_time"] = rfc3339_nano(st["last_ts"])
                    cfg["deliver_policy"] = "by_start_time"
                elif st["first_seq"] > 1 and st["last_ts"] and not si.rc:
                    # Everything we took was removed: go on from the time of the last.
                    cfg["opt_start_time"] = rfc3339_nano(st["last_ts"])
                    cfg["deliver_policy"] = "by_start_time"
            else:
                cfg["opt_start_seq"] = seq
                cfg["deliver_policy"] = "by_start_sequence"
        if si.sf:
            cfg["filter_subject"] = si.sf
        if si.sfs:
            if not si.sf and len(si.sfs) == 1:
                # A single filter goes in the subject of the extended create request.
                cfg["filter_subject"] = si.sfs[0]
            else:
                cfg["filter_subjects"] = si.sfs
        if cfg.get("filter_subject"):
            subject = "%s.CONSUMER.CREATE.%s.%s.%s" % (API_PREFIX, si.name, cfg["name"],
                                                       cfg["filter_subject"])
        else:
            subject = "%s.CONSUMER.CREATE.%s" % (API_PREFIX, si.name)
        if ext.get("api"):
            subject = subject.replace(API_PREFIX, ext["api"], 1).replace("..", ".")
        pairs = [(b"Nats-Required-Api-Level", b"4" if si.mirror else b"5")]
        if not si.mirror and si.ident:
            pairs.append((b"Nats-Stream-Identity", si.ident.encode()))
        return subject, {"stream_name": si.name, "config": cfg}, H.make(0, "", pairs)

    @staticmethod
    def _before(text: str, ts: int) -> bool:
        from natsjs.jetstream.jstime import parse_rfc3339
        try:
            return parse_rfc3339(text) < ts
        except ValueError:
            return False

    def _setup(self, si: SourceInfo) -> None:
        """Ask the origin for a consumer (server/stream.go setupMirrorConsumer,
        trySetupSourceConsumer).  Its deliver subject is listened to at once, so that
        nothing it sends before our answer arrives is lost."""
        if self.closed or self.stream.closed:
            return
        self._cancel(si)
        si.lreq = trio.current_time()
        if si.mirror:
            si.sseq = self.stream.store.last_seq
        subject, body, hdr = self._request(si)
        si.gen += 1
        gen = si.gen
        si.dseq = 0
        si.taken = False
        deliver = body["config"]["deliver_subject"].encode()
        si.sub = self.js.subscribe(self.account, deliver, self._on_delivery(si, gen))
        reply = ("$JSC.R." + rand_token()).encode()

        def on_response(sub, subj, rep, h, msg):
            if si.gen != gen:
                return
            h_bytes = msg[:h] if h and h > 0 else None
            data = msg[h:] if h and h > 0 else msg
            si.resp = (gen, data, h_bytes)
            self._wake.unpark_all()
        si.req_sub = self.js.subscribe(self.account, reply, on_response)
        si.sip = True
        si.err = None
        si.req_deadline = trio.current_time() + CONSUMER_WAIT
        payload = json.dumps(body, separators=(",", ":")).encode()
        self.server.deliver(self.account, subject.encode(), reply, hdr + payload, len(hdr))

    def _on_delivery(self, si: SourceInfo, gen: int):
        stream = self.stream

        def on_msg(sub, subject, reply, hdr, msg):
            if si.gen != gen:
                return
            # Routed by our deliver subject; the origin's subject rides in the reply.
            reply, shown = split_js_delivery(reply)
            if shown is not None:
                subject = shown
            if hdr is not None and hdr > 0:
                h, payload = msg[:hdr], msg[hdr:]
            else:
                h, payload = None, msg
            si.last = trio.current_time()
            stream.enqueue(subject, Inbound(self, si, gen, reply), h, payload)
        return on_msg

    def _on_timeout(self, si: SourceInfo) -> None:
        self.log.warn("JetStream %s consumer setup for '%s > %s' from %r timed out",
                      "mirror" if si.mirror else "source", self.account.name,
                      self.stream.name, si.name)
        si.fails += 1
        self.retry(si, si.next_seq)

    def _on_response(self, si: SourceInfo, gen: int, data: bytes, hdr: bytes | None) -> None:
        if gen != si.gen:
            return
        if si.req_sub is not None:
            self.js.unsubscribe(self.account, si.req_sub)
            si.req_sub = None
        si.sip = False
        try:
            resp = json.loads(data)
            if not isinstance(resp, dict):
                raise ValueError("not an object")
        except ValueError:
            self.log.warn("JetStream bad %s consumer create response: %r",
                          "mirror" if si.mirror else "source", data[:256])
            si.err = ApiError.of("JSInvalidJSONErr").to_dict()
            si.fails += 1
            self.retry(si, si.next_seq)
            return
        err = resp.get("error")
        info = None if err else resp
        if err is None and (not isinstance(info.get("config"), dict) or not info.get("name")):
            err = ApiError.of("JSSourceConsumerSetupFailedErrF" if not si.mirror else
                              "JSMirrorConsumerSetupFailedErrF",
                              err="invalid consumer create response").to_dict()
        if err is not None:
            if not si.mirror and err.get("err_code") == ERR_IDENTITY_MISMATCH:
                # The origin was deleted and created again: start over from its start.
                si.sseq = si.dseq = 0
                si.ident, si.rc = "", True
                self.retry(si, 0)
                return
            if si.mirror:
                self.log.warn("JetStream error response for create mirror consumer: %s (%d)",
                              err.get("description"), err.get("err_code", 0))
            else:
                self.log.warn("JetStream error response for stream %s create source "
                              "consumer %s: %s (%d)", self.stream.name, si.name,
                              err.get("description"), err.get("err_code", 0))
            si.err = err
            si.fails += 1
            self.retry(si, si.next_seq)
            return
        si.err = None
        si.fails = 0
        delivered = (info.get("delivered") or {}).get("stream_seq", 0)
        if si.mirror:
            self._mirror_started(si, delivered)
        else:
            ident = H.get(hdr, b"Nats-Stream-Identity") if hdr else None
            ident = ident.decode("utf-8", "replace") if ident else ""
            if si.rc or (ident and si.ident and ident != si.ident):
                self.log.warn("JetStream source stream %r for stream '%s > %s' was recreated, "
                              "resetting source state", si.name, self.account.name,
                              self.stream.name)
                si.sseq = 0
            si.ident, si.rc = ident, False
            if si.sseq < delivered and not si.taken:
                si.sseq = delivered
        if not si.cname:
            si.cname = info["name"]
        si.last = trio.current_time()

    def _mirror_started(self, si: SourceInfo, delivered: int) -> None:
        """The mirror consumer exists: if it starts past our end (a high first sequence
        at the origin), an empty mirror starts there too (server/stream.go)."""
        stream = self.stream
        store = stream.store
        if not si.taken and store.last_seq < delivered and store.msgs == 0:
            store.compact(delivered + 1)
            stream.lseq = delivered
            stream.synced_seq = max(stream.synced_seq, delivered)
        if not si.taken:
            si.sseq = max(delivered, store.last_seq)

    # ---- what the origin delivers (called by the stream's ingest task) -------------------

    def inbound(self, ib: Inbound, subject: bytes, hdr: bytes | None, msg: bytes) -> None:
        si = ib.si
        if ib.gen != si.gen or self.closed:
            return
        if not msg and hdr and hdr.startswith(b"NATS/1.0 100 "):
            self._control(si, ib.reply, hdr)
            return
        info = ack_reply_info(ib.reply)
        if info is None:
            return
        sseq, dseq, dc, ts, pending, cname, _ = info
        if si.cname and cname != si.cname:
            return
        if dc > 1:
            return
        track = self._track_mirror if si.mirror else self._track_source
        old = (si.sseq, si.dseq, si.lag)
        verdict = track(si, sseq, dseq, cname)
        if verdict is not True:
            return
        si.taken = True
        si.lag = pending - 1 if pending else 0
        if si.mirror and self.stream.cfg["mirror_direct"] and not self._mdirect_subs and \
                pending < DGET_CAUGHT_UP:
            self._subscribe_mirror_direct()
        if si.mirror:
            hdr = _remove_prefixed(_remove_prefixed(hdr, b"Nats-Expected-"), b"Nats-Batch-")
            out = self.stream.write_sourced(si.transform(subject), hdr, msg, ts, sseq)
        else:
            if hdr:
                hdr = H.remove(hdr, H.STREAM_SOURCE)
                hdr = _remove_prefixed(_remove_prefixed(hdr, b"Nats-Expected-"),
                                       b"Nats-Batch-")
            hdr = H.add(hdr, H.STREAM_SOURCE, si.source_header(subject, sseq))
            out = self.stream.write_sourced(si.transform(subject), hdr, msg)
        if isinstance(out, ApiError):
            self._store_failed(si, old, sseq, out)

    def _track_mirror(self, si: SourceInfo, sseq: int, dseq: int, cname: str):
        """server/stream.go processInboundMirrorMsg: True to store, else ignore."""
        if sseq <= si.sseq:
            if dseq == si.dseq + 1:
                si.dseq += 1
            return False
        if sseq == si.sseq + 1:
            si.dseq = dseq
            si.sseq += 1
        elif not si.cname:
            si.cname = cname
            si.dseq, si.sseq = dseq, sseq
        elif dseq == si.dseq + 1:
            # The origin no longer has what lies between: a gap in the mirror too.
            si.dseq += 1
            si.sseq = sseq
        else:
            self.retry(si)
            return False
        return True

    def _track_source(self, si: SourceInfo, sseq: int, dseq: int, cname: str):
        """server/stream.go processInboundSourceMsg."""
        if sseq <= si.sseq:
            if dseq == si.dseq + 1:
                si.dseq += 1
            return False
        if dseq == si.dseq + 1:
            si.dseq += 1
            si.sseq = sseq
        elif dseq > si.dseq:
            if not si.cname:
                si.cname = cname
                si.dseq, si.sseq = dseq, sseq
            else:
                # A delivery went missing: ask again from after the last one taken.
                self.retry(si, si.sseq + 1)
                return False
        else:
            return False
        return True

    def _store_failed(self, si: SourceInfo, old: tuple, sseq: int, err: ApiError) -> None:
        si.sseq, si.dseq, si.lag = old
        if si.mirror:
            if err.err_code != 10063:
                self.log.warn("Error processing inbound mirror message for '%s' > '%s': %s",
                              self.account.name, self.stream.name, err.description)
            # Set up again from our last sequence: nothing is skipped.
            self.retry(si)
            return
        if "maximum" not in err.description:
            self.log.warn("Error processing inbound source %r for '%s' > '%s': %s",
                          si.iname, self.account.name, self.stream.name, err.description)
        self.retry(si, sseq)

    def _control(self, si: SourceInfo, reply: bytes | None, hdr: bytes) -> None:
        """Flow control requests and idle heartbeats from the origin consumer."""
        if reply:
            # server/stream.go handleFlowControl: the reply says how far we are.
            h = H.make(0, "", [(H.LAST_CONSUMER, b"%d" % si.dseq),
                               (H.LAST_STREAM, b"%d" % si.sseq)])
            self.server.deliver(self.account, reply, None, h, len(h))
            return
        ldseq = H.get(hdr, H.LAST_CONSUMER)
        if ldseq and ldseq.isdigit() and int(ldseq) > 0 and int(ldseq) != si.dseq:
            # It delivered something we never saw.
            self.retry(si, si.sseq + 1)
            return
        stalled = H.get(hdr, H.CONSUMER_STALLED)
        if stalled:
            self.server.deliver(self.account, stalled, None, b"")

    # ---- mirror direct gets ------------------------------------------------------------

    def _subscribe_mirror_direct(self) -> None:
        """Caught up: answer direct gets for the origin too (queue group, as the
        origin's own subscriptions)."""
        stream = self.stream
        base = b"$JS.API.DIRECT.GET." + self.mirror.name.encode()
        self._mdirect_subs = [
            self.js.subscribe(self.account, base, stream.on_direct_get, queue=b"_sys_"),
            self.js.subscribe(self.account, base + b".>", stream.on_direct_get_last,
                              queue=b"_sys_")]

    def _unsubscribe_mirror_direct(self) -> None:
        for sub in self._mdirect_subs:
            self.js.unsubscribe(self.account, sub)
        self._mdirect_subs = []

    # ---- where to start after a restart ------------------------------------------------

    def _starting_sequences(self, infos: list[SourceInfo]) -> None:
        """server/stream.go startingSequenceForSources: the newest message of each
        source in the stream says where it stopped."""
        store = self.stream.store
        want = {si.iname: si for si in infos}
        by_name: dict[str, list] = {}
        for si in infos:
            by_name.setdefault(si.name, []).append(si)
        seq = store.last_seq
        while want and seq >= store.first_seq:
            rec = store.load_prev(seq)
            if rec is None:
                break
            seq = rec[0] - 1
            hdr = rec[2]
            if not hdr:
                continue
            val = H.get(hdr, H.STREAM_SOURCE)
            if not val:
                continue
            name, iname, sseq, ident = parse_source_header(val.decode("utf-8", "replace"))
            if iname:
                si = want.pop(iname, None)
                if si is not None:
                    si.sseq, si.dseq, si.ident, si.rc = sseq, 0, ident, False
            elif name:
                # Headers older than index names match every source of that stream.
                for si in by_name.get(name, []):
                    if want.pop(si.iname, None) is not None:
                        si.sseq, si.dseq = sseq, 0

    # ---- info --------------------------------------------------------------------------

    def info(self) -> dict:
        if self.mirror is not None:
            return {"mirror": self._si_info(self.mirror)}
        order = [index_name(s) for s in self.stream.cfg["sources"] or []]
        return {"sources": [self._si_info(self.sources[n]) for n in order
                            if n in self.sources]}

    def _si_info(self, si: SourceInfo) -> dict:
        """server/stream.go sourceInfo (StreamSourceInfo)."""
        out = {"name": si.name}
        if si.ext:
            out["external"] = {k: v for k, v in si.ext.items() if v}
        out["lag"] = si.lag
        if not si.mirror and si.sseq:
            out["seq"] = si.sseq
        out["active"] = -1 if not si.last else int((trio.current_time() - si.last) * NS)
        if si.err:
            out["error"] = si.err
        if si.sf:
            out["filter_subject"] = si.sf
        if si.sfs:
            out["subject_transforms"] = [{"src": s, "dest": tr.dest if tr is not None else ""}
                                         for s, tr in zip(si.sfs, si.trs)]
        return out


__all__ = ["Sourcing", "for_stream", "update_for_stream", "get_hash", "stream_identity",
           "index_name", "parse_source_header", "ack_reply_info"]
