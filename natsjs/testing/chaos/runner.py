"""One chaos run, start to verdict.

1. ``ChaosCluster`` starts N servers (natsjs, or any binary that reads nats-server's
   configuration: the reference nats-server runs the same suite) and waits for a meta
   leader;
2. the workload (``workload.py``) creates the R3 (or R5) stream and the work queue and
   its clients start publishing; the nemesis (``nemesis.py``) injects and heals faults
   until the duration is over;
3. everything is healed (every node running, links open), the publishers stop, the
   worker drains the queue, and the runner waits (bounded) until every replica reports
   the same last sequence;
4. the servers are stopped cleanly and each replica is read from its files
   (``replicas.py``);
5. the checker (``checker.py``) judges history and replicas; the history, the fault
   timeline and the figures are written as a trace (``bench/trace.py``, CHAOS tables) when
   a results folder is given.

Sabotage modes prove the checker can fail: ``phantom-ack`` acknowledges attempts that
were never sent, ``drop-committed`` deletes an acknowledged message through the API
before the final read, ``drop-replica`` leaves one acknowledged message out of one
replica's read.  Each must make the run invalid.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from natsjs.testing.chaos import checker
from natsjs.testing.chaos.cluster import ChaosCluster
from natsjs.testing.chaos.nemesis import Nemesis, run_nemesis
from natsjs.testing.chaos.replicas import read_replica
from natsjs.testing.chaos.workload import (QSTREAM, STREAM, History, Workload, WorkloadConfig,
                                           connect)

SABOTAGE = ("", "phantom-ack", "drop-committed", "drop-replica")


@dataclass
class RunConfig:
    server_cmd: list[str]
    label: str = "natsjs"
    reference: bool = False          # the store is nats-server's format
    nodes: int = 3
    replicas: int = 3
    duration: float = 30.0
    clients: int = 5
    rate: float = 100.0
    ack_timeout: float = 2.0
    queue: bool = True
    seed: int = 1
    faults: list[str] = field(default_factory=lambda: ["kill"])
    hold: float = 4.0                # seconds a fault lasts
    calm: float = 3.0                # seconds between faults
    lossy: bool = False
    sabotage: str = ""
    workdir: str | None = None       # kept when given; a temporary folder otherwise
    converge_timeout: float = 60.0


@dataclass
class RunResult:
    config: dict
    figures: dict
    history: History
    timeline: list
    replica_sizes: dict
    notes: list[str]
    workdir: str


def _stream_states(c: ChaosCluster) -> dict[str, tuple]:
    """Each running node's own view of the stream: (last_seq, messages)."""
    out = {}
    for i in c.alive():
        jsz = c.http(i, "/jsz?accounts=true&streams=true") or {}
        for acc in jsz.get("account_details") or []:
            for sd in acc.get("stream_detail") or []:
                if sd.get("name") == STREAM:
                    st = sd.get("state") or {}
                    out[c.nodes[i].name] = (st.get("last_seq"), st.get("messages"))
    return out


async def _converge(c: ChaosCluster, admin, timeout: float) -> tuple[list[int], str]:
    """Until the stream's replicas (per the stream leader) all report the same state."""
    deadline = time.monotonic() + timeout
    note = ""
    while time.monotonic() < deadline:
        try:
            msg = await admin.request("$JS.API.STREAM.INFO." + STREAM, b"", timeout=2.0)
            info = json.loads(msg.data)
            cl = info.get("cluster") or {}
            names = ([cl["leader"]] if cl.get("leader") else []) + \
                [r["name"] for r in cl.get("replicas") or []]
            states = await asyncio.to_thread(_stream_states, c)
            mine = {n: states.get(n) for n in names}
            if cl.get("leader") and None not in mine.values() and len(set(mine.values())) == 1 \
                    and all(r.get("current") for r in cl.get("replicas") or []):
                return [c.index_of(n) for n in names], ""
            note = "replicas not converged: %s" % mine
        except Exception as e:  # noqa: BLE001
            note = "no stream info: %s" % type(e).__name__
        await asyncio.sleep(0.5)
    # Read whatever nodes have the stream, and let the checker show the divergence.
    states = await asyncio.to_thread(_stream_states, c)
    return [c.index_of(n) for n in states] or list(range(c.size)), note


