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
    sl.match(b"a.b")          # 3 plain + 1 queue group
    sl.match(b"a.c")          # 1 queue group
    st = sl.stats()
    assert st["max_fanout"] == 4
    assert st["avg_fanout"] == 2.5
    assert st["num_cache"] == 2
