"""Tests of the benchmark plumbing without servers: the trace writer/reader
(bench/trace.py), the scenario catalogue (bench/scenarios.py) and the runner's table
(bench/run.py)."""
from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from bench import run, scenarios, trace  # noqa: E402


def test_throughput_bins_counts_by_receive_time():
    send = np.array([0, 10, 50, 120, 130, 390], dtype=np.int64) * 1_000_000 + 10**18
    lat = np.array([5, 95, 10, 0, 200, 20], dtype=np.int64) * 1_000_000
    # receive offsets (ms): 5, 105, 60, 120, 330, 410 -> bins 0,1,0,1,3,4
    t, c = trace.throughput_bins(send, lat, 0.1)
    assert c.tolist() == [2, 2, 0, 1, 1]
    np.testing.assert_allclose(t, [0, 0.1, 0.2, 0.3, 0.4])
    assert trace.throughput_bins(np.zeros(0, np.int64), np.zeros(0, np.int64))[1].size == 0


def test_run_writer_round_trip(tmp_path):
    w = trace.RunWriter(tmp_path / "r1", "r1")
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    w.add_meta({"kind": "e2e", "started_at": now, "server": "natsjs", "repeat": 1})
    w.add_result({"scenario": "req", "server": "natsjs", "repeat": 0, "msgs_per_sec": 10.0,
                  "error": None, "started_at": now})
    csv = tmp_path / "t.csv"
    csv.write_text("seq,send_unix_ns,latency_ns\n1,1000000000,50000\n2,1050000000,60000\n"
                   "3,1250000000,70000\n")
    assert w.add_latency_csv(csv, "req", "natsjs", 0) == 3
    w.flush()
    dirs = trace.discover([tmp_path])
    assert [d.name for d in dirs] == ["r1"]
    meta = trace.read_table(dirs, "meta")
    assert meta.schema.equals(trace.META)
    assert meta["schema_version"].to_pylist() == [trace.SCHEMA_VERSION]
    assert trace.read_table(dirs, "results")["msgs_per_sec"].to_pylist() == [10.0]
    lat = trace.read_latency(dirs)
    assert lat.schema.equals(trace.LATENCY)
    assert lat["latency_ns"].to_pylist() == [50000, 60000, 70000]
    assert lat["run_id"].to_pylist() == ["r1"] * 3
    thr = trace.read_table(dirs, "throughput").to_pydict()
    assert thr["msgs"] == [2, 0, 1] and thr["msgs_per_sec"] == [20.0, 0.0, 10.0]
    md = pq.read_schema(tmp_path / "r1" / "results.parquet").metadata
    assert md[b"natsjs.schema_version"] == str(trace.SCHEMA_VERSION).encode()
    assert json.loads((tmp_path / "r1" / "meta.json").read_text())[0]["server"] == "natsjs"
    assert trace.read_table(dirs, "micro").num_rows == 0


