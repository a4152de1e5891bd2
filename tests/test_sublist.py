"""natsjs/_core/sublist.pyx checked against a naive matcher."""
import pytest
from hypothesis import given, settings, strategies as st

from natsjs._core.sublist import (Sublist, Subscription, subject_matches, valid_literal_subject,
                                  valid_subject)


def naive_match(pattern: bytes, subject: bytes) -> bool:
    pt, stoks = pattern.split(b"."), subject.split(b".")
    for i, t in enumerate(pt):
        if t == b">":
            return len(stoks) > i
        if i >= len(stoks) or (t != b"*" and t != stoks[i]):
            return False
    return len(pt) == len(stoks)


@pytest.mark.parametrize("subject,ok", [
    (b"foo", True), (b"foo.bar", True), (b"foo.*", True), (b"foo.>", True), (b">", True),
    (b"*", True), (b"foo.*.bar", True), (b"a*.b>", True), (b"", False), (b"foo.", False),
    (b".foo", False), (b"foo..bar", False), (b"foo.>.bar", False), (b"foo bar", False),
    (b"foo\tbar", False),
])
def test_valid_subject(subject, ok):
    assert valid_subject(subject) is ok


@pytest.mark.parametrize("subject,ok", [
    (b"foo", True), (b"foo.*", False), (b"foo.>", False), (b"a*.b>", True), (b"foo..bar", False),
])
def test_valid_literal_subject(subject, ok):
    assert valid_literal_subject(subject) is ok


def test_insert_match_remove():
    sl = Sublist()
    subs = [Subscription(s, sid=str(i).encode()) for i, s in enumerate(
        [b"foo.bar", b"foo.*", b"foo.>", b">", b"*.bar", b"foo.bar.baz", b"*"])]
    for s in subs:
        sl.insert(s)
    got = {s.subject for s in sl.match(b"foo.bar").psubs}
    assert got == {b"foo.bar", b"foo.*", b"foo.>", b">", b"*.bar"}
    assert {s.subject for s in sl.match(b"foo").psubs} == {b">", b"*"}
    assert sl.count == 7
    assert sl.remove(subs[1])
    assert not sl.remove(subs[1])
    assert {s.subject for s in sl.match(b"foo.bar").psubs} == {b"foo.bar", b"foo.>", b">", b"*.bar"}
    for s in subs:
        sl.remove(s)
    assert sl.count == 0
    assert sl.match(b"foo.bar").psubs == []


def test_invalid_subject_rejected():
    with pytest.raises(ValueError):
        Sublist().insert(Subscription(b"foo..bar"))


def test_queue_groups_grouped_by_name():
    sl = Sublist()
    a1 = Subscription(b"foo", b"a", b"1")
    a2 = Subscription(b"foo.*", b"a", b"2")
    b1 = Subscription(b"foo", b"b", b"3")
    p = Subscription(b"foo", None, b"4")
    for s in (a1, a2, b1, p):
        sl.insert(s)
    r = sl.match(b"foo")
    assert r.psubs == [p]
    groups = sorted(sorted(s.sid for s in g) for g in r.qsubs)
    assert groups == [[b"1"], [b"3"]]
    r = sl.match(b"foo.x")
    assert [[s.sid for s in g] for g in r.qsubs] == [[b"2"]]


def test_cache_is_updated_on_change():
    sl = Sublist()
    assert sl.match(b"a.b").psubs == []
    s = Subscription(b"a.*")
    sl.insert(s)
    assert sl.match(b"a.b").psubs == [s]          # cached empty result was dropped
    held = sl.match(b"a.b")
    sl.remove(s)
    assert sl.match(b"a.b").psubs == []
    assert held.psubs == [s]                      # results are never mutated in place


def test_genid_changes_on_every_change():
    sl = Sublist()
    g0 = sl.genid
    s = Subscription(b"x")
    sl.insert(s)
    g1 = sl.genid
    sl.remove(s)
    assert g0 < g1 < sl.genid


TOKEN = st.sampled_from([b"a", b"b", b"c", b"dd"])
PATTERN_TOKEN = st.sampled_from([b"a", b"b", b"c", b"dd", b"*"])


@st.composite
def patterns(draw):
    toks = draw(st.lists(PATTERN_TOKEN, min_size=1, max_size=4))
    if draw(st.booleans()):
        toks.append(b">")
    return b".".join(toks)


subjects = st.lists(TOKEN, min_size=1, max_size=5).map(b".".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(patterns(), max_size=25), st.lists(subjects, min_size=1, max_size=10),
       st.data())
