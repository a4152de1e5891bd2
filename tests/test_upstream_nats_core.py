"""The official nats-core client's own tests, unmodified, against natsjs (and nats-server).

nats.py's ``nats-core/tests/test_client.py`` is taken at test time from the nats-core
0.1.0 source distribution on PyPI (the later ones ship no tests), never from this
repository. It starts its servers through nats.py's ``nats.server`` harness, which is
not on PyPI; tests/upstream_harness/ is a stand-in with its interface (see its
docstring). ``nats-server`` on PATH is natsjs or the reference, and the same tests must
pass against both.

``test_cluster_reconnect_sequential_shutdown`` stops, one after another, the server its
client is on (SIGTERM, then waits for the process to exit) and only then starts
waiting for the client's reconnection: it passes only if the server closes its
client connections as the last thing before it exits (issue 20).

Needs Python 3.13 and PyPI (or the pip cache); skipped, saying why, otherwise.
"""
from __future__ import annotations

import pytest

from conftest import py313_with
from upstream import CACHE, run_pytest, sdist_root

NATS_CORE_WITH_TESTS = "nats-core==0.1.0"
UPSTREAM_VENV = CACHE / "upstream-venv"

UPSTREAM_TESTS = [
    "tests/test_client.py::test_cluster_reconnect_sequential_shutdown[3]",
    "tests/test_client.py::test_cluster_reconnect_sequential_shutdown[5]",
]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """(Python 3.13 with nats-core 0.1.0 and the tests' needs, the unpacked sdist)."""
    python = py313_with([NATS_CORE_WITH_TESTS, "nkeys", "pynacl", "pytest", "pytest-asyncio"],
                        "import nats.client, nkeys, nacl, pytest_asyncio", venv=UPSTREAM_VENV)
    root = sdist_root(python, "nats-core", "0.1.0", tmp_path_factory.mktemp("nats-core"))
    # test_client.py reads a user JWT and seed from tests/jwts/ when it is collected
    # (the parameters of its JWT tests), and the sdist leaves that folder out: without
    # files there the module cannot even be imported. The tests run here never use
    # them, so they only have to exist.
    jwts = root / "tests/jwts"
    jwts.mkdir(exist_ok=True)
    for name in ("foo-user.jwt", "foo-user.nk"):
        (jwts / name).write_text("not in the sdist; not used by the tests run here\n")
    return python, root


@pytest.mark.parametrize("kind", ["natsjs", "nats-server"])
def test_upstream_cluster_reconnect_sequential_shutdown(upstream, kind, tmp_path):
    python, root = upstream
    assert (root / "tests/test_client.py").exists(), "the sdist has no tests/test_client.py"
    code, text, _ = run_pytest(python, root, kind, tmp_path, UPSTREAM_TESTS, timeout=600)
    summary = [line for line in text.splitlines() if "Failed:" in line or "FAILED" in line]
    assert code == 0 and "2 passed" in text, "\n".join(summary + [text[-3000:]])
