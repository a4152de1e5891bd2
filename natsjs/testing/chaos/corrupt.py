"""Corruption of a stopped node's store: bit flips and truncation.

Jepsen's NATS analysis found that corrupting one node's files could lose acknowledged
data cluster-wide.  A correct server detects the damage (checksums), discards what it
cannot trust and catches up from its peers, so the stream's replicas end identical and
complete.  ``corrupt_store`` damages a node's JetStream files while it is down: the
stream's message files, its index and snapshot files, and the Raft files of its groups
(whatever the server named them: every regular file under ``<store>/jetstream`` is a
candidate except the small JSON metadata that says which streams exist, which both
servers keep in a file written atomically).  It returns what it did, for the timeline.
"""
from __future__ import annotations

import os
import random

# Metadata files (stream/consumer configurations) are written atomically and are not
# what the fault class is about; damaging them tests config parsing, not replication.
SKIP = {"meta.json", "meta.inf", "meta.sum"}


def candidates(store_dir: str) -> list[str]:
    out = []
    root = os.path.join(store_dir, "jetstream")
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            if f in SKIP or f.endswith(".tmp"):
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


def corrupt_store(store_dir: str, rng: random.Random, files: int = 3) -> list[str]:
    """Damage up to ``files`` of the node's files, each by bit flips or a cut tail."""
    pool = candidates(store_dir)
    notes = []
    for path in rng.sample(pool, min(files, len(pool))):
        rel = os.path.relpath(path, store_dir)
        if rng.random() < 0.5:
            notes.append(flip_bits(path, rng, rng.randint(1, 8)).replace(path, rel))
        else:
            notes.append(truncate(path, rng).replace(path, rel))
    return notes or ["no files to corrupt"]
