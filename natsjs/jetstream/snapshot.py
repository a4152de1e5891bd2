"""Stream snapshots and restores: ``$JS.API.STREAM.SNAPSHOT.<stream>`` and ``RESTORE``.

Not a step of a message's path: these take a whole stream out of the server (its
configuration, every stored message and, unless asked not to, its consumers with
their state) and put one back, the way ``nats stream backup/restore`` (nats-io/jsm.go)
drives it.  The protocol is nats-server's (server/jetstream_api.go
jsStreamSnapshotRequest, streamSnapshot, jsStreamRestoreRequest,
processStreamRestore):

* snapshot: the API answers with the stream's configuration and state, then the
  archive goes to the request's ``deliver_subject`` in chunks; each full chunk has a
  reply ``$JS.SNAPSHOT.ACK.<stream>.<id>.<size>.<n>`` whose answer frees room in a
  window (``window_size / chunk_size`` chunks in flight, 5 s without an answer ends
  it with ``408 No Flow Response``); the last, short chunk has no reply; the end is an
  empty message (``204`` status once a full chunk went out, as the reference does).
* restore: the API checks the configuration and answers with a subject
  ``$JS.SNAPSHOT.RESTORE.<stream>.<id>``; the client sends the archive there in
  chunks, each as a request answered with an empty message, then an empty request,
  answered with a ``stream_create_response`` once the stream exists (or the error).

The archive is our own: an S2 stream (natsjs/_core/s2.pyx framing, which clients
decompress to show progress) of records ``kind, length, payload, CRC-32C``:
``M`` the stream's configuration, creation time and bounds; ``m`` one message each;
``c`` one consumer each (configuration, creation time and state); ``E`` the counts
and a SHA-256 of everything before it.  A restore checks every record's checksum,
the digest and the counts before anything is installed.

An archive is input from a client like any request, and a crafted one must not reach
the disk or a protocol line unchecked (issue 19).  Pass one over it (``_checked``)
holds every record to what an API request would be held to (``_ArchiveChecks``):
consumer names are names (natsjs/jetstream/names.py) before a directory is made of
them, each consumer's configuration goes through the checks of a consumer create and
the account's and stream's limits, every message has a publish subject, a size within
the server's max_payload and the stream's max_msg_size, and sequences and times in
bounds the store can hold.  Only then is anything written, and only under the new
stream's own directory, which goes again if anything fails after it was made.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import struct

import trio

from natsjs._core.s2 import S2Error, S2Reader, S2Writer, crc32c
from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.apicore import (RESTORE_REQUEST, SNAPSHOT_REQUEST, T, check_api_level,
                                      decode, lookup_stream)
from natsjs.jetstream.apicore import err as error_reply
from natsjs.jetstream.consumer import Consumer
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import now_ns, rfc3339_nano
from natsjs.jetstream.names import (name_too_long, safe_name, valid_asset_name,
                                    valid_publish_subject)
from natsjs.jetstream.schema import DecodeError, decode_struct, is_empty_request, loads
from natsjs.jetstream.store import (META, MSGS, OBS, ConsumerState, FileConsumerStore,
                                    MemConsumerStore, open_message_log, write_json_atomic)
from natsjs.jetstream.stream import Stream

MAGIC = b"NATSJSS1"
K_META, K_MSG, K_CONSUMER, K_END = b"M", b"m", b"c", b"E"
_REC = struct.Struct("<cI")          # kind, payload length
_CRC = struct.Struct("<I")
_MSG = struct.Struct("<QqHII")       # seq, ts, subject, header and payload lengths
MAX_RECORD = 64 * 1024 * 1024 + 1024

# server/jetstream_api.go: chunk and window defaults and bounds, ack timeout.
DEFAULT_CHUNK = 128 * 1024
DEFAULT_WINDOW = 8 * 1024 * 1024
ACK_TIMEOUT = 5.0
INTEREST_WAIT = 2.0
RESTORE_IDLE = 5.0                  # processStreamRestore's activityInterval
SNAPSHOTS_DIR = "__snapshots__"
# Sequences a restore accepts: Go's int64 range (what JSON clients and nats-server's
# signed fields carry safely), and at most MAX_SPAN sequences from the first restored
# message to the last sequence: the store indexes every sequence between its first
# live message and its last one (natsjs/_core/filelog.pyx), 32 bytes each, so the
# span is memory, and an archive of a few bytes must not ask for terabytes of it.
MAX_SEQ = (1 << 63) - 1
MAX_SPAN = 1 << 24

SNAPSHOT_ADV = "$JS.EVENT.ADVISORY.STREAM.SNAPSHOT_%s."
RESTORE_ADV = "$JS.EVENT.ADVISORY.STREAM.RESTORE_%s."


class ArchiveError(ValueError):
    """An archive that cannot be restored; the text goes into the restore error."""


# ---- the archive ------------------------------------------------------------------------

def _record(kind: bytes, payload: bytes) -> bytes:
    head = _REC.pack(kind, len(payload))
    return head + payload + _CRC.pack(crc32c(payload, crc32c(head)))


def archive_records(stream, consumers: bool, upto: int):
    """The records of a stream's archive, messages read lazily up to ``upto``."""
    store = stream.store
    st = store.state()
    meta = {"config": stream.cfg, "created": stream.created,
            "first_seq": st["first_seq"], "last_seq": upto, "last_ts": st["last_ts"]}
    digest = hashlib.sha256()
    first = MAGIC + _record(K_META, json.dumps(meta, separators=(",", ":")).encode())
    digest.update(first)
    yield first
    n = 0
    seq = store.first_seq
    while seq <= upto:
        rec = store.load_next(seq)
        if rec is None or rec[0] > upto:
            break
        mseq, subj, hdr, msg, ts = rec
        hdr = hdr or b""
        body = _MSG.pack(mseq, ts, len(subj), len(hdr), len(msg)) + subj + hdr + msg
        out = _record(K_MSG, body)
        digest.update(out)
        n += 1
        seq = mseq + 1
        yield out
    nc = 0
    if consumers:
        for c in list(stream.consumers.values()):
            if c.direct:
                continue
            body = {"name": c.name, "config": c.cfg, "created": c.created,
                    "state": c.st.to_json()}
            out = _record(K_CONSUMER, json.dumps(body, separators=(",", ":")).encode())
            digest.update(out)
            nc += 1
            yield out
    end = {"messages": n, "consumers": nc, "sha256": digest.hexdigest()}
    yield _record(K_END, json.dumps(end, separators=(",", ":")).encode())


