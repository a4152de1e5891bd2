"""Corruption of a stopped node's store: bit flips and truncation.

Jepsen's NATS analysis found that corrupting one node's files could lose acknowledged
data cluster-wide.  A correct server detects the damage (checksums), discards what it
cannot trust and catches up from its peers, so the stream's replicas end identical and
complete.  ``corrupt_store`` damages a node's JetStream files while it is down, and
returns what it did, for the timeline.  Two sets of files, two fault classes:

* ``data``: the message block, index and snapshot files of streams, consumers and Raft
  logs (every regular file under ``<store>/jetstream`` except the two kinds below);
* ``state``: the small files where Raft keeps its term, vote and peers (natsjs
  ``state.json``; nats-server ``tav.idx`` and ``peers.idx``).  A lost vote cannot be
  recovered from peers without risking two votes in one term, so this class measures
  what a server does about it (refuse to start, rejoin, or carry on).

The stream and consumer configurations (``meta.json``; nats-server ``meta.inf`` and
``meta.sum``) are never touched: both servers write them atomically, and damaging them
tests configuration parsing, not replication.
"""
from __future__ import annotations

import os
import random

# Metadata files (stream/consumer configurations) are written atomically and are not
# what the fault class is about; damaging them tests config parsing, not replication.
SKIP = {"meta.json", "meta.inf", "meta.sum"}
RAFT_STATE = {"state.json", "tav.idx", "peers.idx"}


def candidates(store_dir: str, kind: str = "data") -> list[str]:
    out = []
    root = os.path.join(store_dir, "jetstream")
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            if f in SKIP or f.endswith(".tmp") or (f in RAFT_STATE) != (kind == "state"):
                continue
            try:
                if os.path.getsize(path) > 0:
                    out.append(path)
            except OSError:
                continue
    return sorted(out)


def flip_bits(path: str, rng: random.Random, count: int) -> str:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for _ in range(count):
            off = rng.randrange(size)
            f.seek(off)
            b = f.read(1)[0]
            f.seek(off)
            f.write(bytes([b ^ (1 << rng.randrange(8))]))
    return "flipped %d bits in %s" % (count, path)


def truncate(path: str, rng: random.Random) -> str:
    size = os.path.getsize(path)
    keep = rng.randrange(size)
    os.truncate(path, keep)
    return "truncated %s %d -> %d" % (path, size, keep)


def corrupt_store(store_dir: str, rng: random.Random, files: int = 3,
                  kind: str = "data") -> list[str]:
    """Damage up to ``files`` of the node's ``kind`` files, each by bit flips or a cut tail."""
    pool = candidates(store_dir, kind)
    notes = []
    for path in rng.sample(pool, min(files, len(pool))):
        rel = os.path.relpath(path, store_dir)
        if rng.random() < 0.5:
            notes.append(flip_bits(path, rng, rng.randint(1, 8)).replace(path, rel))
        else:
            notes.append(truncate(path, rng).replace(path, rel))
    return notes or ["no files to corrupt"]
