"""The benchmark trace format: one schema, its writer and its reader.

Every benchmark run (``bench.run``, ``make micro``) writes one folder
``results/<UTC timestamp>-<git sha>/`` of Parquet files whose pyarrow schemas are defined
here and documented in ``bench/SCHEMA.md``; ``bench.analyze`` (Spark) and the tests read
them back through the same definitions.  Nothing else in ``bench/`` writes trace files.

Tables (file in the run folder -> schema constant):
  meta.parquet         META        one row per (run, server): versions, flags, machine
  results.parquet      RESULTS     one row per (run, scenario, server, repeat): natsbench figures
  throughput.parquet   THROUGHPUT  one row per 100 ms bin, derived from the latency samples
  latency/*.parquet    LATENCY     one row per message (natsbench -trace), a file per repeat
  micro.parquet        MICRO       one row per pytest-benchmark benchmark (micro runs)
  chaos.parquet        CHAOS       one row per (run, fault class, server): the checker's figures
  ops.parquet          CHAOS_OPS   one row per client operation of a chaos run (the history)
  faults.parquet       CHAOS_FAULTS one row per injected fault (the timeline)
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

SCHEMA_VERSION = 2
BIN_S = 0.1  # throughput bin width
TS = pa.timestamp("us", tz="UTC")

META = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("kind", pa.string()),             # "e2e" (bench.run) or "micro" (pytest-benchmark)
    ("started_at", TS),
    ("git_sha", pa.string()),
    ("git_dirty", pa.bool_()),
    ("server", pa.string()),           # "nats-server" | "natsjs"; "natsjs" for micro runs
    ("server_version", pa.string()),
    ("server_cmd", pa.string()),       # the command, without per-node flags
    ("natsbench", pa.string()),        # path of the load generator ("" for micro)
    ("hostname", pa.string()),
    ("cpu_count", pa.int32()),
    ("cpu_model", pa.string()),
    ("python_version", pa.string()),
    ("platform", pa.string()),
    ("repeat", pa.int32()),
    ("quick", pa.bool_()),
    ("scenarios", pa.string()),        # comma separated scenario names
    ("params", pa.string()),           # JSON: the runner's options
    ("argv", pa.string()),             # the command line of the run
])

RESULTS = pa.schema([
    ("run_id", pa.string()),
    ("scenario", pa.string()),
    ("title", pa.string()),
    ("mode", pa.string()),
    ("topology", pa.string()),
    ("nodes", pa.int32()),
    ("server", pa.string()),
    ("repeat", pa.int32()),            # 0-based repeat index
    ("slot", pa.int32()),              # position of this measurement in the run's sequence
    ("started_at", TS),
    ("msgs", pa.int64()),
    ("size", pa.int32()),
    ("pubs", pa.int32()),
    ("subs", pa.int32()),
    ("seconds", pa.float64()),
    ("msgs_per_sec", pa.float64()),
    ("mb_per_sec", pa.float64()),
    ("p50_us", pa.float64()),          # natsbench's own figures: req, and pubsub with -trace
    ("p99_us", pa.float64()),
    ("received", pa.int64()),
    ("samples", pa.int64()),           # latency rows written for this repeat (0: no trace)
    ("rss_mb", pa.float64()),          # servers' resident memory after the load (rss scenarios)
    ("leaders", pa.string()),          # JSON {"stream": i, "consumer": j}: leaders' nodes (JS clusters)
    ("restarts", pa.int32()),          # topology started afresh after "no responders" (bench.run)
    ("error", pa.string()),            # null when natsbench succeeded
    ("natsbench_args", pa.string()),
    ("server_args", pa.string()),      # JSON list of per-node flag lists
])

THROUGHPUT = pa.schema([
    ("run_id", pa.string()),
    ("scenario", pa.string()),
    ("server", pa.string()),
    ("repeat", pa.int32()),
    ("t_s", pa.float64()),             # bin start, seconds after the first message was sent
    ("bin_s", pa.float64()),
    ("msgs", pa.int64()),              # messages received (pubsub) / replies (req) in the bin
    ("msgs_per_sec", pa.float64()),
])

LATENCY = pa.schema([
    ("run_id", pa.string()),
    ("scenario", pa.string()),
    ("server", pa.string()),
    ("repeat", pa.int32()),
    ("seq", pa.int64()),
    ("send_unix_ns", pa.int64()),
    ("latency_ns", pa.int64()),
])

MICRO = pa.schema([
    ("run_id", pa.string()),
    ("started_at", TS),
    ("git_sha", pa.string()),
    ("name", pa.string()),
    ("fullname", pa.string()),
    ("group", pa.string()),
    ("param", pa.string()),
    ("mean_s", pa.float64()),
    ("stddev_s", pa.float64()),
    ("median_s", pa.float64()),
    ("min_s", pa.float64()),
    ("max_s", pa.float64()),
    ("ops", pa.float64()),
    ("rounds", pa.int64()),
    ("iterations", pa.int64()),
])

# Chaos runs (natsjs/testing/chaos, ``make chaos``): scenario = the fault class(es) of the
# run, "+"-joined; repeat 0.  Their RESULTS rows count publish attempts (msgs) and
# acknowledgements (received); LATENCY holds one row per acknowledged publish (seq = the
# stream sequence of its PubAck), so THROUGHPUT is acknowledgements per 100 ms.
CHAOS = pa.schema([
    ("run_id", pa.string()),
    ("scenario", pa.string()),
    ("server", pa.string()),
    ("nodes", pa.int32()),
    ("replicas", pa.int32()),
    ("seed", pa.int64()),
    ("sabotage", pa.string()),         # "" for a real run
    ("valid", pa.bool_()),
    ("attempts", pa.int64()),
    ("ok", pa.int64()),
    ("failed", pa.int64()),
    ("unknown", pa.int64()),
    ("lost", pa.int64()),              # acknowledged, missing from at least one replica
    ("lost_all", pa.int64()),          # acknowledged, missing from every replica
    ("duplicated", pa.int64()),
    ("divergent", pa.int64()),         # sequences where the replicas differ
    ("unexpected", pa.int64()),
    ("misplaced", pa.int64()),
    ("order", pa.int64()),
    ("availability", pa.float64()),    # ok / attempts
    ("longest_gap_s", pa.float64()),
    ("q_attempts", pa.int64()),
    ("q_ok", pa.int64()),
    ("q_lost", pa.int64()),
    ("q_undelivered", pa.int64()),     # not delivered but still in the queue stream at the end
    ("q_redelivered_after_ack", pa.int64()),
    ("q_unexpected", pa.int64()),
    ("unrecovered", pa.int64()),       # nodes that could not be restarted after a fault
    ("notes", pa.string()),
])

CHAOS_OPS = pa.schema([
    ("run_id", pa.string()),
    ("scenario", pa.string()),
    ("server", pa.string()),
    ("process", pa.string()),          # p0..pN publishers, q the queue producer, worker
    ("kind", pa.string()),             # publish | enqueue | deliver | ack
    ("value", pa.string()),
    ("start_unix_ns", pa.int64()),
    ("end_unix_ns", pa.int64()),       # null while unknown never ended (not written)
    ("outcome", pa.string()),          # ok | failed | unknown
    ("seq", pa.int64()),               # PubAck / delivery stream sequence, -1 if none
    ("node", pa.int32()),              # node index the client first connected to, -1
    ("error", pa.string()),
    ("redelivered", pa.int32()),
])

CHAOS_FAULTS = pa.schema([
    ("run_id", pa.string()),
    ("scenario", pa.string()),
    ("server", pa.string()),
    ("kind", pa.string()),             # the fault class of this injection
    ("start_unix_ns", pa.int64()),
    ("end_unix_ns", pa.int64()),       # the heal
    ("nodes", pa.string()),            # "n1,n3", or "n1 | n2,n3" for a partition
    ("detail", pa.string()),
])

TABLES = {"meta": META, "results": RESULTS, "throughput": THROUGHPUT, "micro": MICRO,
          "chaos": CHAOS, "ops": CHAOS_OPS, "faults": CHAOS_FAULTS}


# --------------------------------------------------------------------------- run metadata

def git_info(repo: Path | str = ".") -> tuple[str, bool]:
    """(short sha or "nocommit", dirty) of the work tree at ``repo``; read-only git calls."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "--short=12", "HEAD") or "nocommit"
    status = git("status", "--porcelain", "--untracked-files=no")
    return sha, bool(status)