def _json_record(payload: bytes, what: str) -> dict:
    """A JSON record of the archive as Go would read it (schema.loads: no lone
    surrogate survives); anything but an object is a damaged archive."""
    try:
        value = loads(payload)
    except ValueError:
        raise ArchiveError("bad %s record" % what) from None
    if not isinstance(value, dict):
        raise ArchiveError("bad %s record" % what)
    return value


class ArchiveReader:
    """Parses a decompressed archive fed in pieces, checking as it goes; with
    ``checks`` (an ``_ArchiveChecks``), each record is also held to what a request
    would be held to, and ``meta`` and ``consumers`` are what the checks made of them."""

    def __init__(self, checks=None):
        self.checks = checks
        self._buf = bytearray()
        self._digest = hashlib.sha256()
        self._magic = False
        self.meta = None
        self.end = None
        self.messages = 0
        self.consumers = []

    def feed(self, data: bytes, on_msg) -> None:
        buf = self._buf
        buf += data
        if not self._magic:
            if len(buf) < len(MAGIC):
                return
            if bytes(buf[:len(MAGIC)]) != MAGIC:
                raise ArchiveError("not a natsjs stream snapshot")
            self._digest.update(MAGIC)
            del buf[:len(MAGIC)]
            self._magic = True
        pos = 0
        while len(buf) - pos >= _REC.size:
            kind, size = _REC.unpack_from(buf, pos)
            if size > MAX_RECORD:
                raise ArchiveError("record too large")
            total = _REC.size + size + _CRC.size
            if len(buf) - pos < total:
                break
            raw = bytes(buf[pos:pos + total])
            pos += total
            payload = raw[_REC.size:_REC.size + size]
            (crc,) = _CRC.unpack_from(raw, _REC.size + size)
            if crc != crc32c(payload, crc32c(raw[:_REC.size])):
                raise ArchiveError("checksum mismatch")
            if self.end is not None:
                raise ArchiveError("data after the end of the snapshot")
            self._record(kind, payload, raw, on_msg)
        del buf[:pos]

    def _record(self, kind: bytes, payload: bytes, raw: bytes, on_msg) -> None:
        if kind == K_END:
            end = _json_record(payload, "end")
            if end.get("sha256") != self._digest.hexdigest():
                raise ArchiveError("snapshot digest mismatch")
            if end.get("messages") != self.messages or \
                    end.get("consumers") != len(self.consumers):
                raise ArchiveError("snapshot is incomplete")
            self.end = end
            return
        self._digest.update(raw)
        if kind == K_META:
            if self.meta is not None:
                raise ArchiveError("unexpected content")
            meta = _json_record(payload, "metadata")
            self.meta = self.checks.meta(meta) if self.checks else meta
        elif self.meta is None:
            raise ArchiveError("unexpected content")
        elif kind == K_MSG:
            if len(payload) < _MSG.size:
                raise ArchiveError("bad message record")
            seq, ts, sl, hl, ml = _MSG.unpack_from(payload)
            p = _MSG.size
            if p + sl + hl + ml != len(payload):
                raise ArchiveError("bad message record")
            subj = payload[p:p + sl]
            hdr = payload[p + sl:p + sl + hl] or None
            msg = payload[p + sl + hl:]
            self.messages += 1
            if self.checks:
                self.checks.message(seq, ts, subj, hdr, msg)
            on_msg(seq, subj, hdr, msg, ts)
        elif kind == K_CONSUMER:
            c = _json_record(payload, "consumer")
            self.consumers.append(self.checks.consumer(c) if self.checks else c)
        else:
            raise ArchiveError("unexpected content")

    def finish(self) -> None:
        if self.end is None or self._buf:
            raise ArchiveError("snapshot is incomplete")


