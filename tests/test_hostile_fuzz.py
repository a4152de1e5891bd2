"""Generated hostile JetStream API requests (issue 19, the class fix): what a user with
nothing but API access could send, drawn by hypothesis.

Requests are stream create, update, info, delete, purge, message get and delete,
consumer create in all four subject forms, consumer info, delete and pause, stream
names and list.  Their fields take hostile text (lone surrogate escapes, CR/LF,
whitespace, NUL and other control characters, ``.``, ``*``, ``>``, path separators,
``..``, 200-400 byte names in multibyte UTF-8, bytes that are not UTF-8), numbers that
do not fit, values of the wrong JSON type, deep nesting and duplicated keys, and also
sane values, so that some streams and consumers exist for later requests to touch.
Everything is sent on a bare socket (``RawRequester``): the subject's bytes too.

- One natsjs server takes a run of request sequences: each request is answered in
  time with a well-formed answer that does not show the store's path, the server keeps
  answering PINGs, a ``>`` subscriber of the same account only ever reads whole frames
  on subjects someone published, and the server starts again from its store with the
  streams it had.
- Stream and consumer creates against natsjs and nats-server: the same outcome, but
  where natsjs is stricter on purpose (natsjs/jetstream/names.py).
- A three-server cluster takes R1 and R3 creates with hostile fields, then all three
  are stopped and started: all come back, agree on a meta leader and answer.

A short run in CI; NATSJS_HOSTILE_EXAMPLES=500 (say) for a long one.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import start_natsjs, start_reference
from natsjs.jetstream import consumercfg, streamcfg
from natsjs.jetstream.schema import DecodeError, decode_request
from hostile import RawRequester, frames, raw_subscriber, read_until_pong, restarted
from jscluster import JSCluster

EXAMPLES = int(os.environ.get("NATSJS_HOSTILE_EXAMPLES", "300"))
T = "io.nats.jetstream.api.v1."
ANSWER_WAIT = 5.0

# ---- JSON written byte by byte ---------------------------------------------------------


class Raw(bytes):
    """A JSON value's text, written as it is (deep nesting, numbers Python would
    rewrite)."""


class RawStr(bytes):
    """A string's content written as it is between the quotes: bytes that are not
    UTF-8, raw control characters."""


class Obj(tuple):
    """A JSON object as ``(key, value)`` pairs, so a key can come twice."""


_LONE = re.compile("[\ud800-\udfff]")


def enc(v) -> bytes:
    """The JSON text of ``v``; a lone surrogate is written as its escape (``\\udc80``),
    any other character as UTF-8."""
    if isinstance(v, Raw):
        return bytes(v)
    if isinstance(v, RawStr):
        return b'"' + bytes(v) + b'"'
    if isinstance(v, Obj):
        return b"{" + b",".join(enc(k) + b":" + enc(x) for k, x in v) + b"}"
    if isinstance(v, dict):
        return enc(Obj(v.items()))
    if isinstance(v, (list, tuple)):
        return b"[" + b",".join(enc(x) for x in v) + b"]"
    if isinstance(v, str):
        text = json.dumps(v, ensure_ascii=False)
        return _LONE.sub(lambda m: "\\u%04x" % ord(m.group()), text).encode()
    return json.dumps(v).encode()


def strings_in(v):
    """Every string in ``v``, as the server reads it (a lone surrogate or a stray byte
    a U+FFFD), encoded: the subjects a server may publish on are made of these."""
    if isinstance(v, RawStr):
        yield bytes(v).decode("utf-8", "replace").encode()
    elif isinstance(v, str):
        yield _LONE.sub("\ufffd", v).encode()
    elif isinstance(v, Obj):
        for k, x in v:
            yield from strings_in(k)
            yield from strings_in(x)
    elif isinstance(v, (list, tuple)) and not isinstance(v, bytes):
        for x in v:
            yield from strings_in(x)


# ---- hostile values ------------------------------------------------------------------

STREAMS = ["S1", "S2", "ORDERS"]
CONSUMERS = ["C1", "C2", "D1"]
SUBJECTS = ["a", "a.b", "a.*", "a.>", ">", "*", "b.c.d", "o.x", "q.>", "a..b", ".a", "a.",
            "a.>.b", "a b", "*.*"]
BITS = ["\udc80", "\ud800", "\udfff", "\r\n", "\r", "\n", " ", "\t", "\x00", "\x01", "\x1f",
        "\x7f", "\x85", ".", "*", ">", "/", "\\", "..", "../", "é", "€", "𝄞", "\ufffd",
        "\u2028", "\ufeff"]
BAD_BYTES = [RawStr(b"\xff"), RawStr(b"a\xc3("), RawStr(b"\xed\xb2\x80"), RawStr(b"a\x01b"),
             RawStr(b"a\r\nb"), RawStr(b"\xf4\x90\x80\x80"), RawStr(b"x\x00")]


def long_text(n: int, c: str) -> str:
    return c * (n // len(c.encode()))


def hostile(base: list):
    """A sane value from ``base`` (often), or one spoiled, or worse."""
    sane = st.sampled_from(base)
    return st.one_of(
        sane, sane,
        st.tuples(sane, st.lists(st.sampled_from(BITS), min_size=1, max_size=3),
                  st.integers(0, 2)).map(
            lambda t: ["".join(t[1]) + t[0], t[0] + "".join(t[1]),
                       t[0][:1] + "".join(t[1]) + t[0][1:]][t[2]]),
        st.sampled_from(BITS),
        st.builds(long_text, st.integers(200, 400), st.sampled_from(["é", "€", "𝄞", "x"])),
        st.sampled_from(BAD_BYTES),
        st.text(max_size=8),
        st.just(""))


NAME = hostile(STREAMS)
CNAME = hostile(CONSUMERS)
SUBJECT = hostile(SUBJECTS)
NUMBER = st.sampled_from([-1, 0, 1, 3, 100, 2 ** 20]) | st.sampled_from([2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64,
                          -2 ** 63 - 1, 10 ** 30, 1.5, -0.0, Raw(b"1e400"), Raw(b"-1e400"),
                          Raw(b"1E2"), Raw(b"0.1e1")])
WRONG = st.sampled_from([None, True, False, [], {}, "x", [1], {"a": 1}, 3, [None]])
DEEP = st.builds(lambda n, obj: Raw(b'{"a":' * n + b"1" + b"}" * n) if obj
                 else Raw(b"[" * n + b"]" * n),
                 st.sampled_from([50, 1500, 9999, 10001, 100000]), st.booleans())
ANY = st.one_of(NAME, SUBJECT, NUMBER, WRONG, DEEP)
DURATION = st.one_of(st.sampled_from([0, 1, 10 ** 9, 10 ** 12]), NUMBER, WRONG)
TIME = st.one_of(st.sampled_from(["2030-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
                                  "1969-12-31T23:59:59.999999999Z", "9999-12-31T23:59:59Z",
                                  "2030-01-01T00:00:00+25:00", "yesterday"]), NUMBER, NAME)


def maybe(s):
    """Usually ``s``, now and then any hostile value of any type."""
    return st.integers(0, 9).flatmap(lambda i: ANY if i == 9 else s)


@st.composite
def obj(draw, required: dict, optional: dict, most: int = 4):
    """An object with the ``required`` fields and a few of the ``optional`` ones, each
    value from its strategy or worse; sometimes a key twice or one nobody knows."""
    keys = list(required) + draw(st.lists(st.sampled_from(sorted(optional)), max_size=most,
                                          unique=True))
    fields = {**required, **optional}
    pairs = [(k, draw(fields[k] if k in required else maybe(fields[k]))) for k in keys]
    extra = draw(st.sampled_from(["dup", "unknown", "case"] + [""] * 12))
    if extra == "dup" and pairs:
        k = draw(st.sampled_from(keys))
        pairs.append((k, draw(maybe(fields[k]))))
    elif extra == "unknown":
        pairs.append((draw(NAME), draw(ANY)))
    elif extra == "case" and pairs:
        pairs[0] = (pairs[0][0].upper(), pairs[0][1])
    return Obj(draw(st.permutations(pairs)))


def lists(s, most: int = 3):
    return st.lists(s, max_size=most)


TRANSFORM = obj({}, {"src": SUBJECT, "dest": SUBJECT})
EXTERNAL = obj({}, {"api": SUBJECT, "deliver": SUBJECT})
SOURCE = obj({"name": NAME}, {
    "filter_subject": SUBJECT, "opt_start_seq": NUMBER, "opt_start_time": TIME,
    "external": EXTERNAL, "subject_transforms": lists(TRANSFORM),
    "consumer": obj({}, {"name": CNAME, "deliver_subject": SUBJECT})}, most=3)
METADATA = st.dictionaries(st.one_of(NAME, SUBJECT), st.one_of(NAME, SUBJECT), max_size=3)
STREAM_FIELDS = {
    "subjects": lists(SUBJECT), "sources": lists(SOURCE, 2), "mirror": SOURCE,
    "storage": st.sampled_from(["file", "memory", "File", "disk"]),
    "retention": st.sampled_from(["limits", "interest", "workqueue", "x"]),
    "discard": st.sampled_from(["old", "new", "NEW", "x"]),
    "max_msgs": NUMBER, "max_bytes": NUMBER, "max_age": DURATION, "max_msg_size": NUMBER,
    "max_consumers": NUMBER, "max_msgs_per_subject": NUMBER, "duplicate_window": DURATION,
    "num_replicas": st.sampled_from([1, 1, 3, 0, -1, 6]), "first_seq": NUMBER,
    "metadata": METADATA, "description": NAME,
    "republish": obj({}, {"src": SUBJECT, "dest": SUBJECT, "headers_only": WRONG}),
    "subject_transform": TRANSFORM,
    "placement": obj({}, {"cluster": NAME, "tags": lists(NAME)}),
    "compression": st.sampled_from(["none", "s2", "zstd"]),
    "allow_direct": st.booleans(), "mirror_direct": st.booleans(),
    "deny_delete": st.booleans(), "sealed": st.booleans(), "allow_rollup_hdrs": st.booleans(),
    "allow_msg_ttl": st.booleans(), "subject_delete_marker_ttl": DURATION,
    "consumer_limits": obj({}, {"inactive_threshold": DURATION, "max_ack_pending": NUMBER}),
}
CONSUMER_FIELDS = {
    "durable_name": CNAME, "name": CNAME, "description": NAME,
    "deliver_subject": SUBJECT, "deliver_group": NAME,
    "filter_subject": SUBJECT, "filter_subjects": lists(SUBJECT),
    "deliver_policy": st.sampled_from(["all", "last", "new", "by_start_sequence",
                                       "by_start_time", "last_per_subject", "x"]),
    "opt_start_seq": NUMBER, "opt_start_time": TIME,
    "ack_policy": st.sampled_from(["none", "all", "explicit", "x"]),
    "ack_wait": DURATION, "max_deliver": NUMBER, "backoff": lists(DURATION),
    "max_ack_pending": NUMBER, "max_waiting": NUMBER, "idle_heartbeat": DURATION,
    "flow_control": st.booleans(), "headers_only": st.booleans(),
    "inactive_threshold": DURATION, "num_replicas": st.sampled_from([0, 1, 3, -1]),
    "mem_storage": st.booleans(), "metadata": METADATA, "sample_freq": NAME,
    "max_batch": NUMBER, "max_expires": DURATION, "pause_until": TIME,
    "priority_groups": lists(NAME), "priority_policy": st.sampled_from(
        ["none", "overflow", "pinned_client", "prioritized", "x"]),
}

# Subject tokens: what a client can put in a subject (no whitespace) and that stays one
# token (no ``.``), so each request reaches a handler that must answer it.
TOKEN_BITS = [b"\x00", b"\x01", b"\x7f", b"\xff", b"\xed\xb2\x80", b"*", b">", b"/", b"\\",
              b"%", "é".encode(), "𝄞".encode()]


def token_of(name) -> bytes | None:
    """``name`` as a subject token, if it can be one."""
    if isinstance(name, RawStr):
        name = bytes(name).decode("utf-8", "replace")
    if not isinstance(name, str) or not name or re.search(r"[\s.]", name):
        return None
    return name.encode("utf-8", "surrogatepass")


TOKEN = st.one_of(
    st.sampled_from(STREAMS + CONSUMERS).map(str.encode),
    st.tuples(st.sampled_from(STREAMS + CONSUMERS), st.sampled_from(TOKEN_BITS)).map(
        lambda t: t[0].encode() + t[1]),
    st.sampled_from(TOKEN_BITS),
    st.builds(lambda n, c: long_text(n, c).encode(), st.integers(200, 400),
              st.sampled_from(["é", "x"])))


@st.composite
def named(draw, names, body_of):
    """A token and a body about the same name (usually), or about another."""
    name = draw(names)
    token = token_of(name)
    if token is None or draw(st.integers(0, 5)) == 0:
        token = draw(TOKEN)
    return token, body_of(name)


@st.composite
def stream_create(draw, op: str = "CREATE"):
    name = draw(NAME)
    token = token_of(name)
    if token is None or draw(st.integers(0, 7)) == 0:
        token = draw(TOKEN)
    body = draw(obj({"name": st.just(name)}, STREAM_FIELDS))
    return b"$JS.API.STREAM.%s.%s" % (op.encode(), token), body


@st.composite
def consumer_create(draw):
    stream = draw(st.one_of(st.sampled_from(STREAMS), NAME))
    stoken = token_of(stream)
    if stoken is None or draw(st.integers(0, 7)) == 0:
        stoken = draw(TOKEN)
    cfg = draw(obj({}, CONSUMER_FIELDS, most=5))
    form = draw(st.sampled_from(["ephemeral", "named", "filtered", "durable"]))
    cname = next((v for k, v in cfg if k in ("name", "durable_name")), None)
    ctoken = token_of(cname) if cname is not None else None
    if ctoken is None or draw(st.integers(0, 7)) == 0:
        ctoken = draw(TOKEN)
    if form == "ephemeral":
        subject = b"$JS.API.CONSUMER.CREATE.%s" % stoken
    elif form == "named":
        subject = b"$JS.API.CONSUMER.CREATE.%s.%s" % (stoken, ctoken)
    elif form == "filtered":
        filt = draw(st.lists(TOKEN, min_size=1, max_size=3))
        subject = b"$JS.API.CONSUMER.CREATE.%s.%s.%s" % (stoken, ctoken, b".".join(filt))
    else:
        subject = b"$JS.API.CONSUMER.DURABLE.CREATE.%s.%s" % (stoken, ctoken)
    body = draw(obj({"stream_name": st.just(stream), "config": st.just(cfg)},
                    {"action": st.sampled_from(["", "create", "update", "x"]),
                     "pedantic": st.booleans()}, most=1))
    return subject, body


def on_stream(op: str, body):
    return st.tuples(TOKEN.map(lambda t: b"$JS.API.STREAM.%s.%s" % (op.encode(), t)), body)


def on_consumer(op: str, body):
    return st.tuples(st.tuples(TOKEN, TOKEN).map(
        lambda t: b"$JS.API.CONSUMER.%s.%s.%s" % (op.encode(), t[0], t[1])), body)


def as_obj(v):
    """Dicts (nested too) as ``Obj``: what ``strings_in`` reads."""
    if isinstance(v, dict):
        return Obj((k, as_obj(x)) for k, x in v.items())
    if isinstance(v, list):
        return [as_obj(x) for x in v]
    return v


SPOIL = st.sampled_from(["\udc80", "\ud800", "\udfff", "\r\n", " ", "\x01", "\x7f"])


@st.composite
def one_bad_field(draw):
    """A create that would succeed but for one spoiled field.  Only a request that goes
    through can leave files that fail the next start (issue 19's crash-and-stay-down
    class: a lone surrogate in a subject, a mirror's or a source's name, a deliver
    subject or group, a filter), and the generated requests above rarely get that far."""
    n = draw(st.integers(0, 10 ** 6))
    bad = draw(SPOIL)
    where = draw(st.sampled_from(["subjects", "mirror", "source", "source_filter",
                                  "deliver_subject", "deliver_group", "filter_subject",
                                  "filter_subjects", "durable"]))
    name = "H%d" % n
    if where in ("subjects", "mirror", "source", "source_filter"):
        body = {"name": name, "subjects": ["h%d.>" % n]}
        if where == "subjects":
            body["subjects"].append("i%d.%s" % (n, bad))
        elif where == "mirror":
            body = {"name": name, "mirror": {"name": "M" + bad}}
        elif where == "source":
            body["sources"] = [{"name": "O" + bad}]
        else:
            body["sources"] = [{"name": "O", "filter_subject": "o." + bad}]
        return b"$JS.API.STREAM.CREATE." + name.encode(), as_obj(body)
    cfg = {"deliver_subject": "dl%d" % n} if where == "deliver_group" else {}
    if where == "durable":
        cfg["durable_name"] = "D" + bad
    elif where == "filter_subjects":
        cfg["filter_subjects"] = ["a.%s" % bad, "b.>"]
    elif where == "filter_subject":
        cfg["filter_subject"] = "a." + bad
    else:
        cfg[where] = ("dl%d." % n) + bad if where == "deliver_subject" else "g" + bad
    return b"$JS.API.CONSUMER.CREATE.S1", as_obj({"stream_name": "S1", "config": cfg})


EMPTY = st.sampled_from([b"", b" ", Obj(), b"null", b"\x00", b"{", b"[]"])
REQUEST = st.one_of(
    one_bad_field(), one_bad_field(),
    stream_create(), stream_create(), stream_create("UPDATE"), consumer_create(),
    consumer_create(), consumer_create(),
    on_stream("INFO", st.one_of(EMPTY, obj({}, {"subjects_filter": SUBJECT, "offset": NUMBER,
                                                "deleted_details": st.booleans()}))),
    on_stream("DELETE", EMPTY),
    on_stream("PURGE", st.one_of(EMPTY, obj({}, {"filter": SUBJECT, "seq": NUMBER,
                                                 "keep": NUMBER}))),
    on_stream("MSG.GET", obj({}, {"seq": NUMBER, "last_by_subj": SUBJECT,
                                  "next_by_subj": SUBJECT})),
    on_stream("MSG.DELETE", obj({}, {"seq": NUMBER, "no_erase": st.booleans()})),
    on_consumer("INFO", EMPTY), on_consumer("DELETE", EMPTY),
    on_consumer("PAUSE", st.one_of(EMPTY, obj({}, {"pause_until": TIME}))),
    st.tuples(st.sampled_from([b"$JS.API.STREAM.NAMES", b"$JS.API.STREAM.LIST"]),
              st.one_of(EMPTY, obj({}, {"subject": SUBJECT, "offset": NUMBER}))),
)


def body_bytes(body) -> bytes:
    return body if type(body) is bytes else enc(body)


# ---- what every answer must be ---------------------------------------------------------

def check_answer(subject: bytes, body: bytes, data, secret: str) -> dict:
    """A well-formed API answer: JSON with a ``type`` and either an error with code,
    err_code and description, or something more than the type."""
    where = (subject[:120], body[:200])
    assert data is not None, ("no answer in %ss" % ANSWER_WAIT, where)
    assert secret.encode() not in data, (data, where)
    answer = json.loads(data)
    assert isinstance(answer, dict) and answer.get("type", "").startswith(T), (answer, where)
    err = answer.get("error")
    if err is not None:
        assert isinstance(err.get("code"), int) and isinstance(err.get("err_code"), int) \
            and isinstance(err.get("description"), str) and err["description"], (answer, where)
    else:
        assert len(answer) > 1, (answer, where)
    return answer


def stream_names(client: RawRequester, storage: str | None = None) -> list:
    """The names of the account's streams (with this ``storage`` only)."""
    infos: list = []
    while True:
        got = json.loads(client.request(b"$JS.API.STREAM.LIST", b'{"offset":%d}' % len(infos)))
        page = got.get("streams") or []
        infos += page
        if not page or len(infos) >= got["total"]:
            return sorted(i["config"]["name"] for i in infos
                          if storage in (None, i["config"]["storage"]))


