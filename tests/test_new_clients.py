"""JetStream and key-value through PyPI's newer clients (nats-jetstream, nats-key-value
on nats-core; Python 3.13), the same steps against natsjs and nats-server
(tests/newclients_js.py).  The clients' strict mode refuses any field of an API answer
they do not model, which checks natsjs's JSON field by field: on one server both
servers pass it.  In a cluster nats-server's replica entries carry a ``peer`` field
(2.11+) these client versions do not model, so there natsjs must fail strict mode exactly
where the reference does, and pass every step otherwise."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import start_natsjs, start_reference
from jscluster import JSCluster

HERE = Path(__file__).parent


def run_steps(python: str, url: str, replicas: int, mode: str = "strict") -> dict:
    out = subprocess.run([python, str(HERE / "newclients_js.py"), url, str(replicas), mode],
                         capture_output=True, text=True, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-2000:]
    return json.loads(lines[-1])


def assert_all_ok(result: dict, what: str) -> None:
    failed = {k: v for k, v in result["steps"].items() if v != "ok"}
    assert not failed, "%s: %s\n%s" % (what, failed, result["facts"].get("tracebacks"))


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_one_server_in_strict_mode(nats_jetstream_python, tmp_path, kind):
    start = start_natsjs if kind == "natsjs" else start_reference
    server = start("-js", "-sd", str(tmp_path))
    try:
        result = run_steps(nats_jetstream_python, server.url, 1)
    finally:
        server.stop()
    assert_all_ok(result, kind)
    # the bucket: three values of k, one of other and its delete marker
    assert result["facts"]["replicas"] == 1 and result["facts"]["kv_values"] == 5


def test_three_servers_r3(nats_jetstream_python, tmp_path):
    results = {}
    for kind in ("natsjs", "reference"):
        (tmp_path / kind).mkdir()
        with JSCluster(tmp_path / kind, 3, reference=kind == "reference").start() as cluster:
            results[kind] = run_steps(nats_jetstream_python, cluster.url(0), 3)
            if kind == "natsjs":
                lenient = run_steps(nats_jetstream_python, cluster.url(0), 3, "lenient")
                names = {cluster.name(i) for i in range(3)}
    assert results["natsjs"]["steps"] == results["reference"]["steps"]
    assert_all_ok(lenient, "natsjs, lenient")
    facts = lenient["facts"]
    assert facts["replicas"] == 3 and facts["leader"] in names and facts["kv_values"] == 5
    assert set(facts["replicas_seen"]) == names - {facts["leader"]}
