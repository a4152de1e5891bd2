"""Flamegraphs of natsjs-server under natsbench load, with py-spy.

``python -m bench.profile --scenario pubsub`` (``make profile SCENARIO=pubsub``) starts the
scenario's topology of natsjs (``bench.servers``), samples node 0 with ``py-spy record``
while natsbench runs the scenario's load (``bench.scenarios``), and writes
``results/flame-<scenario>.svg``.

Two ways to hook py-spy in: ``--mode attach`` (default) starts the server normally and
attaches with ``--pid`` once it listens, so start-up is not in the profile; ``--mode spawn``
runs ``py-spy record -- natsjs-server ...`` and stops both with SIGINT.  ``--native`` (on by
default) unwinds C frames too, which is what shows time inside the Cython modules;
``--profile-build`` (``make profile PROFILE_BUILD=1``) profiles a copy of natsjs built with
``NATSJS_PROFILE=1`` in ``build/profile/`` (Cython's profiling hooks: ``.pyx`` file and line
names in the flamegraph), leaving the work tree's build alone.  py-spy needs ptrace on the target (root, or CAP_SYS_PTRACE in a container).

``--scenario ctl-subs`` and ``ctl-conns`` drive one server with bench/control.py's loads
instead (200,000 SUBs on one connection; 4,000 connections with CONNECT and 10 SUBs).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from . import scenarios as sc_mod
from .run import REPO, BenchResult, run_natsbench
from .servers import NATSJS, ServerKind, find_natsjs_cmd, running


def find_py_spy(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def profile_build(repo: Path, dest: Path, timeout: float = 900) -> tuple[str, ...]:
    """Build natsjs with ``NATSJS_PROFILE=1`` (Cython profile/linetrace hooks) in a copy at
    ``dest`` and return the command that runs that copy.

    Out of tree on purpose: an in-place rebuild would swap the instrumented, slower
    modules under everyone else using the work tree.  Sources are copied with their
    mtimes and generated files are not, so a second build only redoes what changed.
    """
    src = repo / "natsjs"
    for path in src.rglob("*"):
        if path.is_dir() or path.suffix in (".c", ".so", ".html", ".pyc") or "__pycache__" in path.parts:
            continue
        target = dest / path.relative_to(repo)
        if not target.exists() or target.stat().st_mtime < path.stat().st_mtime:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy2(repo / name, dest / name)
    env = {**os.environ, "NATSJS_PROFILE": "1"}
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest,
                         env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"NATSJS_PROFILE=1 build failed:\n{out.stderr[-3000:]}")
    # the copy must come first on sys.path, before the work tree that ``-m`` would put
    # there when started from the repository
    boot = (f"import runpy, sys; sys.path.insert(0, {str(dest)!r}); "
            "runpy.run_module('natsjs', run_name='__main__', alter_sys=True)")
    return (sys.executable, "-c", boot)


def spy_args(out: Path, rate: int, native: bool, fmt: str, nonblocking: bool) -> list[str]:
    args = ["record", "-o", str(out), "--rate", str(rate), "--format", fmt]
    if native and not nonblocking:  # py-spy cannot unwind native stacks without pausing
        args.append("--native")
    if nonblocking:
        args.append("--nonblocking")
    return args


class _Output:
    """Collects a child's output on a thread; ``ready`` is set when py-spy starts sampling."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append(line.rstrip())
            if "Sampling process" in line:
                self.ready.set()
        self.ready.set()  # EOF: py-spy is gone; the caller checks why

    def text(self) -> str:
        return "\n".join(self.lines[-20:])


CONTROL_LOADS = {"ctl-subs": "subscribe: 200k SUB on one connection",
                 "ctl-conns": "connection set-up: 4,000 x CONNECT + 10 SUB"}


