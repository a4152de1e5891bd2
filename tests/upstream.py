"""Running an official client's own tests, unmodified, against natsjs and nats-server.

The tests come from the client's source distribution on PyPI, fetched at test time
(never kept in this repository), and run in a Python 3.13 virtualenv of their own with
``nats-server`` on PATH pointing at natsjs (this checkout, this interpreter) or at the
reference. Used by tests/test_upstream_nats_core.py and tests/test_upstream_jetstream.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import py313_with, reference_server_binary

CACHE = Path.home() / ".cache/natsjs-nats-core"
HARNESS = Path(__file__).parent / "upstream_harness"
REPO = Path(__file__).resolve().parent.parent


def sdist_root(python: str, project: str, version: str, dest: Path) -> Path:
    """``project``'s sdist of ``version`` unpacked under ``dest`` (its root folder), or
    a skip saying why it could not be had."""
    sdists = CACHE / "sdist"
    stem = "%s-%s" % (project.replace("-", "_"), version)
    found = sorted(sdists.glob(stem + ".tar.gz"))
    if not found:
        got = subprocess.run(
            [python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", project,
             "%s==%s" % (project, version), "-d", str(sdists)],
            capture_output=True, timeout=300)
        found = sorted(sdists.glob(stem + ".tar.gz"))
        if got.returncode != 0 or not found:
            pytest.skip("could not download the %s %s sdist: %s"
                        % (project, version, got.stderr.decode(errors="replace")[-300:]))
    with tarfile.open(found[0]) as tar:
        tar.extractall(dest, filter="data")
    return dest / stem


def upstream_python(packages: list[str], imports: str, venv: str) -> str:
    """Python 3.13 in the cached virtualenv ``venv`` with ``packages`` and pytest."""
    return py313_with(packages + ["pytest", "pytest-asyncio"],
                      imports + ", pytest_asyncio", venv=CACHE / venv)


def nats_server_on_path(bindir: Path, kind: str) -> None:
    """``bindir/nats-server``: natsjs (this checkout, this interpreter) or the reference."""
    bindir.mkdir()
    target = bindir / "nats-server"
    if kind == "natsjs":
        target.write_text("#!/bin/sh\nexec %s -m natsjs \"$@\"\n" % sys.executable)
        target.chmod(0o755)
    else:
        target.symlink_to(reference_server_binary())


def run_pytest(python: str, root: Path, kind: str, tmp: Path, args: list[str],
               timeout: float = 1200) -> tuple[int, str, dict[str, str]]:
    """Run the upstream tests ``args`` from the sdist's ``root`` (its pyproject's pytest
    settings apply) against ``kind``: (exit status, output, outcome of each test id:
    "passed", "failed", "error" or "skipped: <reason>")."""
    bindir = tmp / ("bin-%s" % kind)
    if not bindir.exists():
        nats_server_on_path(bindir, kind)
    report = tmp / ("junit-%s-%d.xml" % (kind, len(list(tmp.glob("junit-*")))))
    env = dict(os.environ,
               PATH="%s:%s" % (bindir, os.environ.get("PATH", "")),
               PYTHONPATH=os.pathsep.join([str(HARNESS), str(REPO)]))
    out = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "--rootdir", str(root), "--junitxml", str(report), *args],
                         cwd=root, env=env, capture_output=True, timeout=timeout)
    text = out.stdout.decode(errors="replace") + out.stderr.decode(errors="replace")
    return out.returncode, text, outcomes(report) if report.exists() else {}


def outcomes(report: Path) -> dict[str, str]:
    """Each test case of a JUnit XML report: "<file>::<name>" -> its outcome."""
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = "skipped: %s" % child.get("message", "")
        result["%s::%s" % (path, case.get("name"))] = outcome
    return result
