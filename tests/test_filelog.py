"""Tests for natsjs._core.filelog: the JetStream message store (FileLog and MemLog).

Behaviour both logs share runs against both through the ``log`` fixture and is checked
against a plain Python model of nats-server's store semantics (server/filestore.go,
server/memstore.go).  FileLog alone: reopening, torn tails, bit flips, corrupt lengths,
compaction, S2 blocks, secure erase, syncing from a worker thread and a full disk.
"""
import errno
import os
import queue
import random
import shutil
import struct
import subprocess
import threading
import uuid

import pytest
import xxhash

from natsjs._core.filelog import FileLog, MemLog, subject_matches, xxh64

HDR = struct.Struct("<BBHIQqII")  # magic, kind, subject len, record len, seq, ts, hdr len, check
K_MSG, K_TOMB = 1, 2


def file_size(subject: bytes, hdr, msg: bytes) -> int:
    """server/filestore.go fileStoreMsgSize."""
    if hdr:
        return 22 + len(subject) + 4 + len(hdr) + len(msg) + 8
    return 22 + len(subject) + len(msg) + 8


def mem_size(subject: bytes, hdr, msg: bytes) -> int:
    """server/memstore.go memStoreMsgSize."""
    return len(subject) + len(hdr or b"") + len(msg) + 16


# ---------------------------------------------------------------------------------------
# The model: nats-server store semantics in plain Python.


class Model:
    def __init__(self, size_fn, first_seq=1):
        self.size_fn = size_fn
        self.msgs = {}  # seq -> (subject, hdr, msg, ts)
        self.first = first_seq
        self.last = first_seq - 1 if first_seq else 0
        self.last_ts = 0

    def _fix_first(self):
        if self.msgs:
            self.first = min(self.msgs)
        else:
            self.first = self.last + 1

    def append(self, subject, hdr, msg, ts, seq=0):
        if seq == 0:
            seq = self.last + 1
        assert seq > self.last
        self.msgs[seq] = (subject, hdr or None, msg, ts)
        self.last = seq
        self.last_ts = ts
        self._fix_first()
        return seq

    def skip(self, seq=0, num=1):
        if seq == 0:
            seq = self.last + 1
        self.last = seq + num - 1
        self._fix_first()
        return self.last

    def remove(self, seq):
        if seq not in self.msgs:
            return False
        del self.msgs[seq]
        self._fix_first()
        return True

    def matching(self, flt):
        return sorted(s for s, m in self.msgs.items()
                      if flt is None or subject_matches(flt, m[0]))

    def compact(self, seq):
        if seq == 0:
            return self.purge()
        if seq <= self.first and seq <= self.last:
            return 0
        if seq > self.last:
            n = len(self.msgs)
            self.msgs.clear()
            self.first, self.last = seq, seq - 1
            return n
        gone = [s for s in self.msgs if s < seq]
        for s in gone:
            del self.msgs[s]
        self._fix_first()
        return len(gone)

    def purge(self, subject=None, seq=0, keep=0):
        if seq == 1:
            return 0
        if subject in (None, b">"):
            if keep == 0 and seq == 0:
                return self.compact(self.last + 1)
            if seq > 1:
                return self.compact(seq)
            subject = None
        match = self.matching(subject)
        if not match:
            return 0
        maxp = 0
        if keep:
            if keep >= len(match):
                return 0
            maxp = len(match) - keep
        upto = seq - 1 if seq else self.last
        n = 0
        for s in match:
            if s > upto:
                break
            del self.msgs[s]
            n += 1
            if maxp and n >= maxp:
                break
        self._fix_first()
        return n

    def truncate(self, seq):
        if seq >= self.last:
            return 0
        gone = [s for s in self.msgs if s > seq]
        for s in gone:
            del self.msgs[s]
        if seq in self.msgs:
            self.last_ts = self.msgs[seq][3]
        self.last = seq
        self._fix_first()
        return len(gone)

    def expire(self, before):
        cut = self.last + 1
        for s in sorted(self.msgs):
            if self.msgs[s][3] >= before:
                cut = s
                break
        if cut <= self.first:
            return 0
        gone = [s for s in self.msgs if s < cut]
        for s in gone:
            del self.msgs[s]
        self._fix_first()
        return len(gone)

    def state(self):
        n = len(self.msgs)
        return {
            "messages": n,
            "bytes": sum(self.size_fn(m[0], m[1], m[2]) for m in self.msgs.values()),
            "first_seq": self.first,
            "first_ts": self.msgs[self.first][3] if n else 0,
            "last_seq": self.last,
            "last_ts": self.last_ts,
            "num_deleted": self.last - self.first + 1 - n if n else 0,
            "num_subjects": len({m[0] for m in self.msgs.values()}),
        }

    def num_pending(self, start, flt=None, lps=False):
        match = [s for s in self.matching(flt) if s >= start]
        if not lps:
            return len(match)
        last = {}
        for s in self.matching(flt):
            last[self.msgs[s][0]] = s
        return sum(1 for s in last.values() if s >= start)


# ---------------------------------------------------------------------------------------
# Fixtures


