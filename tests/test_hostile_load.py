"""One large request must not stop the server (issue 19, finding 5).

A stream with 10,000 subjects took natsjs 23 s to check, pair by pair, on the event
loop: no other client was answered meanwhile.  The checks are now set-wise
(natsjs/_core/subjecttrie.pyx driven by natsjs/jetstream/subjects.py) and a large
request is decoded and checked off the loop (Api.off_loop).

- The set-wise checks against nats-server's nested loops over the pairwise relations,
  on random subject lists, wildcards, nats-server's quirky tokens (``*x``, ``>y``) and
  invalid subjects included.
- The pairwise relations against the definitions natsjs had (on ordinary subjects,
  where nats-server agrees with them), and the subjects where nats-server's differ.
- End to end: the answers for overlapping subjects and filters equal nats-server's, and
  another client's PINGs are answered while the large requests are processed.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import nats
import nats.errors
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsdiff  # noqa: E402
from conftest import start_natsjs, start_reference  # noqa: E402
from natsjs._core.subjecttrie import SubjectTrie  # noqa: E402
from natsjs.jetstream.subjects import (any_collide, filters_overlap, first_overlap,  # noqa: E402
                                       subjects_collide, subset_match, valid_subject)


# ---- the definitions: nats-server's loops over the pairwise relations -------------------

def loop_first_overlap(subjects, upto):
    """server/stream.go checkStreamCfg: for i in order, the first later j colliding."""
    for i in range(upto):
        for j in range(i + 1, len(subjects)):
            if subjects_collide(subjects[j], subjects[i]):
                return i, j
    return None


def loop_filters_overlap(filters, upto):
    """server/consumer.go checkConsumerCfg's filter loop, up to the first invalid one."""
    return any(i != j and subset_match(filters[i], filters[j])
               for i in range(upto) for j in range(len(filters)))


def loop_any_collide(ours, theirs):
    return any(subjects_collide(b, a) for a in ours for b in theirs)


def old_subjects_collide(a: str, b: str) -> bool:
    """natsjs's definition before the set-wise checks (for ordinary subjects)."""
    if a == b:
        return True
    ta, tb = a.split("."), b.split(".")
    la, lb = len(ta), len(tb)
    for i in range(min(la, lb)):
        x, y = ta[i], tb[i]
        if x == ">" or y == ">":
            return True
        if x != y and x != "*" and y != "*":
            return False
    if la == lb:
        return True
    longer = ta if la > lb else tb
    shorter_len = min(la, lb)
    return longer[shorter_len - 1] == ">" if shorter_len else False


def old_subset_match(subject: str, test: str) -> bool:
    ts, tt = subject.split("."), test.split(".")
    for i, t in enumerate(tt):
        if t == ">":
            return len(ts) > i
        if i >= len(ts):
            return False
        s = ts[i]
        if s == ">":
            return False
        if t == "*":
            continue
        if s == "*" or s != t:
            return False
    return len(ts) == len(tt)


# ---- random subjects --------------------------------------------------------------------

PLAIN = ["a", "b", "c", "*", ">"]
QUIRKY = PLAIN + ["*x", ">y", "ab"]
BROKEN = QUIRKY + ["", " ", "a b"]


def subjects_of(tokens, max_tokens=4):
    return st.lists(st.sampled_from(tokens), min_size=1, max_size=max_tokens).map(".".join)


def valid_of(tokens):
    return subjects_of(tokens).filter(valid_subject)


def prefix_checked(subjects):
    """Where nats-server's stream loop would stop before overlaps: the first subject
    that is invalid or repeats an earlier one."""
    seen = set()
    for i, s in enumerate(subjects):
        if not valid_subject(s) or s in seen:
            return i
        seen.add(s)
    return len(subjects)


@settings(max_examples=400, deadline=None)
@given(st.lists(subjects_of(BROKEN), max_size=12))
def test_first_overlap_is_the_streams_loop(subjects):
    upto = prefix_checked(subjects)
    assert first_overlap(subjects, upto) == loop_first_overlap(subjects, upto)


@settings(max_examples=400, deadline=None)
@given(st.lists(subjects_of(BROKEN), max_size=12))
def test_filters_overlap_is_the_consumers_loop(filters):
    upto = next((i for i, f in enumerate(filters) if not valid_subject(f)), len(filters))
    assert filters_overlap(filters, upto) == loop_filters_overlap(filters, upto)


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_of(QUIRKY), max_size=8), st.lists(valid_of(QUIRKY), max_size=8))
def test_any_collide_is_the_accounts_loop(ours, theirs):
    assert any_collide(ours, theirs) == loop_any_collide(ours, theirs)


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_of(QUIRKY), max_size=10), subjects_of(BROKEN, 5),
       st.integers(min_value=-1, max_value=10))
