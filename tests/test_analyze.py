"""Tests of the Spark analysis (bench/analyze.py) on synthetic traces.

Two runs x two servers x two latency scenarios (+ one throughput-only scenario) are written
with bench.trace's writer; the Spark job's medians, ratios, exact percentiles, time series
and run-to-run changes are checked against numpy, and the report files must exist.  One
local SparkSession serves the whole module.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import shutil

import numpy as np
import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("pyspark needs java", allow_module_level=True)

from bench import analyze, trace  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

SERVERS = ("nats-server", "natsjs")
LAT_SCENARIOS = ("pubsub", "req")
SCENARIOS = ("pub",) + LAT_SCENARIOS
REPEATS = 3
T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def _rate(run: int, scenario: str, server: str, rep: int) -> float:
    base = {"pub": 4e6, "pubsub": 1e6, "req": 8e3}[scenario]
    factor = 1.0 if server == "nats-server" else 0.4 + 0.1 * run
    # skewed spread, so a mean would not pass for the median
    return base * factor * (0.9, 1.0, 1.3)[(rep * 7 + run) % 3]


def _write_runs(root) -> dict:
    """Two e2e runs and one micro run under ``root``; returns the ground truth."""
    rng = np.random.default_rng(1234)
    truth = {"rates": {}, "lat": {}, "bins": {}, "runs": []}
    for run in range(2):
        run_id = f"2026010{run + 1}T120000Z-abc{run}"
        truth["runs"].append(run_id)
        w = trace.RunWriter(root / run_id, run_id)
        started = T0 + dt.timedelta(days=run)
        for srv in SERVERS:
            w.add_meta({"kind": "e2e", "started_at": started, "git_sha": f"abc{run}",
                        "git_dirty": False, "server": srv, "server_version": "v0",
                        "server_cmd": srv, "natsbench": "natsbench", "hostname": "h",
                        "cpu_count": 2, "cpu_model": "cpu", "python_version": "3.11",
                        "platform": "linux", "repeat": REPEATS, "quick": True,
                        "scenarios": ",".join(SCENARIOS), "params": "{}", "argv": "test"})
        slot = 0
        for sc in SCENARIOS:
            for rep in range(REPEATS):
                for srv in SERVERS:
                    rate = _rate(run, sc, srv, rep)
                    row = {"scenario": sc, "title": sc.upper(), "mode": sc, "topology": "single",
                           "nodes": 1, "server": srv, "repeat": rep, "slot": slot,
                           "started_at": started + dt.timedelta(seconds=slot), "msgs": 1000,
                           "size": 16, "seconds": 1000 / rate, "msgs_per_sec": rate,
                           "mb_per_sec": rate * 16 / 1e6, "error": None}
                    slot += 1
                    truth["rates"].setdefault((run_id, sc, srv), []).append(rate)
                    if sc in LAT_SCENARIOS:
                        n = 2000 + 500 * rep
                        lat = (rng.lognormal(np.log(100_000 if sc == "req" else 30_000), 0.6, n)
                               * (1.5 if srv == "natsjs" else 1.0)).astype(np.int64)
                        send = 1_700_000_000_000_000_000 + np.sort(rng.integers(0, 700_000_000, n))
                        row["samples"] = w.add_latency(np.arange(n), send, lat, sc, srv, rep)
                        truth["lat"].setdefault((run_id, sc, srv), []).append(lat)
                        truth["bins"].setdefault((run_id, sc, srv), []).append((send, lat))
                    w.add_result(row)
            # a failed repeat: counted as an error, kept out of the median
            w.add_result({"scenario": sc, "title": sc.upper(), "mode": sc, "topology": "single",
                          "nodes": 1, "server": "natsjs", "repeat": REPEATS, "slot": slot,
                          "started_at": started, "msgs": 1000, "error": "boom"})
        w.flush()
    micro_json = root / "bench.json"
    for k, mean in enumerate((2e-6, 1.6e-6)):
        micro_json.write_text(json.dumps({
            "datetime": (T0 + dt.timedelta(days=k)).isoformat(), "commit_info": {"id": f"m{k}"},
            "machine_info": {}, "benchmarks": [
                {"name": "test_parse", "fullname": "bench/bench_x.py::test_parse", "group": "parser",
                 "param": None, "stats": {"mean": mean, "stddev": 1e-7, "median": mean, "min": mean / 2,
                                          "max": mean * 2, "ops": 1 / mean, "rounds": 100,
                                          "iterations": 1}}]}))
        trace.write_micro(micro_json, root / f"2026010{k + 1}T130000Z-m{k}-micro")
    micro_json.unlink()
    return truth


@pytest.fixture(scope="module")
def spark():
    s = analyze.spark_session("local[2]", shuffle_partitions=2, driver_memory="1g")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return root, _write_runs(root)


@pytest.fixture(scope="module")
def result(spark, data):
    root, _ = data
    return analyze.analyze(spark, [root])


def _one(df, **kv):
    m = np.ones(len(df), dtype=bool)
    for k, v in kv.items():
        m &= (df[k] == v).to_numpy()
    assert m.sum() == 1, (kv, m.sum())
    return df[m].iloc[0]


def test_throughput_median_and_errors(result, data):
    _, truth = data
    for (run_id, sc, srv), rates in truth["rates"].items():
        r = _one(result.throughput, run_id=run_id, scenario=sc, server=srv)
        assert r.msgs_per_sec == pytest.approx(np.median(rates), rel=1e-12)
        assert r.repeats == REPEATS
        assert r.errors == (1 if srv == "natsjs" else 0)
        assert r.min_msgs_per_sec == pytest.approx(min(rates))


def test_ratio(result, data):
    _, truth = data
    for run_id in truth["runs"]:
        for sc in SCENARIOS:
            expect = (np.median(truth["rates"][(run_id, sc, "natsjs")])
                      / np.median(truth["rates"][(run_id, sc, "nats-server")]))
            assert _one(result.ratio, run_id=run_id, scenario=sc).ratio == pytest.approx(expect, rel=1e-12)


def test_exact_latency_percentiles(result, data):
    _, truth = data
    assert len(result.latency) == len(truth["lat"])
    for (run_id, sc, srv), parts in truth["lat"].items():
        pooled = np.concatenate(parts)
        r = _one(result.latency, run_id=run_id, scenario=sc, server=srv)
        assert r.samples == len(pooled)
        # Spark's percentile() and numpy's default both interpolate linearly between ranks
        expect = np.percentile(pooled, [50, 90, 99, 99.9]) / 1000.0
        got = [r.p50_us, r.p90_us, r.p99_us, r.p999_us]
        np.testing.assert_allclose(got, expect, rtol=1e-9)
        assert r.max_us == pytest.approx(pooled.max() / 1000.0)
        assert r.mean_us == pytest.approx(pooled.mean() / 1000.0, rel=1e-9)


def test_cdf_matches_percentiles(result):
    for _, r in result.latency.iterrows():
        c = result.cdf[(result.cdf.run_id == r.run_id) & (result.cdf.scenario == r.scenario)
                       & (result.cdf.server == r.server)]
        assert len(c) == len(analyze.CDF_QUANTILES)
        assert np.all(np.diff(c.latency_us.to_numpy()) >= 0)
        assert _one(c, q=0.5).latency_us == pytest.approx(r.p50_us, rel=1e-9)
        assert _one(c, q=1.0).latency_us == pytest.approx(r.max_us, rel=1e-9)


def test_timeseries_bins(result, data):
    _, truth = data
    for (run_id, sc, srv), parts in truth["bins"].items():
        # independent binning: count receive times per 100 ms, then mean over repeats per bin
        per_bin: dict[int, list[int]] = {}
        for send, lat in parts:
            recv = send + lat - send.min()
            ids, counts = np.unique(recv // 100_000_000, return_counts=True)
            full = dict(zip(ids.tolist(), counts.tolist()))
            for b in range(max(full) + 1):
                per_bin.setdefault(b, []).append(full.get(b, 0))
        ts = result.timeseries[(result.timeseries.run_id == run_id) & (result.timeseries.scenario == sc)
                               & (result.timeseries.server == srv)].sort_values("t_s")
        assert len(ts) == len(per_bin)
        expect = [np.mean(per_bin[b]) * 10 for b in sorted(per_bin)]
        np.testing.assert_allclose(ts.msgs_per_sec.to_numpy(), expect, rtol=1e-9)
        np.testing.assert_allclose(ts.t_s.to_numpy(), np.arange(len(per_bin)) * 0.1, atol=1e-9)


def test_change_against_previous_run(result, data):
    _, truth = data
    first, second = truth["runs"]
    for sc in SCENARIOS:
        for srv in SERVERS:
            prev = np.median(truth["rates"][(first, sc, srv)])
            cur = np.median(truth["rates"][(second, sc, srv)])
            r = _one(result.change, run_id=second, scenario=sc, server=srv)
            assert r.prev_run_id == first
            assert r.change_pct == pytest.approx((cur / prev - 1) * 100, rel=1e-9)
            assert math.isnan(_one(result.change, run_id=first, scenario=sc, server=srv).change_pct)


def test_micro_summary(result):
    m = result.micro.sort_values("started_at")
    assert list(m.name) == ["test_parse", "test_parse"]
    np.testing.assert_allclose(m.mean_s, [2e-6, 1.6e-6])
    np.testing.assert_allclose(m.ops, [5e5, 625000.0])
    assert m.change_pct.iloc[1] == pytest.approx(-20.0)


def test_approx_percentiles_within_rank_error(spark, data):
    root, truth = data
    acc = 100
    keys = ["run_id", "scenario", "server"]
    fr = analyze.load(spark, [root / truth["runs"][0]])
    got = analyze._to_pandas(analyze._approx_quantiles(spark, fr.latency, keys, list(analyze.PCTS), acc))
    assert len(got) == 4 * len(LAT_SCENARIOS) * len(SERVERS)
    for _, r in got.iterrows():
        pooled = np.sort(np.concatenate(truth["lat"][(r.run_id, r.scenario, r.server)]))
        n = len(pooled)
        # percentile_approx returns a sample whose rank is within n/accuracy of q*n
        assert r.value_ns in pooled
        slack = math.ceil(n / acc) + 1
        lo = pooled[max(0, math.floor(r.q * n) - slack)]
        hi = pooled[min(n - 1, math.ceil(r.q * n) + slack)]
        assert lo <= r.value_ns <= hi


def test_report_files(result, tmp_path):
    report = analyze.write_report(result, tmp_path / "report")
    text = report.read_text()
    assert "ratio" in text and "PUBSUB" in text and "test_parse" in text
    for name in ("report.md", "report.html", "throughput.png", "latency_cdf.png",
                 "throughput_time.png", "ratio_history.png", "micro.png", "latency.csv"):
        p = tmp_path / "report" / name
        assert p.exists() and p.stat().st_size > 0, name
    assert (tmp_path / "report" / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_cli(spark, data, tmp_path, capsys):
    root, truth = data
    out = tmp_path / "cli-report"
    assert analyze.main([str(root / truth["runs"][1]), "--out", str(out)], spark=spark) == 0
    assert (out / "report.md").stat().st_size > 0
    assert "PUB" in capsys.readouterr().out
    assert analyze.main([str(tmp_path / "nothing-here")], spark=spark) == 1


# ---- the fault section (chaos runs: bench/faults.py) ---------------------------------------

def _write_chaos_run(root) -> str:
    """A chaos run: 20 publishes, one a second; those sent at 5-7 s time out during a
    kill from 4.5 s to 8.5 s, the one at 8 s is acknowledged late."""
    run_id = "20260103T120000Z-abc2-chaos"
    w = trace.RunWriter(root / run_id, run_id)
    w.add_meta({"kind": "chaos", "started_at": T0, "git_sha": "abc2", "git_dirty": False,
                "server": "natsjs", "server_version": "", "server_cmd": "natsjs", "natsbench": "",
                "hostname": "h", "cpu_count": 2, "cpu_model": "cpu", "python_version": "3.11",
                "platform": "linux", "repeat": 1, "quick": False, "scenarios": "kill",
                "params": "{}", "argv": "test"})
    base = 1_700_000_000_000_000_000
    s = 1_000_000_000
    starts = [base + i * s for i in range(20)]
    outcome = ["unknown" if 5 <= i <= 7 else "ok" for i in range(20)]
    lat = [500_000_000 if i == 8 else 2_000_000 for i in range(20)]
    ends = [st + la if o == "ok" else None for st, la, o in zip(starts, lat, outcome)]
    w.add_result({"scenario": "kill", "title": "chaos: kill", "mode": "chaos",
                  "topology": "chaos3-r3", "nodes": 3, "server": "natsjs", "repeat": 0,
                  "slot": 0, "started_at": T0, "msgs": 20, "seconds": 20.0,
                  "msgs_per_sec": 0.85, "received": 17, "error": None})
    ok = [i for i in range(20) if outcome[i] == "ok"]
    w.add_latency(np.array(ok), np.array([starts[i] for i in ok]), np.array([lat[i] for i in ok]),
                  "kill", "natsjs", 0)
    w.add_chaos({"scenario": "kill", "server": "natsjs", "nodes": 3, "replicas": 3, "seed": 1,
                 "sabotage": "", "valid": True, "attempts": 20, "ok": 17, "failed": 0,
                 "unknown": 3, "lost": 0, "lost_all": 0, "duplicated": 0, "divergent": 0,
                 "unexpected": 0, "misplaced": 0, "order": 0, "availability": 0.85,
                 "longest_gap_s": 4.5, "q_attempts": 0, "q_ok": 0, "q_lost": 0, "q_undelivered": 0,
                 "q_redelivered_after_ack": 0, "q_unexpected": 0, "unrecovered": 0, "notes": ""},
                {"scenario": ["kill"] * 20, "server": ["natsjs"] * 20, "process": ["p0"] * 20,
                 "kind": ["publish"] * 20, "value": ["p0-%d" % i for i in range(20)],
                 "start_unix_ns": starts, "end_unix_ns": ends, "outcome": outcome,
                 "seq": [i + 1 if o == "ok" else -1 for i, o in enumerate(outcome)],
                 "node": [0] * 20, "error": [""] * 20, "redelivered": [0] * 20},
                [{"scenario": "kill", "server": "natsjs", "kind": "kill",
                  "start_unix_ns": base + 4 * s + s // 2, "end_unix_ns": base + 8 * s + s // 2,
                  "nodes": "n1", "detail": "random"}])
    w.flush()
    return run_id


@pytest.fixture(scope="module")
def chaos_result(spark, tmp_path_factory, data):
    root, _ = data
    croot = tmp_path_factory.mktemp("chaos")
    _write_chaos_run(croot)
    return analyze.analyze(spark, [root, croot])


def test_fault_section(chaos_result, result):
    a = chaos_result
    fig = _one(a.fault_figures, scenario="kill", server="natsjs")
    assert fig.valid and fig.lost == 0 and fig.availability == 0.85
    av = a.fault_availability.set_index("t_s")
    assert av.loc[0.0, "availability"] == 1.0 and av.loc[6.0, "availability"] == 0.0
    assert av.attempts.sum() == 20
    calm = _one(a.fault_phases, phase="calm")
    fault = _one(a.fault_phases, phase="fault:kill")
    assert calm.acked == 16 and fault.acked == 1
    assert calm.p50_ms == pytest.approx(2.0) and fault.p99_ms == pytest.approx(500.0)
    w = _one(a.fault_windows, kind="kill")
    assert (w.start_s, w.end_s) == (4.5, 8.5)
    # Chaos rows stay out of the benchmark tables.
    assert "kill" not in set(a.throughput.scenario)
    assert len(a.throughput) == len(result.throughput)


def test_fault_report(chaos_result, tmp_path):
    report = analyze.write_report(chaos_result, tmp_path)
    text = report.read_text()
    assert "Faults: what the checker found per run" in text
    assert "bound method" not in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| kill | natsjs"))
    assert row.split(" | ")[4:8] == ["0", "0", "0", "0"]   # lost, everywhere, dup, divergent
    assert (tmp_path / "faults-kill.png").exists()
