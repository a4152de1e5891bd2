"""natsjs/_core/fanout.pyx: SUB/UNSUB and RS+/RS- handled in the cores, in batches.

The cores are driven directly with protocol bytes (no sockets): what they put in the
sublist, what they hand Python (``on_interest`` once per read batch, ``on_op`` for what
they leave alone) and what they write back.
"""
import gc
import random

import pytest

from natsjs._core import parser as P
from natsjs._core.fanout import ClientCore, PeerSubs, RouteCore, consume
from natsjs._core.sublist import Sublist


class Recorder:
    def __init__(self):
        self.ops = []
        self.batches = []

    def on_op(self, op, args):
        self.ops.append((op, args))

    def on_interest(self, subs, delta):
        self.batches.append(([(s.subject, s.queue, s.sid) for s in subs], delta))


def client(verbose=False):
    rec = Recorder()
    core = ClientCore(rec.on_op, None, Sublist())
    core.on_interest = rec.on_interest
    core.fast_subs = True
    core.verbose = verbose
    return core, rec


def subjects(sl, subject):
    return sorted(s.sid for s in sl.match(subject).psubs)


def test_subs_of_one_read_reach_python_in_one_batch():
    core, rec = client()
    core.feed(b"SUB a 1\r\nSUB b q 2\r\nSUB c.* 3\r\n")
    assert rec.ops == []
    assert rec.batches == [([(b"a", None, b"1"), (b"b", b"q", b"2"), (b"c.*", None, b"3")], 1)]
    assert sorted(core.subs) == [b"1", b"2", b"3"]
    assert subjects(core.sublist, b"a") == [b"1"]
    assert [[s.sid for s in g] for g in core.sublist.match(b"b").qsubs] == [[b"2"]]
    assert subjects(core.sublist, b"c.x") == [b"3"]
    core.feed(b"UNSUB 1\r\nUNSUB 3\r\n")
    assert rec.batches[1:] == [([(b"a", None, b"1"), (b"c.*", None, b"3")], -1)]
    assert sorted(core.subs) == [b"2"] and core.sublist.count == 1


def test_batches_keep_the_order_of_operations():
    """A batch holds one direction; an UNSUB after SUBs closes the SUB batch first, and
    an operation Python handles (PING) sees everything before it already handed on."""
    core, rec = client()
    seen = []
    core.on_interest = lambda subs, d: seen.append(("interest", [s.sid for s in subs], d))
    rec.on_op = None
    core2 = ClientCore(lambda op, a: seen.append(("op", op)), None, core.sublist)
    core2.on_interest = core.on_interest
    core2.fast_subs = True
    core2.verbose = False
    core2.feed(b"SUB a 1\r\nSUB b 2\r\nUNSUB 1\r\nSUB c 3\r\nPING\r\nSUB d 4\r\n")
    assert seen == [("interest", [b"1", b"2"], 1), ("interest", [b"1"], -1),
                    ("interest", [b"3"], 1), ("op", P.PING), ("interest", [b"4"], 1)]


def test_interest_goes_out_before_a_message_published_after_it():
    core, rec = client()
    order = []
    core.on_interest = lambda subs, d: order.append("interest")
    core.headers = True
    core.feed(b"SUB reply 1\r\nPUB req reply 2\r\nhi\r\n")
    assert order == ["interest"]
    # the message reached nobody, but the interest was handed on before it
    assert core.in_msgs == 1


def test_sub_replies_as_python_did():
    core, rec = client(verbose=True)
    core.feed(b"SUB a 1\r\nSUB a 1\r\nSUB foo..bar 2\r\nUNSUB 9\r\n")
    assert bytes(core.out) == b"+OK\r\n+OK\r\n-ERR 'Invalid Subject'\r\n+OK\r\n"
    assert list(core.subs) == [b"1"]
    assert rec.batches == [([(b"a", None, b"1")], 1)]


def test_unsub_with_max_arms_the_subscription():
    core, rec = client()
    core.feed(b"SUB a 1\r\nUNSUB 1 5\r\n")
    sub = core.subs[b"1"]
    assert sub.max_msgs == 5 and not sub.closed
    core.feed(b"UNSUB 1 x\r\n")        # not a number: unsubscribe now (parseSize -1)
    assert sub.closed and not core.subs and core.sublist.count == 0


@pytest.mark.parametrize("line", [b"SUB a\r\n", b"SUB a b c d\r\n", b"UNSUB 1 2 3\r\n"])
def test_malformed_lines_go_to_python(line):
    core, rec = client()
    core.feed(line)
    assert rec.ops == [(P.SUB if line.startswith(b"SUB") else P.UNSUB, line[line.index(b" ") + 1:-2])]
    assert rec.batches == []


