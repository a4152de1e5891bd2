"""JetStream API, differential: every scenario against nats-server and against natsjs.

Each scenario (an ``async def`` below, registered with ``@scenario``) runs against a
fresh server started with ``-js -sd <tmp>``; tests/jsdiff.py records and normalizes what
came back, and the comparison test asserts natsjs's transcript equals the reference's.

- ``test_reference_transcript_is_stable``: each scenario twice against the reference;
  the two normalized transcripts must be equal (so the normalizer hides exactly what
  varies from run to run) and must show that the server answered. With
  ``JSDIFF_CAPTURE=DIR`` it also writes ``DIR/<scenario>.json``.
- ``test_natsjs_matches_reference``: skipped while natsjs's INFO has no ``jetstream``
  (natsjs does not implement JetStream yet); runs by itself once it does.

Capture without pytest: ``python tests/test_js_api_diff.py --capture DIR [--target
natsjs] [scenario ...]``.
"""
from __future__ import annotations

import base64
import functools
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsdiff  # noqa: E402
from jsdiff import Scenario, compare, run_scenario, write_transcript  # noqa: E402

API = "$JS.API."
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn=None, *, args=(), reference_loses=()):
    """Register ``fn`` as a scenario named after it; its docstring says what it shows.
    ``reference_loses``: see jsdiff.Scenario."""
    if fn is None:
        return functools.partial(scenario, args=args, reference_loses=reference_loses)
    name = fn.__name__
    SCENARIOS[name] = Scenario(name, fn, (fn.__doc__ or "").strip(), tuple(args),
                               tuple(reference_loses))
    return fn


# -- small vocabulary ---------------------------------------------------------------------

def api(s, what: str, body=None, **kw):
    return s.request(API + what, body, **kw)


async def add_stream(s, name: str, note: str | None = None, **cfg):
    return await api(s, "STREAM.CREATE." + name, {"name": name, **cfg}, note=note)


async def add_consumer(s, stream: str, name: str | None = None, note: str | None = None,
                       **cfg):
    """CONSUMER.CREATE.<stream>[.<name>] with ``cfg`` as the config."""
    subject = "CONSUMER.CREATE.%s" % stream + (".%s" % name if name else "")
    if name:
        cfg.setdefault("durable_name", name)
    return await api(s, subject, {"stream_name": stream, "config": cfg}, note=note)


async def consumer_action(s, stream: str, name: str, action: str, note: str, **cfg):
    """CONSUMER.CREATE.<stream>.<name> with an ``action`` (create, update, or a bad one)."""
    return await api(s, "CONSUMER.CREATE.%s.%s" % (stream, name),
                     {"stream_name": stream, "action": action,
                      "config": {"durable_name": name, **cfg}}, note=note)


async def stream_with(s, name: str, subject: str, count: int, **cfg):
    """A stream on ``subject`` holding ``count`` messages b"0", b"1", ..."""
    await add_stream(s, name, subjects=[subject], **cfg)
    for i in range(count):
        await pub(s, subject, b"%d" % i)


async def pub(s, subject: str, data=b"", headers=None, note: str | None = None):
    """A JetStream publish that waits for its PubAck (or error, or no responders)."""
    return await s.request(subject, data, headers=headers, note=note)


async def pull(s, stream: str, consumer: str, body, count: int, note: str | None = None,
               timeout: float = jsdiff.WAIT):
    return await s.requests(API + "CONSUMER.MSG.NEXT.%s.%s" % (stream, consumer), body,
                            count=count, note=note, timeout=timeout)


async def consumer_info(s, stream: str, consumer: str, note: str | None = None):
    return await api(s, "CONSUMER.INFO.%s.%s" % (stream, consumer), note=note)


async def ack(s, msg, body: bytes = b"+ACK", note: str | None = None):
    """An ack sent as a request: the server answers an ack that has a reply subject
    (server/consumer.go processAck), which also orders it before the next step."""
    return await s.request(msg.reply, body, note=note, timeout=1.0)


# -- $JS.API.INFO ----------------------------------------------------------------------------

@scenario
async def account_info(s):
    """$JS.API.INFO on an empty account, then with a stream, messages and a consumer: the
    usage numbers (storage counts stored record sizes) and the api counters."""
    await api(s, "INFO")
    await add_stream(s, "S", subjects=["s.>"])
    await add_stream(s, "M", subjects=["m"], storage="memory")
    await pub(s, "s.1", b"hello")
    await pub(s, "m", b"in memory", headers={"h": "v"})
    await add_consumer(s, "S", "C", ack_policy="explicit")
    await api(s, "STREAM.INFO.NOPE", note="an error counts in api.errors")
    await api(s, "INFO", note="after: streams, consumers, memory, storage, api counters")
    await api(s, "INFO", b"{}", note="a body is ignored")


# -- STREAM.CREATE ---------------------------------------------------------------------------

@scenario
async def stream_create_minimal(s):
    """Name and subjects only: the defaults the server fills in, the same request again
    (idempotent), and then the same name with another config."""
    await add_stream(s, "ORDERS", subjects=["orders.*"])
    await add_stream(s, "ORDERS", subjects=["orders.*"], note="same config again")
    await add_stream(s, "ORDERS", subjects=["orders.*"], max_msgs=10,
                     note="same name, other config")
    await api(s, "STREAM.CREATE.ORDERS",
              {"name": "ORDERS", "subjects": ["orders.*"], "retention": "limits",
               "max_consumers": -1, "max_msgs": -1, "max_bytes": -1, "max_age": 0,
               "max_msgs_per_subject": -1, "max_msg_size": -1, "discard": "old",
               "storage": "file", "num_replicas": 1, "duplicate_window": 120000000000},
              note="the same config with its defaults spelled out")
    await api(s, "STREAM.INFO.ORDERS")


@scenario
async def stream_create_default_subjects(s):
    """No subjects: the stream listens on its own name."""
    await add_stream(s, "EVENTS")
    await pub(s, "EVENTS", b"x")
    await api(s, "STREAM.CREATE.EMPTYLIST", {"name": "EMPTYLIST", "subjects": []},
              note="an empty list too")
    await api(s, "STREAM.CREATE.NOBODY", note="no body at all")
    await api(s, "STREAM.CREATE.NONAME", {"subjects": ["nn"]},
              note="name only in the subject")
    await api(s, "STREAM.NAMES")


@scenario
async def stream_create_all_fields(s):
    """Every stream config field set to a non-default value that a single server takes."""
    await add_stream(
        s, "FULL", description="every field", subjects=["full.>", "other"],
        retention="limits", max_consumers=10, max_msgs=1000, max_bytes=1 << 20,
        max_age=3600 * 10**9, max_msgs_per_subject=5, max_msg_size=4096, discard="new",
        storage="memory", num_replicas=1, no_ack=False, duplicate_window=60 * 10**9,
        compression="none", first_seq=100, allow_direct=True, mirror_direct=False,
        sealed=False, deny_delete=True, deny_purge=False, allow_rollup_hdrs=True,
        discard_new_per_subject=True,
        consumer_limits={"inactive_threshold": 30 * 10**9, "max_ack_pending": 100},
        allow_msg_ttl=True, subject_delete_marker_ttl=5 * 10**9,
        metadata={"owner": "team-a", "tier": "gold"},
        subject_transform={"src": "full.>", "dest": "t.full.>"},
        republish={"src": ">", "dest": "rp.>", "headers_only": True})
    await add_stream(s, "FILEZ", subjects=["fz"], storage="file", compression="s2",
                     retention="workqueue", no_ack=True, placement={"tags": []},
                     note="file storage with s2, workqueue, no_ack")
    await add_stream(s, "INTEREST", subjects=["int.>"], retention="interest",
                     allow_msg_counter=False, allow_atomic=True, allow_msg_schedules=True,
                     note="newer flags: they raise _nats.req.level")
    await add_stream(s, "ASYNC", subjects=["async"], persist_mode="async",
                     note="async persist mode")
    await add_stream(s, "ASYNCATOMIC", subjects=["aa"], persist_mode="async", allow_atomic=True,
                     note="async persist with atomic publish")
    await add_stream(s, "ROLLNOPURGE", subjects=["rnp"], allow_rollup_hdrs=True, deny_purge=True,
                     note="rollups need purge")
    await add_stream(s, "COUNTER", subjects=["cnt"], allow_msg_counter=True,
                     note="a counter stream")
    await api(s, "STREAM.INFO.FULL")


@scenario
async def stream_create_bad_json(s):
    """Bodies that are not a stream config: syntax errors, unknown fields, wrong types."""
    subject = API + "STREAM.CREATE.BAD"
    for body, note in [
        (b"{", "truncated"),
        (b"not json", "not JSON"),
        (b"[]", "an array"),
        (b"\"BAD\"", "a string"),
        (b'{"name":"BAD","bogus":1}', "unknown field"),
        (b'{"name":"BAD","subjects":"bad.x"}', "subjects as a string"),
        (b'{"name":"BAD","max_msgs":"10"}', "number as a string"),
        (b'{"name":"BAD","max_msgs":1.5}', "a fraction"),
        (b'{"name":"BAD","max_age":"1h"}', "duration as a string"),
        (b'{"name":"BAD","max_msg_size":5000000000}', "int32 overflow"),
        (b'{"name":"BAD","num_replicas":null}', "null (taken: this creates BAD)"),
        (b'{"name":"BAD","sealed":"yes"}', "bool as a string"),
        (b'{"name":"BAD","retention":"forever"}', "unknown retention"),
        (b'{"name":"BAD","storage":"disk"}', "unknown storage"),
        (b'{"name":"BAD","discard":"newest"}', "unknown discard"),
        (b'{"name":"BAD","compression":"gzip"}', "unknown compression"),
        (b'{"name":"BAD","Retention":"interest"}',
         "field name in another case (a different config than BAD's now)"),
        (b'{"name":"BAD","subjects":["bad"]} trailing', "trailing bytes"),
    ]:
        await s.request(subject, body, note=note)
    await api(s, "INFO", note="api.errors counted all of them")