def published(subject: bytes, sent: set, prefixes: set) -> bool:
    """A subject someone published on: one of ours, an answer to us, the server's own
    API and advisories, or one the server was told to use (a source's API or delivery
    prefix, a consumer's deliver subject, a republish destination; ``$JSC.R.``: the
    answers to a mirror's or a source's own consumer requests)."""
    if subject in sent or subject.startswith((b"_RAW.", b"$JS.", b"$JSC.R.", b"_INBOX.")):
        return True
    return any(subject == p or subject.startswith(p + b".") for p in prefixes)


# ---- property 1: one server, many requests ---------------------------------------------

def test_generated_requests_are_answered_and_the_server_survives_them(tmp_path):
    store = str(tmp_path / "store")
    server = start_natsjs("-js", "-sd", store)
    client = RawRequester(server.port)
    watcher = raw_subscriber(server.port)
    sent: set = set()
    prefixes: set = set()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests=st.lists(REQUEST, min_size=1, max_size=6))
    def one(requests):
        for subject, body in requests:
            data = body_bytes(body)
            sent.add(subject)
            prefixes.update(s for s in strings_in(body) if s)
            check_answer(subject, data, client.request(subject, data, ANSWER_WAIT), store)
        assert server.alive(), server.text()[-3000:]
        assert client.ping(), server.text()[-3000:]
        seen = frames(read_until_pong(watcher))
        strays = [s for s in seen if not published(s, sent, prefixes)]
        assert not strays, strays

    try:
        # S1 takes everything under a. and b. (one_bad_field's consumers live there).
        check_answer(b"$JS.API.STREAM.CREATE.S1", b'{"name":"S1","subjects":["a.>","b.>"]}',
                     client.request(b"$JS.API.STREAM.CREATE.S1",
                                    b'{"name":"S1","subjects":["a.>","b.>"]}', ANSWER_WAIT),
                     store)
        one()
        # Memory streams are gone after a restart, as on nats-server.
        before = stream_names(client, "file")
        client.close()
        watcher.close()
        server = restarted(server)
        assert "Traceback" not in server.text(), server.text()[-3000:]
        client = RawRequester(server.port)
        assert stream_names(client) == before, server.text()[-3000:]
        client.close()
    finally:
        server.stop()