class _ArchiveChecks:
    """What pass one holds an archive's records to before anything is made of them:
    the checks a request meets (see the module's docstring).  Failures raise
    ArchiveError (or ApiError for the stream's own limits) with nats-server's words
    where it has them (server/stream_backup.go RestoreStreamV2)."""

    def __init__(self, api, jsa, cfg: dict):
        self.jsa = jsa
        self.cfg = cfg
        self.server_limits = api.js.opts.limits
        self.clustered = api.server.cluster is not None
        self.max_payload = api.server.opts.max_payload
        self.first = 1
        self.last = 0
        self.prev = 0
        self.names: set = set()
        self.filters: list = []     # filter lists of the consumers checked so far

    def meta(self, meta: dict) -> dict:
        cfg = meta.get("config")
        if not isinstance(cfg, dict) or cfg.get("name") != self.cfg["name"]:
            raise ArchiveError("stream names do not match")
        first = _int(meta.get("first_seq", 1))
        last = _int(meta.get("last_seq", 0))
        created = _int(meta.get("created", 0))
        last_ts = _int(meta.get("last_ts", 0))
        if first is None or last is None or created is None or last_ts is None or \
                created < 0 or last_ts < 0:
            raise ArchiveError("bad stream metadata")
        if not 1 <= first <= MAX_SEQ or not 0 <= last <= MAX_SEQ or first > last + 1:
            raise ArchiveError("stream sequences %d to %d out of range" % (first, last))
        self.first, self.last = first, last
        return {"config": {"name": cfg["name"]}, "created": created, "first_seq": first,
                "last_seq": last, "last_ts": last_ts}

    def message(self, seq: int, ts: int, subj: bytes, hdr, msg: bytes) -> None:
        if not self.first <= seq <= self.last:
            raise ArchiveError("message sequence %d out of range" % seq)
        if seq <= self.prev:
            raise ArchiveError("message sequence %d out of order" % seq)
        if not self.prev and self.last - seq >= MAX_SPAN:
            # The store would index every sequence from here to the last one.
            raise ArchiveError("sequence gap too large to restore (%d to %d)"
                               % (seq, self.last))
        self.prev = seq
        hl, ml = len(hdr or b""), len(msg)
        mp = self.max_payload
        if hl > mp or ml > mp - hl:
            raise ArchiveError("message sequence %d exceeds maximum payload size" % seq)
        mms = self.cfg["max_msg_size"]
        if mms > 0 and (hl > mms or ml > mms - hl):
            raise ArchiveError("message sequence %d exceeds maximum message size" % seq)
        if ts < 0:
            raise ArchiveError("message sequence %d has an invalid timestamp" % seq)
        try:
            subject = subj.decode("utf-8")
        except UnicodeDecodeError:
            subject = None
        if subject is None or not valid_publish_subject(subject):
            raise ArchiveError("message sequence %d has an invalid subject" % seq)

    def consumer(self, rec: dict) -> dict:
        """The consumer as it will be made: its name checked, its configuration with a
        create's defaults and checks, its state in bounds."""
        name = rec.get("name")
        if not isinstance(name, str) or not name:
            raise ArchiveError("bad consumer record")
        shown = json.dumps(name, ensure_ascii=False)      # as Go's %q shows it
        try:
            out = self._consumer(name, rec)
        except ApiError as err:
            raise ArchiveError("failed to add consumer %s: %s" % (shown, err)) from None
        except ArchiveError as err:
            raise ArchiveError("consumer %s: %s" % (shown, err)) from None
        self.names.add(name)
        return out

    def _consumer(self, name: str, rec: dict) -> dict:
        config, state, created = rec.get("config"), rec.get("state"), _int(rec.get("created", 0))
        if not isinstance(config, dict):
            raise ArchiveError("missing config")
        if not isinstance(state, dict):
            raise ArchiveError("missing state")
        if created is None or created < 0:
            raise ArchiveError("bad creation time")
        if name in self.names:
            raise ArchiveError("appears twice")
        try:
            ccfg = CC.from_request(decode_struct(config, CC.CONSUMER_CONFIG, strict=False))
        except DecodeError as exc:
            raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from None
        if any(ccfg[k] and ccfg[k] != name for k in ("durable_name", "name")):
            raise ArchiveError("configuration names another consumer")
        if ccfg["direct"]:
            raise ArchiveError("a direct consumer is never restored")
        if ccfg["num_replicas"] > 1 and not self.clustered:
            raise ApiError.of("JSStreamReplicasNotSupportedErr")
        scfg, jsa = self.cfg, self.jsa
        # The checks of a create (api.add_consumer), the name in the configuration so
        # that it is judged too.
        cfg = CC.set_defaults(dict(ccfg, name=name), scfg, self.server_limits, jsa.limits)
        CC.check_config(cfg, scfg, self.server_limits, jsa.limits)
        cfg["name"] = ccfg["name"]
        if not valid_asset_name(name):
            raise ApiError.of("JSStreamInvalidConfigF",
                              err="consumer name can not contain '.', '*', '>', '\\', '/'")
        if name_too_long(name):
            raise ApiError.of("JSConsumerNameTooLongErrF", max=SC.MAX_NAME_LEN)
        CC.check_new_consumer(scfg, jsa.limits, cfg, lambda: self.filters)
        if not cfg["durable_name"] and cfg["inactive_threshold"] == 0:
            cfg["inactive_threshold"] = CC.DEFAULT_DELETE_WAIT
        self.filters.append(CC.filters_of(cfg))
        return {"name": name, "config": cfg, "created": created, "state": _state(state)}