def machine_info() -> dict:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count() or 0,
        "cpu_model": model,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
    }


def new_run_id(sha: str, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{sha}"


# --------------------------------------------------------------------------- derivations

def throughput_bins(send_unix_ns: np.ndarray, latency_ns: np.ndarray,
                    bin_s: float = BIN_S) -> tuple[np.ndarray, np.ndarray]:
    """Messages received per bin, by receive time (send + latency) measured from the first
    send.  Returns (bin start seconds, counts); empty bins inside the span are kept as 0,
    the last bin is usually partial."""
    if len(send_unix_ns) == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    t0 = int(send_unix_ns.min())
    recv = send_unix_ns.astype(np.int64) + latency_ns.astype(np.int64) - t0
    idx = np.maximum(recv, 0) // int(round(bin_s * 1e9))
    counts = np.bincount(idx).astype(np.int64)
    return np.arange(len(counts)) * bin_s, counts


# --------------------------------------------------------------------------- writing

def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.table(cols, schema=schema)


def _write(table: pa.Table, path: Path) -> None:
    table = table.replace_schema_metadata({"natsjs.schema_version": str(SCHEMA_VERSION)})
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)  # readers never see a half-written file


class RunWriter:
    """Accumulates one run's rows and writes them into its folder.

    ``flush()`` rewrites the small tables whole, so the runner calls it after every
    scenario and an interrupted run still leaves a readable folder.  Latency samples go
    straight to their own file per repeat and are never held for the whole run.
    """

    def __init__(self, run_dir: Path | str, run_id: str):
        self.dir = Path(run_dir)
        self.run_id = run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.meta: list[dict] = []
        self.results: list[dict] = []
        self.throughput: list[dict] = []
        self.chaos: list[dict] = []
        self.ops: list[pa.Table] = []
        self.faults: list[dict] = []

    def add_meta(self, row: dict) -> None:
        self.meta.append({"schema_version": SCHEMA_VERSION, "run_id": self.run_id, **row})

    def add_result(self, row: dict) -> None:
        self.results.append({"run_id": self.run_id, **row})

    def add_latency_csv(self, csv_path: Path | str, scenario: str, server: str,
                        repeat: int, bin_s: float = BIN_S) -> int:
        """Convert a natsbench ``-trace`` CSV into ``latency/`` Parquet plus throughput
        bins; returns the number of samples."""
        raw = pacsv.read_csv(csv_path, convert_options=pacsv.ConvertOptions(
            column_types={"seq": pa.int64(), "send_unix_ns": pa.int64(), "latency_ns": pa.int64()}))
        return self.add_latency(raw["seq"].to_numpy(), raw["send_unix_ns"].to_numpy(),
                                raw["latency_ns"].to_numpy(), scenario, server, repeat, bin_s)

    def add_latency(self, seq: np.ndarray, send_unix_ns: np.ndarray, latency_ns: np.ndarray,
                    scenario: str, server: str, repeat: int, bin_s: float = BIN_S) -> int:
        n = len(seq)
        table = pa.table({
            "run_id": pa.repeat(pa.scalar(self.run_id, pa.string()), n),
            "scenario": pa.repeat(pa.scalar(scenario, pa.string()), n),
            "server": pa.repeat(pa.scalar(server, pa.string()), n),
            "repeat": pa.repeat(pa.scalar(repeat, pa.int32()), n),
            "seq": pa.array(np.asarray(seq, dtype=np.int64)),
            "send_unix_ns": pa.array(np.asarray(send_unix_ns, dtype=np.int64)),
            "latency_ns": pa.array(np.asarray(latency_ns, dtype=np.int64)),
        }, schema=LATENCY)
        (self.dir / "latency").mkdir(exist_ok=True)
        _write(table, self.dir / "latency" / f"{scenario}.{server}.r{repeat}.parquet")
        t_s, counts = throughput_bins(np.asarray(send_unix_ns), np.asarray(latency_ns), bin_s)
        self.throughput += [
            {"run_id": self.run_id, "scenario": scenario, "server": server, "repeat": repeat,
             "t_s": float(t), "bin_s": bin_s, "msgs": int(c), "msgs_per_sec": c / bin_s}
            for t, c in zip(t_s, counts)]
        return n

    def add_chaos(self, figures: dict, ops: dict[str, list], faults: list[dict]) -> None:
        """One chaos run: its figures (a CHAOS row), its history (CHAOS_OPS columns as
        lists) and its fault timeline (CHAOS_FAULTS rows)."""
        self.chaos.append({"run_id": self.run_id, **figures})
        n = len(ops["value"])
        cols = {"run_id": [self.run_id] * n, **ops}
        self.ops.append(pa.table({f.name: cols[f.name] for f in CHAOS_OPS}, schema=CHAOS_OPS))
        self.faults += [{"run_id": self.run_id, **f} for f in faults]

    def flush(self) -> None:
        _write(_table(self.meta, META), self.dir / "meta.parquet")
        _write(_table(self.results, RESULTS), self.dir / "results.parquet")
        _write(_table(self.throughput, THROUGHPUT), self.dir / "throughput.parquet")
        if self.chaos:
            _write(_table(self.chaos, CHAOS), self.dir / "chaos.parquet")
            _write(pa.concat_tables(self.ops), self.dir / "ops.parquet")
            _write(_table(self.faults, CHAOS_FAULTS), self.dir / "faults.parquet")
        # a human-readable copy of the metadata next to the columnar one
        with open(self.dir / "meta.json", "w") as f:
            json.dump(self.meta, f, indent=2, default=str)