@scenario
async def stream_create_invalid_names(s):
    """Names the server refuses, in the body and in the subject."""
    for name in ["a*", "a>", "a/b", "a\\b", "x" * 256, "*", ">"]:
        await api(s, "STREAM.CREATE." + name, {"name": name}, note="name %r" % name)
    for name in ["a b", "a\tb", ""]:
        await api(s, "STREAM.CREATE.OK", {"name": name},
                  note="name %r cannot be a subject token" % name)
    await api(s, "STREAM.CREATE.a.b", {"name": "a.b"}, timeout=1,
              note="a dot makes two tokens: no handler, no answer")
    await api(s, "STREAM.CREATE.A", {"name": "B"}, note="subject and body disagree")
    await add_stream(s, "x" * 255, note="255 characters")


@scenario
async def stream_create_subject_conflicts(s):
    """Subjects that overlap another stream or the system's, and invalid subjects."""
    await add_stream(s, "A", subjects=["foo.*", "bar"])
    await add_stream(s, "B", subjects=["foo.x"], note="inside A's wildcard")
    await add_stream(s, "C", subjects=[">"], note="everything")
    await add_stream(s, "D", subjects=["bar"], note="the same literal")
    await add_stream(s, "E", subjects=["baz", "baz"], note="duplicate within the stream")
    await add_stream(s, "F", subjects=["q.*", "q.>"], note="overlapping within the stream")
    await add_stream(s, "CNA", subjects=[">"], no_ack=True, note="everything, without acks")
    # A stream that is created is deleted at once: one on _INBOX.> or $JS.API.> would
    # store the replies and requests of the steps after it. ($JS.EVENT.METRIC.> rather
    # than $JS.EVENT.>: the latter may or may not catch the stream's own create
    # advisory before the reply is made.)
    for i, subj in enumerate(["$JS.API.>", "$JS.API.STREAM.INFO.X", "$JS.>", "$JSC.>",
                              "$SYS.>", "$NRG.>", "_INBOX.>", "$JS.ACK.>", "$KV.x.>",
                              "$JS.EVENT.METRIC.>", "*.API.>", "$JS.API.>"]):
        r = await add_stream(s, "R%d" % i, subjects=[subj], no_ack=(i == 11),
                             note="reserved? %s" % subj + (" (no_ack)" if i == 11 else ""))
        if r is not None and isinstance(r.json, dict) and "error" not in r.json:
            await api(s, "STREAM.DELETE.R%d" % i)
    for i, subj in enumerate(["a..b", "a.", ".a", "a b", "*.>.x", "", "a.>.>"]):
        await add_stream(s, "V%d" % i, subjects=[subj], note="invalid subject %r" % subj)


@scenario
async def stream_create_limits_combinations(s):
    """Combinations of limits the server checks against each other."""
    await add_stream(s, "REP", subjects=["rep"], num_replicas=3, note="R3 on one server")
    await add_stream(s, "REP0", subjects=["rep0"], num_replicas=0, note="R0 means R1")
    await add_stream(s, "DUP", subjects=["dup"], max_age=10**9, duplicate_window=2 * 10**9,
                     note="duplicate window longer than max age")
    await add_stream(s, "DUPOK", subjects=["dupok"], max_age=10**9,
                     note="max age shorter than the default window")
    await add_stream(s, "DNP", subjects=["dnp"], discard_new_per_subject=True,
                     note="discard new per subject without discard new")
    await add_stream(s, "DNP2", subjects=["dnp2"], discard="new", discard_new_per_subject=True,
                     note="discard new per subject without max msgs per subject")
    await add_stream(s, "DNP3", subjects=["dnp3"], discard="new", discard_new_per_subject=True,
                     max_msgs_per_subject=1, note="all three")
    await add_stream(s, "NEG", subjects=["neg"], max_msgs=-5, note="negative max_msgs")
    await add_stream(s, "ZERO", subjects=["zero"], max_msgs=0, max_bytes=0,
                     max_msgs_per_subject=0, max_consumers=0, note="zeros")
    await add_stream(s, "MAXAGE", subjects=["ma"], max_age=-1, note="negative max_age")
    await add_stream(s, "SMALLAGE", subjects=["sa"], max_age=10**6, note="1ms max_age")
    await add_stream(s, "TTLNO", subjects=["tn"], subject_delete_marker_ttl=10**9,
                     note="delete marker ttl without allow_msg_ttl")
    await add_stream(s, "TTLSMALL", subjects=["ts"], allow_msg_ttl=True,
                     subject_delete_marker_ttl=10**6, note="delete marker ttl below 1s")
    await add_stream(s, "WQDN", subjects=["wq"], retention="workqueue", discard="new",
                     max_msgs=1, note="workqueue with discard new")
    await add_stream(s, "MIRROR", mirror={"name": "NOPE"}, subjects=["m"],
                     note="a mirror with subjects")
    await add_stream(s, "SEALED", subjects=["sealed"], sealed=True, note="sealed on create")
    await add_stream(s, "DEL", subjects=["del"], max_msg_size=2 * 1024 * 1024,
                     note="max_msg_size above max_payload")


@scenario
async def api_unknown_subjects(s):
    """Subjects under $JS.API that no handler takes: the API's subscription covers all of
    $JS.API.>, so there are responders, but nothing answers."""
    for what in ["BOGUS", "STREAM.CREATE", "STREAM.INFO.A.B", "CONSUMER.INFO.S", "INFO.X"]:
        await api(s, what, timeout=0.5)
    await api(s, "INFO", note="which of them counted")


# -- STREAM.INFO -----------------------------------------------------------------------------

@scenario
async def stream_info(s):
    """STREAM.INFO plain, with subjects_filter (and its paging), deleted_details, on a
    stream that has deletes, and for a missing stream."""
    await add_stream(s, "S", subjects=["s.>"])
    for i in range(1, 8):
        await pub(s, "s.%d" % (i % 3), b"m%d" % i)
    await api(s, "STREAM.MSG.DELETE.S", {"seq": 2})
    await api(s, "STREAM.MSG.DELETE.S", {"seq": 4})
    await api(s, "STREAM.INFO.S")
    await api(s, "STREAM.INFO.S", {"subjects_filter": ">"})
    await api(s, "STREAM.INFO.S", {"subjects_filter": "s.1"})
    await api(s, "STREAM.INFO.S", {"subjects_filter": "nomatch"})
    await api(s, "STREAM.INFO.S", {"subjects_filter": ">", "offset": 1})
    await api(s, "STREAM.INFO.S", {"deleted_details": True})
    await api(s, "STREAM.INFO.S", {"deleted_details": True, "subjects_filter": "s.*"})
    await api(s, "STREAM.INFO.S", b"{bad", note="bad JSON")
    await api(s, "STREAM.INFO.S", {"bogus": 1}, note="unknown field")
    await api(s, "STREAM.INFO.NOPE")


# -- STREAM.UPDATE ---------------------------------------------------------------------------

@scenario
async def stream_update(s):
    """Changes STREAM.UPDATE takes and the ones it refuses. Each update sends the config
    as last accepted plus one change, as a client editing a stream would."""
    await add_stream(s, "U", subjects=["u.*"], max_msgs=100)
    base = {"name": "U", "subjects": ["u.*"], "max_msgs": 100}

    async def update(note, **change):
        r = await api(s, "STREAM.UPDATE.U", {**base, **change}, note=note)
        if r is not None and isinstance(r.json, dict) and "error" not in r.json:
            base.update(change)

    await update("description and limits", description="updated", max_msgs=5, max_bytes=4096,
                 max_age=60 * 10**9, max_msgs_per_subject=2, discard="new",
                 duplicate_window=10 * 10**9)
    await update("add a subject", subjects=["u.*", "v"])
    await api(s, "STREAM.UPDATE.U", {"name": "U", "subjects": ["u.*"]},
              note="only name and subjects: everything else back to defaults")
    base = {"name": "U", "subjects": ["u.*"]}
    await update("storage", storage="memory")
    await update("retention to workqueue", retention="workqueue")
    await update("retention to interest", retention="interest")
    await update("replicas", num_replicas=3)
    await update("max_consumers", max_consumers=5)
    await update("allow_direct and rollup", allow_direct=True, allow_rollup_hdrs=True)
    await update("first_seq", first_seq=10)
    await update("compression", compression="s2")
    await update("metadata", metadata={"k": "v"})
    await update("mirror", mirror={"name": "X"})
    await update("deny_delete", deny_delete=True)
    await update("deny_delete off again", deny_delete=False)
    await update("deny_purge", deny_purge=True)
    await update("deny_purge off again", deny_purge=False)
    await update("allow_msg_ttl on", allow_msg_ttl=True)
    await update("allow_msg_ttl off again", allow_msg_ttl=False)
    await api(s, "STREAM.UPDATE.U", {"name": "V", "subjects": ["u.*"]}, note="other name")
    await api(s, "STREAM.UPDATE.NOPE", {"name": "NOPE"}, note="missing stream")
    await api(s, "STREAM.UPDATE.U", b"{", note="bad JSON")
    await add_stream(s, "W", subjects=["w"])
    await update("take another stream's subject", subjects=["u.*", "w"])
    await update("sealed", sealed=True)
    await update("unseal", sealed=False)
    await api(s, "STREAM.INFO.U")
    await pub(s, "u.1", b"sealed?", note="publish to a sealed stream")
    await api(s, "STREAM.PURGE.U", note="purge a sealed stream")
    await api(s, "STREAM.MSG.DELETE.U", {"seq": 1}, note="delete from a sealed stream")