def _int(v):
    """A JSON integer (not a bool, not a float), else None."""
    return v if type(v) is int else None


def _state(d: dict) -> dict:
    """A consumer's state from an archive, its numbers in the store's bounds
    (store.ConsumerState.to_json's shape)."""
    def seq(v, low=0):
        v = _int(v)
        if v is None or not low <= v <= MAX_SEQ:
            raise ArchiveError("bad state")
        return v

    def rows(key, width):
        v = d.get(key, [])
        if not isinstance(v, list):
            raise ArchiveError("bad state")
        out = []
        for row in v:
            if width == 1:
                out.append(seq(row))
                continue
            if not isinstance(row, list) or len(row) != width:
                raise ArchiveError("bad state")
            out.append([seq(x) for x in row])
        return out
    sseq, dseq = seq(d.get("sseq"), 1), seq(d.get("dseq"), 1)
    asflr, adflr = seq(d.get("asflr")), seq(d.get("adflr"))
    if asflr >= sseq or adflr >= dseq:
        raise ArchiveError("bad state")
    return {"sseq": sseq, "dseq": dseq, "asflr": asflr, "adflr": adflr,
            "pending": rows("pending", 3), "rdc": rows("rdc", 2),
            "acked_ahead": rows("acked_ahead", 1)}


# ---- snapshot ---------------------------------------------------------------------------

def client_info(jsa) -> dict:
    """What advisories say about the requester: natsjs's API does not see the client
    connection, so only the account and server are known."""
    return {"acc": jsa.name, "server": jsa.js.server.name}


def snapshot_request(api, jsa, name: str, hdr, body: bytes) -> dict:
    """Answer a snapshot request and start sending the archive."""
    rtype = "stream_snapshot_response"
    try:
        check_api_level(hdr)
        if is_empty_request(body):
            raise ApiError.of("JSBadRequestErr")
        stream = lookup_stream(jsa, name)
        req = decode(body, SNAPSHOT_REQUEST)
        if not valid_publish_subject(req.get("deliver_subject") or ""):
            raise ApiError.of("JSSnapshotDeliverSubjectInvalidErr")
    except ApiError as exc:
        return error_reply(rtype, exc)
    st = stream.state()
    cfg = SC.config_json(stream.cfg)
    api.js.spawn(_send_snapshot, api, jsa, stream, req, st)
    return {"type": T + rtype, "config": cfg, "state": st}