def micro_table(bench_json: dict, run_id: str, git_sha: str | None = None) -> pa.Table:
    """pytest-benchmark's ``--benchmark-json`` document as a MICRO table; ``git_sha``
    replaces the document's commit id (pytest-benchmark says "unknown" before a commit)."""
    started = bench_json.get("datetime")
    started_at = dt.datetime.fromisoformat(started) if started else None
    if started_at is not None and started_at.tzinfo is None:
        started_at = started_at.replace(tzinfo=dt.timezone.utc)
    sha = git_sha or (bench_json.get("commit_info") or {}).get("id") or ""
    rows = []
    for b in bench_json.get("benchmarks", []):
        st = b.get("stats", {})
        rows.append({
            "run_id": run_id, "started_at": started_at, "git_sha": sha[:12],
            "name": b.get("name"), "fullname": b.get("fullname"), "group": b.get("group"),
            "param": None if b.get("param") is None else str(b.get("param")),
            "mean_s": st.get("mean"), "stddev_s": st.get("stddev"), "median_s": st.get("median"),
            "min_s": st.get("min"), "max_s": st.get("max"), "ops": st.get("ops"),
            "rounds": st.get("rounds"), "iterations": st.get("iterations"),
        })
    return _table(rows, MICRO)


def write_micro(json_path: Path | str, run_dir: Path | str | None = None,
                results_root: Path | str = "results", argv: str = "") -> Path:
    """Turn a pytest-benchmark JSON file into a micro run folder (micro.parquet,
    meta.parquet, and the JSON itself as micro.json).  Returns the folder."""
    json_path = Path(json_path)
    doc = json.loads(json_path.read_text())
    sha, dirty = git_info()
    if run_dir is None:
        run_dir = Path(results_root) / (new_run_id(sha) + "-micro")
    run_dir = Path(run_dir)
    run_id = run_dir.name
    w = RunWriter(run_dir, run_id)
    table = micro_table(doc, run_id, sha)
    started = table["started_at"][0].as_py() if table.num_rows else dt.datetime.now(dt.timezone.utc)
    try:
        from importlib.metadata import version
        natsjs_version = version("natsjs")
    except Exception:  # noqa: BLE001 - version is informative only
        natsjs_version = "unknown"
    w.add_meta({"kind": "micro", "started_at": started, "git_sha": sha, "git_dirty": dirty,
                "server": "natsjs", "server_version": natsjs_version, "server_cmd": "",
                "natsbench": "", **machine_info(), "repeat": 1, "quick": False,
                "scenarios": ",".join(sorted({r for r in table["group"].to_pylist() if r})),
                "params": json.dumps(doc.get("machine_info", {}), default=str), "argv": argv})
    w.flush()
    _write(table, run_dir / "micro.parquet")
    if json_path.resolve() != (run_dir / "micro.json").resolve():
        (run_dir / "micro.json").write_text(json_path.read_text())
    return run_dir


