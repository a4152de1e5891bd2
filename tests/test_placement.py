"""natsjs/jetstream/placement.py: which servers a replicated stream is placed on."""
from __future__ import annotations

import random

import pytest

from natsjs.jetstream.placement import Candidate, PlacementError, select_peers

GB = 1 << 30


def nodes(n=5, **kw):
    return [Candidate(id="p%d" % i, name="n%d" % i, cluster="C1", max_store=10 * GB,
                      max_memory=GB, **kw) for i in range(n)]


def test_picks_distinct_online_peers_with_most_room():
    cands = nodes(5)
    cands[0].store = 9 * GB
    peers = select_peers(3, "C1", {"storage": "file"}, cands, rng=random.Random(1))
    assert len(set(peers)) == 3 and "p0" not in peers


def test_offline_and_wrong_cluster_are_skipped_and_reported():
    cands = nodes(3)
    cands[1].online = False
    cands[2].cluster = "C2"
    with pytest.raises(PlacementError) as e:
        select_peers(3, "C1", {}, cands)
    assert str(e.value) == "no suitable peers for placement, peer offline"


def test_tags_required_and_excluded():
    cands = nodes(4)
    for i, c in enumerate(cands):
        c.tags = frozenset({"az:%d" % (i % 2), "ssd"} if i else {"az:0"})
    # p1..p3 have ssd; p1 and p3 are in az:1, which is excluded.
    peers = select_peers(1, "C1", {"placement": {"tags": ["ssd", "!az:1"]}}, cands)
    assert peers == ["p2"]
    with pytest.raises(PlacementError) as e:
        select_peers(2, "C1", {"placement": {"tags": ["ssd", "!az:1"]}}, cands)
    assert "tags excluded ['az:1']" in str(e.value)
    with pytest.raises(PlacementError) as e:
        select_peers(3, "C1", {"placement": {"tags": ["gpu"]}}, cands)
    assert "tags not matched ['gpu']" in str(e.value)


def test_unique_tag_spreads_replicas():
    cands = nodes(6)
    for i, c in enumerate(cands):
        c.tags = frozenset({"az:%d" % (i % 3)})
    for seed in range(20):
        peers = select_peers(3, "C1", {}, cands, unique_tag="az:", rng=random.Random(seed))
        zones = {next(iter(c.tags)) for c in cands if c.id in peers}
        assert len(zones) == 3
    with pytest.raises(PlacementError) as e:
        select_peers(4, "C1", {}, cands, unique_tag="az:")
    assert "server tag not unique" in str(e.value)


def test_max_bytes_needs_room_and_existing_peers_are_kept():
    cands = nodes(4)
    cands[3].max_store = GB
    peers = select_peers(3, "C1", {"max_bytes": 2 * GB}, cands, existing=["p0"],
                         rng=random.Random(3))
    assert peers[0] == "p0" and "p3" not in peers and len(peers) == 3
    with pytest.raises(PlacementError) as e:
        select_peers(3, "C1", {"max_bytes": 20 * GB}, cands)
    assert "insufficient storage" in str(e.value)


def test_replicated_streams_prefer_peers_with_fewer_ha_assets():
    cands = nodes(5)
    for i, c in enumerate(cands):
        c.ha_assets = i
    peers = select_peers(3, "C1", {}, cands, rng=random.Random(5))
    assert sorted(peers) == ["p0", "p1", "p2"]