# -- STREAM.NAMES / STREAM.LIST ---------------------------------------------------------------

@scenario
async def stream_names_and_list(s):
    """STREAM.NAMES and STREAM.LIST: paging with offset and the subject filter."""
    await api(s, "STREAM.NAMES", note="none yet")
    await api(s, "STREAM.LIST", note="none yet")
    for name, subjects in [("B", ["b.*"]), ("A", ["a.>"]), ("C", ["c", "shared.c"]),
                           ("D", ["d"])]:
        await add_stream(s, name, subjects=subjects)
    await pub(s, "a.x", b"1")
    await api(s, "STREAM.NAMES")
    await api(s, "STREAM.NAMES", {"offset": 2})
    await api(s, "STREAM.NAMES", {"offset": 10})
    await api(s, "STREAM.NAMES", {"subject": "a.x"})
    await api(s, "STREAM.NAMES", {"subject": "shared.*"})
    await api(s, "STREAM.NAMES", {"subject": ">"})
    await api(s, "STREAM.NAMES", {"subject": "nomatch"})
    await api(s, "STREAM.LIST")
    await api(s, "STREAM.LIST", {"offset": 3})
    await api(s, "STREAM.LIST", {"subject": "b.1"})
    await api(s, "STREAM.NAMES", b"{", note="bad JSON")
    await api(s, "STREAM.NAMES", {"limit": 1}, note="limit is not a request field")


# -- STREAM.PURGE / STREAM.DELETE -------------------------------------------------------------

@scenario
async def stream_purge(s):
    """Purge everything, by subject filter, up to a sequence, keeping N, filter+keep."""
    await add_stream(s, "P", subjects=["p.*"])

    async def fill(n=10):
        for i in range(n):
            await pub(s, "p.%s" % "abc"[i % 3], b"%d" % i)

    await fill()
    await api(s, "STREAM.PURGE.P")
    await api(s, "STREAM.INFO.P")
    await fill()
    await api(s, "STREAM.PURGE.P", {"filter": "p.a"})
    await api(s, "STREAM.PURGE.P", {"seq": 16})
    await api(s, "STREAM.INFO.P")
    await api(s, "STREAM.PURGE.P", {"keep": 2})
    await fill()
    await api(s, "STREAM.PURGE.P", {"filter": "p.b", "keep": 1})
    await api(s, "STREAM.PURGE.P", {"filter": "p.*", "seq": 28})
    await api(s, "STREAM.PURGE.P", {"seq": 5, "keep": 1}, note="seq and keep together")
    await api(s, "STREAM.PURGE.P", {"filter": "q.>"}, note="filter outside the stream")
    await api(s, "STREAM.PURGE.P", b"{", note="bad JSON")
    await api(s, "STREAM.INFO.P")
    await api(s, "STREAM.PURGE.NOPE")
    await add_stream(s, "DP", subjects=["dp"], deny_purge=True)
    await api(s, "STREAM.PURGE.DP", note="deny_purge")


@scenario
async def stream_delete(s):
    """STREAM.DELETE, again, and what is left."""
    await add_stream(s, "D", subjects=["d"])
    await pub(s, "d", b"x")
    await add_consumer(s, "D", "C")
    await api(s, "STREAM.DELETE.D")
    await api(s, "STREAM.DELETE.D", note="again")
    await api(s, "STREAM.INFO.D")
    await api(s, "CONSUMER.INFO.D.C")
    await pub(s, "d", b"after", note="nobody stores it now")
    await api(s, "STREAM.DELETE.D", {"bogus": 1}, note="a body is ignored?")
    await api(s, "INFO")


# -- STREAM.MSG.GET / STREAM.MSG.DELETE ----------------------------------------------------

@scenario
async def stream_msg_get(s):
    """STREAM.MSG.GET by sequence, last by subject, next by subject, and misses."""
    await add_stream(s, "G", subjects=["g.*"])
    await pub(s, "g.a", b"one")
    await pub(s, "g.b", b"two", headers={"X-Key": "v", "Nats-Msg-Id": "id2"})
    await pub(s, "g.a", b"three")
    await pub(s, "g.c", b"")
    get = lambda body, note=None: api(s, "STREAM.MSG.GET.G", body, note=note)  # noqa: E731
    await get({"seq": 1})
    await get({"seq": 2}, "with headers: hdrs is base64")
    await get({"seq": 4}, "empty payload")
    await get({"last_by_subj": "g.a"})
    await get({"last_by_subj": "g.*"}, "wildcard last")
    await get({"next_by_subj": "g.a", "seq": 2})
    await get({"next_by_subj": "g.a"}, "next without seq starts at 0")
    await get({"seq": 99}, "past the end")
    await get({"seq": 0}, "zero")
    await get({"last_by_subj": "g.z"}, "no such subject")
    await get({"next_by_subj": "g.b", "seq": 3}, "none after")
    await get({"seq": 1, "last_by_subj": "g.a"}, "two ways at once")
    await get({}, "nothing asked")
    await get(None, "no body")
    await get(b"{", "bad JSON")
    await api(s, "STREAM.MSG.DELETE.G", {"seq": 1})
    await get({"seq": 1}, "deleted")
    await get({"next_by_subj": "g.a", "seq": 1}, "skips the deleted one")
    await api(s, "STREAM.MSG.GET.NOPE", {"seq": 1})


@scenario
async def stream_msg_delete(s):
    """STREAM.MSG.DELETE with and without no_erase, misses, and deny_delete."""
    await stream_with(s, "X", "x", 5)
    delete = lambda body, note=None: api(s, "STREAM.MSG.DELETE.X", body, note=note)  # noqa
    await delete({"seq": 2})
    await delete({"seq": 3, "no_erase": True})
    await delete({"seq": 2}, "again")
    await delete({"seq": 99}, "past the end")
    await delete({"seq": 0}, "zero")
    await delete({}, "no seq")
    await delete(None, "no body")
    await delete(b"[1]", "bad JSON")
    await delete({"seq": 1}, "first: first_seq moves")
    await api(s, "STREAM.INFO.X", {"deleted_details": True})
    await api(s, "STREAM.MSG.DELETE.NOPE", {"seq": 1})
    await add_stream(s, "DD", subjects=["dd"], deny_delete=True)
    await pub(s, "dd", b"x")
    await api(s, "STREAM.MSG.DELETE.DD", {"seq": 1}, note="deny_delete")


# -- DIRECT.GET ------------------------------------------------------------------------------

@scenario
async def direct_get(s):
    """DIRECT.GET with allow_direct: answers are the message itself with Nats-* headers,
    misses are status messages; batches end with an EOB status."""
    await add_stream(s, "D", subjects=["d.*"], allow_direct=True)
    await pub(s, "d.a", b"one")
    await pub(s, "d.b", b"two", headers={"X-Key": "v"})
    await pub(s, "d.a", b"three")
    await pub(s, "d.c", b"four")
    direct = lambda body, note=None, count=1: s.requests(      # noqa: E731
        API + "DIRECT.GET.D", body, count=count, note=note)
    await direct({"seq": 1})
    await direct({"seq": 2}, "with a header of its own")
    await direct({"last_by_subj": "d.a"})
    await direct({"next_by_subj": "d.a", "seq": 2})
    await direct({"seq": 99}, "missing")
    await direct({"last_by_subj": "d.z"}, "missing subject")
    await direct({}, "empty request")
    await direct(None, "no body")
    await direct(b"{", "bad JSON")
    await direct({"seq": 1, "last_by_subj": "d.a"}, "two ways at once")
    await direct({"seq": 1, "batch": 3}, "batch of 3", count=4)
    await direct({"seq": 2, "batch": 10, "next_by_subj": "d.a"}, "batch filtered", count=3)
    await direct({"seq": 1, "batch": 10, "max_bytes": 40}, "batch capped by bytes", count=5)
    await direct({"multi_last": ["d.*"]}, "multi_last", count=5)
    await direct({"multi_last": ["d.a", "d.c"], "up_to_seq": 3}, "multi_last up_to_seq",
                 count=5)
    await direct({"multi_last": ["nomatch"]}, "multi_last none", count=2)
    await s.requests(API + "DIRECT.GET.D.d.a", None, count=1, note="last by subject in subject")
    await s.requests(API + "DIRECT.GET.D.d.z", None, count=1, note="missing, subject form")
    await s.requests(API + "DIRECT.GET.D.d.a", {"seq": 1}, count=1,
                     note="subject form with a body")
    await add_stream(s, "ND", subjects=["nd"])
    await pub(s, "nd", b"x")
    await s.requests(API + "DIRECT.GET.ND", {"seq": 1}, count=1,
                     note="allow_direct off: nobody answers")
    await api(s, "STREAM.MSG.DELETE.D", {"seq": 1})
    await direct({"seq": 1}, "deleted")


