"""An acknowledgement is a promise: JetStream's durability tried the hard way.

* kill -9 while publishers stream acknowledged messages, restart, and every
  acknowledged message is there, byte for byte (a loop of rounds);
* a consumer's acknowledged acks survive kill -9 (no redelivery of what was acked);
* block files truncated or with flipped bits are detected on start: the bad records
  are reported and never served, the rest of the stream is;
* a full disk (a small tmpfs) makes publishes fail with an error, loses nothing that
  was acknowledged, and publishing works again once space comes back.
"""
from __future__ import annotations

import asyncio
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import time
from functools import partial

import nats
import pytest
from nats.js.api import ConsumerConfig

from conftest import start_natsjs
import helpers

run = partial(helpers.run, timeout=120)

TIMEOUT = 10


async def _publish_until_killed(server, stream_subject: str, acked: dict, stop_after: int,
                                publishers: int = 4):
    """Publishers send numbered messages; each ack is recorded; the server is killed
    with SIGKILL once ``stop_after`` acks have come back (with more still in flight)."""
    nc = await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0)
    js = nc.jetstream(timeout=5)
    killed = asyncio.Event()

    async def publisher(pid: int):
        n = 0
        while not killed.is_set():
            payload = b"p%d-%d-" % (pid, n) + os.urandom(16).hex().encode()
            n += 1
            try:
                ack = await js.publish(stream_subject, payload)
            except Exception:
                return
            acked[ack.seq] = payload
            if len(acked) >= stop_after and not killed.is_set():
                killed.set()
                server.proc.send_signal(signal.SIGKILL)
                return

    await asyncio.gather(*(publisher(i) for i in range(publishers)))
    try:
        await nc.close()
    except Exception:
        pass


def test_kill9_keeps_every_acknowledged_message(tmp_path):
    store = str(tmp_path / "js")
    acked: dict[int, bytes] = {}
    rounds = int(os.environ.get("NATSJS_KILL9_ROUNDS", "4"))
    rng = random.Random(7)
    s = start_natsjs("-js", "-sd", store)
    try:
        async def setup():
            nc = await nats.connect(s.url)
            await nc.jetstream().add_stream(name="D", subjects=["d"])
            await nc.close()
        run(setup())
        for r in range(rounds):
            run(_publish_until_killed(s, "d", acked, len(acked) + rng.randint(200, 2000)))
            s.proc.wait(10)
            s = start_natsjs("-js", "-sd", store)

            async def check():
                nc = await nats.connect(s.url)
                js = nc.jetstream()
                info = await js.stream_info("D")
                assert info.state.messages >= len(acked)
                for seq, payload in sorted(acked.items()):
                    msg = await js.get_msg("D", seq)
                    assert msg.data == payload, (r, seq)
                await nc.close()
            run(check())
    finally:
        s.stop()


def test_consumer_acks_survive_kill9(tmp_path):
    store = str(tmp_path / "js")
    s = start_natsjs("-js", "-sd", store)
    try:
        async def first():
            nc = await nats.connect(s.url)
            js = nc.jetstream()
            await js.add_stream(name="C", subjects=["c"])
            for i in range(50):
                await js.publish("c", b"%d" % i)
            sub = await js.pull_subscribe("c", "dur", config=ConsumerConfig(ack_wait=60))
            msgs = await sub.fetch(30, timeout=TIMEOUT)
            for m in msgs[:20]:
                await m.ack_sync(timeout=TIMEOUT)     # acknowledged acks: the server confirmed each
            await nc.close()
        run(first())
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        s = start_natsjs("-js", "-sd", store)

        async def second():
            nc = await nats.connect(s.url)
            js = nc.jetstream()
            sub = await js.pull_subscribe("c", "dur")
            seen = []
            # Until all thirty unacknowledged messages have come (a loaded machine may let a
            # fetch time out first: nats-py raises nats' TimeoutError or asyncio's), then one
            # more fetch for anything that should not come.
            deadline = time.monotonic() + 60
            quiet = False
            while not quiet:
                assert time.monotonic() < deadline, sorted(seen)
                try:
                    msgs = await sub.fetch(50, timeout=2)
                except asyncio.TimeoutError:
                    quiet = set(range(20, 50)) <= set(seen)
                    continue
                seen += [int(m.data) for m in msgs]
                for m in msgs:
                    await m.ack()
            acked = set(range(20))
            assert not acked & set(seen), sorted(acked & set(seen))
            assert set(range(20, 50)) <= set(seen)
            await nc.close()
        run(second())
    finally:
        s.stop()


