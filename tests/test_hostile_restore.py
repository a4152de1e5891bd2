"""Hostile stream restores (issue 19, findings 2 and 4): archives a user of one account
crafts and sends through ``$JS.API.STREAM.RESTORE`` the way ``nats stream restore``
does.  Each must be answered (an error, or a stream made of checked parts), must not
write anything outside the restoring account's own new stream, must leave the server
up, and the server must start again afterwards.

natsjs's archive is its own (natsjs/jetstream/snapshot.py: an S2 stream of
``kind, length, payload, CRC-32C`` records ending in a digest); the builder below
writes it from the format's description, with correct checksums and digest, so what
is tested is the content, not the damage detection.  nats-server 2.15's archive
(server/archive/archive.go, server/stream_backup.go) is built the same way for the
cases compared with the reference.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import struct
from functools import partial

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import start_natsjs, start_reference
from natsjs._core.s2 import S2Writer, crc32c
import helpers

run = partial(helpers.run, timeout=120)

TIMEOUT = 10
T = "io.nats.jetstream.api.v1."

# ---- natsjs's archive, written from its description -------------------------------------

MAGIC = b"NATSJSS1"
_REC = struct.Struct("<cI")
_MSG = struct.Struct("<QqHII")


def _record(kind: bytes, payload: bytes) -> bytes:
    head = _REC.pack(kind, len(payload))
    return head + payload + struct.pack("<I", crc32c(payload, crc32c(head)))


def _js(obj) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


def stream_cfg(name: str, **kw) -> dict:
    cfg = {"name": name, "subjects": [name.lower() + ".>"], "storage": "file",
           "retention": "limits", "num_replicas": 1}
    cfg.update(kw)
    return cfg


def consumer(name: str, **cfg) -> dict:
    c = {"durable_name": name, "ack_policy": "explicit", "deliver_policy": "all"}
    c.update(cfg)
    return {"name": name, "config": c, "created": 1,
            "state": {"sseq": 1, "dseq": 1, "asflr": 0, "adflr": 0, "pending": [],
                      "rdc": [], "acked_ahead": []}}


def archive_records(cfg: dict, msgs=(), consumers=(), first_seq=None, last_seq=None,
                    last_ts=0) -> list:
    """The raw records of a natsjs archive: meta, messages ``(seq, ts, subject,
    header, payload)``, consumers, then the end record with the right counts and
    digest.  ``cfg`` and consumer records may be bytes (taken as they are)."""
    msgs = list(msgs)
    if first_seq is None:
        first_seq = msgs[0][0] if msgs else 1
    if last_seq is None:
        last_seq = msgs[-1][0] if msgs else 0
    meta = {"config": cfg, "created": 1, "first_seq": first_seq, "last_seq": last_seq,
            "last_ts": last_ts}
    recs = [_record(b"M", _js(meta) if not isinstance(cfg, bytes) else
                    b'{"config":' + cfg + b',"created":1,"first_seq":%d,"last_seq":%d}'
                    % (first_seq, last_seq))]
    for seq, ts, subj, hdr, msg in msgs:
        recs.append(_record(b"m", _MSG.pack(seq, ts, len(subj), len(hdr), len(msg)) +
                            subj + hdr + msg))
    for c in consumers:
        recs.append(_record(b"c", _js(c)))
    return recs


def seal(recs: list, n_msgs: int | None = None, n_consumers: int | None = None) -> bytes:
    """MAGIC, the records, and an end record whose digest covers them."""
    body = MAGIC + b"".join(recs)
    if n_msgs is None:
        n_msgs = sum(1 for r in recs if r[:1] == b"m")
    if n_consumers is None:
        n_consumers = sum(1 for r in recs if r[:1] == b"c")
    end = {"messages": n_msgs, "consumers": n_consumers,
           "sha256": hashlib.sha256(body).hexdigest()}
    return body + _record(b"E", _js(end))


def natsjs_archive(cfg, msgs=(), consumers=(), **kw) -> bytes:
    return S2Writer("fast").compress(seal(archive_records(cfg, msgs, consumers, **kw)))


# ---- nats-server 2.15's archive ("NATSARC1" entries under S2) ---------------------------

def _uvarint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _varint(v: int) -> bytes:
    return _uvarint((v << 1) ^ (v >> 63) if v >= 0 else ((-v - 1) << 1) | 1)


def _entry(name: bytes, ts: int, seq: int, hdr: bytes, payload: bytes) -> bytes:
    return (_uvarint(len(name)) + _varint(ts) + _uvarint(seq) + _uvarint(len(hdr)) +
            _uvarint(len(payload)) + name + hdr + payload)


def reference_archive(msgs=(), consumers=(), first_seq=None, last_seq=None) -> bytes:
    """server/stream_backup.go streamSnapshotV2's layout: state.json, the consumers
    (``consumers/<name>`` holding config and state), the messages, an empty entry."""
    msgs = list(msgs)
    first_seq = first_seq if first_seq is not None else (msgs[0][0] if msgs else 1)
    last_seq = last_seq if last_seq is not None else (msgs[-1][0] if msgs else 0)
    state = {"messages": len(msgs), "bytes": sum(len(m[3]) + len(m[4]) for m in msgs),
             "first_seq": first_seq, "last_seq": last_seq, "consumer_count": len(consumers)}
    out = [b"NATSARC1", _entry(b"state.json", 1, 0, b"", _js(state))]
    for c in consumers:
        body = {"config": dict(c["config"], name=c["name"]),
                "state": {"delivered": {"consumer_seq": 0, "stream_seq": 0},
                          "ack_floor": {"consumer_seq": 0, "stream_seq": 0}}}
        out.append(_entry(b"consumers/" + c["name"].encode(), 1, 0, b"", _js(body)))
    for seq, ts, subj, hdr, msg in msgs:
        out.append(_entry(subj, ts, seq, hdr, msg))
    out.append(_entry(b"", 0, 0, b"", b""))
    return S2Writer("fast").compress(b"".join(out))


# ---- speaking the restore protocol ------------------------------------------------------

async def api(nc, subject: str, body=None) -> dict:
    data = b"" if body is None else _js(body)
    return json.loads((await nc.request(subject, data, timeout=TIMEOUT)).data)


async def restore(nc, cfg: dict, archive: bytes, chunk: int = 64 * 1024) -> dict:
    """jsm.go restoreSnapshot: the restore request, the archive in chunks, an empty
    chunk; the final answer (or the restore request's error)."""
    resp = await api(nc, "$JS.API.STREAM.RESTORE." + cfg["name"], {"config": cfg})
    if "error" in resp:
        return resp
    chunk = min(chunk, nc.max_payload)
    for i in range(0, len(archive), chunk):
        r = await nc.request(resp["deliver_subject"], archive[i:i + chunk], timeout=TIMEOUT)
        if r.data:
            return json.loads(r.data)
    r = await nc.request(resp["deliver_subject"], b"", timeout=TIMEOUT)
    return json.loads(r.data)


def two_accounts_conf(tmp_path, store: str, max_payload: int = 1024 * 1024,
                      b_limits: str = "") -> str:
    conf = tmp_path / "accounts.conf"
    conf.write_text("""
max_payload: %d
jetstream { store_dir: "%s" }
accounts {
  A: { jetstream: enabled, users: [ {user: a, password: a} ] }
  B: { jetstream: { %s }, users: [ {user: b, password: b} ] }
}
""" % (max_payload, store, b_limits or "max_mem: -1, max_file: -1"))
    return str(conf)


def user_url(server, user: str) -> str:
    return "nats://%s:%s@127.0.0.1:%d" % (user, user, server.port)


async def connect(server, user: str | None = None):
    url = user_url(server, user) if user else server.url
    return await nats.connect(url, allow_reconnect=False)


def text_of(resp: dict) -> str:
    return json.dumps(resp)


def store_files(store: str) -> dict:
    """Every file under the store with its content's digest."""
    out = {}
    for root, _, files in os.walk(store):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, store)] = hashlib.sha256(fh.read()).hexdigest()
    return out