class Opener:
    """Makes a log of one kind; reopen() closes and recovers a FileLog (MemLog: same)."""

    def __init__(self, kind, path):
        self.kind = kind
        self.path = path
        self.logs = []
        self.kw = {}

    def __call__(self, **kw):
        self.kw = kw
        if self.kind == "file":
            log = FileLog(str(self.path), **kw)
        else:
            kw = {k: v for k, v in kw.items() if k in ("first_seq", "block_size")}
            log = MemLog(**kw)
        self.logs.append(log)
        return log

    def reopen(self, log):
        if self.kind != "file":
            return log
        log.close()
        kw = dict(self.kw)
        kw.pop("first_seq", None)
        new = FileLog(str(self.path), **kw)
        self.logs.append(new)
        return new

    @property
    def size_fn(self):
        return file_size if self.kind == "file" else mem_size

    def close(self):
        for log in self.logs:
            log.close()


@pytest.fixture(params=["file", "mem"])
def opener(request, tmp_path):
    o = Opener(request.param, tmp_path / "log")
    yield o
    o.close()


@pytest.fixture
def fopener(tmp_path):
    o = Opener("file", tmp_path / "log")
    yield o
    o.close()


def check_against(log, model, filters=(None, b"a.*", b"a.>", b"b.x", b">", b"*.y", b"c")):
    assert log.state() == model.state()
    assert (log.first_seq, log.last_seq, log.msgs, log.bytes) == (
        model.first, model.last, len(model.msgs), model.state()["bytes"])
    lo = max(model.first - 2, 0)
    for s in range(lo, model.last + 3):
        assert log.load(s) == model.msgs.get(s), s
    expect_deleted = [s for s in range(model.first, model.last + 1) if s not in model.msgs] \
        if model.msgs else []
    assert log.deleted() == expect_deleted
    subjects = {}
    for m in model.msgs.values():
        subjects[m[0]] = subjects.get(m[0], 0) + 1
    assert log.subjects() == subjects
    for subj, count in subjects.items():
        seqs = [s for s, m in model.msgs.items() if m[0] == subj]
        assert log.subject_state(subj) == (count, min(seqs), max(seqs))
    assert log.subject_state(b"never.seen") == (0, 0, 0)
    for flt in filters:
        match = model.matching(flt)
        if match:
            seq = match[-1]
            assert log.load_last(flt) == (seq,) + model.msgs[seq]
        else:
            assert log.load_last(flt) is None
        for start in (0, model.first, (model.first + model.last) // 2, model.last, model.last + 1):
            nxt = [s for s in match if s >= start]
            got = log.load_next(start, flt)
            assert got == ((nxt[0],) + model.msgs[nxt[0]] if nxt else None), (flt, start)
            prv = [s for s in match if s <= start]
            got = log.load_prev(start, flt)
            assert got == ((prv[-1],) + model.msgs[prv[-1]] if prv else None), (flt, start)
            assert log.num_pending(start, flt) == model.num_pending(start, flt), (flt, start)
            assert log.num_pending(start, flt, True) == model.num_pending(start, flt, True)
        assert log.subjects(flt) == {k: v for k, v in subjects.items()
                                     if flt is None or subject_matches(flt, k)}


# ---------------------------------------------------------------------------------------
# Checksums and subject matching


def test_xxh64_matches_the_xxhash_package():
    rnd = random.Random(7)
    for n in list(range(0, 80)) + [255, 256, 1000, 4096, 65537]:
        data = rnd.randbytes(n)
        assert xxh64(data) == xxhash.xxh64(data).intdigest(), n
        assert xxh64(data, 0xDEADBEEF) == xxhash.xxh64(data, seed=0xDEADBEEF).intdigest()
    assert xxh64(memoryview(b"abc")) == xxhash.xxh64(b"abc").intdigest()


@pytest.mark.parametrize("flt,subj,ok", [
    (b"foo", b"foo", True), (b"foo", b"foo.bar", False), (b"foo.*", b"foo.bar", True),
    (b"foo.*", b"foo", False), (b"foo.*", b"foo.bar.baz", False), (b"foo.>", b"foo.bar", True),
    (b"foo.>", b"foo.bar.baz", True), (b"foo.>", b"foo", False), (b">", b"a.b.c", True),
    (b"*", b"a", True), (b"*", b"a.b", False), (b"*.b.*", b"a.b.c", True),
    (b"*.b.*", b"a.c.c", False), (b"a.*.>", b"a.b.c.d", True), (b"a.*.>", b"a.b", False),
    (b"foo*", b"foo*", True), (b"foo*", b"foox", False), (b"a.>x", b"a.b", False),
])
def test_subject_matches(flt, subj, ok):
    assert subject_matches(flt, subj) is ok


# ---------------------------------------------------------------------------------------
# Shared behaviour


def test_append_and_load(opener):
    log = opener(block_size=4096)
    assert log.state()["messages"] == 0 and (log.first_seq, log.last_seq) == (1, 0)
    assert log.append(b"a.x", None, b"one", 100) == 1
    assert log.append(b"a.y", b"NATS/1.0\r\nk: v\r\n\r\n", b"two", 200) == 2
    assert log.append(b"b.x", b"", b"", 300) == 3
    assert log.load(1) == (b"a.x", None, b"one", 100)
    assert log.load(2) == (b"a.y", b"NATS/1.0\r\nk: v\r\n\r\n", b"two", 200)
    assert log.load(3) == (b"b.x", None, b"", 300)
    assert log.load(0) is None and log.load(4) is None
    assert log.append(b"a.x", None, bytearray(b"ba"), 400, seq=10) == 10  # a gap
    assert log.deleted() == [4, 5, 6, 7, 8, 9]
    assert log.load(5) is None
    assert log.append(b"a.x", None, memoryview(b"next"), 500) == 11
    with pytest.raises(ValueError):
        log.append(b"a.x", None, b"old", 1, seq=11)
    with pytest.raises(ValueError):
        log.append(b"", None, b"no subject", 1)
    st = log.state()
    assert st["messages"] == 5 and st["last_seq"] == 11 and st["num_deleted"] == 6
    size = opener.size_fn
    assert st["bytes"] == (size(b"a.x", None, b"one") + size(b"a.y", b"NATS/1.0\r\nk: v\r\n\r\n", b"two")
                           + size(b"b.x", None, b"") + size(b"a.x", None, b"ba")
                           + size(b"a.x", None, b"next"))


def test_byte_accounting_matches_the_reference_formulas():
    # server/filestore.go fileStoreMsgSize and server/memstore.go memStoreMsgSize.
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        log = FileLog(d)
        log.append(b"foo", None, b"hello", 1)
        assert log.bytes == 22 + 3 + 5 + 8
        log.append(b"foo", b"H1", b"hello", 1)
        assert log.bytes == 38 + 22 + 3 + 4 + 2 + 5 + 8
        log.close()
    mem = MemLog()
    mem.append(b"foo", None, b"hello", 1)
    mem.append(b"foo", b"H1", b"hello", 1)
    assert mem.bytes == (3 + 5 + 16) + (3 + 2 + 5 + 16)


def test_memory_log_gives_memory_back():
    log = MemLog(block_size=64 * 1024)
    for i in range(20000):
        log.append(b"m.%d" % (i % 10), None, b"v" * 100, i)
    full = log.store_bytes
    rnd = random.Random(5)
    gone = set(rnd.sample(range(1, 20001), 18000))
    for seq in gone:
        assert log.remove(seq)
    assert log.store_bytes < full * 0.3
    assert log.msgs == 2000
    assert all((log.load(s) is None) == (s in gone) for s in range(1, 20001))


def test_first_seq_and_skips(opener):
    log = opener(first_seq=100)
    assert (log.first_seq, log.last_seq) == (100, 99)
    assert log.append(b"a", None, b"x", 1) == 100
    log.remove(100)
    assert (log.first_seq, log.last_seq, log.msgs) == (101, 100, 0)
    assert log.append(b"a", None, b"x", 2, seq=1000) == 1000
    assert (log.first_seq, log.last_seq) == (1000, 1000)
    assert log.deleted() == []
    assert log.skip() == 1001 and log.skip(1005, 3) == 1007
    assert (log.first_seq, log.last_seq, log.msgs) == (1000, 1007, 1)
    assert log.deleted() == list(range(1001, 1008))
    with pytest.raises(ValueError):
        log.skip(1007)
    log = opener.reopen(log)
    assert (log.first_seq, log.last_seq, log.msgs) == (1000, 1007, 1)
    log.remove(1000)
    assert log.skip(num=2) == 1009 and (log.first_seq, log.last_seq) == (1010, 1009)
    log = opener.reopen(log)
    assert (log.first_seq, log.last_seq, log.msgs) == (1010, 1009, 0)


def test_filters_and_sparse_subjects(opener):
    log = opener(block_size=4096)
    model = Model(opener.size_fn)
    rnd = random.Random(3)
    for i in range(3000):
        subj = b"rare.one" if i in (5, 1700, 2999) else b"busy.%d" % rnd.randrange(20)
        log.append(subj, None, b"p%d" % i, i)
        model.append(subj, None, b"p%d" % i, i)
    assert log.load_next(0, b"rare.one")[:2] == (6, b"rare.one")
    assert log.load_next(7, b"rare.one")[:2] == (1701, b"rare.one")
    assert log.load_next(7, b"rare.*")[:2] == (1701, b"rare.one")
    assert log.load_next(1702, b"rare.>")[:2] == (3000, b"rare.one")
    assert log.load_next(3001, b"rare.>") is None
    assert log.load_last(b"rare.one")[0] == 3000
    assert log.load_prev(2999, b"rare.one")[0] == 1701
    assert log.load_next(0, b"nothing.here") is None
    assert log.num_pending(0, b"rare.one") == 3
    assert log.num_pending(1000, b"rare.one") == 2
    assert log.num_pending(1000, b"busy.*") == 2001 - 2
    assert log.num_pending(1000, b"rare.one", True) == 1
    assert log.num_pending(1000, None, True) == 21
    check_against(log, model, filters=(None, b"rare.one", b"rare.*", b"busy.3", b"busy.*", b"*.7"))
    log.remove(1701)
    model.remove(1701)
    check_against(log, model, filters=(b"rare.one", b"rare.*"))
    log = opener.reopen(log)
    check_against(log, model, filters=(None, b"rare.one", b"rare.*", b"busy.3", b"busy.*"))


def test_purge_semantics(opener):
    log = opener(block_size=4096)
    model = Model(opener.size_fn)
    for i in range(1, 101):
        subj = b"a.x" if i % 2 else b"b.x"
        log.append(subj, None, b"m%d" % i, i)
        model.append(subj, None, b"m%d" % i, i)
    assert log.purge(b"a.x", keep=10) == model.purge(b"a.x", keep=10) == 40
    check_against(log, model)
    assert log.purge(b"b.x", seq=31) == model.purge(b"b.x", seq=31) == 15
    check_against(log, model)
    assert log.purge(seq=1) == 0
    assert log.purge(seq=60) == model.purge(seq=60)
    check_against(log, model)
    assert log.purge(None, keep=5) == model.purge(None, keep=5)
    check_against(log, model)
    assert log.purge() == model.purge()
    check_against(log, model)
    st = log.state()
    assert st["messages"] == 0 and st["first_seq"] == st["last_seq"] + 1 == 101
    log = opener.reopen(log)
    check_against(log, model)
    assert log.append(b"a.x", None, b"after", 1000) == 101
    assert log.compact(500) == 1
    assert (log.first_seq, log.last_seq) == (500, 499)
    log = opener.reopen(log)
    assert (log.first_seq, log.last_seq) == (500, 499)
    assert log.append(b"a.x", None, b"next", 1001) == 500


def random_ops(opener, seed, steps=400, reopen=True, block_size=4096):
    rnd = random.Random(seed)
    log = opener(block_size=block_size)
    model = Model(opener.size_fn)
    subjects = [b"a.x", b"a.y", b"a.z.q", b"b.x", b"b.y", b"c"]
    ts = 0
    for step in range(steps):
        op = rnd.random()
        if op < 0.55:
            for _ in range(rnd.randrange(1, 12)):
                ts += rnd.randrange(0, 3)
                subj = rnd.choice(subjects)
                hdr = rnd.choice([None, b"NATS/1.0\r\n\r\n"])
                msg = rnd.randbytes(rnd.randrange(0, 300))
                seq = 0
                if rnd.random() < 0.05:
                    seq = model.last + rnd.randrange(1, 5)
                assert log.append(subj, hdr, msg, ts, seq) == model.append(subj, hdr, msg, ts, seq)
        elif op < 0.57:
            seq = rnd.choice([0, model.last + rnd.randrange(1, 4)])
            num = rnd.randrange(1, 4)
            assert log.skip(seq, num) == model.skip(seq, num)
        elif op < 0.70:
            seq = rnd.randrange(max(model.first - 2, 0), model.last + 3)
            assert log.remove(seq, rnd.random() < 0.2) == model.remove(seq)
        elif op < 0.74:
            subj = rnd.choice(subjects + [None, b"a.*", b"a.>", b">"])
            seq = rnd.choice([0, 0, rnd.randrange(0, model.last + 5)])
            keep = rnd.choice([0, 0, rnd.randrange(0, 10)])
            assert log.purge(subj, seq, keep) == model.purge(subj, seq, keep), (subj, seq, keep)
        elif op < 0.77:
            seq = rnd.randrange(0, model.last + 10)
            assert log.compact(seq) == model.compact(seq)
        elif op < 0.80:
            low = 0 if rnd.random() < 0.1 else max(model.first - 1, 0)
            seq = rnd.randrange(low, model.last + 2)
            assert log.truncate(seq) == model.truncate(seq)
        elif op < 0.84:
            before = rnd.randrange(0, ts + 5)
            assert log.expire(before) == model.expire(before)
        elif op < 0.90:
            log.compact_blocks(rnd.choice([0.0, 0.3, 0.5]))
        elif op < 0.95:
            s = log.begin_sync()
            s.run()
            assert log.mark_synced(s)
            assert log.synced_seq == model.last
        elif reopen:
            log = opener.reopen(log)
            assert log.recovery["corrupt"] == [] and log.recovery["truncated_bytes"] == 0
        assert log.state() == model.state(), (seed, step)
        if step % 40 == 0:
            check_against(log, model)
    check_against(log, model)
    log = opener.reopen(log)
    check_against(log, model)
    return log, model


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_the_model(opener, seed):
    random_ops(opener, seed)


@pytest.mark.parametrize("seed", range(3))
def test_s2_blocks_and_reopen(tmp_path, seed):
    path = str(tmp_path / "s2")
    log = FileLog(path, block_size=4096, compression="s2")
    model = Model(file_size)
    rnd = random.Random(seed)
    try:
        for i in range(1500):
            subj = rnd.choice([b"a.x", b"b.y", b"c"])
            msg = (b'{"k": %d, "v": "repeat repeat"}' % i) * rnd.randrange(1, 4)
            log.append(subj, None, msg, i)
            model.append(subj, None, msg, i)
            if rnd.random() < 0.2:
                s = rnd.randrange(model.first, model.last + 1)
                assert log.remove(s) == model.remove(s)
        s = log.begin_sync()
        s.run()
        log.mark_synced(s)
        raw = sum(p.stat().st_size for p in (tmp_path / "s2" / "blk").iterdir())
        assert log.compact_blocks(0.9) > 0
        check_against(log, model, filters=(None, b"a.x", b"*.y"))
        log.close()
        compressed = [p for p in (tmp_path / "s2" / "blk").iterdir()
                      if p.read_bytes()[:8] == b"\xa9NJS2BLK"]
        assert compressed
        assert sum(p.stat().st_size for p in (tmp_path / "s2" / "blk").iterdir()) < raw / 2
        log = FileLog(path, block_size=4096, compression="s2")
        assert log.recovery["corrupt"] == []
        check_against(log, model, filters=(None, b"a.x", b"*.y"))
        # Appending after reopen, then more compaction of compressed blocks.
        for i in range(300):
            log.append(b"c", None, b"more %d" % i, 5000 + i)
            model.append(b"c", None, b"more %d" % i, 5000 + i)
        for s in list(model.msgs)[:400]:
            log.remove(s)
            model.remove(s)
        s = log.begin_sync()
        s.run()
        log.mark_synced(s)
        log.compact_blocks(0.3)
        check_against(log, model, filters=(None, b"c"))
        log.close()
        log = FileLog(path, block_size=4096, compression="s2")
        check_against(log, model, filters=(None, b"c"))
    finally:
        log.close()


# ---------------------------------------------------------------------------------------
# FileLog: reopening and recovery


def block_files(path):
    return sorted((path / "blk").glob("*.blk"))


def records(data: bytes):
    out, p = [], 0
    while p + HDR.size <= len(data):
        magic, kind, slen, rlen, seq, ts, hlen, _ = HDR.unpack_from(data, p)
        assert magic == 0xD5
        out.append((p, kind, rlen, seq))
        p += rlen
    return out


def fill(log, n, start_ts=0, payload=b"payload-%d"):
    for i in range(n):
        log.append(b"s.%d" % (i % 3), None, payload % i, start_ts + i)


def test_reopen_gives_identical_state(fopener):
    log, model = random_ops(fopener, 99, steps=200, reopen=False)
    before = (log.state(), log.deleted(), log.subjects())
    log = fopener.reopen(log)
    assert (log.state(), log.deleted(), log.subjects()) == before
    rec = log.recovery
    assert set(rec) == {"blocks", "records", "tombstones", "truncated_bytes", "corrupt", "lost",
                        "damaged_from", "seconds"}
    assert rec["damaged_from"] == 0
    assert rec["blocks"] >= 1 and rec["records"] > 0


def test_torn_tail_is_truncated_and_reported(fopener, tmp_path):
    log = fopener(block_size=1 << 20)
    fill(log, 50)
    log.close()
    blk = block_files(fopener.path)[-1]
    data = blk.read_bytes()
    off, kind, rlen, seq = records(data)[-1]
    assert kind == K_MSG and seq == 50
    for cut in range(off, off + rlen):
        work = tmp_path / "torn"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(fopener.path, work)
        wblk = block_files(work)[-1]
        wblk.write_bytes(data[:cut])
        log = FileLog(str(work))
        try:
            assert log.recovery["truncated_bytes"] == cut - off, cut
            assert log.recovery["corrupt"] == [] and log.recovery["lost"] == []
            assert (log.first_seq, log.last_seq, log.msgs) == (1, 49, 49)
            assert log.load(49) == (b"s.0", None, b"payload-48", 48)
            assert log.load(50) is None
            assert wblk.stat().st_size == off
            assert log.append(b"s.x", None, b"again", 99) == 50
        finally:
            log.close()
        log = FileLog(str(work))
        assert log.load(50) == (b"s.x", None, b"again", 99)
        assert log.recovery["truncated_bytes"] == 0
        log.close()


def damage_record(fopener, seq, damage):
    """Write 100 messages, close, let damage(data, offset, length) change the bytes of
    message `seq` in its block file; returns the record's offset."""
    log = fopener(block_size=1 << 20)
    fill(log, 100)
    log.close()
    blk = block_files(fopener.path)[0]
    data = bytearray(blk.read_bytes())
    off, kind, rlen, _ = [r for r in records(bytes(data)) if r[3] == seq and r[1] == K_MSG][0]
    damage(data, off, rlen)
    blk.write_bytes(bytes(data))
    return off


def test_bit_flip_is_reported_and_never_served(fopener):
    def flip(data, off, rlen):
        data[off + rlen - 12] ^= 0x10  # inside the payload

    off = damage_record(fopener, 40, flip)
    log = FileLog(str(fopener.path))
    fopener.logs.append(log)
    rec = log.recovery
    assert len(rec["corrupt"]) == 1
    c = rec["corrupt"][0]
    assert (c["block"], c["offset"], c["seq"]) == (1, off, 40)
    assert rec["lost"] == [40]
    assert rec["truncated_bytes"] == 0
    assert log.load(40) is None
    assert log.load(39) == (b"s.2", None, b"payload-38", 38)
    assert log.load(41) == (b"s.1", None, b"payload-40", 40)
    assert log.load_next(40)[0] == 41
    assert log.msgs == 99 and log.last_seq == 100
    assert 40 in log.deleted()


def test_corrupt_length_resynchronises(fopener):
    def bad_length(data, off, rlen):
        struct.pack_into("<I", data, off + 4, 0x00FFFFFF)

    off = damage_record(fopener, 60, bad_length)
    log = FileLog(str(fopener.path))
    fopener.logs.append(log)
    rec = log.recovery
    assert len(rec["corrupt"]) == 1 and rec["corrupt"][0]["offset"] == off
    assert rec["corrupt"][0]["reason"] == "bad header"
    assert rec["lost"] == [(60, 60)]
    assert log.load(60) is None
    assert [log.load(s)[2] for s in (59, 61, 100)] == [b"payload-58", b"payload-60", b"payload-99"]
    assert log.msgs == 99


def test_damage_says_from_which_sequence_and_scrub_removes_it(fopener):
    def flip(data, off, rlen):
        data[off + rlen - 12] ^= 0x10

    damage_record(fopener, 40, flip)
    log = FileLog(str(fopener.path))
    assert log.recovery["damaged_from"] == 40       # a message: its own sequence
    log.truncate(39)                                # what the owner decided ...
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)                              # ... is durable: now scrub
    assert log.scrub() == 1
    log.close()
    log = FileLog(str(fopener.path))
    fopener.logs.append(log)
    rec = log.recovery
    assert rec["corrupt"] == [] and rec["lost"] == [] and rec["damaged_from"] == 0
    assert (log.last_seq, log.msgs) == (39, 39) and log.load(39)[2] == b"payload-38"


