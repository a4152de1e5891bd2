"""natsjs/_core/syncer.pyx: Syncs run on the fsync thread and complete through the eventfd."""
from __future__ import annotations

import select

import pytest

from natsjs._core.filelog import FileLog
from natsjs._core.syncer import Syncer


def _wait(syncer: Syncer, n: int, timeout: float = 10.0) -> list:
    done = []
    while len(done) < n:
        r, _, _ = select.select([syncer.fd], [], [], timeout)
        assert r, "no completion within %gs" % timeout
        done += syncer.collect()
    return done


def test_syncs_complete_in_order_and_mark_the_log(tmp_path):
    syncer = Syncer()
    log = FileLog(str(tmp_path / "log"))
    try:
        syncs = []
        for i in range(20):
            for j in range(10):
                log.append(b"s", None, b"%d-%d" % (i, j), 0)
            syncs.append(log.begin_sync())
        for s in syncs:
            syncer.submit(s)
        done = _wait(syncer, len(syncs))
        assert [s for s, _ in done] == syncs and all(err == 0 for _, err in done)
        for s in syncs:
            assert s.done and s.ok
            log.mark_synced(s)
        assert log.synced_seq == 200
        with pytest.raises(ValueError):
            syncer.submit(syncs[0])          # a Sync runs once
    finally:
        log.close()
        syncer.close()


def test_close_finishes_submitted_work(tmp_path):
    syncer = Syncer()
    log = FileLog(str(tmp_path / "log"))
    log.append(b"s", None, b"x", 0)
    s = log.begin_sync()
    syncer.submit(s)
    syncer.close()
    assert syncer.collect()[0][0] is s
    log.close()