def _stream_blocks(store: str, stream: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(store, "jetstream", "$G", "streams", stream, "msgs",
                                          "**", "*.blk"), recursive=True))
    assert files, "no block files"
    return files


def _fill(server, n: int, stream: str = "X", size: int = 64) -> list[bytes]:
    payloads = [b"%04d" % i + b"x" * size for i in range(n)]

    async def main():
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[stream.lower()])
        for p in payloads:
            await js.publish(stream.lower(), p)
        await nc.close()
    run(main())
    return payloads


def test_torn_tail_is_truncated_and_reported(tmp_path):
    store = str(tmp_path / "js")
    s = start_natsjs("-js", "-sd", store)
    payloads = _fill(s, 100)
    s.stop()
    last = _stream_blocks(store, "X")[-1]
    size = os.path.getsize(last)
    with open(last, "r+b") as f:
        f.truncate(size - 30)        # the last record is torn
    s = start_natsjs("-js", "-sd", store)
    try:
        s.wait_for(re.compile(rb"truncated a torn tail"))
        # The stream had reached 100 (its state file says so): the lost message is
        # reported and its sequence is not given to another.
        s.wait_for(re.compile(rb"could not locate 1 messages \(sequences 100-100\)"))

        async def main():
            nc = await nats.connect(s.url)
            js = nc.jetstream()
            info = await js.stream_info("X")
            assert info.state.last_seq == 100 and info.state.messages == 99
            for seq in (1, 50, 99):
                assert (await js.get_msg("X", seq)).data == payloads[seq - 1]
            ack = await js.publish("x", b"after")
            assert ack.seq == 101
            await nc.close()
        run(main())
    finally:
        s.stop()


def test_flipped_bits_are_reported_and_never_served(tmp_path):
    store = str(tmp_path / "js")
    s = start_natsjs("-js", "-sd", store)
    payloads = _fill(s, 100)
    s.stop()
    blk = _stream_blocks(store, "X")[0]
    data = bytearray(open(blk, "rb").read())
    # Corrupt the payload of a record in the middle of the block.
    idx = data.find(b"0050" + b"x" * 10)
    assert idx > 0
    data[idx + 8] ^= 0xFF
    open(blk, "wb").write(bytes(data))
    s = start_natsjs("-js", "-sd", store)
    try:
        s.wait_for(re.compile(rb"corrupt record"))

        async def main():
            nc = await nats.connect(s.url)
            js = nc.jetstream()
            with pytest.raises(nats.js.errors.NotFoundError):
                await js.get_msg("X", 51)
            for seq in (1, 50, 52, 100):
                assert (await js.get_msg("X", seq)).data == payloads[seq - 1]
            info = await js.stream_info("X")
            assert info.state.messages == 99
            await nc.close()
        run(main())
    finally:
        s.stop()


def _mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                       capture_output=True)
    return r.returncode == 0


def test_full_disk_fails_publishes_and_recovers(tmp_path):
    mnt = str(tmp_path / "small")
    if not _mount_tmpfs(mnt, "3m"):
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk test needs one")
    # Something else on the disk that can be deleted to give the space back.
    ballast = os.path.join(mnt, "ballast")
    with open(ballast, "wb") as f:
        f.write(b"\0" * 512 * 1024)
    conf = tmp_path / "js.conf"
    conf.write_text("jetstream { store_dir: %s, max_file_store: 1G }\n" % mnt)
    s = None
    try:
        s = start_natsjs("-c", str(conf))

        async def main():
            nc = await nats.connect(s.url)
            js = nc.jetstream()
            await js.add_stream(name="F", subjects=["f"])
            acked = {}
            failed = 0
            payload = b"y" * 4000
            for i in range(2000):
                try:
                    ack = await js.publish("f", payload + b"%d" % i)
                    acked[ack.seq] = payload + b"%d" % i
                except nats.js.errors.APIError:
                    failed += 1
                    if failed >= 3:
                        break
            assert failed >= 3, "the disk never filled"
            for seq, data in acked.items():
                assert (await js.get_msg("F", seq)).data == data
            # Space comes back: the same stream takes messages again, and nothing that
            # was acknowledged is lost.
            os.unlink(ballast)
            ack = await js.publish("f", b"again")
            assert ack.seq == max(acked) + 1
            assert (await js.get_msg("F", ack.seq)).data == b"again"
            for seq, data in acked.items():
                assert (await js.get_msg("F", seq)).data == data
            await nc.close()
        run(main())
    finally:
        if s is not None:
            s.stop()
        subprocess.run(["umount", mnt], capture_output=True)
