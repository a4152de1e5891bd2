"""The chaos checker on made-up histories: each error class is found, and a clean history
passes (natsjs/testing/chaos/checker.py)."""
from __future__ import annotations

import random

from natsjs.testing.chaos import checker
from natsjs.testing.chaos.corrupt import corrupt_store
from natsjs.testing.chaos.replicas import parse_blk
from natsjs.testing.chaos.workload import FAILED, OK, UNKNOWN, Op

S = 1_000_000_000  # ns


def ok(process, n, seq, t):
    return Op(process, "publish", "%s-%d" % (process, n), t, t + S // 100, OK, seq=seq)


def clean():
    """Two publishers, 5 acked values each, interleaved in the stream."""
    ops, stream = [], {}
    seq = 0
    for n in range(5):
        for p in ("p0", "p1"):
            seq += 1
            ops.append(ok(p, n, seq, seq * S // 10))
            stream[seq] = ("%s-%d" % (p, n)).encode()
    return ops, stream


def three(stream):
    return {"n1": dict(stream), "n2": dict(stream), "n3": dict(stream)}


def test_clean_history_is_valid():
    ops, stream = clean()
    r = checker.check(ops, three(stream))
    assert r["valid"], r
    assert r["availability"] == 1.0
    assert all(r[k] == 0 for k in checker.ERRORS)


def test_lost_on_one_replica_is_lost_and_divergent():
    ops, stream = clean()
    reps = three(stream)
    del reps["n2"][4]
    r = checker.check(ops, reps)
    assert not r["valid"]
    assert r["lost"] == 1 and r["lost_all"] == 0
    assert r["divergent"] == 1
    assert r["lost_values"] == [stream[4].decode()]


def test_lost_everywhere():
    ops, stream = clean()
    reps = three(stream)
    for m in reps.values():
        del m[7]
    r = checker.check(ops, reps)
    assert r["lost"] == 1 and r["lost_all"] == 1 and r["divergent"] == 0


def test_phantom_ack_is_lost():
    ops, stream = clean()
    ops.append(Op("p0", "publish", "p0-99", 10 * S, 10 * S + 1, OK, seq=0))
    r = checker.check(ops, three(stream))
    assert r["lost_all"] == 1 and not r["valid"]


def test_duplicate_and_unexpected():
    ops, stream = clean()
    reps = three(stream)
    for m in reps.values():
        m[11] = stream[3]           # stored twice
        m[12] = b"never-sent"
    r = checker.check(ops, reps)
    assert r["duplicated"] == 1
    assert r["unexpected"] == 1
    assert not r["valid"]


def test_misplaced_and_order():
    ops, stream = clean()
    reps = three(stream)
    for m in reps.values():
        # p0-1 (seq 3) and p0-2 (seq 5) swap places: both misplaced, p0 out of order
        m[3], m[5] = m[5], m[3]
    r = checker.check(ops, reps)
    assert r["misplaced"] == 2
    assert r["order"] == 1
    assert not r["valid"]


def test_unknown_and_failed_are_not_errors():
    ops, stream = clean()
    ops.append(Op("p1", "publish", "p1-50", 20 * S, 22 * S, UNKNOWN))
    ops.append(Op("p1", "publish", "p1-51", 21 * S, 21 * S + 5, FAILED, error="no responders"))
    reps = three(stream)
    for m in reps.values():
        m[11] = b"p1-50"            # an unknown that made it: allowed
        m[12] = b"p1-51"            # a "failed" that made it: counted, allowed
    r = checker.check(ops, reps)
    assert r["valid"], r
    assert r["unknown_stored"] == 1 and r["failed_stored"] == 1
    assert r["availability"] == 10 / 12


def test_longest_gap():
    ops = [Op("p0", "publish", "a", 0, S // 10, OK, seq=1),
           Op("p0", "publish", "b", S // 10, 3 * S, UNKNOWN),
           Op("p0", "publish", "c", 2 * S, 3 * S + S // 2, OK, seq=2),
           Op("p0", "publish", "d", 3 * S, 4 * S, OK, seq=3)]
    # acks at 0.1 s, 3.5 s, 4.0 s: the gap is 3.4 s
    assert abs(checker.longest_gap(ops) - 3.4) < 1e-9


def test_queue_checks():
    t = S
    ops = [Op("q", "enqueue", "q-0", t, t + 1, OK, seq=1),
           Op("q", "enqueue", "q-1", t, t + 1, OK, seq=2),
           Op("q", "enqueue", "q-2", t, t + 1, UNKNOWN),
           Op("worker", "deliver", "q-0", 2 * t, 2 * t, OK, seq=1),
           Op("worker", "ack", "q-0", 2 * t, 2 * t + 5, OK, seq=1),
           Op("worker", "deliver", "q-0", 5 * t, 5 * t, OK, seq=1, redelivered=1),
           Op("worker", "deliver", "q-9", 6 * t, 6 * t, OK, seq=9)]
    r = checker.check_queue(ops)
    assert r["q_lost"] == 1                     # q-1 acknowledged, never delivered
    assert r["q_redelivered_after_ack"] == 1    # q-0 again after a confirmed ack
    assert r["q_unexpected"] == 1               # q-9 never enqueued
    assert r["q_availability"] == 2 / 3


def test_no_replicas_means_everything_lost():
    ops, _ = clean()
    r = checker.check(ops, {})
    assert r["lost_all"] == 10 and not r["valid"]


def _blk_record(seq: int, subj: bytes, msg: bytes, hdr: bytes = b"") -> bytes:
    import struct
    body = subj + ((struct.pack("<I", len(hdr)) + hdr) if hdr else b"") + msg
    rl = 22 + len(body) + 8
    return struct.pack("<IQQH", rl | ((1 << 31) if hdr else 0), seq, 123, len(subj)) + body + b"\0" * 8


def test_parse_nats_server_block():
    data = (_blk_record(1, b"chaos.p0", b"p0-0")
            + _blk_record(2, b"chaos.p0", b"p0-1", hdr=b"NATS/1.0\r\nNats-Msg-Id: p0-1\r\n\r\n")
            + _blk_record(3 | (1 << 63), b"chaos.p0", b"erased")
            + _blk_record(1 | (1 << 62), b"", b"")
            + b"\x07\x00")                       # a torn tail
    msgs, dead = parse_blk(data)
    assert msgs == {1: b"p0-0", 2: b"p0-1"}   # read_nats_server drops the dead ones
    assert dead == {1, 3}


def test_corrupt_store_damages_files(tmp_path):
    d = tmp_path / "jetstream" / "APP" / "streams" / "S" / "msgs"
    d.mkdir(parents=True)
    (d / "1.blk").write_bytes(bytes(4096))
    (tmp_path / "jetstream" / "APP" / "streams" / "S" / "meta.json").write_text("{}")
    notes = corrupt_store(str(tmp_path), random.Random(3))
    assert len(notes) == 1 and "1.blk" in notes[0]
    data = (d / "1.blk").read_bytes()
    assert len(data) < 4096 or any(data)
    assert (tmp_path / "jetstream" / "APP" / "streams" / "S" / "meta.json").read_text() == "{}"


def test_corrupt_state_only_touches_raft_state(tmp_path):
    raft = tmp_path / "jetstream" / "APP" / "streams" / "S" / "raft"
    (raft / "log").mkdir(parents=True)
    (raft / "log" / "1.blk").write_bytes(bytes(512))
    (raft / "state.json").write_text('{"term":3,"vote":"abc"}')
    notes = corrupt_store(str(tmp_path), random.Random(5), kind="state")
    assert len(notes) == 1 and "state.json" in notes[0]
    assert (raft / "log" / "1.blk").read_bytes() == bytes(512)


def test_queue_value_still_stored_is_undelivered_not_lost():
    ops = [Op("q", "enqueue", "q-0", S, S + 1, OK, seq=1),
           Op("q", "enqueue", "q-1", S, S + 1, OK, seq=2)]
    r = checker.check_queue(ops, {"n1": {2: b"q-1"}})
    assert r["q_lost"] == 1 and r["q_undelivered"] == 1