async def _sabotage_drop(admin, hist: History) -> str:
    acked = [o for o in hist.ops if o.kind == "publish" and o.outcome == "ok" and o.seq > 0]
    if not acked:
        return "drop-committed: nothing acknowledged"
    victim = acked[len(acked) // 2]
    msg = await admin.request("$JS.API.STREAM.MSG.DELETE." + STREAM,
                              json.dumps({"seq": victim.seq, "no_erase": True}).encode(),
                              timeout=5.0)
    return "drop-committed: deleted %s at %d: %s" % (victim.value, victim.seq,
                                                     msg.data.decode(errors="replace")[:100])


async def _run_async(cfg: RunConfig, c: ChaosCluster, hist: History, notes: list[str]):
    rng = random.Random(cfg.seed)
    urls = [nd.url for nd in c.nodes]
    wl = Workload(urls, WorkloadConfig(clients=cfg.clients, rate=cfg.rate,
                                       ack_timeout=cfg.ack_timeout, queue=cfg.queue,
                                       replicas=cfg.replicas),
                  hist, sabotage=cfg.sabotage)
    await wl.create_streams()
    admin = await connect(urls, 0, "chaos-admin")
    nem = Nemesis(c, hist, admin, rng, cfg.replicas)
    stop = asyncio.Event()
    healed = asyncio.Event()
    work = asyncio.create_task(wl.run(stop, healed))
    try:
        stop_at = time.monotonic() + cfg.duration
        await run_nemesis(nem, cfg.faults, stop_at, cfg.hold, cfg.calm)
        await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
        await nem.heal_all()
        stop.set()
        healed.set()
        await work
        if cfg.sabotage == "drop-committed":
            notes.append(await _sabotage_drop(admin, hist))
        members, note = await _converge(c, admin, cfg.converge_timeout)
        if note:
            notes.append(note)
        # A server can log "ready" and die just after (a store it fails to load lazily).
        for nd in c.nodes:
            if not nd.alive() and nd.name not in nem.unrecovered:
                nem.unrecovered[nd.name] = "exited (%s) after restarting: %s" % (
                    nd.proc.returncode if nd.proc else "?", c.last_error(nd.index))
        for name, why in nem.unrecovered.items():
            notes.append("%s did not restart: %s" % (name, why))
        return members, nem.timeline, sorted(nem.unrecovered)
    finally:
        if not work.done():
            stop.set()
            healed.set()
            work.cancel()
        await admin.close()


def run(cfg: RunConfig) -> RunResult:
    own_dir = cfg.workdir is None
    workdir = cfg.workdir or tempfile.mkdtemp(prefix="natsjs-chaos-")
    hist = History()
    notes: list[str] = []
    c = ChaosCluster(cfg.server_cmd, workdir, nodes=cfg.nodes, seed=cfg.seed, lossy=cfg.lossy)
    try:
        c.start_all()
        c.wait_meta()
        members, timeline, unrecovered = asyncio.run(_run_async(cfg, c, hist, notes))
        for i in range(c.size):
            c.stop(i)
        replicas = {}
        for i in members:
            nd = c.nodes[i]
            try:
                replicas[nd.name] = read_replica(nd.data_dir, STREAM, cfg.reference)
            except Exception as e:  # noqa: BLE001 - an unreadable replica holds nothing
                notes.append("%s: replica unreadable: %s: %s" % (nd.name, type(e).__name__, e))
                replicas[nd.name] = {}
        queue = {}
        if cfg.queue:
            for nd in c.nodes:
                try:
                    queue[nd.name] = read_replica(nd.data_dir, QSTREAM, cfg.reference)
                except Exception:  # noqa: BLE001 - only used to excuse undelivered values
                    pass
        if cfg.sabotage == "drop-replica" and replicas:
            name = sorted(replicas)[-1]
            acked = sorted(o.seq for o in hist.ops if o.kind == "publish" and o.outcome == "ok")
            if acked:
                replicas[name].pop(acked[len(acked) // 2], None)
                notes.append("drop-replica: seq %d left out of %s" % (acked[len(acked) // 2], name))
        figures = checker.check(hist.ops, replicas, unrecovered=len(unrecovered),
                                queue_replicas=queue)
    finally:
        c.close()
    result = RunResult(config=asdict(cfg), figures=figures, history=hist, timeline=timeline,
                       replica_sizes={k: len(v) for k, v in replicas.items()}, notes=notes,
                       workdir=workdir)
    if own_dir and figures.get("valid"):
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        dump(result, os.path.join(workdir, "history.jsonl"))
    return result


def dump(r: RunResult, path: str) -> None:
    """The run as JSON lines, next to the servers' files it kept: figures, notes, the
    fault timeline, then one line per operation."""
    with open(path, "w") as f:
        f.write(json.dumps({"figures": r.figures, "notes": r.notes,
                            "config": r.config, "replica_sizes": r.replica_sizes}) + "\n")
        for x in r.timeline:
            f.write(json.dumps({"fault": asdict(x)}) + "\n")
        for o in r.history.ops:
            f.write(json.dumps(asdict(o)) + "\n")


def summary_line(r: RunResult) -> str:
    f = r.figures
    return ("%-12s %-16s %s  attempts %d ok %d unknown %d  lost %d dup %d divergent %d "
            "unexpected %d order %d  avail %.3f  gap %.2fs  q_lost %d q_dup %d  down %d"
            % (r.config["label"], ",".join(r.config["faults"]) or "none",
               "VALID  " if f["valid"] else "INVALID", f["attempts"], f["ok"], f["unknown"],
               f["lost"], f["duplicated"], f["divergent"], f["unexpected"], f["order"],
               f["availability"], f["longest_gap_s"], f["q_lost"],
               f["q_redelivered_after_ack"], f["unrecovered"]))


if __name__ == "__main__":  # a quick manual run: python -m natsjs.testing.chaos.runner CMD...
    res = run(RunConfig(server_cmd=sys.argv[1:] or [sys.executable, "-m", "natsjs"],
                        reference=bool(sys.argv[1:]) and "nats-server" in sys.argv[1],
                        duration=float(os.environ.get("CHAOS_DURATION", "15")),
                        faults=os.environ.get("CHAOS_FAULTS", "kill").split(",")))
    print(summary_line(res))
    print(json.dumps({k: v for k, v in res.figures.items()}, default=str))
    print(res.notes)
    for f in res.timeline:
        print(f)