# ---- property 2: the same outcome as nats-server ---------------------------------------

def _control(s: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in s)


def natsjs_stricter(subject: bytes, body, answer: dict) -> bool:
    """Where natsjs refuses on purpose what nats-server takes (natsjs/jetstream/
    names.py): a control character in a name or subject (it would reach a file name
    or a protocol line), a consumer name over 255 bytes (a directory name of its
    own), in the body or in the subject's tokens.  Any request carrying one of those
    may be refused by natsjs, with the error of whichever check noticed first."""
    if "error" not in answer:
        return False
    texts = [s.decode("utf-8", "replace") for s in strings_in(body)] + \
        subject.decode("utf-8", "replace").split(".")
    return any(_control(t) for t in texts) or any(len(t.encode()) > 255 for t in texts)


def duplicate_key(body) -> bool:
    """A key given twice: Go decodes every occurrence in turn and reports a type error
    in any of them, Python's json keeps only the last one, so natsjs judges only that
    (harmless: natsjs uses the value it judged)."""
    if isinstance(body, Obj):
        keys = [k for k, _ in body]
        return len(set(keys)) < len(keys) or any(duplicate_key(v) for _, v in body)
    if isinstance(body, (list, tuple)) and not isinstance(body, bytes):
        return any(duplicate_key(v) for v in body)
    return False


