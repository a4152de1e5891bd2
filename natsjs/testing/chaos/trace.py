"""Chaos runs in the benchmark trace format (bench/trace.py, bench/SCHEMA.md).

A ``make chaos`` invocation is one run folder ``results/<UTC start>-<sha>-chaos/``:
META rows (kind ``chaos``, one per server), a RESULTS row and latency samples per (fault
class, server) so the Spark job's throughput and latency views show acknowledgements over
time, plus the chaos tables: CHAOS (the checker's figures), CHAOS_OPS (the history) and
CHAOS_FAULTS (the timeline).  ``bench`` lives beside ``natsjs`` in the repository, so this
module needs the repository root on ``sys.path`` (``make chaos`` runs from there).
"""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np


def _bench_trace():
    try:
        from bench import trace
    except ImportError as e:  # pragma: no cover - only outside the repository
        raise SystemExit("--results needs the repository's bench/ package on sys.path "
                         "(run from the repository root): %s" % e) from e
    return trace


class ChaosTrace:
    def __init__(self, results: str, params: dict):
        t = self.t = _bench_trace()
        self.started = dt.datetime.now(dt.timezone.utc)
        self.sha, self.dirty = t.git_info(Path(__file__).resolve().parents[3])
        self.run_id = t.new_run_id(self.sha, self.started) + "-chaos"
        self.run_dir = Path(results) / self.run_id
        self.w = t.RunWriter(self.run_dir, self.run_id)
        self.params = params
        self.servers: dict[str, str] = {}
        self.scenarios: list[str] = []
        self.slot = 0

    def add(self, r) -> None:
        """One finished ``runner.RunResult``."""
        cfg, f, h = r.config, r.figures, r.history
        scenario = "+".join(cfg["faults"]) or "none"
        server = cfg["label"]
        if scenario not in self.scenarios:
            self.scenarios.append(scenario)
        self.servers.setdefault(server, " ".join(cfg["server_cmd"]))
        base = h.start_unix_ns
        pubs = [o for o in h.ops if o.kind == "publish"]
        acked = [o for o in pubs if o.outcome == "ok" and o.end_ns >= 0]
        lat = np.array([o.end_ns - o.start_ns for o in acked], dtype=np.int64)
        self.w.add_latency(np.array([o.seq for o in acked], dtype=np.int64),
                           np.array([base + o.start_ns for o in acked], dtype=np.int64), lat,
                           scenario, server, 0)
        self.w.add_result({
            "scenario": scenario, "title": "chaos: " + scenario, "mode": "chaos",
            "topology": "chaos%d-r%d" % (cfg["nodes"], cfg["replicas"]), "nodes": cfg["nodes"],
            "server": server, "repeat": 0, "slot": self.slot,
            "started_at": dt.datetime.fromtimestamp(base / 1e9, dt.timezone.utc),
            "msgs": f["attempts"], "size": 0, "pubs": cfg["clients"], "subs": 1 if cfg["queue"] else 0,
            "seconds": cfg["duration"], "msgs_per_sec": f["ok"] / cfg["duration"],
            "mb_per_sec": 0.0,
            "p50_us": float(np.percentile(lat, 50) / 1e3) if len(lat) else None,
            "p99_us": float(np.percentile(lat, 99) / 1e3) if len(lat) else None,
            "received": f["ok"], "samples": len(lat),
            "error": None if f["valid"] else "invalid: " + ", ".join(
                "%s %d" % (k, f[k]) for k in ("lost", "duplicated", "divergent", "unexpected",
                                              "misplaced", "order", "q_lost", "unrecovered") if f[k]),
            "natsbench_args": json.dumps({"faults": cfg["faults"], "seed": cfg["seed"]}),
            "server_args": json.dumps(cfg["server_cmd"])})
        self.slot += 1
        row = {k: f[k] for k in ("valid", "attempts", "ok", "failed", "unknown", "lost",
                                 "lost_all", "duplicated", "divergent", "unexpected", "misplaced",
                                 "order", "availability", "longest_gap_s", "q_attempts", "q_ok",
                                 "q_lost", "q_undelivered", "q_redelivered_after_ack", "q_unexpected",
                                 "unrecovered")}
        row.update(scenario=scenario, server=server, nodes=cfg["nodes"], replicas=cfg["replicas"],
                   seed=cfg["seed"], sabotage=cfg["sabotage"], notes="; ".join(r.notes))
        ops = {"scenario": [scenario] * len(h.ops), "server": [server] * len(h.ops),
               "process": [o.process for o in h.ops], "kind": [o.kind for o in h.ops],
               "value": [o.value for o in h.ops],
               "start_unix_ns": [base + o.start_ns for o in h.ops],
               "end_unix_ns": [base + o.end_ns if o.end_ns >= 0 else None for o in h.ops],
               "outcome": [o.outcome for o in h.ops], "seq": [o.seq for o in h.ops],
               "node": [o.node for o in h.ops], "error": [o.error for o in h.ops],
               "redelivered": [o.redelivered for o in h.ops]}
        faults = [{"scenario": scenario, "server": server, "kind": x.kind,
                   "start_unix_ns": base + x.start_ns,
                   "end_unix_ns": base + x.end_ns if x.end_ns >= 0 else None,
                   "nodes": x.nodes, "detail": x.detail} for x in r.timeline]
        self.w.add_chaos(row, ops, faults)
        self._meta()
        self.w.flush()

    def _meta(self) -> None:
        self.w.meta = []
        machine = self.t.machine_info()
        for server, cmd in self.servers.items():
            self.w.add_meta({
                "kind": "chaos", "started_at": self.started, "git_sha": self.sha,
                "git_dirty": self.dirty, "server": server, "server_version": "",
                "server_cmd": cmd, "natsbench": "", **machine, "repeat": 1, "quick": False,
                "scenarios": ",".join(self.scenarios),
                "params": json.dumps(self.params, default=str), "argv": " ".join(sys.argv)})
