"""A hostile disk: a full file system and damaged store files (issue 19, findings 6, 7).

* A full disk (``max_file_store`` larger than the file system, a small tmpfs): a message
  answered with an error is not there after a restart, fetches and acks are answered,
  a create that fails leaves nothing behind, and SIGTERM exits cleanly.
* Damaged files: a deleted or halved block keeps the stream's sequence and says how
  many messages were lost (nats-server warns "could not locate msg block" and keeps the
  sequence too); garbage in a consumer's state is reported and loses no acknowledgement;
  a meta.json nats-server's checks refuse skips that stream only.
* A property: random damage (truncation, flipped bytes, deleted files, garbage JSON)
  to one stream's files never stops the server, never costs another stream anything,
  is reported, and no message whose checksum fails is ever served.
  ``NATSJS_HOSTILE_EXAMPLES`` sets how many examples (a few dozen in CI).
"""
from __future__ import annotations

import asyncio
import glob
import json
import os
import re
import shutil
import subprocess
from functools import partial

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.api import ConsumerConfig

from conftest import start_natsjs, start_reference
import helpers

run = partial(helpers.run, timeout=120)

TIMEOUT = 10


def _stream_dir(store: str, stream: str) -> str:
    return os.path.join(store, "jetstream", "$G", "streams", stream)


def _blocks(store: str, stream: str) -> list[str]:
    """The message block files of a stream, natsjs's or nats-server's layout."""
    d = os.path.join(_stream_dir(store, stream), "msgs")
    return sorted(glob.glob(os.path.join(d, "**", "*.blk"), recursive=True))


# ---- a full disk ----------------------------------------------------------------------


def _mount_tmpfs(path: str, size: str) -> None:
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                       capture_output=True)
    if r.returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): %s" % r.stderr.decode().strip())


def _fill_up(path: str) -> None:
    """Take every byte the file system has left."""
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass        # full (even the file's inode may not have fitted)


def test_full_disk_answers_and_stores_nothing_it_refused(tmp_path):
    mnt = str(tmp_path / "small")
    _mount_tmpfs(mnt, "2m")
    conf = tmp_path / "js.conf"
    conf.write_text("jetstream { store_dir: %s, max_file_store: 1G }\n" % mnt)
    s = None
    try:
        s = start_natsjs("-c", str(conf))
        acked: dict[int, bytes] = {}
        refused: set[bytes] = set()

        async def fill():
            nc = await nats.connect(s.url)
            js = nc.jetstream(timeout=5)
            await js.add_stream(name="F", subjects=["f"])
            sub = await js.pull_subscribe("f", "dur", config=ConsumerConfig(ack_wait=60))
            stop = asyncio.Event()

            async def publisher(p: int):
                i = 0
                while not stop.is_set():
                    data = b"y" * 3000 + b"%d-%d" % (p, i)
                    i += 1
                    try:
                        ack = await js.publish("f", data)
                        acked[ack.seq] = data
                    except nats.js.errors.APIError:
                        refused.add(data)
                        if len(refused) >= 40:
                            stop.set()
            # Several publishers, so a failing fsync covers several messages at once.
            await asyncio.gather(*(publisher(p) for p in range(8)))
            assert acked and refused, "the disk never filled"
            _fill_up(os.path.join(mnt, "ballast"))
            # A fetch while full is answered, and so is each AckSync: confirmed or
            # refused (503), never silence.
            msgs = await sub.fetch(3, timeout=TIMEOUT)
            assert msgs
            for m in msgs:
                try:
                    await m.ack_sync(timeout=TIMEOUT)
                except nats.errors.NoRespondersError:
                    pass
            # A create that fails leaves no directory behind.
            with pytest.raises(nats.js.errors.APIError):
                await js.add_stream(name="G", subjects=["g"])
            with pytest.raises(nats.js.errors.APIError):
                await js.add_consumer("F", ConsumerConfig(durable_name="d2"))
            await nc.close()
        run(fill())
        assert not os.path.exists(_stream_dir(mnt, "G"))
        assert not os.path.exists(os.path.join(_stream_dir(mnt, "F"), "obs", "d2"))
        assert s.stop() == 0, s.text()
        assert "Traceback" not in s.text(), s.text()
        if os.path.exists(os.path.join(mnt, "ballast")):
            os.unlink(os.path.join(mnt, "ballast"))
        s = start_natsjs("-c", str(conf))

        async def check():
            nc = await nats.connect(s.url)
            js = nc.jetstream(timeout=5)
            info = await js.stream_info("F")
            stored = {}
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                stored[seq] = (await js.get_msg("F", seq)).data
            for seq, data in acked.items():
                assert stored.get(seq) == data, seq
            again = [seq for seq, data in stored.items() if data in refused]
            assert not again, "messages answered with an error were stored: %s" % again
            await nc.close()
        run(check())
    finally:
        if s is not None:
            s.stop()
        subprocess.run(["umount", mnt], capture_output=True)