def test_trie_walks_find_the_least_position(stored, query, exclude):
    trie = SubjectTrie()
    for i, s in enumerate(stored):
        trie.add(s, i)
    least = {}
    for i, s in enumerate(stored):
        least.setdefault(s, i)
    collide = [p for s, p in least.items() if subjects_collide(query, s)]
    assert trie.first_collision(query) == min(collide, default=-1)
    within = [p for s, p in least.items() if p != exclude and subset_match(s, query)]
    assert trie.first_within(query, exclude) == min(within, default=-1)
    assert len(trie) == len(least)


@settings(max_examples=500, deadline=None)
@given(subjects_of(PLAIN), subjects_of(PLAIN))
def test_pairwise_relations_keep_the_old_answers_on_ordinary_subjects(a, b):
    if valid_subject(a) and valid_subject(b):
        assert subjects_collide(a, b) == old_subjects_collide(a, b)
        assert subset_match(a, b) == old_subset_match(a, b)


@pytest.mark.parametrize("a,b,collide", [
    ("*x.*", "y.*", True),      # two wildcard subjects: tokens compared by first character
    ("*x.a", "y.a", False),     # two literals: equal or not
    ("*x.a", "*.a", True),
    (">y.*", "z.*", True),
    ("", ">", True),            # (an empty filter of a transform)
    ("a.>.b", "a.*", False),    # a later, still unchecked, invalid subject
    ("a.>.b", "a.>", True),
    ("a..b", "a.>", True),
])
def test_pairwise_collide_follows_nats_server(a, b, collide):
    assert subjects_collide(a, b) is collide
    assert subjects_collide(b, a) is collide


@pytest.mark.parametrize("subject,test,within", [
    ("y.a", "*x.a", True),      # a test token starting with '*' takes a literal ...
    ("*.a", "*x.a", False),     # ... but not '*'
    ("*.a", "*.a", True),
    ("a.b", "a.>.c", True),     # '>' in the test ends the walk
    ("a", "a.>", False),
])
def test_pairwise_subset_follows_nats_server(subject, test, within):
    assert subset_match(subject, test) is within


def test_large_lists_are_not_quadratic():
    """100,000 subjects: far below the 5 billion pairs the loops would compare."""
    subjects = ["s.%d.x" % i for i in range(100_000)]
    start = time.monotonic()
    assert first_overlap(subjects) is None
    assert first_overlap(subjects + ["s.*.x"]) == (0, 100_000)
    assert not filters_overlap(subjects)
    assert filters_overlap(subjects + ["s.>"])
    assert any_collide(subjects, ["s.99999.*"])
    # Generous: the pairs alone would take hours; here it is a second or two.
    assert time.monotonic() - start < 60


# ---- end to end ---------------------------------------------------------------------------

def _api(s, what, body):
    return s.request("$JS.API." + what, body)