def test_matches_naive_matcher(pats, subjs, data):
    sl = Sublist(cache_max=8)       # small, to exercise eviction too
    subs = [Subscription(p, sid=b"%d" % i) for i, p in enumerate(pats)]
    live = []
    for s in subs:
        sl.insert(s)
        live.append(s)
        # interleave matches with changes so that cached results get invalidated
        subj = data.draw(st.sampled_from(subjs))
        assert set(sl.match(subj).psubs) == {x for x in live if naive_match(x.subject, subj)}
    for s in list(live):
        if data.draw(st.booleans()):
            sl.remove(s)
            live.remove(s)
    for subj in subjs:
        assert set(sl.match(subj).psubs) == {x for x in live if naive_match(x.subject, subj)}
        for x in live:
            assert subject_matches(x.subject, subj) == naive_match(x.subject, subj)
    assert sl.count == len(live)
    assert set(sl.subscriptions()) == set(live)


def test_stats_fanout_over_cached_results():
    sl = Sublist()
    for i in range(3):
        sl.insert(Subscription(b"a.b", sid=b"%d" % i))
    sl.insert(Subscription(b"a.*", b"q", b"9"))
    for _ in range(2):        # a subject's result is cached when it is matched again
        sl.match(b"a.b")      # 3 plain + 1 queue group
        sl.match(b"a.c")      # 1 queue group
    st = sl.stats()
    assert st["max_fanout"] == 4
    assert st["avg_fanout"] == 2.5
    assert st["num_cache"] == 2


def test_lone_subscriptions_take_no_node_and_grow_one_when_needed():
    """A subject with one plain subscription and nothing below sits in its level
    directly; a second interest there (or below) gives it a node, in order."""
    sl = Sublist()
    a = Subscription(b"x.y", sid=b"a")
    sl.insert(a)
    sl.insert(a)                                   # a duplicate is a no-op
    assert sl.count == 1 and sl.match(b"x.y").psubs == [a]
    assert sl.match(b"x.y.z").psubs == [] and sl.match(b"x").psubs == []
    below = Subscription(b"x.y.z", sid=b"b")
    sl.insert(below)
    q = Subscription(b"x.y", b"g", b"q")
    sl.insert(q)
    second = Subscription(b"x.y", sid=b"c")
    sl.insert(second)
    assert sl.match(b"x.y").psubs == [a, second]
    assert [g for g in sl.match(b"x.y").qsubs] == [[q]]
    assert sl.match(b"x.y.z").psubs == [below]
    assert set(sl.subscriptions()) == {a, below, q, second}
    for s in (a, q, below, second):
        assert sl.remove(s)
        assert not sl.remove(s)
    assert sl.count == 0 and sl.subscriptions() == []
    # a lone one next to wildcards at the same level
    star, lone = Subscription(b"m.*", sid=b"s"), Subscription(b"m.n", sid=b"l")
    sl.insert(star)
    sl.insert(lone)
    assert set(sl.match(b"m.n").psubs) == {star, lone}
    assert sl.match(b"m.o").psubs == [star]
    assert not sl.remove(Subscription(b"m.n", sid=b"other"))
    assert not sl.remove(Subscription(b"m.n.o", sid=b"l"))
    assert sl.remove(lone) and sl.match(b"m.n").psubs == [star]


def test_clear_forgets_everything():
    sl = Sublist()
    sl.insert(Subscription(b"a"))
    sl.match(b"a")
    sl.clear()
    assert sl.count == 0 and sl.match(b"a").psubs == [] and sl.subscriptions() == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(patterns(), st.sampled_from([None, b"q1", b"q2"]), st.booleans()),
                max_size=30), st.lists(subjects, min_size=1, max_size=6))
def test_queue_and_plain_mix_matches_naive(ops, subjs):
    sl = Sublist(cache_max=4)
    live = []
    for i, (pat, queue, remove_one) in enumerate(ops):
        s = Subscription(pat, queue, b"%d" % i)
        sl.insert(s)
        live.append(s)
        if remove_one and live:
            victim = live.pop(len(live) // 2)
            assert sl.remove(victim)
        for subj in subjs:
            r = sl.match(subj)
            want = [x for x in live if naive_match(x.subject, subj)]
            assert set(r.psubs) == {x for x in want if x.queue is None}
            got_q = {m for g in r.qsubs for m in g}
            assert got_q == {x for x in want if x.queue is not None}
    assert set(sl.subscriptions()) == set(live) and sl.count == len(live)


def test_subjects_matched_once_are_not_cached():
    """Reply inboxes are matched once each: their results must not fill the cache (nor
    keep the collector busy), while a subject matched again is cached."""
    sl = Sublist(cache_max=64)
    sl.insert(Subscription(b"_INBOX.x.*", sid=b"1"))
    for i in range(1000):
        assert len(sl.match(b"_INBOX.x.%d" % i).psubs) == 1
    assert sl.cache_size() == 0
    first = sl.match(b"_INBOX.x.999")
    assert sl.cache_size() == 1
    assert sl.match(b"_INBOX.x.999") is first
