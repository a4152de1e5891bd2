"""Spark analysis of benchmark traces: many runs in, one report out.

``python -m bench.analyze RESULTS_DIR... [--master local[*]] [--out DIR]`` (``make analyze``)
reads every trace folder at or below the given paths (format: ``bench.trace``,
``bench/SCHEMA.md``), aggregates with PySpark (local mode by default, ``--master URL`` for a
cluster) and writes ``report.md``, ``report.html``, the aggregated tables as CSV and PNG plots.
Spark does all aggregation; the results are small and are only handed to pandas/matplotlib
for drawing.

What it computes, per run, scenario and server:
- throughput: the median over repeats of natsbench's msgs/s (and MB/s), min and max;
- the natsjs / nats-server ratio of those medians;
- latency percentiles p50/p90/p99/p99.9 (µs) over all latency samples of the run's repeats,
  pooled.  Percentiles are EXACT, computed by rank (a window sort per group, see
  ``_exact_quantiles``) with linear interpolation between the two closest ranks, the same
  definition as ``numpy.percentile(..., method="linear")``.  ``--approx-accuracy N``
  switches to ``percentile_approx`` (rank error at most samples/N) for very large traces;
- the latency CDF at fixed quantiles (for plots), the throughput time series (100 ms bins,
  averaged over repeats), and the change of throughput and p99 against the previous run
  (by start time) of the same scenario and server;
- for pytest-benchmark micro runs: mean time and ops per benchmark, and the change of the
  mean against the previous micro run;
- for chaos runs (``make chaos``): the fault section of bench/faults.py (the checker's
  figures, availability over time with the faults marked, latency per phase); their
  RESULTS and latency rows stay out of the benchmark tables above.
"""
from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd
import pyarrow as pa

from . import faults as faults_mod
from . import trace
from .servers import NATSJS, REFERENCE

PCTS = (0.5, 0.9, 0.99, 0.999)
PCT_NAMES = ("p50_us", "p90_us", "p99_us", "p999_us")
# quantiles for the CDF plot: dense in the body, denser in the tail
CDF_QUANTILES = tuple(sorted({round(i / 100, 4) for i in range(0, 100)}
                             | {0.995, 0.999, 0.9995, 0.9999, 1.0}))


# --------------------------------------------------------------------------- Spark plumbing

def spark_session(master: str = "local[*]", app: str = "natsjs-bench-analyze",
                  shuffle_partitions: int | None = None, driver_memory: str = "2g"):
    """A SparkSession for the analysis; in local mode few shuffle partitions, because the
    aggregated data is small and 200 tasks per shuffle would dominate the run time."""
    from pyspark.sql import SparkSession
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.memory", driver_memory))
    if master.startswith("local"):
        # the job runs no Python UDFs, but any Python worker should be this interpreter
        b = b.config("spark.pyspark.python", sys.executable)
        if shuffle_partitions is None:
            shuffle_partitions = 4
    if shuffle_partitions:
        b = b.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_schema(schema: pa.Schema):
    """The Spark StructType of one of bench.trace's pyarrow schemas."""
    from pyspark.sql import types as T
    m = {pa.string(): T.StringType(), pa.int32(): T.IntegerType(), pa.int64(): T.LongType(),
         pa.float64(): T.DoubleType(), pa.bool_(): T.BooleanType(), trace.TS: T.TimestampType()}
    return T.StructType([T.StructField(f.name, m[f.type], True) for f in schema])


def _read(spark, files: list[str], schema: pa.Schema):
    if not files:
        return spark.createDataFrame([], spark_schema(schema))
    return spark.read.schema(spark_schema(schema)).parquet(*files)


def _to_pandas(df) -> pd.DataFrame:
    """Collect a small aggregated DataFrame.  Row by row rather than toPandas(): the
    frames are tiny, and this keeps the job independent of pyspark's pandas version range."""
    cols = df.columns
    return pd.DataFrame([r.asDict(recursive=True) for r in df.collect()], columns=cols)