class Setup:
    """Account A with stream S (three messages), account B (max_consumers 3) that
    restores; on natsjs or on the reference, each with its own archive format."""

    def __init__(self, tmp_path, kind: str, max_payload: int = 64 * 1024):
        self.kind = kind
        self.tmp = tmp_path
        self.store = str(tmp_path / "js")
        self.conf = two_accounts_conf(tmp_path, self.store, max_payload,
                                      "max_consumers: 3, max_mem: -1, max_file: -1")
        self.server = None
        self.start()
        # Where account A's stream lives (both servers put accounts under
        # <store_dir>/jetstream).
        self.a_stream_dir = os.path.join(self.store, "jetstream", "A", "streams", "S")

    def start(self):
        self.server = (start_natsjs if self.kind == "natsjs" else start_reference)(
            "-c", self.conf)
        return self.server

    def restart(self):
        self.server.stop()
        return self.start()

    def archive(self, cfg, msgs=(), consumers=(), **kw) -> bytes:
        if self.kind == "natsjs":
            return natsjs_archive(cfg, msgs, consumers, **kw)
        return reference_archive(msgs, consumers, **kw)

    async def fill_a(self):
        nc = await connect(self.server, "a")
        js = nc.jetstream()
        await js.add_stream(name="S", subjects=["s.>"])
        for i in range(3):
            await js.publish("s.%d" % i, b"A-%d" % i)
        await nc.close()

    def left_over(self, before: dict, after: dict) -> dict:
        """Files the refused restore left or changed: none on natsjs; nats-server
        2.15.1 keeps the half-restored stream in the restoring account (B's R), so
        there only what lies elsewhere counts."""
        changed = {k: v for k, v in after.items() if before.get(k) != v}
        if self.kind == "reference":
            changed = {k: v for k, v in changed.items()
                       if not k.startswith("jetstream/B/streams/R/")}
        return changed

    def no_streams_left(self, names: dict) -> None:
        if self.kind == "natsjs":
            assert not names.get("streams"), names

    async def a_state(self):
        nc = await connect(self.server, "a")
        info = await api(nc, "$JS.API.STREAM.INFO.S")
        await nc.close()
        return info["config"]["max_msgs"], info["state"]["messages"]