def known_difference(body, got: dict, expected: dict) -> bool:
    """Mismatches found by this test and left for later (issue 19's report), where
    nats-server refuses while decoding (400, 10025) and natsjs decides otherwise:

    - a key given twice (``duplicate_key``);
    - a time field (``opt_start_time``, ``pause_until``, a source's start time) that is
      not RFC 3339, ``""`` included: Go's time.Time refuses it while decoding, natsjs
      decodes it as a string and judges it later, or not at all;

    and a configuration judged differently: nats-server takes a republish with an
    empty destination (no transform, so nothing is republished), natsjs refuses it."""
    err = expected.get("error") or {}
    if "error" not in expected and (got.get("error") or {}).get(
            "description", "").endswith("to '' not valid"):
        return True
    if outcome_of(expected) != (400, 10025):
        return False
    return duplicate_key(body) or "parsing time" in err["description"]


DIFF_REQUEST = st.one_of(stream_create(), consumer_create())
SETUP_STREAMS = [("S1", ["a", "a.>", "b.>", "o.>", "q.>"]), ("S2", ["s2.>"]),
                 ("ORDERS", ["orders.*"])]


def outcome_of(answer: dict) -> tuple:
    err = answer.get("error")
    return (err["code"], err["err_code"]) if err else ("ok", answer["type"])