@dataclass
class Frames:
    """The trace tables of the analysed runs as Spark DataFrames."""

    meta: object
    results: object
    throughput: object
    latency: object
    micro: object


def load(spark, paths: list[str | Path]) -> Frames:
    """Spark DataFrames over the trace folders at or below ``paths``; pytest-benchmark JSON
    files given directly are read as micro runs."""
    json_files = [Path(p) for p in paths if str(p).endswith(".json") and Path(p).is_file()]
    run_dirs = trace.discover([p for p in paths if Path(p) not in json_files])

    def files(name: str) -> list[str]:
        return [str(d / f"{name}.parquet") for d in run_dirs if (d / f"{name}.parquet").exists()]

    micro = _read(spark, files("micro"), trace.MICRO)
    for jf in json_files:
        t = trace.micro_table(json.loads(jf.read_text()), jf.stem)
        micro = micro.unionByName(spark.createDataFrame(t.to_pylist(), spark_schema(trace.MICRO)))
    return Frames(meta=_read(spark, files("meta"), trace.META),
                  results=_read(spark, files("results"), trace.RESULTS),
                  throughput=_read(spark, files("throughput"), trace.THROUGHPUT),
                  latency=_read(spark, trace.latency_files(run_dirs), trace.LATENCY),
                  micro=micro)


# --------------------------------------------------------------------------- the analysis

@dataclass
class Analysis:
    """The aggregated results, small pandas frames (see ``analyze``)."""

    runs: pd.DataFrame         # run_id, started_at, git_sha, hostname, servers, versions
    throughput: pd.DataFrame   # run_id, started_at, scenario, title, mode, server, repeats, errors,
                               #   msgs_per_sec, mb_per_sec, min/max msgs_per_sec
    ratio: pd.DataFrame        # run_id, started_at, scenario, title, nats-server, natsjs, ratio
    latency: pd.DataFrame      # run_id, scenario, server, samples, mean_us, p50..p999_us, max_us
    change: pd.DataFrame       # scenario, server, run_id, prev_run_id, msgs_per_sec, prev, change_pct, p99
    timeseries: pd.DataFrame   # run_id, scenario, server, t_s, msgs_per_sec, bin_s, repeats
    cdf: pd.DataFrame          # run_id, scenario, server, q, latency_us
    micro: pd.DataFrame        # run_id, started_at, name, group, mean_s, ops, ..., change_pct
    fault_figures: pd.DataFrame       # chaos runs: bench/faults.py FaultAnalysis
    fault_availability: pd.DataFrame
    fault_phases: pd.DataFrame
    fault_windows: pd.DataFrame

    @property
    def faults(self) -> faults_mod.FaultAnalysis:
        return faults_mod.FaultAnalysis(self.fault_figures, self.fault_availability,
                                        self.fault_phases, self.fault_windows)


