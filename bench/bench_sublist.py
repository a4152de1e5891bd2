"""Micro-benchmarks of the subject trie (natsjs/_core/sublist.pyx), run by ``make micro``.

Matching literal subjects against a trie of 10,000 subscriptions with wildcards and queue
groups, with the match cache warm (the steady state of a busy subject) and cold (a cache
of 1 entry, so every match walks the trie), plus insert/remove churn.
"""
import pytest

sublist = pytest.importorskip("natsjs._core.sublist")

N_SUBS = 10_000
SUBJECTS = [b"orders.%d.created" % (i % 500) for i in range(1000)]


def _filled(cache_max: int):
    sl = sublist.Sublist(cache_max=cache_max)
    for i in range(N_SUBS):
        k = i % 500
        if i % 10 == 0:
            subj = b"orders.*.created"
        elif i % 10 == 1:
            subj = b"orders.>"
        else:
            subj = b"orders.%d.created" % k
        sl.insert(sublist.Subscription(subj, queue=b"q" if i % 7 == 0 else None, sid=b"%d" % i))
    return sl


@pytest.mark.parametrize("cache", ["warm", "cold"])
def test_match(benchmark, cache):
    benchmark.group = "sublist"
    sl = _filled(4096 if cache == "warm" else 1)

    def run():
        m = sl.match
        total = 0
        for s in SUBJECTS:
            total += len(m(s))
        return total
    assert benchmark(run) > 0
    benchmark.extra_info["matches_per_round"] = len(SUBJECTS)


def test_insert_remove(benchmark):
    benchmark.group = "sublist"
    sl = _filled(1024)
    subs = [sublist.Subscription(b"churn.%d.x" % i, sid=b"c%d" % i) for i in range(1000)]

    def run():
        for s in subs:
            sl.insert(s)
        for s in subs:
            sl.remove(s)
    benchmark(run)
