"""natsjs/jetstream/raft_driver.py: RaftService on trio with real FileLogs in tmp dirs.

Three services over the in-process LocalNetwork elect a leader, replicate 10k entries with
fsync group commit, lose a follower (closed) while the others go on and compact, and the
follower restarts from its files and catches up by snapshot plus replay.  The entries/s
figure is printed (``pytest -s``); timing targets live in bench/, not here.
"""
from __future__ import annotations

import json
import time

import pytest
import trio

from natsjs._core.filelog import FileLog
from natsjs.jetstream.raft import NotLeader, RaftConfig
from natsjs.jetstream.raft_driver import RaftService, StateMachine
from natsjs.jetstream.raft_storage import DirFiles, RaftStorage
from natsjs.testing.raftnet import LocalNetwork

PEERS = ("a", "b", "c")


class ListFSM(StateMachine):
    """The application: the list of applied payloads (snapshot = that list as JSON)."""

    def __init__(self):
        self.items: list[str] = []
        self.leaders = []

    def apply(self, entries):
        self.items.extend(d.decode() for _, _, d in entries)

    def restore(self, storage, index, term):
        self.items = json.loads(storage.snapshot_bytes())

    def leader_changed(self, leader, term):
        self.leaders.append((leader, term))


class Member:
    """One server's Raft group member: its files, service and task."""

    def __init__(self, net, root, node_id, config):
        self.net, self.root, self.id, self.config = net, root, node_id, config
        self.svc = None
        self.fsm = None
        self._scope = None
        self._stopped = None

    async def start(self, nursery):
        log = FileLog(str(self.root / self.id / "log"))
        storage = RaftStorage(log, DirFiles(str(self.root / self.id)))
        transport, inbox = self.net.attach(self.id)
        self.fsm = ListFSM()
        self.svc = RaftService(self.id, storage, transport, self.fsm, peers=PEERS,
                               config=self.config, seed=self.id)
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

        async def runner(task_status=trio.TASK_STATUS_IGNORED):
            try:
                with self._scope:
                    await self.svc.run(inbox, task_status=task_status)
            finally:
                self._stopped.set()

        await nursery.start(runner)

    async def stop(self):
        self.net.detach(self.id)
        self._scope.cancel()
        await self._stopped.wait()
        self.svc.storage.close()