def test_creates_are_answered_as_nats_server_answers_them(tmp_path):
    servers = [start_natsjs("-js", "-sd", str(tmp_path / "js")),
               start_reference("-js", "-sd", str(tmp_path / "ref"))]
    clients = [RawRequester(s.port) for s in servers]

    def ask_both(subject: bytes, body: bytes) -> list:
        return [check_answer(subject, body, c.request(subject, body, ANSWER_WAIT), str(tmp_path))
                for c in clients]

    def clean() -> None:
        """Each example on the same servers: what one of them took must not change
        the other's later answers (a subject overlap, a stream or consumer that
        exists)."""
        for c in clients:
            for name in stream_names(c):
                token = name.encode("utf-8", "surrogatepass")
                if not re.search(rb"[\s.]", token):
                    c.request(b"$JS.API.STREAM.DELETE." + token, b"")
            assert stream_names(c) == []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request=DIFF_REQUEST)
    def one(request):
        subject, body = request
        if subject.startswith(b"$JS.API.CONSUMER."):
            # Streams for the consumers to be made on.
            for name, subjects in SETUP_STREAMS:
                ask_both(b"$JS.API.STREAM.CREATE." + name.encode(), enc(
                    {"name": name, "subjects": subjects, "storage": "memory"}))
        got, expected = ask_both(subject, body_bytes(body))
        clean()
        if outcome_of(got) != outcome_of(expected) and not natsjs_stricter(subject, body, got) \
                and not known_difference(body, got, expected):
            raise AssertionError("natsjs %r, nats-server %r\nsubject %r\nbody %r" % (
                got, expected, subject, body_bytes(body)[:600]))

    try:
        one()
        assert all(s.alive() for s in servers)
    finally:
        for s in servers:
            s.stop()


