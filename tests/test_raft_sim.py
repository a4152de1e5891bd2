"""Raft under random faults: many seeds of natsjs/testing/raftsim.py, and proof that its
checker catches broken nodes.

Every seed runs 6 simulated seconds of proposals under partitions (majority/minority,
isolated leader, bridge), loss, duplication, reordering, crashes that lose unsynced
writes (one node, or all at once), leader transfers, snapshots and membership changes,
then heals and demands progress; some seeds restore received snapshots slowly, as
stream replicas do (they fetch the messages a snapshot only counts).  More seeds for a soak run:

    NATSJS_RAFT_SEEDS=5000 pytest tests/test_raft_sim.py      # per node count
    python -m natsjs.testing.raftsim --seeds 5000 --nodes 5
"""
from __future__ import annotations

import os

import pytest

from natsjs.testing.raftsim import (AckBeforePersist, CountedWhileRestoring, MinorityCommit,
                                    Sim, Violation, VoteBeforeRepair)

SEEDS = int(os.environ.get("NATSJS_RAFT_SEEDS", "0"))
CHUNK = 25


def _chunks(default):
    total = SEEDS or default
    return [(first, min(CHUNK, total - first)) for first in range(0, total, CHUNK)]


@pytest.mark.parametrize("first,count", _chunks(200))
def test_three_nodes_random_faults(first, count):
    acked = 0
    for seed in range(first, first + count):
        acked += Sim(seed, nodes=3).run()["acked"]
    assert acked > 50 * count      # the workload really ran


@pytest.mark.parametrize("first,count", _chunks(50))
def test_five_nodes_random_faults(first, count):
    for seed in range(10000 + first, 10000 + first + count):
        Sim(seed, nodes=5).run()


@pytest.mark.parametrize("first,count", _chunks(100))
def test_snapshots_restored_slowly(first, count):
    # Stream replicas restore a snapshot by fetching the messages it describes: the
    # member is not counted meanwhile (RaftNode.set_restoring).
    for seed in range(20000 + first, 20000 + first + count):
        Sim(seed, nodes=3 + seed % 2 * 2, slow_restore=(0.05, 0.6)).run()


def _detected(node_cls, seeds, **kw):
    caught = []
    for seed in seeds:
        try:
            Sim(seed, node_cls=node_cls, fsync=(0.002, 0.03), **kw).run()
        except Violation as exc:
            caught.append(str(exc).splitlines()[0])
    return caught


def test_checker_catches_acks_sent_before_fsync():
    caught = _detected(AckBeforePersist, range(30))
    assert caught, "a follower acknowledging unsynced entries went unnoticed"


def test_checker_catches_a_minority_commit():
    caught = _detected(MinorityCommit, range(30))
    assert caught, "a leader committing on its own went unnoticed"


def test_checker_catches_a_member_counted_while_restoring():
    caught = _detected(CountedWhileRestoring, range(60), slow_restore=(0.05, 0.6))
    assert caught, "a member counted before it restored its snapshot went unnoticed"


def test_a_seed_replays_exactly():
    a = Sim(42, nodes=3).run()
    b = Sim(42, nodes=3).run()
    assert a == b


def test_liveness_failure_is_reported():
    # the checker's liveness arm: a group that can never elect (no voter can reach a
    # quorum) must be reported, not pass silently
    sim = Sim(3, nodes=3, faults=False, liveness=2.0)
    sim.start()
    sim.net.isolate([{"n0"}, {"n1"}, {"n2"}, {"n3"}])
    sim.net.heal = lambda: None          # healing is sabotaged
    with pytest.raises(Violation, match="no progress"):
        sim.drive()


def test_no_election_without_faults_under_load():
    # heartbeats are folded into replication: a busy, healthy group keeps its leader
    for nodes in (3, 5):
        sim = Sim(7, nodes=nodes, faults=False)
        sim.start()
        assert sim.run_for(2.0, until=lambda: sim.leader_host() is not None)
        lead, term = sim.leader_host().id, sim.leader_host().node.term
        for _ in range(5000):          # a proposal every millisecond for 5 s
            sim.propose()
            sim.run_for(0.001)
        assert sim.leader_host().id == lead
        assert {h.node.term for h in sim.hosts.values() if h.up} == {term}
        assert len(sim.checker.acked) > 4500


# ---- damaged storage: repair before voting ----------------------------------------------

CORRUPT_SEEDS = range(100)


def test_nodes_with_damaged_files_repair_before_they_vote():
    # Crashes that damage a node's log, snapshot or term/vote (one node at a time): no
    # acknowledged entry is lost and no term has two leaders.  A node that voted at
    # once with what it had left does lose entries on some of these seeds (next test).
    damaged = 0
    for seed in CORRUPT_SEEDS:
        sim = Sim(seed, nodes=3, corrupt_rate=3)
        sim.run()
        damaged += sum(" found damage: " in t for t in sim.trail)
    assert damaged > 50


def test_checker_catches_a_node_voting_before_it_repairs():
    caught = _detected_with(VoteBeforeRepair, CORRUPT_SEEDS, corrupt_rate=3)
    assert caught, "a damaged node voting with what it had left went unnoticed"


def _detected_with(node_cls, seeds, **kw):
    caught = []
    for seed in seeds:
        try:
            Sim(seed, node_cls=node_cls, **kw).run()
        except Violation as exc:
            caught.append(str(exc).splitlines()[0])
    return caught
