"""natsjs/_core/interest.pyx: local interest counted per account, and the RS+/RS- lines."""
from natsjs._core.interest import count_interest, interest_lines, rm_items, rm_lines
from natsjs._core.sublist import Subscription


def subs(*specs):
    return [Subscription(s, q, b"%d" % i) for i, (s, q) in enumerate(specs)]


def test_plain_interest_is_announced_on_first_and_withdrawn_on_last():
    rm = {}
    a1, a2, b = subs((b"a", None), (b"a", None), (b"b", None))
    assert count_interest(rm, [a1, a2, b], 1) == [a1, b]
    assert rm == {b"a": 2, b"b": 1}
    assert bytes(interest_lines([a1, b], rm, b"$G ", 1)) == b"RS+ $G a\r\nRS+ $G b\r\n"
    assert count_interest(rm, [a1], -1) == []
    assert count_interest(rm, [a2, b], -1) == [a2, b]
    assert rm == {}
    assert bytes(interest_lines([a2, b], rm, b"", -1)) == b"RS- a\r\nRS- b\r\n"


def test_queue_groups_go_out_once_per_batch_with_their_count():
    rm = {}
    q1, q2, other = subs((b"w", b"g"), (b"w", b"g"), (b"w", b"h"))
    changed = count_interest(rm, [q1, q2, other], 1)
    assert changed == [q1, other]
    assert bytes(interest_lines(changed, rm, b"A ", 1)) == b"RS+ A w g 2\r\nRS+ A w h 1\r\n"
    changed = count_interest(rm, [q1], -1)
    assert bytes(interest_lines(changed, rm, b"A ", -1)) == b"RS+ A w g 1\r\n"
    changed = count_interest(rm, [q2, other], -1)
    assert bytes(interest_lines(changed, rm, b"A ", -1)) == b"RS- A w g\r\nRS- A w h\r\n"
    assert rm == {}


def test_removing_what_was_never_counted_changes_nothing():
    rm = {b"a": 1}
    (x,) = subs((b"x", None))
    assert count_interest(rm, [x], -1) == [x]     # withdrawn (count 0), never negative
    assert rm == {b"a": 1}


def test_whole_map_as_lines():
    rm = {}
    count_interest(rm, subs((b"a", None), (b"w", b"g"), (b"w", b"g")), 1)
    assert bytes(rm_lines(rm, b"$G ", True)) == b"RS+ $G a\r\nRS+ $G w g 2\r\n"
    assert bytes(rm_lines(rm, b"", False)) == b"RS- a\r\nRS- w g\r\n"
    assert sorted(rm_items(rm), key=repr) == [(b"a", None, 1), (b"w", b"g", 2)]