# ---- damaged files --------------------------------------------------------------------


def _publish(server, stream: str, n: int, durable: str | None = None, acks: int = 0):
    """``n`` messages into a new stream; a durable pull consumer acknowledges ``acks``."""
    async def main():
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name=stream, subjects=[stream.lower()])
        for i in range(n):
            await js.publish(stream.lower(), b"%s-%d" % (stream.encode(), i + 1))
        if durable:
            sub = await js.pull_subscribe(stream.lower(), durable,
                                          config=ConsumerConfig(ack_wait=60))
            left = acks
            while left:
                for m in await sub.fetch(min(left, 100), timeout=TIMEOUT):
                    await m.ack_sync(timeout=TIMEOUT)
                    left -= 1
        await nc.close()
    run(main())


def _after_lost_block(server) -> tuple:
    async def main():
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        info = await js.stream_info("S")
        ack = await js.publish("s", b"new")
        sub = await js.pull_subscribe("s", "dur")
        got = [m.data for m in await sub.fetch(5, timeout=TIMEOUT)]
        await nc.close()
        return info.state.first_seq, info.state.last_seq, ack.seq, got
    return run(main())


@pytest.mark.parametrize("start", [start_natsjs, start_reference], ids=["natsjs", "nats-server"])
def test_a_deleted_block_keeps_the_sequence_and_is_reported(tmp_path, start):
    store = str(tmp_path / "js")
    s = start("-js", "-sd", store)
    _publish(s, "S", 100, "dur", acks=60)
    s.stop()
    blocks = _blocks(store, "S")
    assert len(blocks) == 1
    os.unlink(blocks[0])
    s = start("-js", "-sd", store)
    try:
        first, last, new_seq, got = _after_lost_block(s)
        # The sequence is kept: the new message is not hidden below the consumer's floor.
        assert (first, last, new_seq) == (101, 100, 101)
        assert got == [b"new"]
        assert re.search(r"\[WRN\].*could not locate", s.text()), s.text()
    finally:
        s.stop()


