"""The fault section of the Spark report: chaos runs (natsjs/testing/chaos, ``make chaos``).

Reads the CHAOS, CHAOS_OPS and CHAOS_FAULTS tables of the trace folders (bench/trace.py)
and computes, per run, fault class (scenario) and server:

- the checker's figures: lost / duplicated / divergent and the other error counts,
  availability (acknowledged / attempts) and the longest window without an
  acknowledgement;
- availability over time: publish attempts per 1 s bin (by start time, from the first
  attempt of the run) and the share acknowledged, drawn with the fault windows shaded;
- PubAck latency percentiles per phase: each acknowledged publish belongs to the fault
  during which it started (``fault:<class>``), or to ``calm``; exact percentiles (Spark's
  ``percentile``), like the rest of the report.

Spark does the aggregation; pandas and matplotlib only draw the small results.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import trace

BIN_S = 1.0
PHASE_PCTS = (0.5, 0.9, 0.99)


@dataclass
class FaultAnalysis:
    figures: pd.DataFrame        # one row per (run, scenario, server): CHAOS columns
    availability: pd.DataFrame   # run_id, scenario, server, t_s, attempts, ok, availability
    phases: pd.DataFrame         # run_id, scenario, server, phase, acked, p50/p90/p99 ms
    faults: pd.DataFrame         # run_id, scenario, server, kind, start_s, end_s, nodes, detail

    @property
    def empty(self) -> bool:
        return self.figures.empty


def analyze_faults(spark, run_dirs: list[Path]) -> FaultAnalysis:
    from pyspark.sql import functions as F

    from .analyze import _read, _to_pandas

    def files(name: str) -> list[str]:
        return [str(d / f"{name}.parquet") for d in run_dirs if (d / f"{name}.parquet").exists()]

    chaos = _read(spark, files("chaos"), trace.CHAOS)
    ops = _read(spark, files("ops"), trace.CHAOS_OPS)
    faults = _read(spark, files("faults"), trace.CHAOS_FAULTS)
    keys = ["run_id", "scenario", "server"]

    pubs = ops.where(F.col("kind") == "publish")
    t0 = pubs.groupBy(*keys).agg(F.min("start_unix_ns").alias("t0"))
    pubs = pubs.join(t0, keys).withColumn("t_s", (F.col("start_unix_ns") - F.col("t0")) / 1e9)

    avail = (pubs.withColumn("bin", F.floor(F.col("t_s") / BIN_S))
             .groupBy(*keys, "bin")
             .agg(F.count("*").alias("attempts"),
                  F.sum(F.when(F.col("outcome") == "ok", 1).otherwise(0)).alias("ok"))
             .withColumn("t_s", F.col("bin") * BIN_S)
             .withColumn("availability", F.col("ok") / F.col("attempts"))
             .drop("bin"))

    fw = (faults.join(t0, keys)
          .select(*keys, "kind", "nodes", "detail",
                  ((F.col("start_unix_ns") - F.col("t0")) / 1e9).alias("start_s"),
                  ((F.col("end_unix_ns") - F.col("t0")) / 1e9).alias("end_s")))
    acked = (pubs.where((F.col("outcome") == "ok") & F.col("end_unix_ns").isNotNull())
             .withColumn("latency_ms", (F.col("end_unix_ns") - F.col("start_unix_ns")) / 1e6))
    # Which fault window (if any) an acknowledged publish started in.
    a, w = acked.alias("a"), F.broadcast(fw).alias("w")
    tagged = (a.join(w, [F.col("a.run_id") == F.col("w.run_id"),
                         F.col("a.scenario") == F.col("w.scenario"),
                         F.col("a.server") == F.col("w.server"),
                         F.col("a.t_s") >= F.col("w.start_s"),
                         F.col("a.t_s") < F.col("w.end_s")], "left")
              .select(*[F.col("a." + k).alias(k) for k in keys], "a.latency_ms", "a.value",
                      F.when(F.col("w.kind").isNull(), F.lit("calm"))
                      .otherwise(F.concat(F.lit("fault:"), F.col("w.kind"))).alias("phase"))
              .dropDuplicates(keys + ["value"]))
    pct = "percentile(latency_ms, array(%s))" % ", ".join(str(p) for p in PHASE_PCTS)
    phases = (tagged.groupBy(*keys, "phase")
              .agg(F.count("*").alias("acked"), F.expr(pct).alias("p"))
              .select(*keys, "phase", "acked",
                      *[F.col("p")[i].alias("p%s_ms" % str(int(q * 100)))
                        for i, q in enumerate(PHASE_PCTS)]))
    return FaultAnalysis(
        figures=_to_pandas(chaos.orderBy("scenario", "server", "run_id")),
        availability=_to_pandas(avail.orderBy(*keys, "t_s")),
        phases=_to_pandas(phases.orderBy(*keys, "phase")),
        faults=_to_pandas(fw.orderBy(*keys, "start_s")),
    )


def report_tables(fa: FaultAnalysis) -> dict[str, pd.DataFrame]:
    from .analyze import _fmt
    if fa.empty:
        return {}
    f = fa.figures
    figures = pd.DataFrame({
        "faults": f.scenario, "server": f.server, "run": f.run_id,
        "valid": f.valid.map(lambda v: "yes" if v else "NO"),
        # item access: ``duplicated`` is also a DataFrame method
        "lost": f["lost"], "lost everywhere": f["lost_all"], "duplicated": f["duplicated"],
        "divergent": f["divergent"],
        "other errors": f.unexpected + f.misplaced + f.order + f.q_unexpected
        + f.q_redelivered_after_ack,
        "queue lost": f.q_lost, "nodes not back": f.unrecovered,
        "availability": f.availability.map(lambda v: _fmt(v, ".3f")),
        "longest gap s": f.longest_gap_s.map(lambda v: _fmt(v, ".2f")),
        "attempts": f.attempts, "unknown": f.unknown, "sabotage": f.sabotage})
    p = fa.phases
    phases = pd.DataFrame({"faults": p.scenario, "server": p.server, "run": p.run_id,
                           "phase": p.phase, "acked": p.acked,
                           **{c: p[c].map(lambda v: _fmt(v, ",.1f"))
                              for c in p.columns if c.endswith("_ms")}}) if not p.empty else p
    return {"Faults: what the checker found per run (make chaos)": figures,
            "Faults: PubAck latency per phase (ms; the fault a publish started in, or calm)": phases}


def plot(fa: FaultAnalysis, out: Path, colors: dict[str, str]) -> list[Path]:
    """Availability over time per fault class (latest run of each), faults shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if fa.empty:
        return []
    written = []
    latest = fa.figures.sort_values("run_id").groupby("scenario")["run_id"].last().to_dict()
    for scenario, run in latest.items():
        av = fa.availability[(fa.availability.run_id == run) & (fa.availability.scenario == scenario)]
        fw = fa.faults[(fa.faults.run_id == run) & (fa.faults.scenario == scenario)]
        servers = sorted(av.server.unique())
        if not servers:
            continue
        fig, axes = plt.subplots(len(servers), 1, figsize=(9, 2.2 * len(servers)), sharex=True,
                                 squeeze=False)
        for ax, srv in zip(axes[:, 0], servers):
            s = av[av.server == srv]
            ax.step(s.t_s, s.availability, where="post", color=colors.get(srv, "#555"))
            for _, w in fw[fw.server == srv].iterrows():
                ax.axvspan(w.start_s, w.end_s if pd.notna(w.end_s) else s.t_s.max(),
                           color="#d62728", alpha=0.15)
            ax.set_ylim(-0.05, 1.05)
            ax.set_ylabel("%s\nacked share" % srv)
        axes[-1, 0].set_xlabel("seconds (shaded: %s)" % scenario)
        fig.suptitle("Availability under faults: %s" % scenario)
        fig.tight_layout()
        path = out / ("faults-%s.png" % scenario.replace("+", "_"))
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
