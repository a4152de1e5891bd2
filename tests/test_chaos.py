"""The chaos suite (natsjs/testing/chaos) on real clusters: its parts, the sabotage modes
the checker must catch, and the short CI run (3 natsjs nodes, ~30 s, kill + pause +
partition + power loss of one node) that must come out valid."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest

from natsjs.testing.chaos.lossyfs import Undo, available
from natsjs.testing.chaos.netproxy import ChaosNet
from natsjs.testing.chaos.runner import RunConfig, run, summary_line

NATSJS = [sys.executable, "-m", "natsjs"]
FUSE = available()
# CI must exercise power loss: there a missing FUSE is a failure, elsewhere a skip.
needs_fuse = pytest.mark.skipif(bool(FUSE) and not os.environ.get("CI"),
                                reason="lossy mounts unavailable: %s" % FUSE)


# ---- the relays of partitions --------------------------------------------------------------

async def _echo_roundtrip(port: int, payload: bytes, timeout: float) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(payload)
        await w.drain()
        return await asyncio.wait_for(r.readexactly(len(payload)), timeout)
    finally:
        w.close()


def test_netproxy_cut_holds_bytes_until_heal():
    async def main():
        async def echo(r, w):
            while data := await r.read(1024):
                w.write(data)
                await w.drain()
            w.close()
        srv = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        net = await asyncio.to_thread(ChaosNet, [(0, 1, "127.0.0.1", "127.0.0.1", port)])
        try:
            relay = net.ports[(0, 1)]
            assert await _echo_roundtrip(relay, b"ping", 5) == b"ping"
            await asyncio.to_thread(net.cut, 1, 0)          # either order names the link
            r, w = await asyncio.open_connection("127.0.0.1", relay)
            w.write(b"held")
            await w.drain()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r.readexactly(4), 0.5)
            await asyncio.to_thread(net.heal)
            assert await asyncio.wait_for(r.readexactly(4), 5) == b"held"
            w.close()
        finally:
            await asyncio.to_thread(net.close)
            srv.close()
    asyncio.run(main())


# ---- the undo journal of lossyfs, without a mount ----------------------------------------

def test_undo_rolls_back_to_last_fsync(tmp_path):
    undo = Undo(str(tmp_path))
    p = tmp_path / "log"
    p.write_bytes(b"durable-")
    fd = os.open(p, os.O_RDWR)
    try:
        undo.before_write("/log", fd, 8, 5)
        os.pwrite(fd, b"lost!", 8)
        undo.before_write("/log", fd, 0, 1)
        os.pwrite(fd, b"D", 0)
    finally:
        os.close(fd)
    undo.created("/new")
    (tmp_path / "new").write_bytes(b"never synced")
    undo.created("/kept")
    (tmp_path / "kept").write_bytes(b"synced")
    undo.synced("/kept")
    undo.before_truncate("/kept", 2)
    os.truncate(tmp_path / "kept", 2)
    assert undo.pending()[0] == 3
    undo.cut()
    assert p.read_bytes() == b"durable-"
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "kept").read_bytes() == b"synced"
    assert undo.pending() == (0, 0)


@needs_fuse
def test_lossyfs_mount_loses_unsynced_writes(tmp_path):
    from natsjs.testing.chaos.lossyfs import Mount
    m = Mount(str(tmp_path / "back"), str(tmp_path / "mnt"), str(tmp_path / "fs.log"))
    m.mount()
    try:
        path = tmp_path / "mnt" / "f"
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        os.write(fd, b"acked")
        os.fsync(fd)
        os.write(fd, b"+unsynced")
        os.close(fd)
        assert path.read_bytes() == b"acked+unsynced"
        assert m.power_cut().startswith("cut 1 files")
        assert path.read_bytes() == b"acked"
    finally:
        m.unmount()
    assert not os.path.ismount(tmp_path / "mnt")


# ---- the checker must catch sabotage, end to end ------------------------------------------

@pytest.mark.parametrize("mode,figure", [("phantom-ack", "lost_all"),
                                         ("drop-committed", "lost_all"),
                                         ("drop-replica", "divergent")])
def test_sabotage_is_caught(tmp_path, mode, figure):
    r = run(RunConfig(server_cmd=NATSJS, duration=4, clients=2, rate=50, faults=[],
                      queue=False, sabotage=mode, workdir=str(tmp_path)))
    print(summary_line(r), r.notes)
    assert r.figures["ok"] > 0
    assert not r.figures["valid"]
    assert r.figures[figure] >= 1


# ---- the short CI run -----------------------------------------------------------------------

@needs_fuse
@pytest.mark.timeout(400)
def test_short_chaos_run_is_valid(tmp_path):
    r = run(RunConfig(server_cmd=NATSJS, nodes=3, replicas=3, duration=32, clients=3, rate=50,
                      faults=["kill", "pause", "partition", "power-loss"], hold=3.0, calm=1.5,
                      lossy=True, seed=7, workdir=str(tmp_path)))
    print(summary_line(r))
    for f in r.timeline:
        print("  ", f)
    kinds = [f.kind for f in r.timeline]
    assert {"kill", "pause", "partition", "power-loss"} <= set(kinds), kinds
    assert r.figures["ok"] > 0
    assert r.figures["valid"], (r.figures, r.notes)
