"""Where a replicated stream lives: choosing its peers (nats-server's placement rules).

The meta leader calls ``select_peers`` when a stream is created, scaled up, or loses a
peer that will not come back.  The rules are those of nats-server's selectPeerGroup
(server/jetstream_cluster.go), so a user's placement works the same on both servers:

* candidates are JetStream servers of the requested cluster that are online, are not
  excluded (``!tag`` in the placement, or the ``jetstream.exclude_placement`` tag),
  carry every requested tag, and have the stream's ``max_bytes`` of free storage;
* with ``unique_tag`` (for example ``az``), at most one replica per tag value;
* candidates are shuffled, then ordered by free storage (most first, then fewest
  streams), and for replicated streams by how many replicated assets they already
  hold, so load spreads;
* when too few remain, the error says why, in the reference's words.

Pure: peers and statistics in, a list of peer ids (or PlacementError) out.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

EXCLUDE_PLACEMENT = "jetstream.exclude_placement"


@dataclass
class Candidate:
    id: str
    name: str = ""
    cluster: str = ""
    tags: frozenset = frozenset()
    online: bool = True
    max_memory: int = 0
    max_store: int = 0
    memory: int = 0
    store: int = 0
    reserved_memory: int = 0
    reserved_store: int = 0
    ha_assets: int = 0          # replicated assets already placed there
    streams: int = 0            # streams already placed there


@dataclass
class PlacementError(Exception):
    offline: bool = False
    exclude_tag: bool = False
    no_storage: bool = False
    unique_tag: bool = False
    misc: bool = False
    no_js_cluster: bool = False
    missing_tags: list = field(default_factory=list)
    excluded_tags: list = field(default_factory=list)

    def __str__(self) -> str:
        """server/jetstream_cluster.go selectPeerError.Error."""
        parts = ["no suitable peers for placement"]
        for flag, text in ((self.offline, "peer offline"), (self.exclude_tag, "exclude tag set"),
                           (self.no_storage, "insufficient storage"),
                           (self.unique_tag, "server tag not unique"),
                           (self.misc, "miscellaneous issue"),
                           (self.no_js_cluster, "jetstream not enabled in cluster")):
            if flag:
                parts.append(text)
        out = ", ".join(parts)
        if self.missing_tags:
            out += ", tags not matched [%s]" % ", ".join("'%s'" % t for t in self.missing_tags)
        if self.excluded_tags:
            out += ", tags excluded [%s]" % ", ".join("'%s'" % t for t in self.excluded_tags)
        return out


def _available(c: Candidate, storage: str) -> int:
    if storage == "memory":
        used = max(c.reserved_memory, c.memory)
        return max(c.max_memory - used, 0)
    used = max(c.reserved_store, c.store)
    return max(c.max_store - used, 0)


def select_peers(replicas: int, cluster: str, cfg: dict, candidates: list[Candidate],
                 existing: list[str] = (), ignore: list[str] = (), unique_tag: str = "",
                 max_ha_assets: int = 0, rng: random.Random | None = None) -> list[str]:
    """The ids of ``replicas`` peers for a stream with configuration ``cfg``."""
    existing = list(existing)
    if len(existing) >= replicas:
        return existing[:replicas]
    placement = cfg.get("placement") or {}
    tags = [(t[1:], True) if t.startswith("!") else (t, False)
            for t in placement.get("tags") or []]
    if unique_tag and any(t.startswith(unique_tag) for t, _ in tags):
        unique_tag = ""           # the placement already pins the unique tag
    owners: dict[str, str] = {}

    def unique_ok(c: Candidate) -> bool:
        for t in c.tags:
            if t.startswith(unique_tag):
                if t in owners:
                    return False
                owners[t] = c.id
                return True
        return False

    by_id = {c.id: c for c in candidates}
    if unique_tag:
        for pid in existing:
            if pid in by_id:
                unique_ok(by_id[pid])
    max_bytes = max(cfg.get("max_bytes") or 0, 0)
    storage = cfg.get("storage") or "file"
    err = PlacementError()
    pool = list(candidates)
    (rng or random).shuffle(pool)
    chosen = []
    online = 0
    skip = set(existing) | set(ignore)
    for c in pool:
        if c.cluster != cluster:
            continue
        if not c.online:
            err.offline = True
            continue
        if c.id in skip:
            continue
        if EXCLUDE_PLACEMENT in c.tags:
            err.exclude_tag = True
            continue
        bad = False
        for tag, exclude in tags:
            present = tag in c.tags
            if exclude and present:
                if tag not in err.excluded_tags:
                    err.excluded_tags.append(tag)
                bad = True
                break
            if not exclude and not present:
                if tag not in err.missing_tags:
                    err.missing_tags.append(tag)
                bad = True
                break
        if bad:
            continue
        avail = _available(c, storage)
        if max_bytes and max_bytes > avail:
            err.no_storage = True
            continue
        if max_ha_assets and c.ha_assets > max_ha_assets:
            err.misc = True
            continue
        if unique_tag and not unique_ok(c):
            err.unique_tag = True
            continue
        chosen.append((c, avail))
        online += 1
    need = replicas - len(existing)
    if len(chosen) < need or online + len(existing) < replicas // 2 + 1:
        if not candidates:
            err.no_js_cluster = True
        raise err
    chosen.sort(key=lambda ca: (-ca[1], ca[0].streams))
    if replicas > 1:
        chosen.sort(key=lambda ca: ca[0].ha_assets)     # stable: keeps the storage order
    return existing + [c.id for c, _ in chosen[:need]]
