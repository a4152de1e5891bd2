"""The checker: from a history and the final replicas, what went wrong.

Inputs are plain data, so the checker can be tested on made-up histories:

* ``ops``: the clients' operations (``workload.Op``): publish/enqueue attempts with their
  outcome (ok / failed / unknown) and PubAck sequence, the worker's deliveries and acks;
* ``replicas``: ``{node name: {seq: payload}}``, every replica of the stream as read from
  its files after the cluster healed (``replicas.py``).

What it reports (``check()`` returns a flat dict; ``valid`` is the verdict):

``lost``           acknowledged values missing from at least one replica
``lost_all``       acknowledged values missing from every replica
``duplicated``     extra copies of a value within a replica (the worst replica)
``unexpected``     values in a replica that no client ever sent
``misplaced``      acknowledged values not at the sequence their PubAck named
``order``          per publisher, acknowledged values stored out of their send order
``divergent``      sequences at which the replicas do not hold the same payload
``availability``   acknowledged attempts / attempts
``longest_gap_s``  the longest time with attempts under way and no acknowledgement
``q_lost``         enqueued (acknowledged) values the worker never received and that
                   are not in the queue stream either
``q_redelivered_after_ack``  deliveries of a value after its ack was confirmed
``q_unexpected``   deliveries of values never enqueued
``unrecovered``    nodes that could not be restarted after a fault (the runner counts them)

Failed attempts whose value is stored anyway (``failed_stored``) and unknown ones that were
stored (``unknown_stored``) are counted but are no error: a failure can be reported after
the write reached a quorum (a reply lost on the way), which is why clients retry with
``Nats-Msg-Id``.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from natsjs.testing.chaos.workload import FAILED, OK, UNKNOWN

WARMUP = b"warmup"
ERRORS = ("lost", "lost_all", "duplicated", "unexpected", "misplaced", "order", "divergent",
          "q_lost", "q_redelivered_after_ack", "q_unexpected", "unrecovered")


def longest_gap(ops, kind: str = "publish") -> float:
    """Longest stretch (seconds) between acknowledgements while attempts were under way:
    from the first attempt to the first ack, between successive acks, and from the last
    ack to the last attempt's end."""
    attempts = [o for o in ops if o.kind == kind]
    if not attempts:
        return 0.0
    start = min(o.start_ns for o in attempts)
    end = max(max(o.end_ns, o.start_ns) for o in attempts)
    acks = sorted(o.end_ns for o in attempts if o.outcome == OK)
    marks = [start] + acks + [end]
    return max(b - a for a, b in zip(marks, marks[1:])) / 1e9


def _order_violations(acked, where: dict[str, int]) -> int:
    """Per process, acknowledged values (in the order they were sent) whose stored
    sequence is not above the previous one's."""
    bad = 0
    per = defaultdict(list)
    for o in sorted(acked, key=lambda o: o.start_ns):
        per[o.process].append(o)
    for seq_ops in per.values():
        last = 0
        for o in seq_ops:
            s = where.get(o.value)
            if s is None:
                continue
            if s <= last:
                bad += 1
            last = max(last, s)
    return bad


def check(ops, replicas: dict[str, dict[int, bytes]], unrecovered: int = 0,
          queue_replicas: dict[str, dict[int, bytes]] | None = None) -> dict:
    pubs = [o for o in ops if o.kind == "publish"]
    acked = [o for o in pubs if o.outcome == OK]
    sent = {o.value for o in pubs}
    acked_values = {o.value for o in acked}
    r: dict = {"attempts": len(pubs), "ok": len(acked),
               "failed": sum(o.outcome == FAILED for o in pubs),
               "unknown": sum(o.outcome == UNKNOWN for o in pubs),
               "replicas": len(replicas)}
    r["availability"] = len(acked) / len(pubs) if pubs else 0.0
    r["longest_gap_s"] = longest_gap(ops)

    # Per replica: value -> sequences holding it.
    positions: dict[str, dict[str, list[int]]] = {}
    for name, msgs in replicas.items():
        pos: dict[str, list[int]] = defaultdict(list)
        for seq, payload in msgs.items():
            if payload == WARMUP:
                continue
            pos[payload.decode(errors="replace")].append(seq)
        positions[name] = pos

    missing_any, missing_all = set(), set(acked_values)
    for pos in positions.values():
        miss = acked_values - pos.keys()
        missing_any |= miss
        missing_all &= miss
    if not replicas:
        missing_any = missing_all = set(acked_values)
    r["lost"] = len(missing_any)
    r["lost_all"] = len(missing_all)
    r["lost_values"] = sorted(missing_any)[:20]
    r["duplicated"] = max((sum(len(v) - 1 for v in pos.values() if len(v) > 1)
                           for pos in positions.values()), default=0)
    r["unexpected"] = max((sum(1 for v in pos if v not in sent) for pos in positions.values()),
                          default=0)
    misplaced = 0
    for o in acked:
        for pos in positions.values():
            seqs = pos.get(o.value)
            if seqs and o.seq not in seqs:
                misplaced += 1
                break
    r["misplaced"] = misplaced
    # Order on the replica that holds the most (they should all agree; divergence is
    # counted on its own).
    if positions:
        ref = max(positions.values(), key=len)
        r["order"] = _order_violations(acked, {v: min(s) for v, s in ref.items()})
    else:
        r["order"] = 0
    union = set()
    for msgs in replicas.values():
        union |= msgs.keys()
    r["divergent"] = sum(1 for s in union
                         if len({msgs.get(s) for msgs in replicas.values()}) > 1)
    stored = set().union(*(pos.keys() for pos in positions.values())) if positions else set()
    r["failed_stored"] = sum(1 for o in pubs if o.outcome == FAILED and o.value in stored)
    r["unknown_stored"] = sum(1 for o in pubs if o.outcome == UNKNOWN and o.value in stored)
    r.update(check_queue(ops, queue_replicas))
    r["unrecovered"] = unrecovered
    r["valid"] = all(r[k] == 0 for k in ERRORS)
    return r


def check_queue(ops, queue_replicas: dict[str, dict[int, bytes]] | None = None) -> dict:
    """The work queue: an acknowledged enqueue must be delivered, or at least still be in
    the queue stream (``queue_replicas``, read like the main stream) when the worker had
    to stop before it came (no leader at the end): that one is ``q_undelivered``."""
    enq = [o for o in ops if o.kind == "enqueue"]
    delivered = [o for o in ops if o.kind == "deliver"]
    acks = [o for o in ops if o.kind == "ack"]
    enq_ok = {o.value for o in enq if o.outcome == OK}
    sent = {o.value for o in enq}
    got = {o.value for o in delivered}
    acked_at: dict[str, int] = {}
    for o in acks:
        if o.outcome == OK and (o.value not in acked_at or o.end_ns < acked_at[o.value]):
            acked_at[o.value] = o.end_ns
    again = sum(1 for o in delivered if o.value in acked_at and o.start_ns > acked_at[o.value])
    counts = Counter(o.value for o in delivered)
    stored = {p.decode(errors="replace") for msgs in (queue_replicas or {}).values()
              for p in msgs.values()}
    missing = enq_ok - got
    return {"q_attempts": len(enq), "q_ok": len(enq_ok),
            "q_availability": len(enq_ok) / len(enq) if enq else 0.0,
            "q_delivered": len(got), "q_redeliveries": sum(c - 1 for c in counts.values()),
            "q_lost": len(missing - stored), "q_undelivered": len(missing & stored),
            "q_redelivered_after_ack": again,
            "q_unexpected": len(got - sent)}
