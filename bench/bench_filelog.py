"""Micro-benchmarks of the JetStream message store (natsjs/_core/filelog.pyx), run by
``make micro`` (never by the test suite: pytest collects only tests/).

Run:  .venv/bin/python -m pytest bench/bench_filelog.py -o 'python_files=bench_*.py' -q

Cases: appending 128-byte messages (buffered, as the stream leader does between syncs);
begin_sync + Sync.run with 1, 10, 100 and 1000 records per fdatasync (the group-commit
curve: how many PubAcks a second one disk can promise); load by sequence from the page
cache; a consumer walking a sparse literal and a wildcard filter with load_next; and
recovery (open + checksum every record) of a large log.  The recovery log is
NATSJS_BENCH_RECOVERY_MB megabytes (default 256; the issue's figure is for 1 GB, so set
NATSJS_BENCH_RECOVERY_MB=1024 to reproduce it).  Figures land in ``extra_info``.
"""
import os
import random

import pytest

filelog = pytest.importorskip("natsjs._core.filelog")
FileLog, MemLog = filelog.FileLog, filelog.MemLog

PAYLOAD = bytes(random.Random(1).randbytes(128))
N_APPEND = 10_000
N_STORED = 100_000
RECOVERY_MB = int(os.environ.get("NATSJS_BENCH_RECOVERY_MB", "256"))


def _per_second(benchmark, n: int, key: str = "msgs/s"):
    benchmark.extra_info[key] = round(n / benchmark.stats.stats.mean)


@pytest.mark.parametrize("kind", ["file", "mem"])
def test_append_128b(benchmark, tmp_path, kind):
    """Buffered appends only: the file log's write-out and fdatasync are measured by
    test_sync_batching."""
    benchmark.group = "filelog append"
    logs = []

    def setup():
        while logs:
            logs.pop().close()
        if kind == "file":
            logs.append(FileLog(str(tmp_path / str(len(os.listdir(tmp_path))))))
        else:
            logs.append(MemLog())
        return (logs[0],), {}

    def run(log):
        append = log.append
        for i in range(N_APPEND):
            append(b"orders.eu.new", None, PAYLOAD, i)

    benchmark.pedantic(run, setup=setup, rounds=20)
    setup()
    _per_second(benchmark, N_APPEND)
    benchmark.extra_info["MB/s"] = round(N_APPEND * 128 / benchmark.stats.stats.mean / 1e6, 1)


@pytest.mark.parametrize("batch", [1, 10, 100, 1000])
def test_sync_batching(benchmark, tmp_path, batch):
    """Records per fdatasync: append `batch` records, begin_sync, run, mark_synced."""
    benchmark.group = "filelog sync batching"
    log = FileLog(str(tmp_path / "log"))
    ts = [0]

    def one_commit():
        for _ in range(batch):
            ts[0] += 1
            log.append(b"orders.eu.new", None, PAYLOAD, ts[0])
        s = log.begin_sync()
        s.run()
        log.mark_synced(s)

    benchmark.pedantic(one_commit, rounds=max(20, 2000 // batch), warmup_rounds=2)
    _per_second(benchmark, batch)
    _per_second(benchmark, 1, "fsyncs/s")
    log.close()


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A synced file log of N_STORED messages over 1000 subjects (one in 1000 messages
    is on the sparse subject 'audit.rare')."""
    path = tmp_path_factory.mktemp("stored")
    log = FileLog(str(path))
    rnd = random.Random(2)
    for i in range(N_STORED):
        subj = b"audit.rare" if i % 1000 == 0 else b"orders.%d.new" % rnd.randrange(1000)
        log.append(subj, None, PAYLOAD, i)
    s = log.begin_sync()
    s.run()
    log.mark_synced(s)
    yield log
    log.close()


def test_load_by_seq(benchmark, stored):
    benchmark.group = "filelog load"
    seqs = random.Random(3).sample(range(1, N_STORED + 1), 10_000)

    def run():
        load = stored.load
        for s in seqs:
            load(s)

    benchmark(run)
    _per_second(benchmark, len(seqs), "loads/s")


@pytest.mark.parametrize("flt", [b"audit.rare", b"audit.*", b"orders.7.new"])
def test_load_next_filter(benchmark, stored, flt):
    """A consumer reading every message on a filter from the start."""
    benchmark.group = "filelog load_next"

    def run():
        seq, n = 1, 0
        while True:
            m = stored.load_next(seq, flt)
            if m is None:
                return n
            n += 1
            seq = m[0] + 1

    n = benchmark(run)
    assert n > 0
    benchmark.extra_info["matches"] = n
    _per_second(benchmark, n, "msgs/s")


@pytest.fixture(scope="module")
def big_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("recovery")
    log = FileLog(str(path))
    rnd = random.Random(4)
    subjects = [b"orders.%d.new" % i for i in range(1000)]
    n = 0
    target = RECOVERY_MB << 20
    while True:
        for _ in range(10_000):
            log.append(subjects[rnd.randrange(1000)], None, PAYLOAD, n)
            n += 1
        s = log.begin_sync()
        s.run()
        log.mark_synced(s)
        if n * 190 >= target:
            break
    log.close()
    size = sum(p.stat().st_size for p in (path / "blk").iterdir())
    return str(path), n, size


def test_recovery(benchmark, big_log):
    benchmark.group = "filelog recovery"
    path, n, size = big_log

    def run():
        log = FileLog(path)
        assert log.msgs == n and not log.recovery["corrupt"]
        log.close()

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    benchmark.extra_info["MB"] = round(size / 1e6)
    benchmark.extra_info["records"] = n
    _per_second(benchmark, n, "records/s")
    benchmark.extra_info["MB/s"] = round(size / benchmark.stats.stats.mean / 1e6)