# -- publishing --------------------------------------------------------------------------------

@scenario
async def publish_acks(s):
    """PubAck shapes: plain, duplicate by Nats-Msg-Id, every Nats-Expected-* header, and
    nobody listening."""
    await add_stream(s, "P", subjects=["p.*"])
    await pub(s, "p.a", b"1")
    await pub(s, "p.a", b"2", {"Nats-Msg-Id": "m1"})
    await pub(s, "p.a", b"2 again", {"Nats-Msg-Id": "m1"}, note="duplicate")
    await pub(s, "p.b", b"3", {"Nats-Expected-Stream": "P"})
    await pub(s, "p.b", b"x", {"Nats-Expected-Stream": "Q"}, note="wrong stream")
    await pub(s, "p.b", b"4", {"Nats-Expected-Last-Sequence": "3"})
    await pub(s, "p.b", b"x", {"Nats-Expected-Last-Sequence": "1"}, note="wrong last seq")
    await pub(s, "p.b", b"x", {"Nats-Expected-Last-Sequence": "abc"}, note="not a number")
    await pub(s, "p.a", b"5", {"Nats-Expected-Last-Subject-Sequence": "2"})
    await pub(s, "p.a", b"x", {"Nats-Expected-Last-Subject-Sequence": "1"},
              note="wrong last subject seq")
    await pub(s, "p.c", b"6", {"Nats-Expected-Last-Subject-Sequence": "0"},
              note="0: the subject must have no message yet")
    await pub(s, "p.c", b"x", {"Nats-Expected-Last-Subject-Sequence": "0"},
              note="0 again: now it has one")
    await pub(s, "p.a", b"7", {"Nats-Expected-Last-Subject-Sequence": "5",
                               "Nats-Expected-Last-Subject-Sequence-Subject": "p.*"},
              note="last subject seq measured on another subject")
    await pub(s, "p.a", b"8", {"Nats-Expected-Last-Msg-Id": "m1"}, note="last msg id m1? no")
    await pub(s, "p.a", b"9", {"Nats-Msg-Id": "m2"})
    await pub(s, "p.a", b"10", {"Nats-Expected-Last-Msg-Id": "m2", "Nats-Msg-Id": "m3"})
    await pub(s, "p.a", b"x", {"Nats-Expected-Last-Msg-Id": "m2"}, note="now wrong")
    await pub(s, "p.a", b"11", {"Nats-Expected-Stream": "P", "Nats-Expected-Last-Sequence":
                                "10", "Nats-Msg-Id": "m4"}, note="several at once")
    await pub(s, "nobody.here", b"x", note="no stream: no responders")
    await s.publish("p.a", b"no reply", note="no reply subject: stored, nothing answered")
    await pub(s, "p.a", b"12", note="the one before took a sequence")
    await pub(s, "p.a", b"", note="empty payload")
    await api(s, "STREAM.INFO.P")


@scenario
async def publish_limits(s):
    """max_msg_size, discard new when full (msgs, bytes, per subject), discard old."""
    await add_stream(s, "SZ", subjects=["sz"], max_msg_size=10)
    await pub(s, "sz", b"0123456789")
    await pub(s, "sz", b"0123456789x", note="one byte over")
    await pub(s, "sz", b"0123456789", {"k": "v"}, note="headers count?")
    await add_stream(s, "DN", subjects=["dn"], max_msgs=2, discard="new")
    for i in range(3):
        await pub(s, "dn", b"%d" % i)
    await add_stream(s, "DB", subjects=["db"], max_bytes=100, discard="new")
    for i in range(3):
        await pub(s, "db", b"x" * 30)
    await add_stream(s, "DPS", subjects=["dps.*"], max_msgs_per_subject=1, discard="new",
                     discard_new_per_subject=True)
    await pub(s, "dps.a", b"1")
    await pub(s, "dps.b", b"1")
    await pub(s, "dps.a", b"2", note="per subject full")
    await add_stream(s, "DO", subjects=["do"], max_msgs=2)
    for i in range(4):
        await pub(s, "do", b"%d" % i)
    await api(s, "STREAM.INFO.DO")
    await add_stream(s, "PS", subjects=["ps.*"], max_msgs_per_subject=2)
    for i in range(5):
        await pub(s, "ps.%d" % (i % 2), b"%d" % i)
    await api(s, "STREAM.INFO.PS", {"subjects_filter": ">"})


@scenario
async def publish_rollup(s):
    """Nats-Rollup: sub and all where allowed, a bad value, and where not allowed."""
    await add_stream(s, "R", subjects=["r.*"], allow_rollup_hdrs=True)
    for i in range(3):
        await pub(s, "r.a", b"a%d" % i)
        await pub(s, "r.b", b"b%d" % i)
    await pub(s, "r.a", b"roll a", {"Nats-Rollup": "sub"})
    await api(s, "STREAM.INFO.R", {"subjects_filter": ">"})
    await pub(s, "r.b", b"roll all", {"Nats-Rollup": "all"})
    await api(s, "STREAM.INFO.R", {"subjects_filter": ">"})
    await pub(s, "r.a", b"x", {"Nats-Rollup": "everything"}, note="bad value")
    await add_stream(s, "NR", subjects=["nr"])
    await pub(s, "nr", b"x", {"Nats-Rollup": "sub"}, note="rollup not allowed")
    await add_stream(s, "DPR", subjects=["dpr"], allow_rollup_hdrs=True, deny_purge=True)
    await pub(s, "dpr", b"x", {"Nats-Rollup": "sub"}, note="deny_purge stream")


@scenario
async def publish_ttl(s):
    """Nats-TTL with allow_msg_ttl: accepted forms, refused ones, the header on the stored
    message, expiry, and a TTL where the stream does not allow it."""
    await add_stream(s, "T", subjects=["t.*"], allow_msg_ttl=True)
    await pub(s, "t.a", b"1s", {"Nats-TTL": "1s"})
    await pub(s, "t.b", b"never", {"Nats-TTL": "never"})
    await pub(s, "t.c", b"seconds", {"Nats-TTL": "60"})
    await pub(s, "t.c", b"bad", {"Nats-TTL": "soon"}, note="not a duration")
    await pub(s, "t.c", b"zero", {"Nats-TTL": "0s"}, note="zero")
    await pub(s, "t.c", b"short", {"Nats-TTL": "100ms"}, note="below a second")
    await api(s, "STREAM.MSG.GET.T", {"seq": 1})
    await s.poll(API + "STREAM.INFO.T", None,
                 until=lambda r: (r.json or {}).get("state", {}).get("messages") == 2,
                 timeout=10, note="after the 1s TTL ran out")
    await add_stream(s, "NT", subjects=["nt"])
    await pub(s, "nt", b"x", {"Nats-TTL": "1s"}, note="stream does not allow TTLs")


@scenario
async def publish_ttl_delete_markers(s):
    """subject_delete_marker_ttl: when max_age removes the last message of a subject, the
    server stores a marker message with Nats-Marker-Reason."""
    await add_stream(s, "M", subjects=["m.*"], allow_msg_ttl=True, max_age=1 * 10**9,
                     subject_delete_marker_ttl=5 * 10**9)
    await pub(s, "m.a", b"x")
    await s.poll(API + "STREAM.INFO.M", None,
                 until=lambda r: (r.json or {}).get("state", {}).get("first_seq") == 2,
                 timeout=10, note="the message aged out, a marker took its place")
    await api(s, "STREAM.MSG.GET.M", {"seq": 2})


# -- CONSUMER.CREATE ------------------------------------------------------------------------

@scenario
async def consumer_create_durable_pull(s):
    """A durable pull consumer by every subject form: defaults, idempotent create,
    changed config, and the actions."""
    await add_stream(s, "S", subjects=["s.*"])
    await add_consumer(s, "S", "C", ack_policy="explicit")
    await add_consumer(s, "S", "C", ack_policy="explicit", note="same again")
    await add_consumer(s, "S", "C", ack_policy="explicit", max_deliver=3,
                       note="changed: an update")
    await consumer_action(s, "S", "C", "create", ack_policy="explicit",
                          note="action create on an existing one with a different config")
    await consumer_action(s, "S", "C", "create", ack_policy="explicit", max_deliver=3,
                          note="action create with the same config")
    await consumer_action(s, "S", "NEW", "update", note="action update on a missing one")
    await api(s, "CONSUMER.DURABLE.CREATE.S.LEGACY",
              {"stream_name": "S", "config": {"durable_name": "LEGACY",
                                              "ack_policy": "explicit"}},
              note="the old durable subject")
    await api(s, "CONSUMER.CREATE.S.N2", {"stream_name": "S",
                                          "config": {"name": "N2", "ack_policy": "none"}},
              note="name instead of durable_name: not durable")
    await api(s, "CONSUMER.CREATE.S.SUBJ", {"stream_name": "S", "config": {}},
              note="name only in the subject")
    await api(s, "CONSUMER.INFO.S.SUBJ")
    await api(s, "CONSUMER.INFO.S.N2")