def _exact_quantiles(spark, latency, stats, keys: list[str], quantiles: list[float]):
    """Exact quantiles by rank: (keys, q, value_ns).

    numpy's default ("linear") definition: with n sorted values v[0..n-1], quantile q is
    v[lo] + (h - lo) * (v[lo+1] - v[lo]) where h = (n - 1) q and lo = floor(h).  Each group
    is sorted once (row_number over a window), only the ranks needed by some quantile are
    kept, and the interpolation is done on those few rows.  Spark's ``percentile``
    aggregate gives the same numbers but merges per-partition value->count maps, which
    was several times slower on millions of distinct nanosecond latencies.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    qs = spark.createDataFrame([(float(q),) for q in quantiles], "q DOUBLE")
    need = (stats.select(*keys, "samples").crossJoin(F.broadcast(qs))
            .withColumn("h", (F.col("samples") - 1) * F.col("q"))
            .withColumn("lo", F.floor("h").cast("long") + 1)       # 1-based ranks
            .withColumn("hi", F.ceil("h").cast("long") + 1)
            .withColumn("frac", F.col("h") - (F.col("lo") - 1)))
    ranks = need.select(*keys, F.explode(F.array("lo", "hi")).alias("rn")).distinct()
    w = Window.partitionBy(*keys).orderBy("latency_ns")
    picked = (latency.select(*keys, "latency_ns", F.row_number().over(w).alias("rn"))
              .join(F.broadcast(ranks), keys + ["rn"]))
    lo = picked.select(*keys, F.col("rn").alias("lo"), F.col("latency_ns").alias("lo_ns"))
    hi = picked.select(*keys, F.col("rn").alias("hi"), F.col("latency_ns").alias("hi_ns"))
    return (need.join(lo, keys + ["lo"]).join(hi, keys + ["hi"])
            .select(*keys, "q", (F.col("lo_ns") + F.col("frac") * (F.col("hi_ns") - F.col("lo_ns")))
                    .cast("double").alias("value_ns")))


def _approx_quantiles(spark, latency, keys: list[str], quantiles: list[float], accuracy: int):
    """percentile_approx: (keys, q, value_ns); each value is a sample whose rank is within
    samples/accuracy of the exact one."""
    from pyspark.sql import functions as F
    arr = "array(" + ", ".join(repr(float(q)) for q in quantiles) + ")"
    qs = spark.createDataFrame([(i, float(q)) for i, q in enumerate(quantiles)], "i INT, q DOUBLE")
    return (latency.groupBy(*keys)
            .agg(F.expr(f"percentile_approx(latency_ns, {arr}, {int(accuracy)})").alias("p"))
            .select(*keys, F.posexplode("p").alias("i", "value_ns"))
            .join(F.broadcast(qs), "i")
            .select(*keys, "q", F.col("value_ns").cast("double").alias("value_ns")))


def analyze(spark, paths: list[str | Path], approx_accuracy: int | None = None) -> Analysis:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    fr = load(spark, paths)
    # Chaos runs have a section of their own; their rows stay out of the benchmark tables.
    chaos_ids = fr.meta.where(F.col("kind") == "chaos").select("run_id").distinct()
    fr.results = fr.results.join(chaos_ids, "run_id", "left_anti")
    fr.throughput = fr.throughput.join(chaos_ids, "run_id", "left_anti")
    fr.latency = fr.latency.join(chaos_ids, "run_id", "left_anti")
    e2e_meta = fr.meta.where(F.col("kind") == "e2e")
    runs = (fr.meta.groupBy("run_id", "kind")
            .agg(F.min("started_at").alias("started_at"), F.first("git_sha").alias("git_sha"),
                 F.max("git_dirty").alias("git_dirty"), F.first("hostname").alias("hostname"),
                 F.first("cpu_model").alias("cpu_model"), F.first("cpu_count").alias("cpu_count"),
                 F.concat_ws("; ", F.sort_array(F.collect_set(
                     F.concat_ws(" ", "server", "server_version")))).alias("servers"),
                 F.first("scenarios").alias("scenarios")))
    run_start = e2e_meta.groupBy("run_id").agg(F.min("started_at").alias("started_at"))

    # throughput: median over the repeats that succeeded
    ok = fr.results.where(F.col("error").isNull() & F.col("msgs_per_sec").isNotNull())
    thr = (fr.results.groupBy("run_id", "scenario", "server")
           .agg(F.first("title").alias("title"), F.first("mode").alias("mode"),
                F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("errors"))
           .join(ok.groupBy("run_id", "scenario", "server")
                 .agg(F.count("*").alias("repeats"),
                      F.expr("percentile(msgs_per_sec, 0.5)").alias("msgs_per_sec"),
                      F.expr("percentile(mb_per_sec, 0.5)").alias("mb_per_sec"),
                      F.min("msgs_per_sec").alias("min_msgs_per_sec"),
                      F.max("msgs_per_sec").alias("max_msgs_per_sec")),
                 ["run_id", "scenario", "server"], "left")
           .join(run_start, "run_id", "left")
           .fillna({"repeats": 0}))
    thr = thr.cache()

    ratio = (thr.groupBy("run_id", "started_at", "scenario", "title")
             .pivot("server", [REFERENCE, NATSJS]).agg(F.first("msgs_per_sec"))
             .withColumn("ratio", F.col(NATSJS) / F.col(REFERENCE)))

    # latency: one pass for every quantile the report needs (table and CDF), pooled over
    # the repeats of a run; exact unless asked otherwise
    keys = ["run_id", "scenario", "server"]
    stats = (fr.latency.groupBy(*keys)
             .agg(F.count("*").alias("samples"), F.avg("latency_ns").alias("mean_ns"),
                  F.max("latency_ns").alias("max_ns")))
    all_q = sorted(set(PCTS) | set(CDF_QUANTILES))
    if approx_accuracy:
        qv = _approx_quantiles(spark, fr.latency, keys, all_q, approx_accuracy)
    else:
        qv = _exact_quantiles(spark, fr.latency, stats, keys, all_q)
    qv = qv.cache()
    lat = (stats.join(qv.groupBy(*keys).agg(*[
        (F.max(F.when(F.col("q") == p, F.col("value_ns"))) / 1000.0).alias(name)
        for p, name in zip(PCTS, PCT_NAMES)]), keys)
           .select(*keys, "samples", (F.col("mean_ns") / 1000.0).alias("mean_us"), *PCT_NAMES,
                   (F.col("max_ns") / 1000.0).alias("max_us"))).cache()
    cdf = (qv.where(F.col("q").isin(*CDF_QUANTILES))
           .select(*keys, "q", (F.col("value_ns") / 1000.0).alias("latency_us")))

    ts = (fr.throughput.groupBy("run_id", "scenario", "server", "t_s")
          .agg(F.avg("msgs_per_sec").alias("msgs_per_sec"), F.first("bin_s").alias("bin_s"),
               F.count("*").alias("repeats")))

    # change against the previous run of the same scenario and server
    w = Window.partitionBy("scenario", "server").orderBy("started_at", "run_id")
    change = (thr.where(F.col("msgs_per_sec").isNotNull())
              .join(lat.select("run_id", "scenario", "server", "p99_us"),
                    ["run_id", "scenario", "server"], "left")
              .select("scenario", "server", "run_id", "started_at", "msgs_per_sec", "p99_us",
                      F.lag("run_id").over(w).alias("prev_run_id"),
                      F.lag("msgs_per_sec").over(w).alias("prev_msgs_per_sec"),
                      F.lag("p99_us").over(w).alias("prev_p99_us"))
              .withColumn("change_pct", (F.col("msgs_per_sec") / F.col("prev_msgs_per_sec") - 1) * 100)
              .withColumn("p99_change_pct", (F.col("p99_us") / F.col("prev_p99_us") - 1) * 100))

    wm = Window.partitionBy("name").orderBy("started_at", "run_id")
    micro = (fr.micro.select("run_id", "started_at", "git_sha", "group", "name", "mean_s",
                             "stddev_s", "median_s", "min_s", "ops", "rounds",
                             F.lag("mean_s").over(wm).alias("prev_mean_s"))
             .withColumn("change_pct", (F.col("mean_s") / F.col("prev_mean_s") - 1) * 100))

    order = ["started_at", "run_id", "scenario", "server"]
    fa = faults_mod.analyze_faults(spark, trace.discover([p for p in paths
                                                          if not str(p).endswith(".json")]))
    out = Analysis(
        runs=_to_pandas(runs.orderBy("started_at", "run_id")),
        throughput=_to_pandas(thr.orderBy(*order)),
        ratio=_to_pandas(ratio.orderBy("started_at", "run_id", "scenario")),
        latency=_to_pandas(lat.orderBy("run_id", "scenario", "server")),
        change=_to_pandas(change.orderBy("scenario", "server", "started_at")),
        timeseries=_to_pandas(ts.orderBy("run_id", "scenario", "server", "t_s")),
        cdf=_to_pandas(cdf.orderBy("run_id", "scenario", "server", "q")),
        micro=_to_pandas(micro.orderBy("started_at", "run_id", "name")),
        fault_figures=fa.figures, fault_availability=fa.availability,
        fault_phases=fa.phases, fault_windows=fa.faults,
    )
    for df in (thr, lat, qv):
        df.unpersist()
    return out


# --------------------------------------------------------------------------- the report

def _latest_runs(a: Analysis) -> dict[str, str]:
    """scenario -> run_id of the latest run that measured it."""
    if a.throughput.empty:
        return {}
    t = a.throughput.sort_values(["started_at", "run_id"])
    return t.groupby("scenario")["run_id"].last().to_dict()


def _scenario_order(a: Analysis) -> list[str]:
    return list(dict.fromkeys(a.throughput.sort_values(["started_at"], kind="stable")["scenario"])) if not a.throughput.empty else []


def plot(a: Analysis, out: Path) -> list[Path]:
    """PNG plots of the latest run of every scenario (and of the history when there is one)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - for matplotlib.ticker below

    colors = {REFERENCE: "#4C72B0", NATSJS: "#DD8452"}
    latest = _latest_runs(a)
    scen = _scenario_order(a)
    written = []

    def save(fig, name):
        p = out / name
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)

    if latest:
        t = a.throughput[[r == latest.get(s) for s, r in zip(a.throughput.scenario, a.throughput.run_id)]]
        servers = [s for s in (REFERENCE, NATSJS) if s in set(t.server)]
        fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(scen)), 4))
        width = 0.8 / max(1, len(servers))
        for k, srv in enumerate(servers):
            vals = [t[(t.scenario == s) & (t.server == srv)].msgs_per_sec.sum() for s in scen]
            lo = [v - t[(t.scenario == s) & (t.server == srv)].min_msgs_per_sec.fillna(v).sum()
                  for s, v in zip(scen, vals)]
            hi = [t[(t.scenario == s) & (t.server == srv)].max_msgs_per_sec.fillna(v).sum() - v
                  for s, v in zip(scen, vals)]
            ax.bar([i + k * width for i in range(len(scen))], vals, width, label=srv,
                   color=colors.get(srv), yerr=[lo, hi], capsize=3)
        ax.set_xticks([i + width * (len(servers) - 1) / 2 for i in range(len(scen))])
        ax.set_xticklabels([_title(a, s) for s in scen], rotation=15)
        ax.set_ylabel("msgs/s (median over repeats)")
        ax.set_yscale("log")
        ax.set_title("Throughput, latest run per scenario")
        ax.legend()
        save(fig, "throughput.png")

    cdf_scen = [s for s in scen if not a.cdf[(a.cdf.scenario == s) & (a.cdf.run_id == latest.get(s))].empty]
    if cdf_scen:
        fig, axes = plt.subplots(1, len(cdf_scen), figsize=(4.5 * len(cdf_scen), 3.6), squeeze=False)
        for ax, s in zip(axes[0], cdf_scen):
            c = a.cdf[(a.cdf.scenario == s) & (a.cdf.run_id == latest[s])]
            for srv, g in c.groupby("server"):
                ax.plot(g.latency_us, g.q, label=srv, color=colors.get(srv))
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("latency µs")
            ax.set_ylabel("fraction of messages")
            ax.set_title(_title(a, s))
            ax.grid(alpha=0.3)
            ax.legend()
        save(fig, "latency_cdf.png")

    ts_scen = [s for s in scen if not a.timeseries[(a.timeseries.scenario == s)
                                                   & (a.timeseries.run_id == latest.get(s))].empty]
    if ts_scen:
        fig, axes = plt.subplots(len(ts_scen), 1, figsize=(8, 2.6 * len(ts_scen)), squeeze=False)
        for ax, s in zip(axes[:, 0], ts_scen):
            g0 = a.timeseries[(a.timeseries.scenario == s) & (a.timeseries.run_id == latest[s])]
            for srv, g in g0.groupby("server"):
                edges = list(g.t_s) + [g.t_s.iloc[-1] + g.bin_s.iloc[-1]]
                ax.stairs(g.msgs_per_sec, edges, label=srv, color=colors.get(srv))
            ax.set_title(f"{_title(a, s)}: received msgs/s per 100 ms (mean over repeats)")
            ax.set_xlabel("s since first send")
            ax.set_ylabel("msgs/s")
            ax.legend()
        save(fig, "throughput_time.png")

    if a.ratio["run_id"].nunique() > 1 and a.ratio["ratio"].notna().any():
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for s, g in a.ratio.dropna(subset=["ratio"]).groupby("scenario"):
            ax.plot(g.started_at, g.ratio, marker="o", label=_title(a, s))
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("natsjs / nats-server")
        ax.set_title("Throughput ratio over runs")
        ax.legend(fontsize=8)
        fig.autofmt_xdate()
        save(fig, "ratio_history.png")

    if not a.micro.empty:
        last = a.micro[a.micro.run_id == a.micro.sort_values("started_at").run_id.iloc[-1]]
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(last) + 1.5))
        ax.barh(last.name, last.ops, color="#55A868")
        ax.set_xscale("log")
        ax.set_xlabel("ops/s (pytest-benchmark)")
        ax.set_title("Micro-benchmarks, latest run")
        save(fig, "micro.png")
    return written