def test_a_record_of_unknown_kind_damages_every_sequence(fopener):
    def bad_header(data, off, rlen):
        data[off + 1] ^= 0x40                       # the kind: the header check fails

    damage_record(fopener, 60, bad_header)
    log = FileLog(str(fopener.path))
    fopener.logs.append(log)
    # it may have been a tombstone or a marker about any sequence
    assert log.recovery["damaged_from"] == 1


def test_a_sealed_block_cut_short_damages_every_sequence(fopener):
    log = fopener(block_size=4096)
    fill(log, 200)
    log.close()
    first = block_files(fopener.path)[0]
    assert len(block_files(fopener.path)) > 1
    with open(first, "r+b") as f:
        f.truncate(first.stat().st_size // 2)      # whatever followed may have been tombstones
    log = FileLog(str(fopener.path))
    fopener.logs.append(log)
    assert log.recovery["corrupt"] and log.recovery["damaged_from"] == 1


def test_a_damaged_tombstone_names_the_sequence_it_deleted(fopener):
    log = fopener(block_size=1 << 20)
    fill(log, 30)
    log.remove(7)
    log.append(b"s.x", None, b"after", 99)         # (a cut last record is a torn tail)
    log.close()
    blk = block_files(fopener.path)[0]
    data = bytearray(blk.read_bytes())
    off, kind, rlen, seq = [r for r in records(bytes(data)) if r[1] == K_TOMB][0]
    assert seq == 7
    data[off + rlen - 1] ^= 0x01                    # its checksum
    blk.write_bytes(bytes(data))
    log = FileLog(str(fopener.path))
    fopener.logs.append(log)
    assert log.recovery["damaged_from"] == 7
    assert log.load(7) is not None                  # what the damage brought back


def test_corruption_found_on_read_is_not_served(fopener):
    log = fopener(block_size=1 << 20)
    fill(log, 20)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    blk = block_files(fopener.path)[0]
    data = bytearray(blk.read_bytes())
    off, kind, rlen, seq = [r for r in records(bytes(data)) if r[3] == 7][0]
    data[off + rlen - 10] ^= 0xFF
    blk.write_bytes(bytes(data))  # the log's buffered copy is gone after mark_synced
    assert log.load(7) is None
    assert log.recovery["corrupt"][-1]["seq"] == 7
    assert log.load_next(7)[0] == 8
    assert log.msgs == 19


def test_compaction_and_reopen(fopener):
    log = fopener(block_size=8192)
    model = Model(file_size)
    for i in range(1, 1001):
        log.append(b"k.%d" % (i % 10), None, b"v" * 50, i)
        model.append(b"k.%d" % (i % 10), None, b"v" * 50, i)
    for i in range(1, 1001):
        if i % 4 and i > 3:
            log.remove(i)
            model.remove(i)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    before = sum(p.stat().st_size for p in block_files(fopener.path))
    assert log.compact_blocks(0.5) > 0
    after = sum(p.stat().st_size for p in block_files(fopener.path))
    assert after < before / 2
    check_against(log, model, filters=(None, b"k.4", b"k.*"))
    log = fopener.reopen(log)
    check_against(log, model, filters=(None, b"k.4", b"k.*"))
    assert log.recovery["corrupt"] == []


def test_secure_erase_leaves_no_trace(fopener):
    log = fopener(block_size=4096)
    secrets = {}
    for i in range(1, 300):
        payload = b"SECRET-%s" % uuid.uuid4().hex.encode() if i in (5, 150, 298) else b"x" * 40
        if i in (5, 150, 298):
            secrets[i] = payload
        log.append(b"s", None, payload, i)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    log.append(b"s", None, b"SECRET-buffered-only", 300)
    secrets[300] = b"SECRET-buffered-only"
    for seq in secrets:
        assert log.remove(seq, secure=True)
    log.close()
    blob = b"".join(p.read_bytes() for p in (fopener.path / "blk").iterdir())
    for payload in secrets.values():
        assert payload not in blob
    log = FileLog(str(fopener.path), block_size=4096)
    fopener.logs.append(log)
    assert log.recovery["corrupt"] == []
    assert log.msgs == 296 and all(log.load(s) is None for s in secrets)


def test_secure_erase_in_a_compressed_block(fopener):
    log = fopener(block_size=4096, compression="s2")
    secret = b"SECRET-" + os.urandom(16).hex().encode()
    for i in range(1, 200):
        log.append(b"s", None, secret if i == 3 else b"y" * 40, i)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    log.compact_blocks()
    assert any(p.read_bytes()[:8] == b"\xa9NJS2BLK" for p in block_files(fopener.path))
    assert secret in b"".join(p.read_bytes() for p in block_files(fopener.path))
    assert log.remove(3, secure=True)
    log.close()
    assert secret not in b"".join(p.read_bytes() for p in block_files(fopener.path))
    log = FileLog(str(fopener.path), block_size=4096, compression="s2")
    fopener.logs.append(log)
    assert log.load(3) is None and log.msgs == 198 and log.load(4)[2] == b"y" * 40


def test_removed_blocks_go_only_after_a_sync(fopener):
    log = fopener(block_size=4096)
    fill(log, 500)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    nblocks = len(block_files(fopener.path))
    assert nblocks > 3
    assert log.compact(400) == 399
    assert len(block_files(fopener.path)) == nblocks  # the FLOOR is not durable yet
    s = log.begin_sync()
    s.run()
    assert log.mark_synced(s)
    assert len(block_files(fopener.path)) < nblocks
    log = fopener.reopen(log)
    assert (log.first_seq, log.last_seq, log.msgs) == (400, 500, 101)


def test_open_descriptors_stay_bounded(fopener):
    log = fopener(block_size=4096)
    fill(log, 5000, payload=b"%d" + b"z" * 100)
    log = fopener.reopen(log)
    assert log.num_blocks > 150
    before = len(os.listdir("/proc/self/fd"))
    for seq in range(1, 5001, 7):
        assert log.load(seq) is not None
    assert len(os.listdir("/proc/self/fd")) - before <= 64
    s = log.begin_sync()
    s.run()
    assert log.mark_synced(s)


def test_sync_from_a_worker_thread_while_appending(fopener):
    log = fopener(block_size=64 * 1024)
    todo, done = queue.Queue(), queue.Queue()

    def worker():
        while True:
            s = todo.get()
            if s is None:
                return
            try:
                s.run()
                done.put((s, None))
            except OSError as exc:  # pragma: no cover - reported to the main thread
                done.put((s, exc))

    t = threading.Thread(target=worker)
    t.start()
    try:
        in_flight = 0
        for i in range(1, 20001):
            log.append(b"t.%d" % (i % 7), None, b"%d" % i * 8, i)
            if i % 250 == 0:
                todo.put(log.begin_sync())
                in_flight += 1
            if i % 97 == 0:
                assert log.load(i - 50) is not None
            while not done.empty():
                s, exc = done.get()
                assert exc is None
                in_flight -= 1
                log.mark_synced(s)
        while in_flight:
            s, exc = done.get(timeout=30)
            assert exc is None
            log.mark_synced(s)
            in_flight -= 1
    finally:
        todo.put(None)
        t.join()
    assert log.synced_seq == 20000
    log = fopener.reopen(log)
    assert log.msgs == 20000 and log.load(12345) == (b"t.4", None, b"12345" * 8, 12345)


def test_failed_sync_rewrites_everything_unsynced(fopener):
    log = fopener(block_size=1 << 20)
    fill(log, 10)
    s = log.begin_sync()
    s.run()
    assert log.mark_synced(s) and log.synced_seq == 10
    blk = block_files(fopener.path)[0]
    durable = blk.stat().st_size
    fill(log, 10, start_ts=10)
    s1 = log.begin_sync()
    assert blk.stat().st_size > durable
    fill(log, 5, start_ts=20)
    s2 = log.begin_sync()
    s2.run()
    # fdatasync failed for s1: the kernel may have dropped those pages.  Model the worst
    # case by zeroing them in the file.
    with open(blk, "r+b") as fh:
        fh.seek(durable)
        fh.write(b"\0" * (blk.stat().st_size - durable))
    s1._simulate_failure(errno.EIO)
    assert log.mark_synced(s1) is False
    assert log.mark_synced(s2) is False  # began before the failure was seen
    assert log.synced_seq == 10
    assert log.load(15) == (b"s.1", None, b"payload-4", 14)
    s3 = log.begin_sync()
    s3.run()
    assert log.mark_synced(s3) and log.synced_seq == 25
    log = fopener.reopen(log)
    assert log.recovery["corrupt"] == [] and log.recovery["truncated_bytes"] == 0
    assert log.msgs == 25 and log.load(15) == (b"s.1", None, b"payload-4", 14)


def test_mark_synced_needs_a_finished_sync(opener):
    log = opener()
    log.append(b"a", None, b"x", 1)
    s = log.begin_sync()
    assert s.seq == 1
    with pytest.raises(ValueError):
        log.mark_synced(s)
    s.run()
    assert log.mark_synced(s) and log.synced_seq == 1


# ---------------------------------------------------------------------------------------
# A full disk


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk(tiny_tmpfs):
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"\0" * (600 * 1024))
    log = FileLog(str(tiny_tmpfs / "log"), block_size=64 * 1024)
    try:
        payload = os.urandom(1000)
        seq = 0
        err = None
        for _ in range(2000):
            seq = log.append(b"d", None, payload, seq + 1)
            if seq % 20 == 0:
                try:
                    s = log.begin_sync()
                except OSError as exc:
                    err = exc
                    break
                s.run()
                assert log.mark_synced(s)
        assert err is not None and err.errno == errno.ENOSPC
        synced = log.synced_seq
        assert synced > 0
        # Nothing synced is harmed; the unwritten records stay readable from memory.
        assert all(log.load(s) == (b"d", None, payload, s) for s in range(1, seq + 1))
        assert log.pending_bytes > 0
        for i in range(5):
            log.append(b"d", None, payload, seq + 1 + i)
        with pytest.raises(OSError) as info:
            log.begin_sync()
        assert info.value.errno == errno.ENOSPC
        filler.unlink()
        s = log.begin_sync()
        s.run()
        assert log.mark_synced(s) and log.synced_seq == seq + 5
        assert log.pending_bytes == 0
        assert log.append(b"d", None, b"after", seq + 100) == seq + 6
        log.close()
        log = FileLog(str(tiny_tmpfs / "log"), block_size=64 * 1024)
        assert log.recovery["corrupt"] == [] and log.recovery["truncated_bytes"] == 0
        assert log.msgs == seq + 6 and log.load(seq + 6)[2] == b"after"
        assert all(log.load(s) is not None for s in range(1, seq + 6))
    finally:
        log.close()