async def wait_for(cond, timeout=20.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


def leader_of(members):
    leaders = [m for m in members if m.svc and not m.svc.closed and m.svc.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


async def start_group(nursery, net, root, config):
    """Three members started in ``nursery``; returns them and, once elected, the leader."""
    members = [Member(net, root, p, config) for p in PEERS]
    for m in members:
        await m.start(nursery)
    await wait_for(lambda: leader_of(members) is not None)
    return members, leader_of(members)


async def propose_pipelined(svc, payloads, window=2000):
    """Propose one entry per payload (as a stream leader does per message), keeping at
    most ``window`` unapplied; returns the last index."""
    last = 0
    for k, p in enumerate(payloads):
        last = svc.propose(p)
        if k % 200 == 199:
            await svc.wait_applied(last - window)
    return last


@pytest.mark.parametrize("inline", [False, True], ids=["queued", "inline"])
def test_three_services_replicate_restart_and_catch_up(tmp_path, inline):
    """``inline``: messages are stepped in the sender's task when the receiver is free
    (RaftService.receive, as the server's transport does), else queued."""
    config = RaftConfig(snapshot_chunk=64 * 1024)
    result = {}

    async def main():
        net = LocalNetwork(inline=inline)
        async with trio.open_nursery() as nursery:
            members, lead = await start_group(nursery, net, tmp_path, config)
            others = [m for m in members if m is not lead]
            await wait_for(lambda: all(m.svc.leader == lead.id for m in members))
            try:
                others[0].svc.propose(b"x")
                raise AssertionError("a follower took a proposal")
            except NotLeader as exc:
                assert exc.leader == lead.id

            # 10k entries of 128 bytes, one proposal each
            payloads = [b"%06d" % i + b"." * 122 for i in range(10000)]
            syncs0 = lead.svc.syncs
            term0 = lead.svc.term
            t0 = time.perf_counter()
            last = await propose_pipelined(lead.svc, payloads)
            await wait_for(lambda: all(m.svc.applied >= last for m in members))
            elapsed = time.perf_counter() - t0
            result["rate"] = 10000 / elapsed
            result["per_sync"] = 10000 / max(1, lead.svc.syncs - syncs0)
            # real time, so reported rather than asserted (raftsim asserts it: see
            # test_no_election_without_faults_under_load)
            result["elections"] = lead.svc.term - term0
            expect = [p.decode() for p in payloads]
            for m in members:
                assert m.fsm.items == expect

            # a follower goes away; the others go on, and compact their logs
            down = others[0]
            await down.stop()
            more = [b"more-%d" % i for i in range(2000)]
            last = await propose_pipelined(lead.svc, more)
            await wait_for(lambda: all(m.svc.applied >= last for m in members
                                       if m is not down))
            for m in members:
                if m is not down:
                    await m.svc.compact(m.svc.applied, json.dumps(m.fsm.items).encode())
            tail = [b"tail-%d" % i for i in range(100)]
            last = await propose_pipelined(lead.svc, tail)
            assert lead.svc.node.snap.index > 10000

            # it restarts from its files: snapshot from the leader, then replay
            await down.start(nursery)
            assert down.svc.node.last_index >= 10000     # its log survived the restart
            await wait_for(lambda: down.svc.applied >= last)
            assert down.fsm.items == lead.fsm.items
            assert down.svc.storage.snapshot.index == lead.svc.node.snap.index
            info = {p["name"]: p for p in lead.svc.peer_info()}
            await wait_for(lambda: all(p["current"] for p in lead.svc.peer_info()))
            assert set(info) == {m.id for m in others}

            # and the group still takes writes, on whichever node leads now
            final = await propose_pipelined(leader_of(members).svc, [b"last"])
            await wait_for(lambda: all(m.svc.applied >= final for m in members))
            for m in members:
                await m.stop()
            nursery.cancel_scope.cancel()

    trio.run(main)
    print("\nraft: %.0f entries/s (3 nodes, 128 B, fsync group commit, %.0f entries per "
          "leader fsync, %d elections under that load)"
          % (result["rate"], result["per_sync"], result["elections"]))


def test_the_group_goes_on_while_a_snapshot_is_written(tmp_path):
    """A snapshot's files go to disk in a thread: while the leader's are held up, its
    group still commits, and a follower that was down and is now behind the compacted
    log catches up from the snapshot the leader holds in memory.  Once the files are
    written the snapshot is the durable one and the log no longer holds what it
    covers."""
    import threading
    release = threading.Event()

    async def main():
        net = LocalNetwork()
        async with trio.open_nursery() as nursery:
            members, lead = await start_group(nursery, net, tmp_path, RaftConfig())
            down = [m for m in members if m is not lead][0]
            last = await propose_pipelined(lead.svc, [b"a%d" % i for i in range(300)])
            await wait_for(lambda: all(m.svc.applied >= last for m in members))
            await down.stop()
            last = await propose_pipelined(lead.svc, [b"b%d" % i for i in range(300)])
            await wait_for(lambda: lead.svc.applied >= last)

            storage = lead.svc.storage
            write = storage.write_snapshot
            storage.write_snapshot = lambda op: release.wait(30) and write(op)
            index = lead.svc.applied
            state = json.dumps(lead.fsm.items).encode()
            await lead.svc.compact(index, state)
            assert lead.svc.node.snap.index == index and storage.snapshot is None
            assert storage.snapshot_bytes() == state        # from memory meanwhile

            last = await propose_pipelined(lead.svc, [b"c%d" % i for i in range(300)])
            await wait_for(lambda: all(m.svc.applied >= last for m in members
                                       if m is not down))
            await down.start(nursery)
            await wait_for(lambda: down.svc.applied >= last)
            assert down.fsm.items == lead.fsm.items
            assert storage.snapshot is None and storage.log.first_seq <= index

            release.set()
            await wait_for(lambda: storage.snapshot is not None)
            assert storage.snapshot.index == index and storage.log.first_seq == index + 1
            assert storage.snapshot_bytes() == state        # now from its file
            for m in members:
                await m.stop()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        release.set()


def test_leader_step_down_hands_over_to_a_caught_up_peer(tmp_path):
    async def main():
        net = LocalNetwork()
        async with trio.open_nursery() as nursery:
            members, lead = await start_group(nursery, net, tmp_path, RaftConfig())
            last = await propose_pipelined(lead.svc, [b"%d" % i for i in range(100)])
            await wait_for(lambda: all(m.svc.applied >= last for m in members))
            term = lead.svc.term
            target = lead.svc.transfer_leadership()
            start = trio.current_time()
            await wait_for(lambda: leader_of(members) is not None
                           and leader_of(members).id == target, timeout=5)
            # a hand-over, not an election timeout
            assert trio.current_time() - start < RaftConfig().election_timeout_min
            new = leader_of(members)
            assert new.svc.term == term + 1
            await new.svc.wait_applied(new.svc.propose(b"after"))
            for m in members:
                await m.stop()
            nursery.cancel_scope.cancel()

    trio.run(main)


# ---- RaftStorage on a real FileLog: reads and the recovery rules --------------------------

def _storage(path, peers=PEERS):
    s = RaftStorage(FileLog(str(path / "log")), DirFiles(str(path)))
    s.recover(peers)
    return s


def _entries(first, terms):
    from natsjs._core.raftlog import encode_entry
    return [encode_entry(0, t, first + k, b"e%d" % (first + k)) for k, t in enumerate(terms)]


def test_storage_reads_unsynced_entries_and_keeps_hard_state(tmp_path):
    s = _storage(tmp_path)
    entries = _entries(1, [1, 1, 2])
    s.append(1, entries)
    assert [s.entry(i) for i in (1, 2, 3)] == entries and s.entry(4) is None
    s.save_hard_state(2, "b")
    sync = s.begin_sync()
    sync.run()
    assert s.finish_sync(sync) == 3
    s.close()
    s = _storage(tmp_path, peers=())        # bootstrap voters come from the state file
    assert (s.term, s.vote, s.peers, s.last_index) == (2, "b", PEERS, 3)
    assert s.entry(3) == entries[2]
    s.close()


def test_storage_sync_reports_no_more_than_a_truncation_left(tmp_path):
    from natsjs.jetstream.raft import OP_TRUNCATE
    s = _storage(tmp_path)
    s.append(1, _entries(1, [1] * 10))
    sync = s.begin_sync()
    s.apply_op((OP_TRUNCATE, 4))              # while that sync is in flight
    s.append(5, _entries(5, [2, 2]))
    sync.run()
    assert s.finish_sync(sync) == 4           # 5 and 6 are new: not covered by it
    s.close()


def test_recovery_cuts_a_log_whose_terms_go_down(tmp_path):
    s = _storage(tmp_path)
    s.append(1, _entries(1, [1, 3, 3]) + _entries(4, [2, 4]))   # a stale remnant at 4
    s.close()
    s = _storage(tmp_path)
    assert s.last_index == 3 and s.recovered_truncations == 1
    s.close()


def test_recovery_drops_a_log_that_does_not_continue_the_snapshot(tmp_path):
    from natsjs.jetstream.raft import OP_SNAPSHOT_SAVE
    s = _storage(tmp_path)
    s.append(1, _entries(1, [1, 1, 1, 1]))
    s.apply_op((OP_SNAPSHOT_SAVE, 3, 1, PEERS, b"state@3"))
    assert s.log.first_seq == 4 and s.snapshot_bytes() == b"state@3"
    s.close()
    s = _storage(tmp_path)                    # log 4.. continues the snapshot at 3
    assert (s.snapshot.index, s.log.first_seq, s.last_index) == (3, 4, 4)
    # a snapshot whose term at its index differs from the log's: the log goes
    s.files.write_json("snapshot.json", {"index": 4, "term": 9, "peers": list(PEERS),
                                         "size": 7, "file": s._snap_file})
    s.close()
    s = _storage(tmp_path)
    assert (s.snapshot.index, s.log.first_seq, s.last_index) == (4, 5, 4)
    s.close()


def test_recovery_stops_at_a_corrupt_entry(tmp_path):
    s = _storage(tmp_path)
    good = _entries(1, [1, 1])
    s.append(1, good)
    s.log.append(b"$NRG", None, b"\x00" * 30, 0, 3)    # not a valid entry
    s.append(4, _entries(4, [1]))
    s.close()
    s = _storage(tmp_path)
    assert s.last_index == 2 and s.entry(2) == good[1]
    s.close()


def test_a_refused_fsync_acknowledges_nothing_and_is_retried(tmp_path):
    calls = []
    fsm = ListFSM()

    async def flaky_fsync(sync):
        calls.append(sync.seq)
        if len(calls) <= 2:
            assert fsm.items == []        # nothing applied on the strength of it
            raise OSError(5, "Input/output error")
        await trio.to_thread.run_sync(sync.run)

    async def main():
        log = FileLog(str(tmp_path / "log"))
        net = LocalNetwork()
        transport, inbox = net.attach("a")
        svc = RaftService("a", RaftStorage(log, DirFiles(str(tmp_path))), transport, fsm,
                          peers=("a",), fsync=flaky_fsync)
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run, inbox)
            await wait_for(svc.is_leader)
            index = svc.propose(b"one")
            await svc.wait_applied(index)
            assert fsm.items == ["one"]
            assert svc.sync_errors == 2 and len(calls) >= 3
            nursery.cancel_scope.cancel()
        svc.storage.close()

    trio.run(main)


# ---- damaged files: found, never used, repair before voting -----------------------------

def _snapshotted(path):
    """A group member's files: entries 1..6 of terms 1, 1, 2, 2, 3, 3, a snapshot at 4,
    term 3 and a vote for b."""
    from natsjs.jetstream.raft import OP_SNAPSHOT_SAVE
    s = _storage(path)
    s.append(1, _entries(1, [1, 1, 2, 2, 3, 3]))
    s.save_hard_state(3, "b")
    s._sync_now()
    s.apply_op((OP_SNAPSHOT_SAVE, 4, 2, PEERS, b"state@4"))
    assert (s.log.first_seq, s.last_index) == (5, 6)
    s.close()


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    off = len(data) // 2 if offset is None else offset
    data[off] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_cut_snapshot_record_empties_the_log_and_the_node_repairs(tmp_path):
    _snapshotted(tmp_path)
    snap = tmp_path / "snapshot.json"
    snap.write_bytes(snap.read_bytes()[:19])       # a tail cut off
    s = _storage(tmp_path)
    assert s.snapshot is None and s.last_index == 0 and s.log.first_seq == 1
    assert s.repair and any("snapshot.json" in d for d in s.damage)
    assert (s.term, s.vote) == (3, "b")             # the state file is intact
    assert not [n for n in s.files.names() if n.startswith("snap-")]
    s.close()
    s = _storage(tmp_path)                          # the repair survives a restart
    assert s.repair and s.last_index == 0
    s.close()


def test_a_damaged_snapshot_file_is_never_restored(tmp_path):
    _snapshotted(tmp_path)
    _flip(tmp_path / "snap-4.bin", 2)
    s = _storage(tmp_path)
    assert s.snapshot is None and s.snapshot_bytes() == b"" and s.last_index == 0
    assert s.repair and any("snap-4.bin" in d for d in s.damage)
    s.close()


def test_a_log_that_lost_its_start_without_a_snapshot_is_emptied(tmp_path):
    _snapshotted(tmp_path)
    (tmp_path / "snapshot.json").unlink()           # the log starts at 5, nothing before
    s = _storage(tmp_path)
    assert s.snapshot is None and (s.log.first_seq, s.last_index) == (1, 0)
    assert s.repair and any("starts at 5" in d for d in s.damage)
    s.close()


def test_a_damaged_term_and_vote_are_rebuilt_from_the_log_and_not_trusted(tmp_path):
    _snapshotted(tmp_path)
    state = tmp_path / "state.json"
    text = state.read_bytes()
    state.write_bytes(text.replace(b'"term":3', b'"term":1'))   # still valid JSON
    s = _storage(tmp_path)
    # the highest term the snapshot and the log prove; no vote; repair before voting
    assert (s.term, s.vote, s.repair) == (3, None, True)
    assert s.peers == PEERS and s.last_index == 6   # the caller's voters; the log stays
    s.close()
    state.write_bytes(b'{"term":3,"vo')              # cut short: not even JSON
    s = _storage(tmp_path)
    assert (s.term, s.vote, s.repair) == (3, None, True)
    s.close()


def test_a_record_failing_its_checksum_ends_the_log_there_and_the_node_repairs(tmp_path):
    s = _storage(tmp_path)
    entries = _entries(1, [1] * 8)
    s.append(1, entries)
    s._sync_now()
    s.close()
    blk = tmp_path / "log" / "blk" / "00000001.blk"
    size = blk.stat().st_size
    _flip(blk, size * 5 // 8 + 4)                   # inside entry 6 of 8
    s = _storage(tmp_path)
    assert s.last_index < 6 and s.entry(s.last_index) == entries[s.last_index - 1]
    assert s.repair and s.damage
    s.close()


def test_a_torn_tail_is_cut_without_repair(tmp_path):
    s = _storage(tmp_path)
    s.append(1, _entries(1, [1] * 8))
    s._sync_now()
    s.close()
    blk = tmp_path / "log" / "blk" / "00000001.blk"
    with open(blk, "r+b") as f:
        f.truncate(blk.stat().st_size - 5)           # the last write never completed
    s = _storage(tmp_path)
    assert s.last_index == 7 and not s.repair and not s.damage
    s.close()


def test_a_service_over_damaged_files_starts_repairing(tmp_path):
    _snapshotted(tmp_path)
    (tmp_path / "state.json").write_bytes(b"\x00garbage")
    fsm = StateMachine()

    async def main():
        net = LocalNetwork()
        transport, inbox = net.attach("a")
        svc = RaftService("a", RaftStorage(FileLog(str(tmp_path / "log")),
                                           DirFiles(str(tmp_path))),
                          transport, fsm, peers=PEERS)
        assert svc.node.repairing and not svc.node.promotable()
        svc.storage.close()

    trio.run(main)