def _title(a: Analysis, scenario: str) -> str:
    t = a.throughput[a.throughput.scenario == scenario].title
    return t.iloc[0] if len(t) and isinstance(t.iloc[0], str) else scenario


def _fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    return format(v, spec)


def _md(df: pd.DataFrame) -> str:
    if df.empty:
        return "_none_\n"
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rows = ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join([head, "|" + "---|" * len(df.columns), *rows]) + "\n"


def report_tables(a: Analysis) -> dict[str, pd.DataFrame]:
    """The report's tables, formatted for display (titles -> frames)."""
    latest = _latest_runs(a)
    scen = _scenario_order(a)
    chg = a.change.set_index(["run_id", "scenario", "server"]) if not a.change.empty else None

    def change(run, s, srv, col="change_pct"):
        if chg is None or (run, s, srv) not in chg.index:
            return None
        return chg.loc[(run, s, srv), col]

    rows = []
    for s in scen:
        run = latest[s]
        r = a.ratio[(a.ratio.run_id == run) & (a.ratio.scenario == s)]
        ref = r[REFERENCE].iloc[0] if len(r) else None
        ours = r[NATSJS].iloc[0] if len(r) else None
        rows.append({"scenario": _title(a, s), "run": run,
                     f"{REFERENCE} msgs/s": _fmt(ref, ",.0f"),
                     f"{NATSJS} msgs/s": _fmt(ours, ",.0f"),
                     "ratio": _fmt(r["ratio"].iloc[0] if len(r) else None, ".3f"),
                     f"Δ {REFERENCE} %": _fmt(change(run, s, REFERENCE), "+.1f"),
                     f"Δ {NATSJS} %": _fmt(change(run, s, NATSJS), "+.1f")})
    lat_rows = []
    for s in scen:
        for _, r in a.latency[(a.latency.run_id == latest[s]) & (a.latency.scenario == s)].iterrows():
            lat_rows.append({"scenario": _title(a, s), "server": r.server, "samples": f"{r.samples:,}",
                             **{k: _fmt(r[k], ",.1f") for k in ("mean_us", *PCT_NAMES, "max_us")},
                             "Δ p99 %": _fmt(change(latest[s], s, r.server, "p99_change_pct"), "+.1f")})
    hist = a.ratio.assign(
        started_at=a.ratio.started_at.astype(str),
        **{c: a.ratio[c].map(lambda v: _fmt(v, ",.0f")) for c in (REFERENCE, NATSJS)},
        ratio=a.ratio.ratio.map(lambda v: _fmt(v, ".3f")))[
        ["started_at", "run_id", "title", REFERENCE, NATSJS, "ratio"]] if not a.ratio.empty else a.ratio
    micro = a.micro.assign(
        mean_us=(a.micro.mean_s * 1e6).map(lambda v: _fmt(v, ",.3f")),
        ops=a.micro.ops.map(lambda v: _fmt(v, ",.0f")),
        change_pct=a.micro.change_pct.map(lambda v: _fmt(v, "+.1f")))[
        ["run_id", "group", "name", "mean_us", "ops", "rounds", "change_pct"]] if not a.micro.empty else a.micro
    runs = a.runs.assign(started_at=a.runs.started_at.astype(str)) if not a.runs.empty else a.runs
    return {
        "Throughput, latest run per scenario (median over repeats; Δ = change against the previous run)":
            pd.DataFrame(rows),
        "Latency, latest run per scenario (µs, exact percentiles over all samples of the run)":
            pd.DataFrame(lat_rows),
        "History of the ratio natsjs / nats-server": hist,
        "Micro-benchmarks (pytest-benchmark; change_pct = change of the mean time)": micro,
        **faults_mod.report_tables(a.faults),
        "Runs": runs,
    }