@pytest.fixture(params=["natsjs", "reference"])
def kind(request):
    return request.param


@pytest.fixture
def setup(tmp_path, kind):
    s = Setup(tmp_path, kind)
    yield s
    s.server.stop()


def _refused(resp: dict, text: str) -> None:
    assert resp["type"] == T + "stream_create_response", resp
    assert resp["error"]["err_code"] == 10062, resp
    assert text in resp["error"]["description"], resp


# ---- finding 2: restore writes files anywhere -------------------------------------------

@pytest.mark.parametrize("where", ["relative", "absolute", "long"])
def test_a_consumer_name_never_becomes_a_path_into_another_account(setup, where):
    """B restores an archive whose consumer is named after A's stream directory, its
    configuration carrying a stream's ``max_msgs: 1``: refused as a name (nats-server:
    10052 inside 10062), A's files stay as they were, before and after a restart, and
    A's next publish deletes nothing."""
    async def main():
        await setup.fill_a()
        target = setup.a_stream_dir
        name = {"relative": "../../../../A/streams/S", "absolute": target,
                "long": os.path.join(target, "x" * 300)}[where]
        before = store_files(setup.store)
        nc = await connect(setup.server, "b")
        cfg = stream_cfg("R")
        resp = await restore(nc, cfg, setup.archive(cfg, consumers=[
            consumer(name, max_msgs=1)]))
        await nc.close()
        _refused(resp, "failed to add consumer ")
        assert "consumer name can not contain" in resp["error"]["description"]
        assert "Errno" not in text_of(resp) and "File name too long" not in text_of(resp)
        after = store_files(setup.store)
        assert setup.left_over(before, after) == {}
    run(main())
    assert setup.server.alive()
    setup.restart()

    async def later():
        assert await setup.a_state() == (-1, 3)
        nc = await connect(setup.server, "a")
        await nc.jetstream().publish("s.x", b"more")
        await nc.close()
        assert await setup.a_state() == (-1, 4)
    run(later())


def test_restore_holds_consumers_to_the_account_limit(setup):
    """50 consumers into an account limited to 3: nats-server refuses at the fourth
    with 10026 inside the restore error, natsjs the same; no stream is left."""
    async def main():
        nc = await connect(setup.server, "b")
        cfg = stream_cfg("R")
        resp = await restore(nc, cfg, setup.archive(
            cfg, consumers=[consumer("c%d" % i) for i in range(50)]))
        _refused(resp, 'failed to add consumer "c3": maximum consumers limit reached (10026)')
        setup.no_streams_left(await api(nc, "$JS.API.STREAM.NAMES"))
        await nc.close()
    run(main())