@pytest.mark.parametrize("body, words", [
    # Found by the test above: a number where an object goes failed with a
    # TypeError (a 500 "unhashable type: 'dict'"), nesting deeper than Python's json
    # goes with a RecursionError (500); nats-server answers 400 10025 with these words.
    (b'{"stream_name":"S1","config":-1}', "json: cannot unmarshal number into Go struct "
     "field CreateConsumerRequest.config of type server.ConsumerConfig"),
    (b'{"config":{"name":' + b"[" * 3000 + b"]" * 3000 + b"}}", "json: cannot unmarshal "
     "array into Go struct field CreateConsumerRequest.config.name of type string"),
    (b'{"config":{"metadata":{"a":{}}}}', "json: cannot unmarshal object into Go struct "
     "field CreateConsumerRequest.config.metadata of type string"),
])
def test_wrong_shapes_are_invalid_json_in_go_words(body, words):
    with pytest.raises(DecodeError, match="^" + re.escape(words) + "$"):
        decode_request(body, consumercfg.CREATE_CONSUMER_REQUEST)


def test_nesting_go_refuses_or_python_can_not_follow_is_invalid_json():
    for depth, words in ((3000, "json: cannot unmarshal array into Go value of type "
                                "server.StreamConfig"),
                         (10001, "invalid character '[' exceeded max depth at offset 10001")):
        with pytest.raises(DecodeError, match="^" + re.escape(words) + "$"):
            decode_request(b"[" * depth + b"]" * depth, streamcfg.STREAM_CONFIG)


