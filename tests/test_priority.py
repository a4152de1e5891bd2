"""natsjs/jetstream/priority.py's rules on their own: the checks of a pull request's
priority group, the order of a prioritized queue, overflow minimums (the end-to-end
comparisons with nats-server are in tests/test_jetstream_priority.py)."""
from __future__ import annotations

import collections

import pytest

from natsjs.jetstream import priority as P


class Pin:
    """A stand-in for priority.Pin's state in ``refusal`` (no consumer needed)."""

    def __init__(self, pin_id=""):
        self.id = pin_id
        self.touched = 0

    def touch(self):
        self.touched += 1


class Req:
    def __init__(self, name, prio=None):
        self.name = name
        self.pg = None if prio is None else P.PriorityRequest({"priority": prio})


def pg(**kw):
    return P.PriorityRequest(kw)


@pytest.mark.parametrize("policy, request_fields, expected", [
    ("none", {"min_pending": 1}, (400, "Bad Request - Not a Overflow Priority consumer")),
    ("pinned_client", {"min_ack_pending": 1, "group": "A"},
     (400, "Bad Request - Not a Overflow Priority consumer")),
    ("overflow", {"id": "X", "group": "A"},
     (400, "Bad Request - Not a Pinned Client Priority consumer")),
    ("none", {"priority": 10}, (400, "Bad Request - Priority must be between 0 and 9")),
    ("prioritized", {"priority": -1, "group": "A"},
     (400, "Bad Request - Priority must be between 0 and 9")),
    ("none", {"group": "Z", "priority": 9}, None),
    ("overflow", {}, (400, "Bad Request - Priority Group missing")),
    ("overflow", {"group": "B"}, (400, "Bad Request - Invalid Priority Group")),
    ("overflow", {"group": "A", "min_pending": 5}, None),
    ("prioritized", {"group": "A", "priority": 0}, None),
])
def test_refusal(policy, request_fields, expected):
    assert P.refusal(policy, ["A"], Pin(), pg(**request_fields)) == expected


def test_refusal_of_a_pin():
    pin = Pin("P1")
    assert P.refusal("pinned_client", ["A"], pin, pg(group="A", id="P2")) == \
        (423, "Nats-Pin-Id mismatch")
    assert pin.touched == 0
    assert P.refusal("pinned_client", ["A"], pin, pg(group="A", id="P1")) is None
    assert pin.touched == 1                 # the pinned client keeps its pin
    assert P.refusal("pinned_client", ["A"], pin, pg(group="A")) is None
    assert P.refusal("pinned_client", ["A"], Pin(), pg(group="A", id="OLD")) is None
    assert P.refusal("pinned_client", ["A"], pin, None) is None     # a plain request


def test_prioritized_order_and_turns():
    q = collections.deque()
    for name, prio in [("a5", 5), ("b1", 1), ("c5", 5), ("d0", 0), ("e", None), ("f1", 1)]:
        P.insert_prioritized(q, Req(name, prio))
    assert [r.name for r in q] == ["d0", "b1", "f1", "a5", "c5", "e"]
    P.requeue_prioritized(q, q[0])          # alone in its priority: stays first
    assert [r.name for r in q] == ["d0", "b1", "f1", "a5", "c5", "e"]
    q.popleft()
    P.requeue_prioritized(q, q[0])          # b1 served one: f1's turn
    assert [r.name for r in q] == ["f1", "b1", "a5", "c5", "e"]


@pytest.mark.parametrize("fields, pending, ack_pending, waits", [
    ({}, 0, 0, False),
    ({"min_pending": 3}, 2, 0, True),
    ({"min_pending": 3}, 3, 0, False),
    ({"min_ack_pending": 2}, 0, 1, True),
    ({"min_ack_pending": 2}, 0, 2, False),
    ({"min_pending": 10, "min_ack_pending": 2}, 1, 2, False),      # either one
    ({"min_pending": 10, "min_ack_pending": 2}, 1, 1, True),
])
def test_overflow_minimums(fields, pending, ack_pending, waits):
    assert P.overflow_waits(pg(**fields), pending, ack_pending) is waits
    assert P.overflow_waits(None, pending, ack_pending) is False


def test_pin_ids_look_like_nuids():
    ids = {P.new_pin_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 22 and i.isalnum() for i in ids)