@scenario
async def consumer_create_push_and_ephemeral(s):
    """Push consumers (deliver_subject), ephemeral ones (no name), and both."""
    await add_stream(s, "S", subjects=["s.*"])
    await api(s, "CONSUMER.CREATE.S", {"stream_name": "S",
                                       "config": {"deliver_subject": "push.here"}},
              note="ephemeral push")
    await api(s, "CONSUMER.CREATE.S", {"stream_name": "S",
                                       "config": {"ack_policy": "explicit"}},
              note="ephemeral pull")
    await add_consumer(s, "S", "DP", deliver_subject="push.dp", deliver_group="g",
                       ack_policy="explicit", note="durable push with a queue group")
    await add_consumer(s, "S", "DP2", deliver_subject="push.dp2", idle_heartbeat=10**9,
                       flow_control=True, note="heartbeat and flow control")
    await add_consumer(s, "S", "DP3", deliver_subject="push.dp3", flow_control=True,
                       note="flow control without heartbeat")
    await api(s, "CONSUMER.NAMES.S")


@scenario
async def consumer_create_filters(s):
    """Filters: in the body, in the subject, several, overlapping, and not in the stream."""
    await add_stream(s, "F", subjects=["f.>"])
    await add_consumer(s, "F", "ONE", filter_subject="f.a")
    await api(s, "CONSUMER.CREATE.F.SUBJ.f.b", {"stream_name": "F",
                                                "config": {"durable_name": "SUBJ"}},
              note="filter given in the request subject")
    await api(s, "CONSUMER.CREATE.F.SUBJ2.f.*", {"stream_name": "F",
                                                 "config": {"durable_name": "SUBJ2",
                                                            "filter_subject": "f.c"}},
              note="subject filter and body filter disagree")
    await add_consumer(s, "F", "MANY", filter_subjects=["f.a", "f.b.>"])
    await add_consumer(s, "F", "OVER", filter_subjects=["f.*", "f.a"], note="overlapping")
    await add_consumer(s, "F", "BOTH", filter_subject="f.a", filter_subjects=["f.b"],
                       note="both fields")
    await add_consumer(s, "F", "OUT", filter_subject="g.a", note="not a stream subject")
    await add_consumer(s, "F", "BAD", filter_subject="f..a", note="invalid subject")
    await add_consumer(s, "F", "EMPTY", filter_subjects=[""], note="an empty filter")
    await add_consumer(s, "F", "ALL", filter_subject=">", note="everything")
    await api(s, "CONSUMER.LIST.F")


@scenario
async def consumer_deliver_policies(s):
    """Every deliver_policy, and where each starts (one no_wait pull each)."""
    await add_stream(s, "D", subjects=["d.*"])
    for i in range(6):
        await pub(s, "d.%s" % "ab"[i % 2], b"%d" % i)
    cases = [
        ("ALL", {"deliver_policy": "all"}),
        ("LAST", {"deliver_policy": "last"}),
        ("NEW", {"deliver_policy": "new"}),
        ("SEQ", {"deliver_policy": "by_start_sequence", "opt_start_seq": 4}),
        ("TIME", {"deliver_policy": "by_start_time", "opt_start_time": "2000-01-01T00:00:00Z"}),
        ("LPS", {"deliver_policy": "last_per_subject"}),
        ("LPSF", {"deliver_policy": "last_per_subject", "filter_subject": "d.a"}),
    ]
    for name, cfg in cases:
        await add_consumer(s, "D", name, ack_policy="none", **cfg)
        await pull(s, "D", name, {"batch": 10, "no_wait": True}, 11)
    for name, cfg, note in [
        ("E1", {"deliver_policy": "by_start_sequence"}, "no opt_start_seq"),
        ("E2", {"deliver_policy": "by_start_time"}, "no opt_start_time"),
        ("E3", {"deliver_policy": "all", "opt_start_seq": 3}, "opt_start_seq with all"),
        ("E4", {"deliver_policy": "new", "opt_start_time": "2000-01-01T00:00:00Z"},
         "opt_start_time with new"),
        ("E5", {"deliver_policy": "sometimes"}, "unknown policy"),
        ("E6", {"deliver_policy": "by_start_sequence", "opt_start_seq": 3,
                "opt_start_time": "2000-01-01T00:00:00Z"}, "both starts"),
        ("E7", {"replay_policy": "fast-ish"}, "unknown replay policy"),
        ("E8", {"replay_policy": "original"}, "replay original on pull"),
    ]:
        await add_consumer(s, "D", name, note=note, **cfg)


@scenario
async def consumer_ack_policies(s):
    """ack_policy none/all/explicit, ack_wait and max_ack_pending defaults, and the
    redelivery after ack_wait."""
    await stream_with(s, "A", "a", 3)
    await add_consumer(s, "A", "NONE", ack_policy="none")
    await add_consumer(s, "A", "ALL", ack_policy="all")
    await add_consumer(s, "A", "EXP", ack_policy="explicit", ack_wait=500 * 10**6,
                       max_ack_pending=2)
    await add_consumer(s, "A", "FLOW", ack_policy="flow_control", note="newer ack policy")
    await add_consumer(s, "A", "BAD", ack_policy="sometimes", note="unknown")
    await pull(s, "A", "NONE", {"batch": 3, "no_wait": True}, 3)
    await consumer_info(s, "A", "NONE")
    msgs = await pull(s, "A", "ALL", {"batch": 3, "no_wait": True}, 3)
    if len(msgs) >= 2:
        await ack(s, msgs[1], note="ack all up to the second")
    await consumer_info(s, "A", "ALL")
    await pull(s, "A", "EXP", {"batch": 3, "no_wait": True}, 3,
               note="max_ack_pending 2 stops it at two; after ack_wait the first comes again")
    await consumer_info(s, "A", "EXP")
    await pull(s, "A", "EXP", {"batch": 1, "expires": 2 * 10**9}, 1,
               note="redelivered once ack_wait ran out", timeout=3)
    await consumer_info(s, "A", "EXP")


@scenario
async def consumer_backoff(s):
    """backoff with max_deliver, and the combinations the server refuses."""
    await add_stream(s, "B", subjects=["b"])
    await add_consumer(s, "B", "OK", ack_policy="explicit", max_deliver=4,
                       backoff=[10**9, 2 * 10**9, 4 * 10**9])
    await add_consumer(s, "B", "EQ", ack_policy="explicit", max_deliver=3,
                       backoff=[10**9, 2 * 10**9, 4 * 10**9], note="len == max_deliver")
    await add_consumer(s, "B", "LONG", ack_policy="explicit", max_deliver=2,
                       backoff=[10**9, 2 * 10**9, 4 * 10**9], note="longer than max_deliver")
    await add_consumer(s, "B", "NOMD", ack_policy="explicit",
                       backoff=[10**9, 2 * 10**9], note="no max_deliver")
    await add_consumer(s, "B", "AW", ack_policy="explicit", max_deliver=5, ack_wait=10**9,
                       backoff=[3 * 10**9], note="ack_wait and backoff: ack_wait is replaced")
    await add_consumer(s, "B", "NONE", ack_policy="none", max_deliver=5, backoff=[10**9],
                       note="ack none")
    await add_consumer(s, "B", "ZERO", ack_policy="explicit", max_deliver=5, backoff=[0],
                       note="zero backoff")
    await add_consumer(s, "B", "NEG", ack_policy="explicit", max_deliver=-1,
                       backoff=[10**9], note="unlimited deliveries")


@scenario
async def consumer_create_errors(s):
    """Consumer configs the server refuses, and the requests it cannot parse."""
    await add_stream(s, "S", subjects=["s.*"])
    create = lambda subject, body, note: api(s, subject, body, note=note)   # noqa: E731
    await create("CONSUMER.CREATE.S.C", b"{", "bad JSON")
    await create("CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {"bogus": 1}},
                 "unknown config field")
    await create("CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {"durable_name": "C"},
                                         "bogus": 1}, "unknown request field")
    await create("CONSUMER.CREATE.S.C", {"config": {"durable_name": "C"}}, "no stream_name")
    await create("CONSUMER.CREATE.S.C", {"stream_name": "T", "config": {"durable_name": "C"}},
                 "stream_name differs from the subject")
    await create("CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {"durable_name": "D"}},
                 "durable name differs from the subject")
    await create("CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {"name": "D"}},
                 "name differs from the subject")
    await create("CONSUMER.CREATE.S", {"stream_name": "S", "config": {"durable_name": "C"}},
                 "durable on the ephemeral subject")
    await create("CONSUMER.CREATE.NOPE.C", {"stream_name": "NOPE",
                                            "config": {"durable_name": "C"}}, "no stream")
    await create("CONSUMER.CREATE.S.a*b", {"stream_name": "S", "config": {"durable_name":
                                                                          "a*b"}},
                 "wildcard in the name")
    await create("CONSUMER.CREATE.S", {"stream_name": "S", "config": {"name": "a.b"}},
                 "dot in the name")
    await create("CONSUMER.CREATE.S.C", None, "no body")
    await create("CONSUMER.CREATE.S.C", {"stream_name": "S"}, "no config")
    for name, cfg, note in [
        ("P1", {"deliver_subject": "d.p1", "max_waiting": 5}, "max_waiting on push"),
        ("P2", {"idle_heartbeat": 10**9}, "heartbeat on pull"),
        ("P3", {"flow_control": True}, "flow control on pull"),
        ("P4", {"deliver_subject": "d.p4", "max_batch": 5}, "max_batch on push"),
        ("P5", {"deliver_subject": "d.p5", "max_expires": 10**9}, "max_expires on push"),
        ("P6", {"rate_limit_bps": 1000}, "rate limit on pull"),
        ("P7", {"ack_policy": "none", "max_ack_pending": 5}, "max_ack_pending with ack none"),
        ("P8", {"deliver_subject": "s.x"}, "deliver into the stream's own subjects"),
        ("P9", {"max_waiting": -1}, "negative max_waiting"),
        ("P10", {"max_deliver": 0}, "max_deliver 0"),
        ("P11", {"ack_wait": -1}, "negative ack_wait"),
        ("P12", {"sample_freq": "abc"}, "bad sample_freq"),
        ("P13", {"sample_freq": "50%"}, "good sample_freq"),
        ("P14", {"num_replicas": 3}, "R3 on one server"),
        ("P15", {"max_batch": -5}, "negative max_batch"),
        ("P16", {"max_expires": 10**5}, "max_expires under 1ms"),
        ("P17", {"inactive_threshold": -1}, "negative inactive threshold"),
        ("P18", {"description": "d" * 5000}, "long description"),
        ("P19", {"headers_only": True, "deliver_subject": "d.p19"}, "headers only push"),
        ("P20", {"deliver_subject": "d.p20", "deliver_group": "g", "idle_heartbeat": 10**9},
         "queue group with heartbeat"),
        ("P21", {"mem_storage": True, "num_replicas": 1}, "memory state"),
        ("P22", {"pause_until": "2100-01-01T00:00:00Z"}, "paused"),
        ("P23", {"priority_groups": ["g1"], "priority_policy": "pinned_client",
                 "priority_timeout": 60 * 10**9}, "pinned priority group"),
        ("P24", {"priority_policy": "overflow"}, "priority policy without groups"),
        ("P25", {"metadata": {"k": "v"}}, "metadata"),
    ]:
        await add_consumer(s, "S", name, note=note, **cfg)
    await api(s, "INFO")