async def overlap_answers(s):
    """Overlaps within a stream, with another stream, among a consumer's filters: which
    error nats-server gives, and for which pair, when invalid subjects come later."""
    for name, subjects in [("D", ["a", "a"]), ("Q", ["*x.*", "y.*"]), ("L", ["*x.a", "y.a"]),
                           ("P", ["b.*", "b.c"]), ("I", ["c.>", "c.>.d"]),
                           ("J", ["e.*", "bad..x", "e.f"]), ("K", ["bad..x", "g.*", "g.h"]),
                           ("W", ["w.1", "w.*.x", "w.2", "w.>"])]:
        await _api(s, "STREAM.CREATE." + name, {"name": name, "subjects": subjects})
    # Without no_ack, "*x.*" meets "$JS.>" first (its '*x' can match '$JS').
    await _api(s, "STREAM.CREATE.QN", {"name": "QN", "subjects": ["*x.*", "y.*"],
                                       "no_ack": True})
    await _api(s, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>", "t.1"]})
    await _api(s, "STREAM.CREATE.T", {"name": "T", "subjects": ["u.1", "t.*"]})
    await _api(s, "STREAM.CREATE.T", {"name": "T", "subjects": ["u.1", "u.*"]})
    await _api(s, "STREAM.UPDATE.S", {"name": "S", "subjects": ["s.>", "t.1", "u.7"]})
    for cname, filters in [("C1", ["s.a", "s.*"]), ("C2", ["s.a", "s.bad..x", "s.*"]),
                           ("C3", ["s.bad..x", "s.a", "s.*"]), ("C4", ["s.a", "s.a"]),
                           ("C5", ["s.a.*", "s.b.>", "s.*x.c"]), ("C6", ["s.y.c", "s.*x.c"])]:
        await _api(s, "CONSUMER.CREATE.S." + cname,
                   {"stream_name": "S", "config": {"name": cname, "filter_subjects": filters}})


def test_overlap_answers_match_nats_server():
    sc = jsdiff.Scenario("overlap_answers", overlap_answers,
                         "overlapping subjects and filters")
    expected = jsdiff.run_scenario(sc, "reference")
    actual = jsdiff.run_scenario(sc, "natsjs")
    diffs = jsdiff.compare(jsdiff.checked(expected), jsdiff.checked(actual))
    assert not diffs, "\n".join(diffs[:40])


N_SUBJECTS = 10_000
N_FILTERS = 5_000
PING_BOUND = 1.0     # seconds; the quadratic checks held the loop for 10-25 s


async def large_requests(url: str) -> dict:
    """A 10,000-subject stream create, a 5,000-filter consumer create and a stream
    create whose last subject overlaps the first, while another connection keeps
    doing PING round trips.  Returns the answers, the requests' times and the
    longest round trip."""
    nc = await nats.connect(url, allow_reconnect=False)
    pinger = await nats.connect(url, allow_reconnect=False)
    subjects = ["big.%d.x" % i for i in range(N_SUBJECTS)]
    filters = subjects[:N_FILTERS]
    requests = [
        ("STREAM.CREATE.BIG", {"name": "BIG", "subjects": subjects, "storage": "memory"}),
        ("CONSUMER.CREATE.BIG.C", {"stream_name": "BIG", "config": {
            "name": "C", "durable_name": "C", "ack_policy": "explicit",
            "filter_subjects": filters}}),
        ("STREAM.CREATE.CLASH", {"name": "CLASH", "storage": "memory", "subjects": [
            "clash.%d" % i for i in range(N_SUBJECTS)] + ["clash.*"]}),
    ]
    out = {"answers": [], "seconds": [], "longest_ping": 0.0, "pings": 0}
    done = False

    async def ping():
        while not done:
            t = time.monotonic()
            try:
                await pinger.flush(timeout=30)
            except nats.errors.TimeoutError:
                pass                    # counted as the 30 s it waited
            out["longest_ping"] = max(out["longest_ping"], time.monotonic() - t)
            out["pings"] += 1

    task = asyncio.ensure_future(ping())
    try:
        for what, body in requests:
            t = time.monotonic()
            msg = await nc.request("$JS.API." + what, json.dumps(body).encode(), timeout=120)
            out["seconds"].append(time.monotonic() - t)
            out["answers"].append(json.loads(msg.data))
    finally:
        done = True
        await task
        await nc.close()
        await pinger.close()
    return out


def _run_large(server) -> dict:
    return asyncio.run(large_requests("nats://127.0.0.1:%d" % server.port))


def _essence(answer: dict):
    """What must agree: the error, or the subjects and filters that were taken."""
    if "error" in answer:
        return {"error": answer["error"]}
    cfg = answer["config"]
    return {"type": answer["type"], "subjects": cfg.get("subjects"),
            "filter_subjects": cfg.get("filter_subjects")}


def test_large_requests_leave_others_answered(tmp_path):
    natsjs = start_natsjs("-js", "-sd", str(tmp_path / "natsjs"))
    try:
        ours = _run_large(natsjs)
    finally:
        natsjs.stop()
    reference = start_reference("-js", "-sd", str(tmp_path / "reference"))
    try:
        theirs = _run_large(reference)
    finally:
        reference.stop()
    print("natsjs: requests %s s, longest PING %.3f s over %d; nats-server: requests %s s, "
          "longest PING %.3f s over %d"
          % (["%.2f" % t for t in ours["seconds"]], ours["longest_ping"], ours["pings"],
             ["%.2f" % t for t in theirs["seconds"]], theirs["longest_ping"],
             theirs["pings"]))
    assert [_essence(a) for a in ours["answers"]] == [_essence(a) for a in theirs["answers"]]
    assert ours["pings"] > 0
    assert ours["longest_ping"] < PING_BOUND