def test_restored_message_larger_than_max_payload_is_refused(tmp_path, kind):
    s = Setup(tmp_path, kind, max_payload=1024)
    try:
        async def main():
            nc = await connect(s.server, "b")
            cfg = stream_cfg("R")
            resp = await restore(nc, cfg, s.archive(
                cfg, msgs=[(1, 1, b"r.a", b"", b"x" * 10), (2, 2, b"r.a", b"", b"y" * 2000)]))
            _refused(resp, "message sequence 2 exceeds maximum payload size")
            # The stream's own max_msg_size counts too.
            cfg = stream_cfg("R2", max_msg_size=100)
            resp = await restore(nc, cfg, s.archive(cfg, msgs=[(1, 1, b"r2.a", b"", b"y" * 200)]))
            _refused(resp, "message sequence 1 exceeds maximum message size")
            s.no_streams_left(await api(nc, "$JS.API.STREAM.NAMES"))
            await nc.close()
        run(main())
    finally:
        s.server.stop()


def test_consumer_config_is_checked_like_a_create(tmp_path):
    """A consumer's configuration in the archive meets a create's checks (here a push
    consumer whose deliver subject is a wildcard: 10079 inside the restore error)."""
    setup = Setup(tmp_path, "natsjs")

    async def main():
        nc = await connect(setup.server, "b")
        cfg = stream_cfg("R")
        resp = await restore(nc, cfg, setup.archive(cfg, consumers=[
            consumer("p", deliver_subject="d.*", ack_policy="none")]))
        _refused(resp, 'failed to add consumer "p": ')
        assert "(10079)" in resp["error"]["description"]
        # A consumer whose record is named differently from its configuration.
        resp = await restore(nc, cfg, setup.archive(cfg, consumers=[
            dict(consumer("p"), name="q")]))
        _refused(resp, "names another consumer")
        await nc.close()
    try:
        run(main())
    finally:
        setup.server.stop()


# ---- finding 4: a crafted restore kills the server ---------------------------------------