async def _send_snapshot(api, jsa, stream, req: dict, state: dict) -> None:
    js = api.js
    server = api.server
    acc = jsa.account
    log = server.log
    start = now_ns()
    name = stream.name
    js.advisory(SNAPSHOT_ADV % "CREATE" + name, "io.nats.jetstream.advisory.v1.snapshot_create",
                {"stream": name, "state": state, "client": client_info(jsa)}, acc)
    log.info("Starting snapshot for stream '%s > %s'", jsa.name, name)
    err = None
    try:
        await _stream_chunks(js, acc, stream, req)
    except _SnapshotStop as exc:
        err = str(exc)
    end = now_ns()
    body = {"stream": name, "start": rfc3339_nano(start), "end": rfc3339_nano(end),
            "client": client_info(jsa)}
    if err:
        body["error"] = err
        log.warn("Snapshot for stream '%s > %s' failed after %.3fs: %s", jsa.name, name,
                 (end - start) / 1e9, err)
    else:
        log.info("Completed snapshot of %d bytes for stream '%s > %s' in %.3fs",
                 state["bytes"], jsa.name, name, (end - start) / 1e9)
    js.advisory(SNAPSHOT_ADV % "COMPLETE" + name,
                "io.nats.jetstream.advisory.v1.snapshot_complete", body, acc)


class _SnapshotStop(Exception):
    """The receiver stopped answering or went away (the text is the reference's)."""


def _deliver(server, acc, subject: bytes, reply, raw: bytes, hdr_only: bool = True) -> None:
    if hdr_only:
        server.deliver(acc, subject, reply, raw, len(raw))
    else:
        server.deliver(acc, subject, reply, raw)


async def _stream_chunks(js, acc, stream, req: dict) -> None:
    """server/jetstream_api.go streamSnapshot."""
    server = js.server
    chunk = req.get("chunk_size") or DEFAULT_CHUNK
    window = req.get("window_size") or DEFAULT_WINDOW
    chunk = min(max(1024, chunk), 1024 * 1024)
    window = max(min(max(1024, window), 32 * 1024 * 1024), chunk)
    inflight = window // chunk
    deliver = req["deliver_subject"].encode()

    def interest() -> bool:
        r = acc.sublist.match(deliver)
        return bool(r.psubs or r.qsubs)

    if not interest():
        with trio.move_on_after(INTEREST_WAIT):
            while not interest():
                await trio.sleep(0.05)
    slots = trio.Semaphore(inflight)
    ack_base = "$JS.SNAPSHOT.ACK.%s.%s" % (stream.name, secrets.token_hex(11))

    def on_ack(sub, subject, reply, hdr, msg):
        if slots.value < inflight:
            slots.release()
    ack_sub = js.subscribe(acc, (ack_base + ".>").encode(), on_ack)
    status = None
    try:
        writer = S2Writer("fast")
        pending = bytearray()
        index = 1
        upto = stream.store.last_seq
        records = archive_records(stream, not req.get("no_consumers"), upto)
        exhausted = False
        while True:
            while len(pending) < chunk and not exhausted:
                batch = bytearray()
                for rec in records:
                    batch += rec
                    if len(batch) >= chunk:
                        break
                else:
                    exhausted = True
                if batch:
                    pending += writer.compress(bytes(batch))
                await trio.lowlevel.checkpoint()
            if len(pending) < chunk:
                if pending:
                    _deliver(server, acc, deliver, None, bytes(pending), hdr_only=False)
                break
            with trio.move_on_after(ACK_TIMEOUT) as scope:
                await slots.acquire()
            if scope.cancelled_caught:
                status = b"NATS/1.0 408 No Flow Response\r\n\r\n"
                raise _SnapshotStop("no flow response")
            if not interest():
                status = b"NATS/1.0 408 No Interest\r\n\r\n"
                raise _SnapshotStop("no interest")
            piece = bytes(pending[:chunk])
            del pending[:chunk]
            reply = ("%s.%d.%d" % (ack_base, len(piece), index)).encode()
            _deliver(server, acc, deliver, reply, piece, hdr_only=False)
            if status is None:
                status = b"NATS/1.0 204\r\n\r\n"
            index += 1
    except _SnapshotStop:
        raise
    except Exception as exc:   # a failure ends this snapshot, never the server
        server.log.error("Snapshot of stream '%s > %s' failed: %r", stream.jsa.name,
                         stream.name, exc)
        status = b"NATS/1.0 500 %s\r\n\r\n" % str(exc).encode()
        raise _SnapshotStop(str(exc)) from None
    finally:
        js.unsubscribe(acc, ack_sub)
        # The end: a status (204 once a full chunk went out) or nothing at all.
        if status:
            _deliver(server, acc, deliver, None, status)
        else:
            _deliver(server, acc, deliver, None, b"", hdr_only=False)


# ---- restore ----------------------------------------------------------------------------