def test_micro_from_pytest_benchmark_json(tmp_path):
    doc = {"datetime": "2026-01-02T03:04:05+00:00", "commit_info": {"id": "unknown"},
           "machine_info": {"node": "x"},
           "benchmarks": [{"name": "test_a[1]", "fullname": "bench/bench_a.py::test_a[1]",
                           "group": "g", "param": "1",
                           "stats": {"mean": 0.5, "stddev": 0.1, "median": 0.4, "min": 0.3,
                                     "max": 0.9, "ops": 2.0, "rounds": 7, "iterations": 3}}]}
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))
    out = trace.write_micro(f, tmp_path / "m1")
    t = trace.read_table([out], "micro").to_pylist()
    assert len(t) == 1 and t[0]["mean_s"] == 0.5 and t[0]["ops"] == 2.0 and t[0]["rounds"] == 7
    assert t[0]["started_at"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert trace.read_table([out], "meta")["kind"].to_pylist() == ["micro"]
    assert json.loads((out / "micro.json").read_text()) == doc


def test_scenario_catalogue_and_args():
    cat = scenarios.load()
    default = [s.name for s in cat.select()]
    assert default == ["pub", "pubsub", "pubsub-1k", "fanout-4", "req"]
    route = cat.select(["route-pubsub"])[0]
    assert route.topology.nodes == 3 and route.topology.cluster
    args = route.natsbench_args(["nats://a:1", "nats://b:2", "nats://c:3"], 500, "/tmp/t.csv")
    assert args[:6] == ["-mode", "pubsub", "-url", "nats://a:1", "-n", "500"]
    assert args[args.index("-sub-url") + 1] == "nats://b:2"
    assert args[-2:] == ["-trace", "/tmp/t.csv"]
    pub = cat.select(["pub"])[0]
    assert "-trace" not in pub.natsbench_args(["nats://a:1"], 10, "/tmp/t.csv")
    assert pub.messages(quick=True) == pub.quick_n and pub.messages(override=7) == 7
    with pytest.raises(ValueError):
        route.natsbench_args(["nats://a:1"], 10)
    with pytest.raises(KeyError):
        cat.select(["nope"])


def test_scenario_file_validation(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[[scenario]]\nname = "x"\nmode = "pub"\ntrace = true\n')
    with pytest.raises(ValueError, match="trace"):
        scenarios.load(f)
    f.write_text('[[scenario]]\nname = "x"\nmode = "pub"\ntopology = "mesh"\n')
    with pytest.raises(ValueError, match="topology"):
        scenarios.load(f)


def test_ratio_table_splits_cluster_runs_by_where_the_leader_was():
    """JetStream cluster rows carry the leaders' nodes; the notes give the medians of
    the runs with the leader that counts (the stream's for publish, the consumer's for
    fetch) on node 0, the client's, and elsewhere."""
    rows = []
    for server, runs in (("nats-server", [(0, 120.0), (1, 90.0), (2, 100.0)]),
                         ("natsjs", [(1, 95.0), (0, 130.0), (0, 110.0)])):
        for rep, (node, rate) in enumerate(runs):
            rows.append({"scenario": "jspub-r3", "title": "R3 publish", "mode": "jspub",
                         "server": server, "msgs_per_sec": rate, "error": None,
                         "leaders": json.dumps({"stream": node, "consumer": None})})
    servers = ["nats-server", "natsjs"]
    table = run.ratio_table(run.summarise(rows, servers), servers)
    assert ("- R3 publish by placement: leader on the client's node: nats-server 120 "
            "(1 runs), natsjs 120 (2 runs), ratio 1.00; elsewhere: nats-server 95 "
            "(2 runs), natsjs 95 (1 runs), ratio 1.00") in table
    for r in rows:
        r["mode"], r["leaders"] = "jsfetch", json.dumps({"stream": 0, "consumer": 1})
    table = run.ratio_table(run.summarise(rows, servers), servers)
    assert "leader on the client's node: nats-server – (0 runs)" in table


def test_ratio_table_medians_and_errors():
    rows = []
    for rep, (ref, ours) in enumerate([(100.0, 40.0), (300.0, 50.0), (200.0, 90.0)]):
        rows.append({"scenario": "req", "title": "req 16 B", "server": "nats-server",
                     "msgs_per_sec": ref, "p50_us": 100.0 + rep, "p99_us": 200.0, "error": None})
        rows.append({"scenario": "req", "title": "req 16 B", "server": "natsjs",
                     "msgs_per_sec": ours, "p50_us": 300.0, "p99_us": 900.0, "error": None})
    rows.append({"scenario": "req", "title": "req 16 B", "server": "natsjs",
                 "msgs_per_sec": None, "error": "server: exited"})
    servers = ["nats-server", "natsjs"]
    summary = run.summarise(rows, servers)
    assert summary[0]["nats-server"]["msgs_per_sec"] == 200.0
    assert summary[0]["natsjs"]["msgs_per_sec"] == 50.0
    table = run.ratio_table(summary, servers)
    line = [ln for ln in table.splitlines() if ln.startswith("| req")][0]
    assert line == "| req 16 B | 200 | 50 | 0.25 | 101 / 200 | 300 / 900 |"
    assert "1 failed: server: exited" in table
    one = run.ratio_table(run.summarise(rows, ["nats-server"]), ["nats-server"])
    assert "ratio" not in one


def test_a_results_table_written_before_a_column_was_added_reads_it_as_null(tmp_path):
    """Trace folders outlive the runner: one written before ``restarts`` existed still
    reads, the new column null."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    old = [f for f in trace.RESULTS if f.name != "restarts"]
    row = {"run_id": "r", "scenario": "pub", "server": "natsjs", "msgs_per_sec": 5.0}
    pq.write_table(pa.table({f.name: [row.get(f.name)] for f in old}, schema=pa.schema(old)),
                   tmp_path / "results.parquet")
    got = trace.read_table([tmp_path], "results").to_pylist()
    assert got[0]["restarts"] is None and got[0]["msgs_per_sec"] == 5.0
    assert got[0]["scenario"] == "pub"