def test_a_block_cut_in_half_says_how_many_messages_were_lost(tmp_path):
    store = str(tmp_path / "js")
    s = start_natsjs("-js", "-sd", store)
    _publish(s, "S", 1000)
    s.stop()
    blk = _blocks(store, "S")[-1]
    with open(blk, "r+b") as f:
        f.truncate(os.path.getsize(blk) // 2)
    s = start_natsjs("-js", "-sd", store)
    try:
        async def main():
            nc = await nats.connect(s.url)
            js = nc.jetstream(timeout=5)
            info = await js.stream_info("S")
            ack = await js.publish("s", b"new")
            await nc.close()
            return info.state.messages, ack.seq
        kept, new_seq = run(main())
        assert 0 < kept < 1000 and new_seq == 1001
        m = re.search(r"could not locate (\d+) messages \(sequences (\d+)-(\d+)\)", s.text())
        assert m, s.text()
        assert (int(m.group(1)), int(m.group(2)), int(m.group(3))) == \
            (1000 - kept, kept + 1, 1000)
    finally:
        s.stop()


def test_garbage_in_a_consumer_state_is_reported_and_no_ack_is_lost(tmp_path):
    store = str(tmp_path / "js")
    s = start_natsjs("-js", "-sd", store)
    _publish(s, "S", 500, "dur", acks=300)
    s.stop()
    snap = os.path.join(_stream_dir(store, "S"), "obs", "dur", "snap.json")
    assert os.path.exists(snap)
    with open(snap, "wb") as f:
        f.write(b'{"state": {"sseq": "garbage"')
    s = start_natsjs("-js", "-sd", store)
    try:
        async def main():
            nc = await nats.connect(s.url)
            js = nc.jetstream(timeout=5)
            ci = await js.consumer_info("S", "dur")
            sub = await js.pull_subscribe("s", "dur")
            first = (await sub.fetch(1, timeout=TIMEOUT))[0]
            await nc.close()
            return ci.ack_floor.stream_seq, first.metadata.sequence.stream
        floor, next_seq = run(main())
        assert (floor, next_seq) == (300, 301)
        assert re.search(r"\[WRN\].*Consumer '\$G > S > dur': snap\.json unreadable", s.text()), \
            s.text()
    finally:
        s.stop()


def test_a_refused_meta_json_skips_that_stream_only(tmp_path):
    store = str(tmp_path / "js")
    s = start_natsjs("-js", "-sd", store)
    _publish(s, "A", 5)
    _publish(s, "B", 5)
    s.stop()
    meta = os.path.join(_stream_dir(store, "A"), "meta.json")
    with open(meta) as f:
        d = json.load(f)
    d["config"]["max_msgs"] = "abc"
    with open(meta, "w") as f:
        json.dump(d, f)
    s = start_natsjs("-js", "-sd", store)
    try:
        async def main():
            nc = await nats.connect(s.url)
            js = nc.jetstream(timeout=5)
            assert (await js.stream_info("B")).state.messages == 5
            assert (await js.get_msg("B", 5)).data == b"B-5"
            with pytest.raises(nats.js.errors.NotFoundError):
                await js.stream_info("A")
            await nc.close()
        run(main())
        assert re.search(r"\[WRN\].*Error reading stream metafile .*/A/meta\.json", s.text()), \
            s.text()
    finally:
        s.stop()


# ---- random damage --------------------------------------------------------------------

STREAMS = ("A", "B", "C")
STORE_STATE = "state.json"
N_MSGS = 300


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store with three streams of known messages (one with a consumer halfway)."""
    store = str(tmp_path_factory.mktemp("hostile") / "js")
    s = start_natsjs("-js", "-sd", store)
    try:
        for name in STREAMS:
            _publish(s, name, N_MSGS, "dur" if name == "A" else None,
                     acks=100 if name == "A" else 0)
    finally:
        s.stop()
    return store


def _files_of(store: str, stream: str) -> list[str]:
    out = []
    for root, _, files in os.walk(_stream_dir(store, stream)):
        out += [os.path.join(root, f) for f in files]
    return sorted(out)


DAMAGE = st.sampled_from(["truncate", "flip", "delete", "garbage_json", "zero_run"])


def _damage(path: str, how: str, data) -> str:
    size = os.path.getsize(path)
    if how == "delete":
        os.unlink(path)
    elif how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(data.draw(st.integers(0, max(size - 1, 0))))
    elif how == "garbage_json":
        with open(path, "wb") as f:
            f.write(data.draw(st.sampled_from([
                b"", b"{", b"[]", b"null", b'{"config": 7}', b'{"config": {"name": 5}}',
                b'{"state": {"sseq": -1}}', b"\xff\xfe\x00", b'{"first_seq": "x"}'])))
    elif size:
        off = data.draw(st.integers(0, size - 1))
        with open(path, "r+b") as f:
            f.seek(off)
            if how == "flip":
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ data.draw(st.integers(1, 255))]))
            else:
                f.write(b"\0" * min(64, size - off))
    return "%s %s" % (how, os.path.relpath(path))


def _check_served(server, damaged: str) -> int:
    """Every undamaged stream whole; the damaged one, if served, serves only true
    messages.  Returns how many of its messages it serves."""
    async def main():
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        served = 0
        for name in STREAMS:
            try:
                info = await js.stream_info(name)
            except nats.js.errors.NotFoundError:
                assert name == damaged, "undamaged stream %s is gone" % name
                continue
            if name != damaged:
                assert info.state.messages == N_MSGS
            for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
                try:
                    m = await js.get_msg(name, seq)
                except nats.js.errors.NotFoundError:
                    assert name == damaged
                    continue
                assert m.data == b"%s-%d" % (name.encode(), seq), (name, seq, m.data)
                if name == damaged:
                    served += 1
        # The server still takes messages.
        other = next(n for n in STREAMS if n != damaged)
        assert (await js.publish(other.lower(), b"more")).seq == N_MSGS + 1
        await nc.close()
        return served
    return run(main())


EXAMPLES = int(os.environ.get("NATSJS_HOSTILE_EXAMPLES", "20"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 20,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_damage_is_reported_and_never_served(template, tmp_path_factory, data):
    damaged = data.draw(st.sampled_from(STREAMS), label="stream")
    store = str(tmp_path_factory.mktemp("damaged") / "js")
    shutil.copytree(template, store)
    files = _files_of(store, damaged)
    done = []
    for _ in range(data.draw(st.integers(1, 3), label="how many")):
        files = [f for f in files if os.path.exists(f)]
        if not files:
            break
        path = data.draw(st.sampled_from(files), label="file")
        done.append(_damage(path, data.draw(DAMAGE, label="damage"), data))
    s = start_natsjs("-js", "-sd", store)
    try:
        served = _check_served(s, damaged)
        if served < N_MSGS and not any(STORE_STATE in d for d in done):
            # Messages are missing: the log says so, naming the stream (unless the
            # damage took the record of how far the stream had come as well).
            text = s.text()
            assert re.search(r"\[(WRN|ERR)\].*(\b|/)%s\b" % damaged, text), (done, text)
    finally:
        s.stop()