# --------------------------------------------------------------------------- reading

def discover(paths: Iterable[Path | str]) -> list[Path]:
    """Run folders (those holding meta.parquet) at or below ``paths``, sorted by name,
    which starts with the UTC start time."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if (p / "meta.parquet").exists():
            found.add(p.resolve())
        elif p.is_dir():
            found.update(m.parent.resolve() for m in p.rglob("meta.parquet"))
    return sorted(found, key=lambda d: d.name)


def read_table(run_dirs: Iterable[Path | str], name: str) -> pa.Table:
    """One of meta/results/throughput/micro, concatenated over ``run_dirs`` (missing files
    are skipped) and cast to its schema."""
    schema = TABLES[name]
    parts = [_conform(pq.read_table(Path(d) / f"{name}.parquet"), schema)
             for d in run_dirs if (Path(d) / f"{name}.parquet").exists()]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s columns and types; a column added since it was written
    (``restarts``) reads as nulls."""
    cols = [table[f.name].cast(f.type) if f.name in table.column_names
            else pa.nulls(len(table), f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


def latency_files(run_dirs: Iterable[Path | str]) -> list[str]:
    return sorted(str(p) for d in run_dirs for p in (Path(d) / "latency").glob("*.parquet"))


def read_latency(run_dirs: Iterable[Path | str]) -> pa.Table:
    parts = [pq.read_table(p).cast(LATENCY) for p in latency_files(run_dirs)]
    return pa.concat_tables(parts) if parts else LATENCY.empty_table()


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("micro", help="store a pytest-benchmark JSON file as a micro run folder")
    m.add_argument("json")
    m.add_argument("--run-dir")
    m.add_argument("--results", default="results")
    s = sub.add_parser("show", help="print the tables of run folders")
    s.add_argument("paths", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "micro":
        out = write_micro(args.json, args.run_dir, args.results, " ".join(sys.argv))
        print(out)
        return 0
    dirs = discover(args.paths)
    for name in ("meta", "results", "micro"):
        t = read_table(dirs, name)
        if t.num_rows:
            print(f"== {name} ({t.num_rows} rows)")
            print(t.to_pandas().to_string(max_colwidth=40))
    print(f"== throughput: {read_table(dirs, 'throughput').num_rows} rows; "
          f"latency: {len(latency_files(dirs))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