CRAFTED = {
    # nats-server 2.15.1 stores each of these (its sequence index is sparse); natsjs's
    # store indexes every sequence from the first message to the last, so it refuses.
    "top sequence": (dict(msgs=[(2 ** 64 - 1, 1, b"r.a", b"", b"x")], first_seq=1),
                     "out of range"),
    "huge last_seq": (dict(msgs=[(1, 1, b"r.a", b"", b"x")], last_seq=2 ** 62),
                      "sequence gap too large"),
    "far message": (dict(msgs=[(1, 1, b"r.a", b"", b"x"), (2 ** 40, 2, b"r.a", b"", b"x")],
                         last_seq=2 ** 40), "sequence gap too large"),
    "sequence below first": (dict(msgs=[(3, 1, b"r.a", b"", b"x")], first_seq=2 ** 40,
                                  last_seq=2 ** 40 + 5), "out of range"),
    "out of order": (dict(msgs=[(5, 1, b"r.a", b"", b"x"), (4, 1, b"r.b", b"", b"x")],
                          first_seq=1, last_seq=5), "message sequence 4 out of order"),
    # nats-server stores these too; a subject is a protocol line's token.
    "CR/LF subject": (dict(msgs=[(1, 1, b"r.a\r\nMSG forged 1 2\r\nhi", b"", b"x")]),
                      "message sequence 1 has an invalid subject"),
    "wildcard subject": (dict(msgs=[(1, 1, b"r.*", b"", b"x")]), "invalid subject"),
    "not UTF-8 subject": (dict(msgs=[(1, 1, b"r.\xff", b"", b"x")]), "invalid subject"),
    "negative time": (dict(msgs=[(1, -2 ** 63, b"r.a", b"", b"x")]), "invalid timestamp"),
    "CR/LF consumer": (dict(consumers=[consumer("a\r\nb")]), "consumer name can not contain"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_archive_is_refused_and_the_server_stays_up(tmp_path, case):
    kw, text = CRAFTED[case]
    s = Setup(tmp_path, "natsjs")
    try:
        async def main():
            nc = await connect(s.server, "b")
            cfg = stream_cfg("R")
            resp = await restore(nc, cfg, natsjs_archive(cfg, **kw))
            _refused(resp, text)
            assert s.store not in text_of(resp)
            await nc.close()
        run(main())
        assert s.server.alive()
        s.restart()

        async def after():
            nc = await connect(s.server, "b")
            assert not (await api(nc, "$JS.API.STREAM.NAMES")).get("streams")
            await nc.close()
        run(after())
    finally:
        s.server.stop()


def test_crlf_consumer_name_on_the_reference(tmp_path):
    """What nats-server answers for the CR/LF consumer name (natsjs: the same words)."""
    s = Setup(tmp_path, "reference")
    try:
        async def main():
            nc = await connect(s.server, "b")
            cfg = stream_cfg("R")
            resp = await restore(nc, cfg, s.archive(cfg, consumers=[consumer("a\r\nb")]))
            _refused(resp, 'failed to add consumer "a\\r\\nb": consumer name can not contain')
            await nc.close()
        run(main())
    finally:
        s.server.stop()


def test_restored_subject_never_reaches_a_client_raw(tmp_path):
    """A message whose subject carries CR/LF and a push consumer that would deliver
    it: the restore is refused, and a raw client subscribed to the deliver subject
    sees no forged protocol line."""
    s = Setup(tmp_path, "natsjs")
    try:
        async def main():
            reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
            await reader.readline()                      # INFO
            writer.write(b'CONNECT {"verbose":false,"user":"b","pass":"b"}\r\n'
                         b"SUB dl 1\r\nSUB forged 2\r\nPING\r\n")
            assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"PONG\r\n"
            nc = await connect(s.server, "b")
            cfg = stream_cfg("R")
            forged = b"r.a 2 1\r\nMSG forged 2 6\r\nFORGED\r\nMSG r.b"
            resp = await restore(nc, cfg, natsjs_archive(
                cfg, msgs=[(1, 1, forged, b"", b"x")],
                consumers=[consumer("p", deliver_subject="dl", ack_policy="none",
                                    durable_name="p")]))
            _refused(resp, "invalid subject")
            await nc.close()
            writer.write(b"PING\r\n")
            lines = []
            while True:
                line = await asyncio.wait_for(reader.readline(), TIMEOUT)
                if line == b"PONG\r\n":
                    break
                lines.append(line)
            assert not any(ln.startswith(b"MSG forged") for ln in lines), lines
            writer.close()
        run(main())
        assert s.server.alive()
    finally:
        s.server.stop()


# ---- mutated archives -------------------------------------------------------------------

# A short run in CI; NATSJS_HOSTILE_EXAMPLES=2000 for a long one.
EXAMPLES = int(os.environ.get("NATSJS_HOSTILE_EXAMPLES", "30"))

_CONSUMER_FIELDS = ["durable_name", "name", "deliver_subject", "filter_subject",
                    "filter_subjects", "ack_policy", "deliver_policy", "max_ack_pending",
                    "num_replicas", "backoff", "metadata", "opt_start_seq", "direct",
                    "mem_storage", "inactive_threshold"]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 65, 2 ** 65) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=6)
_SEQ = st.integers(0, 2 ** 64 - 1) | st.integers(0, 12)
MUTATION = st.one_of(
    st.tuples(st.just("consumer_name"), st.text(max_size=300)
              | st.sampled_from(["..", "../../A", "/", "a/b", "a\r\nb", "x" * 256])),
    st.tuples(st.just("consumer_field"), st.sampled_from(_CONSUMER_FIELDS), _JSON),
    st.tuples(st.just("consumer_state"), st.sampled_from(["sseq", "dseq", "asflr", "adflr",
                                                          "pending", "rdc"]), _JSON),
    st.tuples(st.just("consumer_bytes"), st.integers(0, 400), st.binary(max_size=8)),
    st.tuples(st.just("seq"), st.integers(0, 4), _SEQ),
    st.tuples(st.just("ts"), st.integers(0, 4), st.integers(-2 ** 63, 2 ** 63 - 1)),
    st.tuples(st.just("subject"), st.integers(0, 4), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("size"), st.integers(0, 4), st.integers(0, 100_000)),
    st.tuples(st.just("bounds"), _SEQ, _SEQ),
    st.tuples(st.just("meta_bytes"), st.integers(0, 300), st.binary(max_size=8)),
    st.tuples(st.just("truncate"), st.integers(0, 4000)),
    st.tuples(st.just("random_bytes"), st.integers(0, 4000), st.binary(min_size=1, max_size=8)),
)


def _splice(data: bytes, at: int, new: bytes) -> bytes:
    at = min(at, len(data))
    return data[:at] + new + data[at + len(new):]