def test_slow_path_when_disabled_and_at_the_limit():
    core, rec = client()
    core.fast_subs = False
    core.feed(b"SUB a 1\r\n")
    assert rec.ops == [(P.SUB, b"a 1")] and not core.subs
    core.fast_subs = True
    core.max_subs = 1
    core.feed(b"SUB a 1\r\nSUB b 2\r\n")
    assert list(core.subs) == [b"1"] and rec.ops[-1] == (P.SUB, b"b 2")


@pytest.mark.parametrize("seed", range(20))
def test_any_split_gives_the_same_subscriptions(seed):
    data = b"".join(b"SUB s.%d %s%d\r\n" % (i, b"q " if i % 3 == 0 else b"", i)
                    for i in range(200)) + b"".join(b"UNSUB %d\r\n" % i for i in range(0, 200, 7))
    rnd = random.Random(seed)
    core, rec = client()
    i = 0
    while i < len(data):
        k = rnd.randint(1, 30)
        core.feed(memoryview(bytearray(data[i:i + k])))
        i += k
    live = {b"%d" % i for i in range(200) if i % 7}
    assert set(core.subs) == live and core.sublist.count == len(live)
    added = [sid for subs, d in rec.batches if d == 1 for _, _, sid in subs]
    removed = [sid for subs, d in rec.batches if d == -1 for _, _, sid in subs]
    assert added == [b"%d" % i for i in range(200)]
    assert removed == [b"%d" % i for i in range(0, 200, 7)]


def test_registered_subscriptions_stay_out_of_the_gc_lists():
    """While registered a subscription is not tracked by the cyclic GC; once it leaves
    it is again, so a closed connection's cycle can be collected."""
    core, rec = client()
    core.feed(b"SUB a 1\r\nSUB b 2\r\n")
    a, b = core.subs[b"1"], core.subs[b"2"]
    assert not gc.is_tracked(a) and not gc.is_tracked(b)
    core.feed(b"UNSUB 1\r\n")
    assert gc.is_tracked(a)
    dropped = core.drop_all(core.sublist, keep=True)
    assert dropped == [b] and gc.is_tracked(b) and b.closed
    assert list(core.subs) == [b"2"] and core.sublist.count == 0


def test_a_dropped_connection_with_its_subscriptions_is_collected():
    import weakref

    class Owner:
        pass
    owner = Owner()
    core = ClientCore(lambda op, a: None, owner, Sublist())
    core.fast_subs = True
    core.verbose = False
    owner.core = core                      # the cycle a real connection has
    core.feed(b"SUB a 1\r\n")
    core.drop_all(core.sublist, keep=True)
    ref = weakref.ref(owner)
    del owner, core
    gc.collect()
    assert ref() is None


# ---- routes ----------------------------------------------------------------------------

def route(pinned=None, limit=1000):
    rec = Recorder()
    sublists = {b"$G": Sublist(), b"A": Sublist()}
    core = RouteCore(rec.on_op, None, sublists)
    core.pinned_account = pinned
    core.no_account = pinned is not None
    core.interest_ok = True
    core.peer_subs = PeerSubs(limit)
    return core, rec, sublists


def test_remote_interest_in_the_core():
    core, rec, sls = route()
    core.feed(b"RS+ $G foo\r\nRS+ A bar q 3\r\nRS+ $G foo\r\n")
    assert rec.ops == []
    assert sorted(core.remote_subs) == [b"$G foo", b"A bar q"]
    assert core.peer_subs.count == 2
    assert sls[b"$G"].match(b"foo").psubs[0].sid == b"$G foo"
    [group] = sls[b"A"].match(b"bar").qsubs
    assert len(group) == 3                 # listed once per member of the weight
    assert not gc.is_tracked(core.remote_subs[b"$G foo"])
    core.feed(b"RS- A bar q\r\nRS- $G nothing\r\n")
    assert sorted(core.remote_subs) == [b"$G foo"] and core.peer_subs.count == 1
    assert sls[b"A"].count == 0


def test_pinned_route_interest_has_no_account():
    core, rec, sls = route(pinned=b"A")
    core.feed(b"RS+ foo\r\nRS+ bar q 1\r\nRS- foo\r\n")
    assert sorted(core.remote_subs) == [b"A bar q"]
    assert sls[b"A"].count == 1 and sls[b"$G"].count == 0