@scenario
async def consumer_limits_from_stream(s):
    """A stream's consumer_limits fill in and bound its consumers; max_consumers."""
    await add_stream(s, "L", subjects=["l"], max_consumers=2,
                     consumer_limits={"inactive_threshold": 60 * 10**9,
                                      "max_ack_pending": 50})
    await add_consumer(s, "L", "A", ack_policy="explicit")
    await add_consumer(s, "L", "B", ack_policy="explicit", max_ack_pending=100,
                       note="above the stream's limit")
    await add_consumer(s, "L", "C", ack_policy="explicit", max_ack_pending=10)
    await add_consumer(s, "L", "D", ack_policy="explicit", note="third: max_consumers 2")
    await api(s, "CONSUMER.INFO.L.A")


@scenario
async def consumer_update(s):
    """Changing a consumer: by creating it again with another config, and with action
    update; what may change and what may not."""
    await add_stream(s, "S", subjects=["s.*"])
    await add_consumer(s, "S", "C", ack_policy="explicit", filter_subject="s.a")
    update = lambda note, **cfg: consumer_action(                       # noqa: E731
        s, "S", "C", "update", note, **{"ack_policy": "explicit", "filter_subject": "s.a",
                                        **cfg})
    await update("description, max_deliver, ack_wait, max_ack_pending",
                 description="changed", max_deliver=5, ack_wait=10 * 10**9,
                 max_ack_pending=10)
    await update("filter subject", filter_subject="s.b")
    await update("deliver policy", deliver_policy="new")
    await update("ack policy", ack_policy="all")
    await update("replay policy", replay_policy="original")
    await update("push", deliver_subject="now.push")
    await update("max_waiting", max_waiting=10)
    await update("opt_start_seq", opt_start_seq=3)
    await update("metadata", metadata={"k": "v"})
    await api(s, "CONSUMER.INFO.S.C")
    await add_consumer(s, "S", "P", deliver_subject="p.here")
    await consumer_action(s, "S", "P", "update", note="push to pull")
    await consumer_action(s, "S", "P", "update", deliver_subject="p.there",
                          note="another deliver subject")
    await consumer_action(s, "S", "P", "bogus", note="unknown action")


@scenario
async def consumer_pause(s):
    """CONSUMER.PAUSE and how a paused consumer shows in its info."""
    await add_stream(s, "S", subjects=["s"])
    await add_consumer(s, "S", "C", ack_policy="explicit")
    await api(s, "CONSUMER.PAUSE.S.C", {"pause_until": "2100-01-01T00:00:00Z"})
    await api(s, "CONSUMER.INFO.S.C")
    await pub(s, "s", b"x")
    await pull(s, "S", "C", {"batch": 1, "no_wait": True}, 1, note="paused: nothing")
    await api(s, "CONSUMER.PAUSE.S.C", {"pause_until": "2000-01-01T00:00:00Z"},
              note="a time in the past resumes")
    await api(s, "CONSUMER.PAUSE.S.C", None, note="no body resumes")
    await pull(s, "S", "C", {"batch": 1, "no_wait": True}, 1, note="resumed")
    await api(s, "CONSUMER.PAUSE.S.NOPE", {"pause_until": "2100-01-01T00:00:00Z"})
    await api(s, "CONSUMER.PAUSE.S.C", b"{", note="bad JSON")


@scenario
async def retention_policies(s):
    """Work queue and interest retention: which consumers they take, and when acked
    messages go away."""
    await stream_with(s, "WQ", "wq.a", 2, retention="workqueue")
    await add_consumer(s, "WQ", "ONE", ack_policy="explicit")
    await add_consumer(s, "WQ", "TWO", ack_policy="explicit",
                       note="second unfiltered consumer on a work queue")
    await add_consumer(s, "WQ", "NONE", ack_policy="none", filter_subject="wq.b",
                       note="ack none on a work queue")
    msgs = await pull(s, "WQ", "ONE", {"batch": 1, "no_wait": True}, 1)
    if msgs:
        await ack(s, msgs[0])
    await api(s, "STREAM.INFO.WQ", note="the acked message is gone")
    await add_consumer(s, "WQ", "DN", ack_policy="explicit", deliver_policy="new",
                       note="a work queue consumer may not start at new?")
    await api(s, "STREAM.CREATE.WQ2", {"name": "WQ2", "subjects": ["wq2.*"],
                                       "retention": "workqueue"})
    await add_consumer(s, "WQ2", "A", ack_policy="explicit", filter_subject="wq2.a")
    await add_consumer(s, "WQ2", "B", ack_policy="explicit", filter_subject="wq2.b",
                       note="disjoint filters are fine")
    await add_consumer(s, "WQ2", "AB", ack_policy="explicit", filter_subject="wq2.*",
                       note="overlapping filters are not")
    await stream_with(s, "IN", "in", 2, retention="interest")
    await api(s, "STREAM.INFO.IN", note="no consumers: nothing kept? (published before any)")
    await add_consumer(s, "IN", "X", ack_policy="explicit")
    await add_consumer(s, "IN", "Y", ack_policy="explicit")
    await pub(s, "in", b"for two")
    for name in ("X", "Y"):
        got = await pull(s, "IN", name, {"batch": 1, "no_wait": True}, 1)
        if got:
            await ack(s, got[0])
        await api(s, "STREAM.INFO.IN", note="after %s acked" % name)


# -- CONSUMER.INFO / NAMES / LIST / DELETE ----------------------------------------------------

@scenario
async def consumer_info_names_list_delete(s):
    """Consumer listing and deletion, with paging and misses."""
    await add_stream(s, "S", subjects=["s"])
    await api(s, "CONSUMER.NAMES.S", note="none yet")
    await api(s, "CONSUMER.LIST.S", note="none yet")
    for name in ["B", "A", "C"]:
        await add_consumer(s, "S", name, ack_policy="explicit")
    await pub(s, "s", b"x")
    await api(s, "CONSUMER.INFO.S.A")
    await api(s, "CONSUMER.INFO.S.Z", note="missing consumer")
    await api(s, "CONSUMER.INFO.NOPE.A", note="missing stream")
    await api(s, "CONSUMER.NAMES.S")
    await api(s, "CONSUMER.NAMES.S", {"offset": 1})
    await api(s, "CONSUMER.NAMES.S", {"offset": 5})
    await api(s, "CONSUMER.LIST.S")
    await api(s, "CONSUMER.LIST.S", {"offset": 2})
    await api(s, "CONSUMER.NAMES.NOPE")
    await api(s, "CONSUMER.LIST.NOPE")
    await api(s, "CONSUMER.NAMES.S", b"{", note="bad JSON")
    await api(s, "CONSUMER.DELETE.S.B")
    await api(s, "CONSUMER.DELETE.S.B", note="again")
    await api(s, "CONSUMER.DELETE.NOPE.B")
    await api(s, "CONSUMER.NAMES.S")
    await api(s, "STREAM.INFO.S")


# -- CONSUMER.MSG.NEXT ------------------------------------------------------------------------

