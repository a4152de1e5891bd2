"""The faults (nemeses) of a chaos run, and the timeline of what was done when.

Each fault class is a pair of steps, ``inject`` and ``heal``, run by the runner's nemesis
loop (``run_nemesis``): a healthy stretch, one fault held for a while, its heal, again,
until the run's duration is over; then ``heal_all`` puts everything back (every node
running, none paused, every link open, every file system mounted).

Classes (``FAULTS``):

``kill``            SIGKILL a random node; restart it at the heal
``kill-leader``     SIGKILL the stream's leader; restart it at the heal
``pause``           SIGSTOP a random node; SIGCONT at the heal
``pause-leader``    the same for the stream leader
``partition``       a random minority cut off from the majority (every link between)
``partition-leader``  the stream leader alone on one side
``bridge``          two halves that only one node (the bridge) still joins (5+ nodes)
``member``          the stream drops a follower (``$JS.API.STREAM.PEER.REMOVE``), the meta
                    group places a replacement; nodes > replicas
``corrupt``         a minority stops (SIGKILL); bits flipped in and tails cut off their
                    message block, index and snapshot files; restarted at the heal
``corrupt-state``   the same for their Raft term/vote/peer files (``corrupt.py``)
``power-loss``      one node loses power: SIGKILL, and its file system forgets every write
                    not fsynced (``lossyfs``); restarted at the heal
``power-loss-all``  every node at once
``skew``            a node's clock jumps (``clockskew``); restarted with the true clock
                    at the heal

The timeline records each step as a ``Fault`` (start, end, class, nodes, detail).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

from natsjs.testing.chaos.workload import STREAM

FAULTS = ("kill", "kill-leader", "pause", "pause-leader", "partition", "partition-leader",
          "bridge", "member", "corrupt", "corrupt-state", "power-loss", "power-loss-all", "skew")


@dataclass
class Fault:
    kind: str
    start_ns: int
    end_ns: int = -1
    nodes: str = ""          # comma separated node names
    detail: str = ""


class Nemesis:
    """Injects and heals faults on a ``ChaosCluster``; ``admin`` is a nats-py connection
    used to find the stream leader and to ask for membership changes."""

    def __init__(self, cluster, history, admin, rng: random.Random, replicas: int):
        self.c = cluster
        self.h = history
        self.admin = admin
        self.rng = rng
        self.replicas = replicas
        self.timeline: list[Fault] = []
        self.down: set[int] = set()       # killed by a fault, restarted at its heal
        self.paused: set[int] = set()
        self.skewed: set[int] = set()
        self.unrecovered: dict[str, str] = {}   # node -> why it did not restart

    # ---- helpers ------------------------------------------------------------------------

    async def leader(self) -> int | None:
        """The stream leader's node index, from the cluster's own answer (bounded)."""
        for _ in range(3):
            try:
                msg = await self.admin.request("$JS.API.STREAM.INFO." + STREAM, b"", timeout=1.0)
                name = (json.loads(msg.data).get("cluster") or {}).get("leader")
                if name:
                    return self.c.index_of(name)
            except Exception:  # noqa: BLE001 - no leader right now
                await asyncio.sleep(0.2)
        return None

    async def stream_peers(self) -> list[int]:
        try:
            msg = await self.admin.request("$JS.API.STREAM.INFO." + STREAM, b"", timeout=2.0)
            cl = json.loads(msg.data).get("cluster") or {}
        except Exception:  # noqa: BLE001
            return []
        names = ([cl["leader"]] if cl.get("leader") else []) + [r["name"] for r in cl.get("replicas") or []]
        return [self.c.index_of(n) for n in names]

    def _names(self, nodes) -> str:
        return ",".join(self.c.nodes[i].name for i in sorted(nodes))

    def minority(self) -> list[int]:
        k = self.rng.randint(1, (self.c.size - 1) // 2)
        return self.rng.sample(range(self.c.size), k)

    # ---- inject / heal ------------------------------------------------------------------

    async def inject(self, kind: str) -> Fault:
        f = Fault(kind, self.h.now())
        c = self.c
        if kind in ("kill", "kill-leader", "pause", "pause-leader"):
            target = await self.leader() if kind.endswith("leader") else None
            if target is None:
                target = self.rng.randrange(c.size)
                f.detail = "random" if not kind.endswith("leader") else "no leader known: random"
            if kind.startswith("kill"):
                await asyncio.to_thread(c.kill, target)
                self.down.add(target)
            else:
                c.pause(target)
                self.paused.add(target)
            f.nodes = self._names([target])
        elif kind in ("partition", "partition-leader", "bridge"):
            if kind == "partition":
                small = self.minority()
                groups = [small, [i for i in range(c.size) if i not in small]]
            elif kind == "partition-leader":
                ld = await self.leader()
                ld = self.rng.randrange(c.size) if ld is None else ld
                groups = [[ld], [i for i in range(c.size) if i != ld]]
            else:
                order = list(range(c.size))
                self.rng.shuffle(order)
                bridge, rest = order[0], order[1:]
                half = len(rest) // 2
                groups = [rest[:half], rest[half:]]
                f.detail = "bridge %s" % c.nodes[bridge].name
            c.net.partition(groups)
            f.nodes = " | ".join(self._names(g) for g in groups)
        elif kind == "member":
            peers = await self.stream_peers()
            ld = await self.leader()
            followers = [p for p in peers if p != ld]
            if not followers or c.size <= self.replicas:
                f.detail = "skipped: no follower to move or no spare node"
            else:
                victim = self.rng.choice(followers)
                f.nodes = self._names([victim])
                try:
                    msg = await self.admin.request("$JS.API.STREAM.PEER.REMOVE." + STREAM,
                                                   json.dumps({"peer": c.nodes[victim].name}).encode(),
                                                   timeout=5.0)
                    f.detail = msg.data.decode(errors="replace")[:200]
                except Exception as e:  # noqa: BLE001
                    f.detail = "peer remove: %s" % type(e).__name__
        elif kind in ("corrupt", "corrupt-state"):
            from natsjs.testing.chaos.corrupt import corrupt_store
            victims = self.minority()
            for i in victims:
                await asyncio.to_thread(c.kill, i)
                self.down.add(i)
            notes = []
            for i in victims:
                notes += await asyncio.to_thread(corrupt_store, c.nodes[i].data_dir, self.rng, 3,
                                                 "state" if kind == "corrupt-state" else "data")
            f.nodes = self._names(victims)
            f.detail = "; ".join(notes)[:1000]
        elif kind in ("power-loss", "power-loss-all"):
            victims = list(range(c.size)) if kind == "power-loss-all" else [self.rng.randrange(c.size)]
            notes = []
            for i in victims:
                await asyncio.to_thread(c.kill, i)
                self.down.add(i)
            for i in victims:
                if c.nodes[i].fs is None:
                    notes.append("%s: no lossy fs (run with --lossy)" % c.nodes[i].name)
                    continue
                lost = await asyncio.to_thread(c.nodes[i].fs.power_cut)
                notes.append("%s: %s" % (c.nodes[i].name, lost))
            f.nodes = self._names(victims)
            f.detail = "; ".join(notes)[:1000]
        elif kind == "skew":
            from natsjs.testing.chaos.clockskew import skew_env
            target = self.rng.randrange(c.size)
            offset = self.rng.choice([-1, 1]) * self.rng.uniform(30, 300)
            env = skew_env(offset)
            if env is None:
                f.detail = "skipped: no C compiler for the clock shim"
            else:
                await asyncio.to_thread(c.kill, target)
                c.nodes[target].extra_env = env
                await asyncio.to_thread(c.start, target)
                self.skewed.add(target)
                f.nodes = self._names([target])
                f.detail = "clock %+.0f s" % offset
                seen = await asyncio.to_thread(c.clock_offset, target)
                if seen is None or abs(seen - offset) > 5:
                    f.detail += " (not effective: the server's /varz now is off by %s s)" % (
                        "?" if seen is None else "%.0f" % seen)
        else:
            raise ValueError("unknown fault %r" % kind)
        self.timeline.append(f)
        return f

    async def heal(self, f: Fault) -> None:
        await self.heal_all()
        f.end_ns = self.h.now()

    async def heal_all(self) -> None:
        c = self.c
        c.net.heal()
        for i in sorted(self.paused):
            c.resume(i)
        self.paused.clear()
        for i in sorted(self.skewed):
            await asyncio.to_thread(c.kill, i)
            c.nodes[i].extra_env = {}
            self.down.add(i)
        self.skewed.clear()
        down = sorted(self.down | {i for i in range(c.size) if not c.nodes[i].alive()})
        for i in down:
            await asyncio.to_thread(c.start, i, False)
        for i in down:
            try:
                await asyncio.to_thread(c.wait_started, i)
            except (RuntimeError, TimeoutError) as e:
                # A node that cannot come back is a finding, not the end of the run.
                self.unrecovered[c.nodes[i].name] = str(e).splitlines()[0][:300]
        self.down.clear()


async def run_nemesis(nem: Nemesis, faults: list[str], stop_at: float, hold: float,
                      calm: float) -> None:
    """Until ``stop_at`` (monotonic): calm for ``calm`` s, one fault (in turn) held for
    ``hold`` s, heal.  Every wait is bounded by ``stop_at``."""
    k = 0
    while faults:
        calm_for = nem.rng.uniform(0.5, 1.5) * calm
        if time.monotonic() + calm_for + hold > stop_at:
            break
        await asyncio.sleep(calm_for)
        f = await nem.inject(faults[k % len(faults)])
        k += 1
        await asyncio.sleep(max(0.0, min(hold, stop_at - time.monotonic())))
        await nem.heal(f)