def test_remote_interest_left_to_python():
    """Python takes what it must report or decide: an unknown account, a new weight,
    a peer at its limit, a malformed line, and everything before registration."""
    core, rec, sls = route(limit=1)
    core.feed(b"RS+ $G a\r\nRS+ X b\r\nRS+ $G c\r\nRS+ $G q g 1\r\nRS+ $G a x y z\r\n")
    assert [a for _, a in rec.ops] == [b"X b", b"$G c", b"$G q g 1", b"$G a x y z"]
    core.peer_subs.limit = 10
    core.feed(b"RS+ $G q g 1\r\nRS+ $G q g 2\r\nRS+ $G q g 1\r\n")
    assert rec.ops[-1] == (P.RS_PLUS, b"$G q g 2")
    core.interest_ok = False
    core.feed(b"RS- $G a\r\n")
    assert rec.ops[-1] == (P.RS_MINUS, b"$G a") and b"$G a" in core.remote_subs


def test_remote_interest_without_arguments_goes_to_python():
    core, rec, sls = route()
    core.feed(b"RS+\r\nRS-  \r\n")
    assert [op for op, _ in rec.ops] == [P.RS_PLUS, P.RS_MINUS] and not core.remote_subs


def test_subscribe_permissions_checked_from_the_core():
    """With a sub_check the core still subscribes in C; a refusal goes to Python."""
    core, rec = client()
    asked = []

    def check(subject, queue):
        asked.append((subject, queue))
        return not subject.startswith(b"secret")
    core.sub_check = check
    core.feed(b"SUB ok.1 1\r\nSUB secret.x q 2\r\nSUB ok.2 g 3\r\n")
    assert asked == [(b"ok.1", None), (b"secret.x", b"q"), (b"ok.2", b"g")]
    assert sorted(core.subs) == [b"1", b"3"]
    assert rec.ops == [(P.SUB, b"secret.x q 2")]
    assert [sids for sids, _ in rec.batches] == [[(b"ok.1", None, b"1")], [(b"ok.2", b"g", b"3")]]


def subscriber_and_publisher():
    """Two client cores on one sublist, the first subscribed to ``s`` (sid 1)."""
    sl = Sublist()
    sub = ClientCore(Recorder().on_op, None, sl)
    pub = ClientCore(Recorder().on_op, None, sl)
    sub.fast_subs = pub.fast_subs = True
    sub.verbose = pub.verbose = False
    sub.feed(b"SUB s 1\r\n")
    return sub, pub


@pytest.mark.parametrize("seed", range(6))
def test_pending_output_survives_any_mix_of_appends_and_writes(seed):
    """A subscriber's pending output grows at the back while the socket takes some from
    the front: past 64 KB ``reserve`` moves what is pending inside its allocation or
    into one twice the size, and ``consume`` only moves the start.  Whatever the mix,
    the bytes taken from the front are the frames in order, and an emptied buffer
    gives its memory back."""
    rnd = random.Random(seed)
    sub, pub = subscriber_and_publisher()
    wire = bytearray()
    expected = bytearray()
    for i in range(3000):
        payload = (b"%d." % i) * rnd.choice((1, 30, 300, 3000))
        pub.feed(b"PUB s %d\r\n%s\r\n" % (len(payload), payload))
        expected += b"MSG s 1 %d\r\n%s\r\n" % (len(payload), payload)
        if rnd.random() < 0.3:
            # the socket takes a prefix: a little, about half, or all of it
            n = min(len(sub.out), rnd.choice((1, 1000, len(sub.out) // 2, len(sub.out))))
            wire += sub.out[:n]
            consume(sub.out, n)
    wire += sub.out
    assert wire == expected
    consume(sub.out, len(sub.out))
    assert len(sub.out) == 0 and sub.out.__alloc__() <= 1


def test_a_steady_backlog_stays_in_its_allocation():
    """A subscriber that reads as fast as messages come, a megabyte behind: once its
    buffer has grown, the backlog moves back to the start of the same allocation each
    time it reaches the end, and no new one is allocated (that copies the whole
    backlog into memory the kernel must fault in).  Where the contents start is read
    through a view, released at once: it advances frame by frame and jumps when the
    backlog moves, always to the same place."""
    import ctypes
    sub, pub = subscriber_and_publisher()
    frame = b"PUB s 1000\r\n" + b"x" * 1000 + b"\r\n"
    size = len(b"MSG s 1 1000\r\n") + 1002
    while len(sub.out) < 1 << 20:
        pub.feed(frame)

    def address():
        return ctypes.addressof(ctypes.c_char.from_buffer(sub.out))

    jumps = set()
    last = address()
    for i in range(20000):
        pub.feed(frame)
        consume(sub.out, size)
        now = address()
        if now != last + size and i >= 2000:
            jumps.add(now)
        last = now
    assert len(sub.out) >= 1 << 20
    assert len(jumps) == 1, "the backlog moved to %d places" % len(jumps)