def drive_control(name: str, url: str, runs: int) -> BenchResult:
    """bench/control.py's load ``name`` against the server at ``url``, ``runs`` times."""
    from . import control
    port = int(url.rsplit(":", 1)[1])
    rate = 0.0
    try:
        for _ in range(runs):
            if name == "ctl-subs":
                r = control.load_subs(port, os.getpid(), 200_000, 120.0)   # RSS: ours, unused
            else:
                r = control.load_conns(port, 4000, 10, 100, 120.0)
            rate = r["rate"]
    except (OSError, TimeoutError) as exc:
        return BenchResult({}, str(exc))
    return BenchResult({"msgs_per_sec": rate}, None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="pubsub")
    ap.add_argument("--scenario-file", default=None)
    ap.add_argument("--natsbench", default=None)
    ap.add_argument("--natsjs-cmd", default=None)
    ap.add_argument("--py-spy", default=None, help="py-spy binary (default: beside python, PATH)")
    ap.add_argument("--out", default=None, help="default results/flame-<scenario>.svg")
    ap.add_argument("--mode", choices=["attach", "spawn"], default="attach")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--format", default="flamegraph", choices=["flamegraph", "speedscope", "raw"])
    ap.add_argument("--no-native", action="store_true", help="Python frames only")
    ap.add_argument("--nonblocking", action="store_true",
                    help="do not pause the server while sampling (implies --no-native)")
    ap.add_argument("--runs", type=int, default=3,
                    help="natsbench runs while sampling, for enough samples (default 3)")
    ap.add_argument("--profile-build", action="store_true",
                    help="profile a NATSJS_PROFILE=1 build of natsjs, made in build/profile/")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("-n", type=int, default=None)
    args = ap.parse_args(argv)

    catalogue = sc_mod.load(args.scenario_file)
    control = args.scenario in CONTROL_LOADS
    if control:
        scenario = sc_mod.Scenario(args.scenario, CONTROL_LOADS[args.scenario], "control",
                                   catalogue.topologies["single"])
    else:
        scenario = catalogue.select([args.scenario])[0]
    natsbench = args.natsbench or shutil.which("natsbench")
    if not natsbench and not control:
        raise SystemExit("natsbench not found: pass --natsbench PATH (see bench/README.md)")
    py_spy = find_py_spy(args.py_spy)
    if not py_spy:
        raise SystemExit("py-spy not found: pip install py-spy")
    out = Path(args.out) if args.out else REPO / "results" / f"flame-{scenario.name}.svg"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    sargs = spy_args(out, args.rate, not args.no_native, args.format, args.nonblocking)
    if args.profile_build:
        natsjs = profile_build(REPO, REPO / "build" / "profile")
    else:
        natsjs = find_natsjs_cmd(args.natsjs_cmd)
    n = scenario.messages(args.quick, args.n)
    log_prefix = out.with_suffix("")

    def drive(urls: list[str]):
        """``--runs`` natsbench runs; the first failure, else the last result."""
        if control:
            return drive_control(args.scenario, urls[0], max(1, args.runs))
        for _ in range(max(1, args.runs)):
            res = run_natsbench(natsbench, scenario.natsbench_args(urls, n), scenario.timeout_s + 30)
            if res.error:
                break
        return res

    with tempfile.TemporaryDirectory(prefix="natsjs-profile-") as tmp:
        if args.mode == "spawn":
            kind = ServerKind(NATSJS, (py_spy, *sargs, "--", *natsjs))
            # SIGINT reaches py-spy and the server alike; py-spy writes its file once the
            # server has exited, so it gets time before SIGKILL
            with running(kind, scenario.topology, Path(tmp), log_prefix,
                         stop_signal=signal.SIGINT, stop_grace=60) as srv:
                res = drive(srv.urls)
            spy_text = Path(f"{log_prefix}-node0.log").read_text(errors="replace")
        else:
            with running(ServerKind(NATSJS, natsjs), scenario.topology, Path(tmp), log_prefix) as srv:
                spy = subprocess.Popen([py_spy, *sargs, "--pid", str(srv.pids[0])],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, text=True)
                try:
                    output = _Output(spy)
                    if not output.ready.wait(15) or spy.poll() is not None:
                        raise SystemExit(f"py-spy did not start sampling:\n{output.text()}")
                    res = drive(srv.urls)
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                finally:
                    if spy.poll() is None:
                        spy.kill()
                        spy.wait()
                spy_text = output.text()
    print(spy_text.strip().splitlines()[-1] if spy_text.strip() else "", file=sys.stderr)
    if res.error:
        print(f"natsbench: {res.error}", file=sys.stderr)
    else:
        print(f"{scenario.title}: {res.data.get('msgs_per_sec', 0):,.0f} msgs/s under the profiler",
              file=sys.stderr)
    if not out.exists() or out.stat().st_size == 0:
        print(f"no flamegraph written; py-spy said:\n{spy_text}", file=sys.stderr)
        return 1
    print(out)
    return 0 if not res.error else 1


if __name__ == "__main__":
    sys.exit(main())
