"""The nats-jetstream and nats-key-value clients' own test suites, unmodified, against
natsjs and against nats-server: natsjs must have the reference's results.

The suites come from the clients' sdists on PyPI at test time (nats-jetstream 0.1.0 and
nats-key-value 0.1.0; later nats-jetstream sdists ship no tests): 222 tests of streams,
consumers (pull, ordered, priority groups, pause), publishing and messages, and 63 of the
key-value store. Each suite runs in full against the reference first, then against natsjs.
A test natsjs fails (or skips) that passed against the reference is run once more, alone,
against both: it counts against natsjs unless it then passes there or fails against the
reference too (upstream tests with timing assertions, such as
``test_publish_custom_retry_attempts``, can fail on a loaded machine against either).
A test that fails against the reference (``test_keys_filtered`` in nats-key-value 0.1.0
expects a key filter the server is not sent) may fail against natsjs too.

Their ``conftest.py`` is not in the sdists; tests/upstream_harness/upstream_js_fixtures.py
gives the fixtures (server, client, jetstream) in its place, and nats.server there starts
the ``nats-server`` on PATH. Needs Python 3.13 and PyPI (or the pip cache); skipped,
saying why, otherwise.
"""
from __future__ import annotations

import pytest

from upstream import run_pytest, sdist_root, upstream_python

SUITES = {
    # suite: (packages for its virtualenv, imports that must work, venv, sdist, version)
    "nats-jetstream": (["nats-core", "nats-jetstream==0.1.0", "nkeys"],
                       "import nats.client, nats.jetstream, nkeys",
                       "upstream-js-venv", "nats-jetstream", "0.1.0"),
    # nats-key-value 0.1.0 needs a later nats-jetstream than 0.1.0 (OrderedConsumerConfig).
    "nats-key-value": (["nats-core", "nats-jetstream", "nats-key-value==0.1.0", "nkeys"],
                       "import nats.client, nats.key_value, nkeys",
                       "upstream-kv-venv", "nats-key-value", "0.1.0"),
}


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_upstream_suite_has_the_references_results(suite, tmp_path):
    packages, imports, venv, project, version = SUITES[suite]
    python = upstream_python(packages, imports, venv)
    root = sdist_root(python, project, version, tmp_path / "src")
    assert (root / "tests").is_dir(), "the %s sdist has no tests/" % project
    plugin = ["-p", "upstream_js_fixtures", "tests"]
    _, ref_text, ref = run_pytest(python, root, "nats-server", tmp_path, plugin)
    assert len(ref) > 50, "the suite did not run against nats-server:\n" + ref_text[-3000:]
    _, js_text, js = run_pytest(python, root, "natsjs", tmp_path, plugin)
    assert set(js) == set(ref), "natsjs ran other tests:\n" + js_text[-3000:]

    worse = sorted(t for t in ref if ref[t] == "passed" and js[t] != "passed")
    if worse:
        _, _, js_again = run_pytest(python, root, "natsjs", tmp_path, worse)
        _, _, ref_again = run_pytest(python, root, "nats-server", tmp_path, worse)
        for t in worse:
            print("%s: natsjs %s, then %s; nats-server then %s"
                  % (t, js[t], js_again.get(t), ref_again.get(t)))
        worse = [t for t in worse
                 if js_again.get(t) != "passed" and ref_again.get(t) == "passed"]
    assert not worse, ("passed against nats-server, not against natsjs: %s\n%s"
                       % (", ".join("%s (%s)" % (t, js[t]) for t in worse), js_text[-4000:]))
    passed = sum(1 for o in js.values() if o == "passed")
    print("%s: natsjs %d passed of %d; nats-server %d" % (
        suite, passed, len(js), sum(1 for o in ref.values() if o == "passed")))
