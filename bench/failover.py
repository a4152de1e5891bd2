"""Failover: how long a replicated stream takes no writes when its leader dies.

Three JetStream servers of each kind (the ``cluster3-js`` topology of bench/scenarios.toml),
an R3 file stream, and a client on a server that does not lead it publishing at a steady
pace: a new publish every ``--interval`` seconds, each waiting up to ``--ack-timeout`` for
its PubAck, many in flight at once, so a lost publish does not hold up the next one.
After ``--warmup`` seconds the stream leader is killed (SIGKILL).  The failover time is from
the kill to the first PubAck for a publish sent after it: the figure a user sees as "no
writes accepted".  The warm-up also checks the leader did not change under load (no
spurious elections).  Before the writes, the stream's and a durable consumer's leaders
are asked to step down a few times: the time from the request to info naming a new
leader is the step-down figure.

    python -m bench.failover [--nats-server PATH] [--repeat 3]

Prints one line per run and a table of medians (natsjs / nats-server ratio).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats
import nats.js.errors

from .scenarios import load
from .servers import NATSJS, REFERENCE, running, server_kinds

STREAM = "FAILOVER"


async def _leader(js) -> str | None:
    with contextlib.suppress(Exception):
        si = await js.stream_info(STREAM)
        return si.cluster.leader if si.cluster else None
    return None


async def _until(pred, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = await pred()
        if v:
            return v
        await asyncio.sleep(0.05)
    raise TimeoutError("condition not met in %gs" % timeout)


async def _step_downs(nc, js, n: int = 3) -> dict:
    """Median seconds from a leader step-down request to info naming another leader."""
    await js.pull_subscribe("failover", "stepdown", stream=STREAM)
    out = {}
    for kind, subject in (("stream", "$JS.API.STREAM.LEADER.STEPDOWN." + STREAM),
                          ("consumer", "$JS.API.CONSUMER.LEADER.STEPDOWN.%s.stepdown" % STREAM)):
        async def leader():
            with contextlib.suppress(Exception):
                info = await (js.stream_info(STREAM) if kind == "stream" else
                              js.consumer_info(STREAM, "stepdown"))
                return info.cluster.leader
            return None
        times = []
        for _ in range(n):
            old = await _until(leader, 20)
            t0 = time.monotonic()
            await nc.request(subject, b"", timeout=5)
            while (await leader()) in (old, None):
                if time.monotonic() - t0 > 30:
                    raise TimeoutError("no new %s leader" % kind)
            times.append(time.monotonic() - t0)
        out[kind + "_stepdown_s"] = statistics.median(times)
    await js.delete_consumer(STREAM, "stepdown")
    return out


async def one_run(srv, args) -> dict:
    """Measure one failover on a running cluster; the dict holds the figures."""
    names = {"bench-%d" % i: i for i in range(len(srv.urls))}
    nc = await nats.connect(srv.urls[0])
    js = nc.jetstream(timeout=5)
    async def created():
        # Right after start either server may still answer 503 "temporarily unavailable".
        with contextlib.suppress(nats.js.errors.ServiceUnavailableError):
            return await js.add_stream(name=STREAM, subjects=["failover"], num_replicas=3)
        return None
    await _until(created, 30)
    stepdowns = await _step_downs(nc, js)
    leader = await _until(lambda: _leader(js), 20)
    await nc.close()
    # The client sits on a server that keeps running.
    other = next(i for n, i in names.items() if n != leader)
    nc = await nats.connect(srv.urls[other], max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=args.ack_timeout)
    acks: list[tuple[float, float]] = []       # (sent, acked) monotonic
    errors = 0
    stop = asyncio.Event()

    async def publish_one(i: int) -> None:
        nonlocal errors
        sent = time.monotonic()
        try:
            await js.publish("failover", b"%d" % i)
            acks.append((sent, time.monotonic()))
        except Exception:   # noqa: BLE001 - timeouts and "no responders" are the point
            errors += 1

    async def publisher() -> None:
        tasks = set()
        i = 0
        while not stop.is_set():
            t = asyncio.create_task(publish_one(i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(args.interval)
        if tasks:
            await asyncio.wait(tasks)

    pub = asyncio.create_task(publisher())
    await asyncio.sleep(args.warmup)
    before = await _leader(js)
    spurious = before != leader
    killed_at = time.monotonic()
    srv.procs[names[before]].send_signal(signal.SIGKILL)

    async def recovered():
        return next((a for s, a in acks if s >= killed_at), None)
    first = await _until(recovered, 60)
    await asyncio.sleep(0.5)
    stop.set()
    await pub
    new_leader = await _until(lambda: _leader(js), 20)
    await nc.close()
    return {"failover_s": first - killed_at, "old_leader": before, "new_leader": new_leader,
            "acked": len(acks), "failed": errors, "spurious_election": spurious, **stepdowns}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nats-server", default=None, help="reference server binary")
    ap.add_argument("--natsjs-cmd", default=None, help="command starting natsjs")
    ap.add_argument("--servers", default=f"{REFERENCE},{NATSJS}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of writes before the kill")
    ap.add_argument("--interval", type=float, default=0.005, help="seconds between publishes")
    ap.add_argument("--ack-timeout", type=float, default=2.0, help="PubAck wait per publish")
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args(argv)
    topology = load().topologies["cluster3-js"]
    kinds = server_kinds(args.servers, args.nats_server, args.natsjs_cmd)
    runs: dict[str, list[dict]] = {k.label: [] for k in kinds}
    for rep in range(args.repeat):
        for kind in (kinds if rep % 2 == 0 else kinds[::-1]):
            with tempfile.TemporaryDirectory(prefix="natsjs-failover-") as tmp:
                with running(kind, topology, Path(tmp), Path(tmp) / "log") as srv:
                    r = asyncio.run(one_run(srv, args))
            runs[kind.label].append(r)
            print("  %-12s r%d failover %.3f s  (%s -> %s, %d acked, %d failed%s)"
                  % (kind.label, rep, r["failover_s"], r["old_leader"], r["new_leader"],
                     r["acked"], r["failed"],
                     ", SPURIOUS ELECTION" if r["spurious_election"] else ""), file=sys.stderr)
    rows = [("failover R3, leader killed", "failover_s"),
            ("stream leader step-down to new leader", "stream_stepdown_s"),
            ("consumer leader step-down to new leader", "consumer_stepdown_s")]
    labels = [k for k, v in runs.items() if v]
    print("| median of %d | " % args.repeat + " | ".join(labels) +
          (" | ratio (natsjs/nats-server) |" if len(labels) == 2 else " |"))
    print("|---" * (len(labels) + 1 + (len(labels) == 2)) + "|")
    for title, key in rows:
        med = {k: statistics.median(r[key] for r in runs[k]) for k in labels}
        cells = ["%.3f s" % v for v in med.values()]
        if len(labels) == 2:
            cells.append("%.2f" % (med[NATSJS] / med[REFERENCE]))
        print("| %s | " % title + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 1 if any(r["spurious_election"] for v in runs.values() for r in v) else 0


if __name__ == "__main__":
    sys.exit(main())