# ---- property 3: a cluster restarted after hostile creates -----------------------------

CLUSTER_EXAMPLES = int(os.environ.get("NATSJS_HOSTILE_CLUSTER_EXAMPLES",
                                      str(max(20, EXAMPLES // 15))))


@st.composite
def replicated(draw):
    subject, body = draw(st.one_of(stream_create(), consumer_create()))
    replicas = draw(st.sampled_from([1, 3]))
    if subject.startswith(b"$JS.API.STREAM."):
        body = Obj([p for p in body if p[0] != "num_replicas"] + [("num_replicas", replicas)])
    return subject, body


def test_a_cluster_restarted_after_hostile_creates_comes_back_whole(tmp_path):
    with JSCluster(tmp_path, 3).start() as cluster:
        clients = [RawRequester(p) for p in cluster.ports]

        @settings(max_examples=CLUSTER_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(requests=st.lists(replicated(), min_size=1, max_size=3),
               at=st.integers(0, 2))
        def one(requests, at):
            for subject, body in requests:
                data = body_bytes(body)
                # A cluster may answer a create it can not place with a timeout of its
                # own; what matters here is what the servers are left with.
                clients[at].request(subject, data, ANSWER_WAIT)
            assert sorted(cluster.alive()) == [0, 1, 2]

        one()
        before = stream_names(clients[0], "file")
        for c in clients:
            c.close()
        for i in range(3):
            cluster.stop(i)
        cluster.start()                 # all three, then a meta leader they agree on
        assert sorted(cluster.alive()) == [0, 1, 2]
        # Right after a start the meta leader may still be applying its log (README:
        # what a JetStream cluster answers right after start), and a create answered
        # late (or not at all) before the restart may have gone through since.
        clients = [RawRequester(p) for p in cluster.ports]
        deadline = time.monotonic() + 20
        while True:
            names = [stream_names(c, "file") for c in clients]
            if (names[0] == names[1] == names[2] and set(before) <= set(names[0])) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert names[0] == names[1] == names[2] and set(before) <= set(names[0]), \
            (before, names)
        for c in clients:
            c.close()