# ---------------------------------------------------------------------------------------
# More recovery cases


def test_context_manager_closes(tmp_path):
    with FileLog(str(tmp_path / "cm")) as log:
        log.append(b"a", None, b"x", 1)
    with pytest.raises(ValueError):
        log.append(b"a", None, b"y", 2)
    with FileLog(str(tmp_path / "cm")) as log:
        assert log.load(1) == (b"a", None, b"x", 1)
    with MemLog() as mem:
        mem.append(b"a", None, b"x", 1)


def test_cut_tail_of_a_sealed_block_is_reported_as_lost(fopener):
    log = fopener(block_size=4096)
    fill(log, 200)
    log.close()
    first = block_files(fopener.path)[0]
    data = first.read_bytes()
    recs = [r for r in records(data) if r[1] == K_MSG]
    off, _, rlen, seq = recs[-3]
    first.write_bytes(data[:off + rlen // 2])  # an older block lost its last writes
    log = FileLog(str(fopener.path), block_size=4096)
    fopener.logs.append(log)
    rec = log.recovery
    assert rec["truncated_bytes"] == 0
    assert len(rec["corrupt"]) == 1 and rec["corrupt"][0]["offset"] == off
    assert rec["lost"] == [(seq, seq + 2)]
    assert log.load(seq - 1) is not None and log.load(seq) is None and log.load(seq + 2) is None
    assert log.load(seq + 3) == (b"s.%d" % ((seq + 2) % 3), None, b"payload-%d" % (seq + 2),
                                 seq + 2)
    assert log.msgs == 197 and log.last_seq == 200


def test_corrupt_compressed_block_is_reported(fopener):
    log = fopener(block_size=4096, compression="s2")
    fill(log, 300)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    assert log.compact_blocks() > 0
    log.close()
    compressed = [p for p in block_files(fopener.path) if p.read_bytes()[:8] == b"\xa9NJS2BLK"]
    victim = compressed[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    log = FileLog(str(fopener.path), block_size=4096, compression="s2")
    fopener.logs.append(log)
    rec = log.recovery
    assert [c["reason"] for c in rec["corrupt"]] == ["compressed block checksum mismatch"]
    assert len(rec["lost"]) == 1
    lo, hi = rec["lost"][0]
    assert lo <= hi and all(log.load(s) is None for s in range(lo, hi + 1))
    assert log.load(1) is not None and log.load(300) is not None
    assert log.msgs == 300 - (hi - lo + 1)


# ---------------------------------------------------------------------------------------
# Byte accounting against the reference nats-server


def test_bytes_match_the_reference_server(reference_server, tmp_path):
    """The same messages in a nats-server file and memory stream: state.bytes equals
    what FileLog and MemLog count for the stored subject, headers and payload."""
    import asyncio

    import nats

    msgs = [(b"orders.new", None, b"hello"),
            (b"orders.eu.paid", {"Nats-Msg-Id": "abc", "K": "v"}, b"x" * 100),
            (b"orders.new", None, b""),
            (b"orders.x", {"A": "1"}, b"y" * 1000)]
    srv = reference_server("-js", "-sd", str(tmp_path / "js"))

    async def run():
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        out = {}
        for storage in ("file", "memory"):
            name = "S" + storage.upper()
            await js.add_stream(name=name, subjects=[f"{storage}.>"], storage=storage)
            for subj, hdrs, payload in msgs:
                await js.publish(f"{storage}.{subj.decode()}", payload, headers=hdrs)
            info = await js.stream_info(name)
            got = []
            for seq in range(1, len(msgs) + 1):
                m = await js.get_msg(name, seq)
                raw_hdr = None
                if m.headers:
                    raw_hdr = b"NATS/1.0\r\n" + b"".join(
                        b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in m.headers.items()
                    ) + b"\r\n"
                got.append((m.subject.encode(), raw_hdr, m.data or b""))
            out[storage] = (info.state.bytes, got)
        await nc.close()
        return out

    out = asyncio.run(asyncio.wait_for(run(), 60))
    for storage, log in (("file", FileLog(str(tmp_path / "ours"))), ("memory", MemLog())):
        ref_bytes, stored = out[storage]
        for subj, hdr, payload in stored:
            log.append(subj, hdr, payload, 1)
        assert log.bytes == ref_bytes, storage
        log.close()