@scenario
async def pull_requests(s):
    """Pull requests: batch, no_wait on empty and partly full, expires, max_bytes,
    heartbeats, and the pending headers on the status messages."""
    await add_stream(s, "S", subjects=["s.*"])
    await add_consumer(s, "S", "C", ack_policy="explicit")
    await pull(s, "S", "C", {"batch": 1, "no_wait": True}, 1, note="empty, no_wait")
    await pull(s, "S", "C", {"batch": 1, "expires": 300 * 10**6}, 1, note="empty, expires")
    await pull(s, "S", "C", {"batch": 2, "expires": 300 * 10**6, "no_wait": True}, 1,
               note="no_wait with expires")
    for i in range(5):
        await pub(s, "s.%d" % i, b"payload-%d" % i, headers={"k": "v%d" % i} if i == 4
                  else None)
    await pull(s, "S", "C", {"batch": 2}, 2, note="batch 2 of 5")
    await pull(s, "S", "C", None, 1, note="empty body: one message")
    await pull(s, "S", "C", b"1", 1, note="a bare number is a batch size")
    await pull(s, "S", "C", {"batch": 5, "no_wait": True}, 6, note="one left, no_wait")
    await pull(s, "S", "C", {"batch": 5, "expires": 300 * 10**6}, 6,
               note="nothing left, expires")
    await consumer_info(s, "S", "C")
    await add_consumer(s, "S", "B", ack_policy="none")
    await pull(s, "S", "B", {"batch": 5, "max_bytes": 30}, 3, note="max_bytes below one message")
    await pull(s, "S", "B", {"batch": 5, "max_bytes": 100, "no_wait": True}, 6,
               note="max_bytes fits some")
    await add_consumer(s, "S", "H", ack_policy="none", deliver_policy="new")
    await pull(s, "S", "H", {"batch": 1, "expires": 1200 * 10**6,
                             "idle_heartbeat": 500 * 10**6}, 3,
               note="heartbeats at 0.5s and 1s, then the 408 at 1.2s")
    await pull(s, "S", "C", {"batch": 1, "idle_heartbeat": 10**9}, 1,
               note="heartbeat without expires")
    await pull(s, "S", "C", {"batch": 1, "expires": 10**5}, 1, note="expires under 1ms")
    await pull(s, "S", "C", {"batch": 0, "no_wait": True}, 1, note="batch 0")
    await pull(s, "S", "C", {"batch": -1}, 1, note="negative batch", timeout=1)
    await pull(s, "S", "C", b"{", 1, note="bad JSON")
    await pull(s, "S", "C", {"batch": 1, "bogus": True, "no_wait": True}, 1,
               note="unknown field")
    await pull(s, "S", "NOPE", {"batch": 1, "no_wait": True}, 1, note="missing consumer")
    await add_consumer(s, "S", "MB", ack_policy="explicit", max_batch=2, max_expires=10**9,
                       max_bytes=64, max_waiting=1)
    await pull(s, "S", "MB", {"batch": 3, "no_wait": True}, 1, note="over max_batch")
    await pull(s, "S", "MB", {"batch": 1, "expires": 2 * 10**9}, 1, note="over max_expires")
    await pull(s, "S", "MB", {"batch": 1, "max_bytes": 100, "no_wait": True}, 1,
               note="over max_bytes")
    await add_consumer(s, "S", "PUSH", deliver_subject="push.s")
    await pull(s, "S", "PUSH", {"batch": 1, "no_wait": True}, 1, note="pull on a push consumer")


@scenario
async def pull_max_waiting(s):
    """max_waiting: a request beyond it is refused with 409."""
    await add_stream(s, "S", subjects=["s"])
    await add_consumer(s, "S", "W", ack_policy="explicit", max_waiting=1)
    inbox = s.nc.new_inbox()
    waiting = await s.subscribe(inbox)
    await s.publish(API + "CONSUMER.MSG.NEXT.S.W", {"batch": 1, "expires": 2 * 10**9},
                    reply=inbox, note="this one waits")
    await s.poll(API + "CONSUMER.INFO.S.W", None,
                 until=lambda r: (r.json or {}).get("num_waiting") == 1,
                 note="the server holds it")
    await pull(s, "S", "W", {"batch": 1, "expires": 10**9}, 1, note="second waiter")
    await pub(s, "s", b"for the first")
    await s.collect(waiting, 1, note="the waiting request gets it")


@scenario
async def acks(s):
    """Every ack kind with a reply subject (the server answers those), and the consumer
    state after each."""
    await stream_with(s, "S", "s", 6)
    await add_consumer(s, "S", "C", ack_policy="explicit", ack_wait=30 * 10**9)
    msgs = await pull(s, "S", "C", {"batch": 6, "no_wait": True}, 6)
    if len(msgs) < 6:
        return
    await ack(s, msgs[0], b"+ACK")
    await consumer_info(s, "S", "C", note="after +ACK")
    await ack(s, msgs[1], b"", note="an empty body acks too")
    await ack(s, msgs[2], b"-NAK")
    await consumer_info(s, "S", "C", note="after -NAK: redelivery pending")
    await pull(s, "S", "C", {"batch": 1, "no_wait": True}, 1, note="the nak'd one again")
    await ack(s, msgs[3], b'-NAK {"delay": 60000000000}', note="nak with delay")
    await ack(s, msgs[3], b"+WPI", note="in progress")
    await ack(s, msgs[4], b"+TERM")
    await ack(s, msgs[4], b"+TERM", note="again")
    await consumer_info(s, "S", "C", note="after +TERM")
    await pub(s, "s", b"for +NXT")
    got = await s.requests(msgs[5].reply, b"+NXT", count=1, timeout=1.0,
                           note="+NXT acks and asks for the next")
    await ack(s, msgs[5], b"+ACK", note="ack of an already acked message")
    await ack(s, msgs[5], b"+OK", note="+OK is an ack")
    await ack(s, msgs[5], b"-NAK {bad", note="nak with a bad body")
    await ack(s, msgs[5], b"+TERM reason given", note="term with a reason")
    await ack(s, msgs[5], b"bogus", note="not an ack")
    await s.publish(msgs[0].reply, b"+ACK", note="no reply: nothing answered")
    await ack(s, msgs[0], b"+ACK", note="answered, after the one before")
    await consumer_info(s, "S", "C", note="final")
    if got:
        await ack(s, got[0], b"+ACK")


@scenario
async def ack_nxt_batch(s):
    """+NXT with a batch body, and the ack subject tokens (delivered count, pending)."""
    await stream_with(s, "S", "s", 4)
    await add_consumer(s, "S", "C", ack_policy="explicit")
    msgs = await pull(s, "S", "C", {"batch": 1}, 1)
    if msgs:
        await s.requests(msgs[0].reply, b'+NXT {"batch": 2}', count=2, timeout=1.0,
                         note="ack and pull two")
    await consumer_info(s, "S", "C")


@scenario
async def max_deliver_and_term_advisories(s):
    """A message that reaches max_deliver, and a terminated one: the advisories."""
    adv = await s.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>")
    await add_stream(s, "S", subjects=["s"])
    await pub(s, "s", b"poison")
    await pub(s, "s", b"other")
    await add_consumer(s, "S", "C", ack_policy="explicit", max_deliver=2, ack_wait=10**9)
    await s.collect(adv, 1, note="consumer created")
    first = await pull(s, "S", "C", {"batch": 1, "no_wait": True}, 1)
    if first:
        await ack(s, first[0], b"-NAK")
    await s.collect(adv, 1, note="nak")
    second = await pull(s, "S", "C", {"batch": 1, "no_wait": True}, 1, note="second delivery")
    if second:
        await ack(s, second[0], b"-NAK")
    await s.collect(adv, 1, note="nak of the last allowed delivery")
    msgs = await pull(s, "S", "C", {"batch": 2, "no_wait": True}, 2,
                      note="the poison one is not delivered again; the other is")
    await s.collect(adv, 1, note="max deliveries reached")
    if msgs and msgs[0].reply:
        await ack(s, msgs[0], b"+TERM no good")
    await s.collect(adv, 1, note="terminated")
    await consumer_info(s, "S", "C")


# -- push consumers --------------------------------------------------------------------------

@scenario
async def push_heartbeat_and_flow_control(s):
    """A push consumer's idle heartbeats (100 Idle Heartbeat + Nats-Last-* headers) and
    flow control requests (100 FlowControl Request, reply $JS.FC...) once over 1 MiB."""
    await add_stream(s, "S", subjects=["s"])
    box = await s.subscribe("deliver.hb")
    await add_consumer(s, "S", "HB", deliver_subject="deliver.hb", idle_heartbeat=300 * 10**6,
                       ack_policy="none")
    await s.collect(box, 1, note="idle: a heartbeat")
    await pub(s, "s", b"one")
    await s.collect(box, 1, note="the message")
    await s.collect(box, 1, note="idle again: the heartbeat has the last sequences")
    big = await s.subscribe("deliver.fc")
    for _ in range(20):
        await pub(s, "s", b"x" * 64 * 1024)
    # The heartbeat is long so that none falls between the messages: where the flow
    # control request falls depends only on the bytes delivered (server/consumer.go
    # needFlowControl: over half of the 2 MiB window that starts at 32 MiB / 16).
    await add_consumer(s, "S", "FC", deliver_subject="deliver.fc", idle_heartbeat=60 * 10**9,
                       flow_control=True, ack_policy="none")
    got = await s.collect(big, 19, more=True, note="messages and the flow control request")
    fc = [m for m in got if m.status == 100]
    if fc and fc[0].reply:
        await s.publish(fc[0].reply, b"", note="answer the flow control")
    await s.collect(big, 3, note="the rest")