def check_restore_request(name: str, hdr, body: bytes, context) -> dict:
    """The checks of server/jetstream_api.go jsStreamRestoreRequest, common to a single
    server and a cluster's meta leader: the configuration to restore (raises ApiError)."""
    check_api_level(hdr)
    if not body.strip():
        raise ApiError.of("JSBadRequestErr")
    req = decode(body, RESTORE_REQUEST)
    cfg = SC.from_request(req.get("config") or {})
    if not cfg["name"]:
        cfg["name"] = name
    if cfg["name"] != name:
        raise ApiError.of("JSStreamMismatchErr")
    if "\\" in name or "/" in name:
        raise ApiError.of("JSStreamNameContainsPathSeparatorsErr")
    return SC.check_stream_config(cfg, context)


def restore_request(api, jsa, name: str, hdr, body: bytes) -> dict:
    """server/jetstream_api.go jsStreamRestoreRequest: check, then open a subject for
    the archive."""
    try:
        cfg = check_restore_request(name, hdr, body, api.check_context(jsa))
        jsa.check_new_stream(cfg)
        if name in jsa.streams:
            raise ApiError.of("JSStreamNameExistRestoreFailedErr")
    except ApiError as e:
        return error_reply("stream_restore_response", e)
    session = _Restore(api, jsa, cfg)
    session.start()
    return restore_answer(session)


def restore_answer(session) -> dict:
    return {"type": T + "stream_restore_response", "deliver_subject": session.subject.decode()}


