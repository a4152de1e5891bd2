"""natsjs/_core/raftlog.pyx: entry and message formats, checksums, term runs, commit rule."""
from __future__ import annotations

import os
import random
import struct

import pytest
import xxhash

from natsjs._core import raftlog as rl
from natsjs._core.raftlog import RaftCodecError


def test_xxh64_matches_the_reference_implementation():
    rng = random.Random(1)
    for n in list(range(0, 70)) + [100, 255, 1000, 4096, 10007]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        for seed in (0, 1, 2**64 - 1):
            assert rl.xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed), (n, seed)
    assert rl.xxh64(memoryview(b"abc")) == xxhash.xxh64_intdigest(b"abc")


def _check(b: bytes) -> bytes:
    return struct.pack("<I", xxhash.xxh64_intdigest(b) & 0xFFFFFFFF)


def test_entry_layout_byte_by_byte():
    e = rl.encode_entry(rl.ENTRY_NORMAL, 7, 42, b"hello")
    body = bytes([0]) + struct.pack("<QQI", 7, 42, 5) + b"hello"
    assert e == body + _check(body)
    assert len(e) == rl.ENTRY_OVERHEAD + 5
    assert rl.decode_entry(e) == (0, 7, 42, b"hello")
    assert rl.entry_term(e) == 7
    assert rl.entry_type(e) == 0
    empty = rl.encode_entry(rl.ENTRY_NOOP, 1, 1, b"")
    assert rl.decode_entry(empty) == (1, 1, 1, b"")


def test_corrupt_entries_are_rejected():
    e = rl.encode_entry(rl.ENTRY_NORMAL, 3, 9, b"payload")
    for i in range(len(e)):
        bad = bytearray(e)
        bad[i] ^= 0x40
        with pytest.raises(RaftCodecError):
            rl.decode_entry(bytes(bad))
    for n in range(len(e)):
        with pytest.raises(RaftCodecError):
            rl.decode_entry(e[:n])
    with pytest.raises(RaftCodecError):
        rl.decode_entry(e + b"x")


def test_peers_round_trip_and_layout():
    peers = ("n1", "server-b", "ünï")
    data = rl.encode_peers(peers)
    assert data[:2] == struct.pack("<H", 3)
    assert data[2:4] == struct.pack("<H", 2) and data[4:6] == b"n1"
    assert rl.decode_peers(data) == peers
    assert rl.decode_peers(rl.encode_peers(())) == ()
    for n in range(len(data)):
        with pytest.raises(RaftCodecError):
            rl.decode_peers(data[:n])


def test_append_entries_layout_byte_by_byte():
    entries = [rl.encode_entry(0, 5, 11, b"a"), rl.encode_entry(2, 5, 12, rl.encode_peers(["x"]))]
    m = rl.encode_append(5, b"n1", 10, 4, 9, entries)
    head = (bytes([rl.MSG_APPEND, 0]) + struct.pack("<QQQQQ", 5, 10, 4, 9, 0) +
            struct.pack("<H", 2) + b"n1")
    body = head + struct.pack("<I", 2) + entries[0] + entries[1]
    assert m == body + _check(body)
    d = rl.decode_message(m)
    assert (d.type, d.flags, d.term, d.sender, d.index, d.log_term, d.commit) == \
        (rl.MSG_APPEND, 0, 5, "n1", 10, 4, 9)
    assert d.entries == entries


def test_every_message_type_round_trips():
    m = rl.decode_message(rl.encode_message(rl.MSG_APPEND_RESP, rl.FLAG_SUCCESS, 3, b"b",
                                            17, 2, 0, 16))
    assert (m.type, m.flags, m.term, m.sender, m.index, m.log_term, m.hint) == \
        (rl.MSG_APPEND_RESP, rl.FLAG_SUCCESS, 3, "b", 17, 2, 16)
    v = rl.decode_message(rl.encode_message(rl.MSG_VOTE, rl.FLAG_PREVOTE | rl.FLAG_TRANSFER,
                                            9, b"c", 100, 8))
    assert v.flags == rl.FLAG_PREVOTE | rl.FLAG_TRANSFER and v.index == 100
    s = rl.decode_message(rl.encode_snapshot(4, b"a", 50, 3, 49, 1024, True,
                                             rl.encode_peers(["a", "b"]), b"chunk"))
    assert (s.type, s.flags, s.index, s.log_term, s.commit, s.hint, s.peers, s.data) == \
        (rl.MSG_SNAPSHOT, rl.FLAG_DONE, 50, 3, 49, 1024, ("a", "b"), b"chunk")