def mutated_archive(cfg: dict, muts: list) -> bytes:
    """A valid archive of five messages and two consumers, then ``muts`` applied:
    content changes keep checksums and the digest right, byte changes do not."""
    msgs = [[i, 1000 + i, b"%s.%d" % (cfg["name"].lower().encode(), i), b"", b"m%d" % i]
            for i in range(1, 6)]
    cons = [consumer("d"), consumer("p", deliver_subject="dl.p", ack_policy="none",
                                   durable_name="p")]
    bounds = {}
    cbytes = None
    mbytes = None
    for m in muts:
        op = m[0]
        if op == "consumer_name":
            cons[0]["name"] = m[1]
            cons[0]["config"]["durable_name"] = m[1]
        elif op == "consumer_field":
            cons[0]["config"][m[1]] = m[2]
        elif op == "consumer_state":
            cons[0]["state"][m[1]] = m[2]
        elif op == "consumer_bytes":
            cbytes = (m[1], m[2])
        elif op == "seq":
            msgs[m[1]][0] = m[2]
        elif op == "ts":
            msgs[m[1]][1] = m[2]
        elif op == "subject":
            msgs[m[1]][2] = m[2]
        elif op == "size":
            msgs[m[1]][4] = b"z" * m[2]
        elif op == "bounds":
            bounds = {"first_seq": m[1], "last_seq": m[2]}
        elif op == "meta_bytes":
            mbytes = (m[1], m[2])
    kw = dict(bounds)
    if not bounds:
        kw = {"first_seq": 1, "last_seq": max(5, max(min(x[0], 2 ** 64 - 1) for x in msgs))}
    consumers = [_js(c) for c in cons]
    if cbytes:
        consumers[0] = _splice(consumers[0], cbytes[0], cbytes[1])
    recs = archive_records(cfg, [tuple(x) for x in msgs], consumers, **kw)
    if mbytes:
        kind, payload = recs[0][:1], recs[0][5:-4]
        recs[0] = _record(kind, _splice(payload, mbytes[0], mbytes[1]))
    raw = seal(recs)
    for m in muts:
        if m[0] == "truncate":
            raw = raw[:m[1]]
        elif m[0] == "random_bytes":
            raw = _splice(raw, m[1], m[2])
    return S2Writer("fast").compress(raw)


def test_mutated_archives_are_answered_and_the_server_restarts(tmp_path):
    """Valid archives with names, sequences, subjects, sizes, bounds, state and bytes
    changed, cut short or overwritten: each restore is answered (an error or a
    stream), nothing is written outside the new stream's own directory, the server
    stays up, and it starts again afterwards with every restored stream."""
    s = Setup(tmp_path, "natsjs")
    run(s.fill_a())
    names = itertools.count()
    made = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(muts=st.lists(MUTATION, min_size=1, max_size=3))
    def one(muts):
        name = "R%d" % next(names)
        cfg = stream_cfg(name)
        archive = mutated_archive(cfg, muts)
        before = store_files(s.store)

        async def main():
            nc = await connect(s.server, "b")
            resp = await restore(nc, cfg, archive)
            if "error" not in resp:
                info = await api(nc, "$JS.API.STREAM.INFO." + name)
                assert "error" not in info, info
                for c in (await api(nc, "$JS.API.CONSUMER.NAMES." + name))["consumers"]:
                    ci = await api(nc, "$JS.API.CONSUMER.INFO.%s.%s" % (name, c))
                    assert "error" not in ci, ci
            await nc.close()
            return resp
        resp = run(main())
        assert resp["type"] == T + "stream_create_response", resp
        assert s.server.alive(), s.server.text()[-3000:]
        assert s.store not in text_of(resp)
        own = os.path.join("jetstream", "B", "streams", name) + os.sep
        after = store_files(s.store)
        outside = {k for k, v in after.items()
                   if before.get(k) != v and not k.startswith(own)}
        assert not outside, (resp, outside)
        if "error" in resp:
            assert not any(k.startswith(own) for k in after), resp
        else:
            made.append(name)

    try:
        one()
        s.restart()

        async def after():
            assert await s.a_state() == (-1, 3)
            nc = await connect(s.server, "b")
            got = (await api(nc, "$JS.API.STREAM.NAMES")).get("streams") or []
            await nc.close()
            assert sorted(got) == sorted(made)
        run(after())
    finally:
        s.server.stop()