@scenario
async def push_delivery(s):
    """A push consumer's deliveries: subject, ack reply, headers, and a queue group."""
    await add_stream(s, "S", subjects=["s.*"])
    for i in range(3):
        await pub(s, "s.%d" % i, b"m%d" % i, headers={"h": str(i)})
    box = await s.subscribe("deliver.p")
    await add_consumer(s, "S", "P", deliver_subject="deliver.p", ack_policy="explicit")
    msgs = await s.collect(box, 3)
    if msgs:
        await ack(s, msgs[0])
    await consumer_info(s, "S", "P")
    hbox = await s.subscribe("deliver.h")
    await add_consumer(s, "S", "H", deliver_subject="deliver.h", headers_only=True,
                       ack_policy="none")
    await s.collect(hbox, 3, note="headers only: Nats-Msg-Size")
    await add_consumer(s, "S", "NI", deliver_subject="deliver.nobody", ack_policy="explicit")
    await consumer_info(s, "S", "NI", note="push_bound false with no interest")


# -- advisories --------------------------------------------------------------------------------

# nats-server loses its STREAM.DELETED advisory now and then: server/stream.go stop
# queues it on the stream's send queue, then closes the loop that drains that queue.
@scenario(reference_loses=("stream deleted",))
async def advisories_stream_consumer(s):
    """Stream and consumer lifecycle advisories on $JS.EVENT.ADVISORY.>."""
    adv = await s.subscribe("$JS.EVENT.ADVISORY.STREAM.>")
    cadv = await s.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>")
    await add_stream(s, "S", subjects=["s"])
    await s.collect(adv, 1, note="stream created")
    await api(s, "STREAM.UPDATE.S", {"name": "S", "subjects": ["s", "t"]})
    await s.collect(adv, 1, note="stream updated")
    await add_consumer(s, "S", "C")
    await s.collect(cadv, 1, note="consumer created")
    await api(s, "CONSUMER.CREATE.S", {"stream_name": "S", "config": {}})
    await s.collect(cadv, 1, note="ephemeral consumer created")
    await api(s, "CONSUMER.DELETE.S.C")
    await s.collect(cadv, 1, note="consumer deleted")
    await api(s, "STREAM.DELETE.S")
    await s.collect(adv, 1, note="stream deleted")
    await s.collect(cadv, 1, note="its ephemeral consumer deleted")


@scenario
async def advisories_api_audit(s):
    """The API audit advisory ($JS.EVENT.ADVISORY.API) for a good and a bad request."""
    audit = await s.subscribe("$JS.EVENT.ADVISORY.API")
    await api(s, "INFO")
    await s.collect(audit, 1)
    await api(s, "STREAM.INFO.NOPE")
    await s.collect(audit, 1)


# -- what the official client sends ------------------------------------------------------

@scenario
async def nats_py_kv_and_object_store(s):
    """What nats-py's KV and object store send and get back, seen by a sniffer
    subscribed to $JS.API.>, $KV.>, $O.> and _INBOX.>."""
    import nats
    sniffer = await s.connect()
    # One subscription, so the sniffer sees messages in the order the server sent them
    # (nats-py runs each subscription's queue on its own); ">" matches "$" subjects too.
    everything = await s.subscribe(">", sniffer)
    nc = await s.connect(cls=nats.aio.client.Client)
    js = nc.jetstream()

    async def step(what, coro):
        try:
            result = await coro
        except Exception as e:                      # the library's answer is the record
            s.record("client", call=what, error=type(e).__name__)
            return None
        s.record("client", call=what)
        return result

    kv = await step("create_key_value", js.create_key_value(bucket="cfg", history=5))
    if kv is not None:
        await step("put a", kv.put("a", b"1"))
        await step("put a again", kv.put("a", b"2"))
        await step("put b", kv.put("b", b"x"))
        await step("create a (exists)", kv.create("a", b"3"))
        await step("update a rev 2", kv.update("a", b"4", last=2))
        await step("get a", kv.get("a"))
        await step("get missing", kv.get("zzz"))
        await step("delete b", kv.delete("b"))
        await step("history a", kv.history("a"))
        await step("keys", kv.keys())
        watcher = await step("watch a", kv.watch("a"))
        if watcher is not None:
            await step("watch update", watcher.updates(timeout=2))
            await step("watch end marker", watcher.updates(timeout=2))
            await step("watch stop", watcher.stop())
        await step("purge a", kv.purge("a"))
        await step("status", kv.status())
    obs = await step("create_object_store", js.create_object_store("files"))
    if obs is not None:
        await step("put", obs.put("hello.txt", b"hello object store"))
        await step("get", obs.get("hello.txt"))
        await step("list", obs.list())
        await step("get missing", obs.get("nope.txt"))
    await nc.publish("sniff.end", b"")
    await nc.close()
    seen = []
    while not seen or seen[-1].subject != "sniff.end":
        got = await everything.take(1)
        if not got:
            break
        seen += got
    # Advisories have scenarios of their own; here they would only add noise.
    seen = [m for m in seen if not m.subject.startswith("$JS.EVENT.")]
    # nats-py asks for consumer info while deliveries flow, so the order of the raw
    # stream varies from run to run: compare each request with its own answer, and the
    # deliveries in their order, and keep the raw stream for reading only.
    answers: dict[str, jsdiff.Reply] = {}
    for m in seen:
        if m.subject.startswith("_INBOX.") and not m.reply:
            answers.setdefault(m.subject, m)
    s.record("exchanges", items=[
        {"request": m.record(), "answer": _readable(m.subject, answers[m.reply].record())
         if m.reply in answers else None}
        for m in seen if m.reply.startswith("_INBOX.") and not m.subject.startswith("_INBOX.")])
    s.record("deliveries", messages=[m.record() for m in seen if m.reply.startswith("$JS.ACK.")])
    s.record("sniffed", unchecked=True, messages=[m.record() for m in seen])


def _readable(subject: str, rec: dict) -> dict:
    """An answer as the sniff scenario compares it.

    A STREAM.MSG.GET answer shows its base64 payload as the JSON it holds (object store
    metadata carries a NUID and a time, which the normalizer can then see). A consumer
    info that nats-py asked for while deliveries were in flight keeps only what does
    not depend on how far delivery had got (its config); the raw answer is in "sniffed".
    """
    body = rec.get("json")
    if subject.startswith("$JS.API.CONSUMER.INFO.") and isinstance(body, dict):
        rec["json"] = {k: body[k] for k in ("type", "stream_name", "name", "config", "error")
                       if k in body}
        return rec
    msg = body.get("message") if isinstance(body, dict) else None
    if isinstance(msg, dict) and "data" in msg:
        try:
            msg["data"] = {"decoded": json.loads(base64.b64decode(msg["data"]))}
        except ValueError:
            pass
    return rec


# -- the tests -----------------------------------------------------------------------------

@functools.cache
def _natsjs_jetstream() -> bool:
    return jsdiff.server_has_jetstream("natsjs")


def _answered(transcript: dict) -> bool:
    """Some step got a reply, so the scenario talked to a JetStream server."""
    return any(step.get("reply") or step.get("replies") or step.get("messages")
               for step in transcript["steps"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_reference_transcript_is_stable(name):
    first = run_scenario(SCENARIOS[name], "reference")
    second = run_scenario(SCENARIOS[name], "reference")
    assert _answered(first)
    diffs = compare(jsdiff.checked(first), jsdiff.checked(second))
    assert not diffs, "reference differs from itself (normalize it?):\n" + "\n".join(diffs)
    folder = os.environ.get(jsdiff.CAPTURE_ENV)
    if folder:
        write_transcript(folder, first)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_natsjs_matches_reference(name):
    if not _natsjs_jetstream():
        pytest.skip("natsjs reports no JetStream (INFO 'jetstream' missing or false when "
                    "started with -js): natsjs does not implement it yet")
    expected = run_scenario(SCENARIOS[name], "reference")
    actual = run_scenario(SCENARIOS[name], "natsjs")
    diffs = compare(jsdiff.checked(expected), jsdiff.checked(actual))
    assert not diffs, "%d differences (reference != natsjs):\n%s" % (len(diffs),
                                                                    "\n".join(diffs[:60]))


def test_harness_sees_differences():
    """The comparison and the normalizer can fail: what differs is reported, what is
    volatile is not."""
    norm = jsdiff.Normalizer({"server_id": "NSERVER", "server_name": "NSERVER"})
    a = norm([{"created": "2026-01-01T00:00:00.123Z", "first_ts": jsdiff.GO_ZERO_TIME,
               "server": "NSERVER", "reply": "$JS.ACK.S.C.1.2.3.1700000000000000000.0",
               "inbox": "_INBOX.ABCDEFGHIJKLMNOPQRSTUV", "n": 0}])
    assert a == [{"created": "<time>", "first_ts": jsdiff.GO_ZERO_TIME, "server": "<server>",
                  "reply": "$JS.ACK.S.C.1.2.3.<ts>.0", "inbox": "_INBOX.<nuid:1>", "n": 0}]
    assert compare({"a": 0}, {"a": 0}) == []
    assert compare({"a": 0}, {}) == ["a: 0 != missing"]
    assert compare({"a": 0}, {"a": None}) == ["a: 0 != null"]
    assert compare({"a": 1}, {"a": True}) == ["a: 1 != true"]
    assert compare({"a": [1]}, {"a": [1, 2]}) == ["a[1]: missing != 2"]


def _main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description="write normalized JetStream API transcripts")
    p.add_argument("--capture", required=True, metavar="DIR")
    p.add_argument("--target", choices=["reference", "natsjs"], default="reference")
    p.add_argument("names", nargs="*", help="scenarios (default: all)")
    ns = p.parse_args(argv)
    for name in ns.names or list(SCENARIOS):
        path = write_transcript(ns.capture, run_scenario(SCENARIOS[name], ns.target))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