def test_corrupt_or_truncated_messages_are_rejected():
    entries = [rl.encode_entry(0, 1, i, os.urandom(20)) for i in range(1, 4)]
    msgs = [rl.encode_append(1, b"leader", 0, 0, 0, entries),
            rl.encode_message(rl.MSG_VOTE_RESP, 1, 2, b"x"),
            rl.encode_snapshot(1, b"l", 5, 1, 5, 0, False, rl.encode_peers(["l"]), b"zz")]
    for m in msgs:
        for n in range(len(m)):
            with pytest.raises(RaftCodecError):
                rl.decode_message(m[:n])
        for i in range(len(m)):
            bad = bytearray(m)
            bad[i] ^= 0x01
            with pytest.raises(RaftCodecError):
                rl.decode_message(bytes(bad))


def test_append_with_entries_out_of_sequence_is_rejected():
    # a well-checksummed message whose entries do not follow prev index
    entries = [rl.encode_entry(0, 1, 5, b"a")]
    with pytest.raises(RaftCodecError, match="sequence"):
        rl.decode_message(rl.encode_append(1, b"l", 0, 0, 0, entries))


def test_random_bytes_never_crash_the_decoder():
    rng = random.Random(7)
    for _ in range(3000):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120)))
        try:
            rl.decode_message(data)
        except RaftCodecError:
            pass


def test_term_runs():
    t = rl.TermRuns(0, 0)
    for i, term in enumerate([1, 1, 1, 2, 2, 5, 5, 5], 1):
        t.append(i, term)
    assert t.runs() == [(0, 0), (1, 1), (4, 2), (6, 5)]
    assert [t.term_at(i) for i in range(10)] == [0, 1, 1, 1, 2, 2, 5, 5, 5, 0]
    # largest index <= 8 whose term is <= 4: the end of the term-2 run
    assert t.last_at_most(8, 4) == 5
    assert t.last_at_most(8, 1) == 3
    assert t.last_at_most(8, 0) == 0
    assert t.last_at_most(2, 9) == 2
    with pytest.raises(ValueError):
        t.append(9, 4)          # terms never go down in a log
    with pytest.raises(ValueError):
        t.append(11, 5)         # no gaps
    t.truncate(4)
    assert t.runs() == [(0, 0), (1, 1), (4, 2)] and (t.last, t.last_term) == (4, 2)
    t.compact(2, 1)
    assert t.runs() == [(2, 1), (4, 2)]
    assert (t.term_at(1), t.term_at(2), t.term_at(3)) == (0, 1, 1)
    t.compact(10, 7)            # a snapshot beyond the log
    assert t.runs() == [(10, 7)] and t.last == 10 and t.term_at(10) == 7
    cfg = t.append_entries(11, [rl.encode_entry(0, 7, 11, b""), rl.encode_entry(2, 8, 12, b"")])
    assert cfg == [1] and t.last_term == 8


def test_commit_needs_a_majority_and_the_current_term():
    runs = rl.TermRuns(0, 0)
    for i in range(1, 11):
        runs.append(i, 1 if i <= 5 else 2)
    m = rl.MatchIndex(["a", "b", "c"])
    assert m.quorum_index() == 0
    m.update("a", 10)
    assert m.commit_index(runs, 2, 0) == 0          # one of three
    m.update("b", 4)
    assert m.quorum_index() == 4
    assert m.commit_index(runs, 2, 0) == 0          # index 4 is from term 1: not yet
    assert m.commit_index(runs, 1, 0) == 4          # (a term-1 leader could)
    m.update("b", 7)
    assert m.commit_index(runs, 2, 0) == 7
    assert not m.update("b", 6)                     # matches never go back
    m.update("c", 9)
    assert m.commit_index(runs, 2, 7) == 9
    assert m.quorum_index(3) == 7 and m.quorum_index(1) == 10
    # five voters need three
    m5 = rl.MatchIndex(["a", "b", "c", "d", "e"])
    for p, i in zip("abcde", [10, 10, 3, 2, 1]):
        m5.update(p, i)
    assert m5.quorum_index() == 3
    # changing voters keeps what is known about those who stay
    m5.set_voters(["a", "b", "f"])
    assert m5.get("a") == 10 and m5.get("f") == 0 and m5.quorum_index() == 10
    assert not m5.update("zz", 5)                   # non-voters are not counted