class _Restore:
    """One restore: chunks land in a file under ``__snapshots__`` (each acknowledged
    once written), the empty request at the end makes the stream out of them."""

    def __init__(self, api, jsa, cfg: dict):
        self.api = api
        self.js = api.js
        self.server = api.server
        self.jsa = jsa
        self.cfg = cfg
        self.name = cfg["name"]
        self.subject = ("$JS.SNAPSHOT.RESTORE.%s.%s" % (self.name, secrets.token_hex(11))).encode()
        self.queue: list = []
        self.wake = trio.lowlevel.ParkingLot()
        self.sub = None
        self.total = 0
        self.start_ns = now_ns()
        sdir = os.path.join(self.js.store_dir, jsa.name, SNAPSHOTS_DIR)
        self.tmp = os.path.join(sdir, "snap-" + secrets.token_hex(8))

    def start(self) -> None:
        acc = self.jsa.account
        log = self.server.log
        log.info("Starting restore for stream '%s > %s'", self.jsa.name, self.name)
        self.js.advisory(RESTORE_ADV % "CREATE" + self.name,
                         "io.nats.jetstream.advisory.v1.restore_create",
                         {"stream": self.name, "client": client_info(self.jsa)}, acc)

        def on_chunk(sub, subject, reply, hdr, msg):
            data = msg[hdr:] if hdr and hdr > 0 else msg
            self.queue.append((reply, data))
            self.wake.unpark()
        self.sub = self.js.subscribe(acc, self.subject, on_chunk)
        self.js.spawn(self.run)

    async def run(self) -> None:
        acc = self.jsa.account
        reply = None
        err = None
        stream = None
        try:
            await trio.to_thread.run_sync(os.makedirs, self.tmp)
            with open(os.path.join(self.tmp, "archive.s2"), "wb") as f:
                while True:
                    if not self.queue:
                        with trio.move_on_after(RESTORE_IDLE) as scope:
                            await self.wake.park()
                        if scope.cancelled_caught:
                            # Nobody to answer: the client is gone.
                            self.server.log.warn("restore for stream '%s > %s' is stalled",
                                                 self.jsa.name, self.name)
                            self.abandoned()
                            return
                        continue
                    reply, data = self.queue.pop(0)
                    if not reply:
                        raise ArchiveError("restore for stream '%s > %s' requires reply "
                                           "subject for each chunk" % (self.jsa.name,
                                                                       self.name))
                    if not data:
                        break
                    await trio.to_thread.run_sync(f.write, data)
                    self.total += len(data)
                    self.server.deliver(acc, reply, None, b"")
            self._unsubscribe()
            stream = await self._install(os.path.join(self.tmp, "archive.s2"))
        except S2Error:
            err = ArchiveError("s2: corrupt input")    # the reference's words
        except (ApiError, ArchiveError) as exc:
            err = exc
        except OSError as exc:
            # Its text would name paths under the store: only what went wrong.
            self.server.log.error("Restore of stream '%s > %s': %s", self.jsa.name,
                                  self.name, exc)
            err = ArchiveError(exc.strerror or "I/O error")
        except Exception as exc:    # one bad archive fails its restore, never the server
            self.server.log.error("Restore of stream '%s > %s' failed: %r", self.jsa.name,
                                  self.name, exc)
            err = ArchiveError("unexpected content")
        finally:
            self._unsubscribe()
            await trio.to_thread.run_sync(shutil.rmtree, self.tmp, True)
        self._finish(reply, err, stream)

    def abandoned(self) -> None:
        """The client went away before the end: nothing was made, nothing to undo."""

    def _unsubscribe(self) -> None:
        if self.sub is not None:
            self.js.unsubscribe(self.jsa.account, self.sub)
            self.sub = None

    def _finish(self, reply, err, stream) -> None:
        acc = self.jsa.account
        end = now_ns()
        self.js.advisory(RESTORE_ADV % "COMPLETE" + self.name,
                         "io.nats.jetstream.advisory.v1.restore_complete",
                         {"stream": self.name, "start": rfc3339_nano(self.start_ns),
                          "end": rfc3339_nano(end), "bytes": self.total,
                          "client": client_info(self.jsa)}, acc)
        log = self.server.log
        if err is not None:
            if isinstance(err, ApiError):
                e = err if err.err_code == 10130 else \
                    ApiError.of("JSStreamRestoreErrF", err=err.description)
            else:
                e = ApiError.of("JSStreamRestoreErrF", err=str(err))
            resp = error_reply("stream_create_response", e)
            log.warn("Restore failed for %d bytes for stream '%s > %s' in %.3fs: %s",
                     self.total, self.jsa.name, self.name, (end - self.start_ns) / 1e9,
                     e.description)
        else:
            cfg = SC.with_dynamic_metadata(stream.cfg, self.js.version)
            resp = {"type": T + "stream_create_response", "config": SC.config_json(cfg),
                    "created": rfc3339_nano(stream.created), "state": stream.state(),
                    "ts": rfc3339_nano(now_ns())}
            log.info("Completed restore of %d bytes for stream '%s > %s' in %.3fs",
                     self.total, self.jsa.name, self.name, (end - self.start_ns) / 1e9)
        if reply:
            self.server.deliver(acc, reply, None,
                                json.dumps(resp, separators=(",", ":")).encode())

    async def _checked(self, archive: str) -> ArchiveReader:
        """Pass one over the archive: every checksum, the digest and the counts, and
        every record held to a request's checks (_ArchiveChecks), before anything is
        made of it."""
        reader = ArchiveReader(_ArchiveChecks(self.api, self.jsa, self.cfg))
        await self._read(archive, reader, lambda *m: None)
        reader.finish()
        return reader

    async def _install(self, archive: str):
        """Check the whole archive, then make the stream and its consumers."""
        jsa = self.jsa
        cfg = self.cfg
        reader = await self._checked(archive)
        if cfg["name"] in jsa.streams or cfg["name"] in self.api.restoring:
            raise ApiError.of("JSStreamNameExistRestoreFailedErr")
        # Other streams may have been made while the archive came in.
        jsa.check_new_stream(cfg)
        self.api.restoring.add(cfg["name"])
        try:
            return await self._build(archive, reader.meta, reader)
        finally:
            self.api.restoring.discard(cfg["name"])

    async def _read(self, archive: str, reader: ArchiveReader, on_msg) -> None:
        s2 = S2Reader()
        with open(archive, "rb") as f:
            while True:
                data = await trio.to_thread.run_sync(f.read, 1 << 20)
                if not data:
                    break
                reader.feed(s2.feed(data), on_msg)
                await trio.lowlevel.checkpoint()
        s2.finish()

    async def fill(self, store, archive: str, meta: dict) -> None:
        """The archive's messages into an empty ``store``, up to the stream's last
        sequence (what it had deleted at its end still counts), made durable.  ``meta``
        and the messages were checked by pass one (_checked)."""
        cfg = self.cfg
        added = [0]
        limit = _storage_room(self.jsa, cfg)

        def on_msg(seq, subj, hdr, msg, ts):
            store.append(subj, hdr, msg, ts, seq)
            added[0] += len(subj) + len(hdr or b"") + len(msg)
            if added[0] > limit:
                raise ApiError.of("JSStorageResourcesExceededErr" if cfg["storage"] == "file"
                                  else "JSMemoryResourcesExceededErr")
        await self._read(archive, ArchiveReader(), on_msg)
        last = meta["last_seq"]
        if last > store.last_seq:
            store.append(b"_", None, b"", meta["last_ts"], last)
            store.remove(last)
        s = store.begin_sync()
        await trio.to_thread.run_sync(s.run)
        store.mark_synced(s)

    async def _build(self, archive: str, meta: dict, first_pass: ArchiveReader):
        jsa = self.jsa
        js = self.js
        cfg = self.cfg
        path = None
        # Names from outside become directories only once they are names (checked
        # where the request and the archive entered; this is the last wall).
        if not safe_name(cfg["name"]) or \
                not all(safe_name(c["name"]) for c in first_pass.consumers):
            raise ArchiveError("unexpected content")
        # A new creation time, as nats-server 2.15 gives (its identity changes too).
        created = now_ns()
        if cfg["storage"] == "file":
            path = os.path.join(jsa.dir, "streams", cfg["name"])
            await trio.to_thread.run_sync(_prepare_dir, path, cfg, created)
        store = None
        try:
            store = open_message_log(os.path.join(path, MSGS) if path else None,
                                     dict(cfg, first_seq=meta["first_seq"]))
            await self.fill(store, archive, meta)
            stream = Stream(jsa, cfg, created, store, path)
            for c in first_pass.consumers:
                ccfg = c["config"]
                state = ConsumerState.from_json(c["state"])
                cname = c["name"]
                if path and not ccfg["mem_storage"]:
                    d = os.path.join(path, OBS, cname)
                    await trio.to_thread.run_sync(_write_consumer, d, ccfg, created)
                    cstore = FileConsumerStore(d)
                    await trio.to_thread.run_sync(cstore.snapshot, state)
                else:
                    cstore = MemConsumerStore()
                stream.consumers[cname] = Consumer(stream, ccfg, cname, created, cstore,
                                                   state)
        except BaseException:
            # Nothing half-restored stays (the stream was not started, nobody saw it).
            if store is not None:
                store.close()
            if path:
                await trio.to_thread.run_sync(shutil.rmtree, path, True)
            raise
        jsa.streams[cfg["name"]] = stream
        js.start_stream(stream)
        acc = jsa.account
        js.advisory("$JS.EVENT.ADVISORY.STREAM.CREATED." + cfg["name"],
                    "io.nats.jetstream.advisory.v1.stream_action",
                    {"stream": cfg["name"], "action": "create"}, acc)
        for cname in stream.consumers:
            js.advisory("$JS.EVENT.ADVISORY.CONSUMER.CREATED.%s.%s" % (cfg["name"], cname),
                        "io.nats.jetstream.advisory.v1.consumer_action",
                        {"stream": cfg["name"], "consumer": cname, "action": "create"}, acc)
        return stream