def write_report(a: Analysis, out: Path | str) -> Path:
    """report.md, report.html, PNG plots and the aggregated tables as CSV in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in fields(a):
        getattr(a, f.name).to_csv(out / f"{f.name}.csv", index=False)
    pngs = plot(a, out) + faults_mod.plot(a.faults, out, {REFERENCE: "#4C72B0",
                                                            NATSJS: "#DD8452"})
    tables = report_tables(a)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# natsjs benchmark report\n\n_{now}; {len(a.runs)} run(s)._\n"]
    htm = ["<!doctype html><meta charset='utf-8'><title>natsjs benchmark report</title>",
           "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
           "text-align:right}</style>",
           f"<h1>natsjs benchmark report</h1><p><i>{html.escape(now)}; {len(a.runs)} run(s).</i></p>"]
    for title, df in tables.items():
        md += [f"## {title}\n", _md(df)]
        htm += [f"<h2>{html.escape(title)}</h2>",
                df.to_html(index=False, border=0) if not df.empty else "<p><i>none</i></p>"]
    md.append("## Plots\n")
    htm.append("<h2>Plots</h2>")
    for p in pngs:
        md.append(f"![{p.stem}]({p.name})\n")
        htm.append(f"<p><img src='{html.escape(p.name)}' alt='{html.escape(p.stem)}'></p>")
    (out / "report.md").write_text("\n".join(md))
    (out / "report.html").write_text("\n".join(htm))
    return out / "report.md"


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None, spark=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.analyze", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", metavar="RESULTS_DIR",
                    help="trace folders or folders holding them; pytest-benchmark JSON files")
    ap.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    ap.add_argument("--out", default=None, help="report folder (default <first path>/report)")
    ap.add_argument("--approx-accuracy", type=int, default=None,
                    help="use percentile_approx with this accuracy instead of exact percentiles")
    ap.add_argument("--shuffle-partitions", type=int, default=None)
    ap.add_argument("--driver-memory", default="2g")
    args = ap.parse_args(argv)
    if not trace.discover(args.paths) and not any(p.endswith(".json") for p in args.paths):
        print(f"no trace folders under {args.paths}", file=sys.stderr)
        return 1
    own = spark is None
    if own:
        spark = spark_session(args.master, shuffle_partitions=args.shuffle_partitions,
                              driver_memory=args.driver_memory)
    try:
        a = analyze(spark, args.paths, args.approx_accuracy)
    finally:
        if own:
            spark.stop()
    out = Path(args.out) if args.out else Path(args.paths[0]) / "report"
    report = write_report(a, out)
    print(_md(next(iter(report_tables(a).values()))))
    print(f"report: {report}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