class ClusterRestore(_Restore):
    """A restore into a clustered JetStream (server/jetstream_cluster.go: the meta
    leader assigns the stream with its restore request; the group's first leader takes
    the archive).  Here that leader fills its replica's empty store, then commits a
    ``restored`` entry to the group's log: every follower that applies it fetches what
    it misses from the leader (natsjs/jetstream/catchup.py), so each replica ends up
    with the same messages.  The archive's consumers are then assigned by the meta
    leader with their state.  On failure the stream's assignment is removed."""

    def __init__(self, rep):
        super().__init__(rep.js.api, rep.jsa, rep.stream.cfg)
        self.rep = rep

    def start(self) -> None:
        super().start()
        # The answer to the restore request the meta leader took: where to send.
        reply = self.rep.sa.get("reply")
        if reply:
            self.api.answer(reply.encode(), restore_answer(self))

    async def _install(self, archive: str):
        reader = await self._checked(archive)
        rep = self.rep
        if rep.closed or not rep.is_leader():
            raise ApiError.of("JSClusterNotAvailErr")
        await self.fill(rep.stream.store, archive, reader.meta)
        await rep.restored(reader.consumers)
        return rep.stream

    def abandoned(self) -> None:
        self.rep.restore_failed()

    def _finish(self, reply, err, stream) -> None:
        super()._finish(reply, err, stream)
        if err is not None:
            self.rep.restore_failed()


def _storage_room(jsa, cfg: dict) -> int:
    """Bytes a restored stream may bring in (account and server limits)."""
    is_mem = cfg["storage"] == "memory"
    room = (jsa.js.max_memory - jsa.js.memory_used()) if is_mem else \
        (jsa.js.max_store - jsa.js.store_used())
    cap = jsa.limits.max_memory if is_mem else jsa.limits.max_store
    if cap >= 0:
        mem, store = jsa.usage()
        room = min(room, cap - (mem if is_mem else store))
    if cfg["max_bytes"] > 0 and cfg["discard"] == "new":
        room = min(room, cfg["max_bytes"])
    return room


def _prepare_dir(path: str, cfg: dict, created: int) -> None:
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(os.path.join(path, MSGS))
    write_json_atomic(os.path.join(path, META), {"config": cfg, "created": created})


def _write_consumer(d: str, cfg: dict, created: int) -> None:
    os.makedirs(d, exist_ok=True)
    write_json_atomic(os.path.join(d, META), {"config": cfg, "created": created})


__all__ = ["snapshot_request", "restore_request", "archive_records", "ArchiveReader",
           "ArchiveError", "ClusterRestore", "check_restore_request"]
