"""Message schedules (``allow_msg_schedules``, ``Nats-Schedule``), natsjs against nats-server.

Each scenario sends the same requests to a fresh natsjs and a fresh nats-server (the
reference binary) through tests/jsdiff.py and compares the normalized transcripts: the
configurations refused and accepted, every refusal of a schedule's headers (pattern,
time zone, target, source, TTL, rollup, scheduler, schedules disabled), the schedule as
stored (with the ``Nats-Rollup: sub`` the server adds), and the message each kind of
schedule publishes (``@at``, ``@every``, with a source, a TTL, a rollup), with the
headers nats-server sets (``Nats-Scheduler``, ``Nats-Schedule-Next``) and the schedule
purged, moved on or cancelled.  Times inside headers are compared as ``<time>``.

A schedule due while its server is down fires after the restart; on an R3 stream a
schedule fires once, from the leader, and every replica stores what it sent.
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import re
import sys

import nats
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import conftest  # noqa: E402
import jsdiff  # noqa: E402
from jscluster import JSCluster, answers_on_both  # noqa: E402
from jsdiff import API, Scenario, add_stream, api, compare, registry, run_scenario  # noqa: E402

SCENARIOS: dict[str, Scenario] = {}
scenario = registry(SCENARIOS)

PAST = "@at 2020-01-01T00:00:00Z"
FUTURE = "@at 2099-01-01T00:00:00Z"


def _at(seconds: float) -> str:
    t = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return "@at " + t.strftime("%Y-%m-%dT%H:%M:%SZ")


async def sched(s, subject: str, pattern: str, target: str | None = None, data=b"",
                note: str | None = None, **headers):
    hdrs = {"Nats-Schedule": pattern, **headers}
    if target is not None:
        hdrs["Nats-Schedule-Target"] = target
    return await s.request(subject, data, headers=hdrs, note=note)


async def last(s, stream: str, subject: str, note: str | None = None):
    return await api(s, "STREAM.MSG.GET." + stream, {"last_by_subj": subject}, note=note)


async def wait_last(s, stream: str, subject: str, note: str, want=lambda m: True):
    def done(r):
        m = (r.json or {}).get("message")
        return m is not None and want(m)
    return await s.poll(API + "STREAM.MSG.GET." + stream, {"last_by_subj": subject},
                        until=done, timeout=10, note=note)


# -- scenarios -----------------------------------------------------------------------------

@scenario
async def schedule_config(s):
    """Which configurations may allow schedules; roll-ups come with them; an update may
    turn them on but not off."""
    await add_stream(s, "S", subjects=["s.>"], allow_msg_schedules=True, note="schedules")
    await add_stream(s, "P", subjects=["p"], allow_msg_schedules=True, pedantic=True,
                     note="pedantic without roll-ups")
    await add_stream(s, "DN", subjects=["dn"], allow_msg_schedules=True, discard="new",
                     note="discard new")
    await add_stream(s, "DP", subjects=["dp"], allow_msg_schedules=True, deny_purge=True,
                     note="deny purge")
    await add_stream(s, "M", mirror={"name": "S"}, allow_msg_schedules=True, note="a mirror")
    await add_stream(s, "SRC", subjects=["src"], sources=[{"name": "S"}],
                     allow_msg_schedules=True, note="a source")
    await add_stream(s, "MEM", subjects=["mem"], allow_msg_schedules=True, storage="memory",
                     allow_msg_ttl=True, note="memory, with TTLs")
    await api(s, "STREAM.UPDATE.S", {"name": "S", "subjects": ["s.>"]},
              note="turning schedules off")
    await add_stream(s, "N", subjects=["n"])
    await api(s, "STREAM.UPDATE.N", {"name": "N", "subjects": ["n"],
                                     "allow_msg_schedules": True},
              note="turning schedules on")


@scenario
async def schedule_refusals(s):
    """What a stream refuses of scheduling headers, with and without schedules."""
    await add_stream(s, "S", subjects=["s.>", "t.*"], allow_msg_schedules=True)
    await add_stream(s, "TTL", subjects=["ttl.>"], allow_msg_schedules=True,
                     allow_msg_ttl=True)
    await add_stream(s, "OFF", subjects=["off.>"], allow_rollup_hdrs=True)
    for pattern in ["@at nope", "@at 2030-01-01", "@at 2030-01-01T00:00:00", "@every 500ms",
                    "@every x", "@every", "@sometimes", "* * * * *", "61 * * * * *",
                    "* * * * * * *", "0 0 0 30 2 *", "@at  2030-01-01T00:00:00Z"]:
        await sched(s, "s.a", pattern, "t.a", note="pattern %r" % pattern)
    await sched(s, "s.a", "", "t.a", note="an empty pattern: no schedule")
    await sched(s, "s.a", PAST, None, note="no target")
    await sched(s, "s.a", PAST, "s.a", note="the target is the schedule's subject")
    await sched(s, "s.a", PAST, "t.*", note="a wildcard target")
    await sched(s, "s.a", PAST, "x.y", note="a target outside the stream")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Schedule-Source": "t.a"},
                note="the source is the target")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Schedule-Source": "s.a"},
                note="the source is the schedule's subject")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Schedule-Source": "x.y"},
                note="a source outside the stream")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Schedule-TTL": "5s"},
                note="a TTL on a stream without TTLs")
    await sched(s, "ttl.a", PAST, "ttl.b", **{"Nats-Schedule-TTL": "nope"},
                note="an invalid TTL")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Schedule-Rollup": "all"},
                note="a schedule rollup other than sub")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Rollup": "all"},
                note="a message rollup other than sub")
    await sched(s, "s.a", PAST, "t.a", **{"Nats-Schedule-Time-Zone": "Europe/Amsterdam"},
                note="a time zone with @at")
    await sched(s, "s.a", "0 0 9 * * *", "t.a", **{"Nats-Schedule-Time-Zone": "Mars/Base"},
                note="an unknown time zone")
    await sched(s, "s.a", "0 0 9 * * *", "t.a", **{"Nats-Schedule-Time-Zone": ""},
                note="an empty time zone")
    await s.request("s.b", b"x", headers={"Nats-Schedule-Time-Zone": "Mars/Base"},
                    note="a bad time zone without a schedule")
    await s.request("s.b", b"x", headers={"Nats-Scheduler": "s.a"},
                    note="Nats-Scheduler alone")
    await s.request("s.b", b"x", headers={"Nats-Schedule-Next": "2030-01-01T00:00:00Z",
                                           "Nats-Scheduler": "s.a"},
                    note="a client's Nats-Schedule-Next time")
    await s.request("s.b", b"x", headers={"Nats-Schedule-Next": "purge"},
                    note="a purge without a scheduler")
    await s.request("s.b", b"x", headers={"Nats-Schedule-Next": "purge",
                                           "Nats-Scheduler": "s.b"},
                    note="a purge of its own subject")
    await s.request("s.c", b"plain", note="a plain message")
    await s.request("s.b", b"x", headers={"Nats-Schedule-Next": "purge",
                                           "Nats-Scheduler": "s.c"},
                    note="a purge of a subject holding no schedule")
    await s.request("s.b", b"x", headers={"Nats-Schedule-Next": "purge",
                                           "Nats-Scheduler": "s.none"},
                    note="a purge of an empty subject")
    await sched(s, "off.a", PAST, "off.b", note="schedules disabled")
    await sched(s, "off.a", "@at nope", "off.b", note="schedules disabled, a bad pattern")
    await s.request("off.b", b"x", headers={"Nats-Schedule-Next": "purge",
                                             "Nats-Scheduler": "off.a"},
                    note="a purge, schedules disabled")
    await sched(s, "s.d", "@hourly", "t.a", note="@hourly: accepted")
    await sched(s, "s.e", "0 30 9 * * mon-fri", "t.a",
                **{"Nats-Schedule-Time-Zone": "America/New_York"}, note="cron in a time zone")
    await api(s, "STREAM.INFO.S", {"subjects_filter": ">"})


@scenario
async def schedule_at_fires(s):
    """A one-off schedule due now: its message goes to the target with the scheduler's
    headers (message id, TTL, expected-* and rollup headers dropped), and the schedule
    is purged; a TTL and a rollup of the schedule's own go along."""
    await add_stream(s, "S", subjects=["s.>", "t.>"], allow_msg_schedules=True,
                     allow_msg_ttl=True)
    await sched(s, "s.a", PAST, "t.a", data=b"payload", note="due at once",
                **{"X-Keep": "kept", "Nats-Msg-Id": "m1", "Nats-Expected-Last-Sequence": "0"})
    await wait_last(s, "S", "t.a", "the scheduled message")
    await last(s, "S", "s.a", note="the schedule is gone")
    await s.request("t.b", b"old", note="something the rollup removes")
    await sched(s, "s.b", PAST, "t.b", data=b"new", note="with a TTL and a rollup",
                **{"Nats-Schedule-TTL": "1h", "Nats-Schedule-Rollup": "sub"})
    await wait_last(s, "S", "t.b", "rolled up, with a TTL",
                    want=lambda m: base64.b64decode(m.get("data", "")) == b"new")
    await api(s, "STREAM.MSG.GET.S", {"seq": 4}, note="the old message rolled up")
    await api(s, "STREAM.INFO.S", {"subjects_filter": ">"})


@scenario
async def schedule_replaced_and_cancelled(s):
    """A newer schedule of the same subject replaces the older one (roll-up); a client
    cancels a schedule with Nats-Schedule-Next: purge; a plain message ends one."""
    await add_stream(s, "S", subjects=["s.>", "t.>"], allow_msg_schedules=True)
    await sched(s, "s.a", FUTURE, "t.a", data=b"first")
    await sched(s, "s.a", FUTURE, "t.a", data=b"second", note="replaces the first")
    await api(s, "STREAM.INFO.S", {"subjects_filter": ">"})
    await s.request("t.x", b"", headers={"Nats-Schedule-Next": "purge",
                                          "Nats-Scheduler": "s.a"},
                    note="cancel it")
    await last(s, "S", "s.a", note="purged")
    await api(s, "STREAM.INFO.S", {"subjects_filter": ">"})


@scenario
async def schedule_every(s):
    """A repeating schedule publishes again and again, each with the time it comes back
    (Nats-Schedule-Next); the schedule stays; a source's last message is what goes."""
    await add_stream(s, "S", subjects=["s.>", "t.>", "src.>"], allow_msg_schedules=True)
    await s.request("src.a", b"from the source", headers={"X-Src": "1"})
    await sched(s, "s.a", "@every 1s", "t.a", data=b"tick")
    await sched(s, "s.b", "@every 1s", "t.b", data=b"own",
                **{"Nats-Schedule-Source": "src.a"}, note="with a source")
    await sched(s, "s.c", "@every 1s", "t.c", data=b"own",
                **{"Nats-Schedule-Source": "src.none"}, note="a source without messages")
    await wait_last(s, "S", "t.a", "a tick")
    await wait_last(s, "S", "t.b", "the source's message")
    await wait_last(s, "S", "t.c", "the schedule's own payload")
    await last(s, "S", "s.a", note="the schedule stays")
    await s.request("t.x", b"", headers={"Nats-Schedule-Next": "purge",
                                          "Nats-Scheduler": "s.a"}, note="cancel")
    await last(s, "S", "s.a", note="gone")


# -- the tests -----------------------------------------------------------------------------

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


def readable(obj):
    """Stored messages' ``hdrs`` as text, with times as ``<time>``; stream states'
    counts of a schedule's ticks left alone (they depend on timing): ``data`` kept."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "hdrs" and isinstance(v, str):
                v = _TIME.sub("<time>", base64.b64decode(v).decode("utf-8", "replace"))
            out[k] = readable(v)
        return out
    if isinstance(obj, list):
        return [readable(v) for v in obj]
    return obj


TIMING = {"schedule_every"}     # seq numbers and counts there depend on ticks


def _untimed(transcript: dict) -> dict:
    """For scenarios with repeating schedules: sequences and counts go."""
    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()
                    if k not in ("seq", "messages", "bytes", "last_seq", "first_seq",
                                 "num_subjects", "subjects", "num_deleted", "state", "time")}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj
    return strip(transcript)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_natsjs_matches_reference(name):
    expected = readable(run_scenario(SCENARIOS[name], "reference"))
    actual = readable(run_scenario(SCENARIOS[name], "natsjs"))
    assert any(step.get("reply") for step in expected["steps"])
    expected, actual = jsdiff.checked(expected), jsdiff.checked(actual)
    if name in TIMING:
        expected, actual = _untimed(expected), _untimed(actual)
    diffs = compare(expected, actual)
    assert not diffs, "%d differences (reference != natsjs):\n%s" % (len(diffs),
                                                                    "\n".join(diffs[:60]))


# -- a restart, and a replicated stream ------------------------------------------------------

async def _connect(url: str):
    for _ in range(50):
        try:
            return await nats.connect(url)
        except (OSError, nats.errors.NoServersError):
            await asyncio.sleep(0.1)    # the server starting, not a synchronisation
    raise TimeoutError("no server at %s" % url)


async def _last_on(nc, stream: str, subject: str, timeout: float = 15):
    """The last message of ``subject`` once there is one (None after ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        msg = await nc.request(API + "STREAM.MSG.GET." + stream,
                               json.dumps({"last_by_subj": subject}).encode(), timeout=5)
        reply = json.loads(msg.data)
        if "message" in reply:
            return readable(reply["message"])
        await asyncio.sleep(0.1)    # the schedule firing on its own clock
    return None


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_schedule_due_while_down_fires_after_restart(tmp_path, kind):
    """A schedule stored, its server stopped until after it was due: it fires once the
    server is back (from what the store holds), and is purged."""
    start = conftest.start_reference if kind == "reference" else conftest.start_natsjs
    args = ("-js", "-sd", str(tmp_path))

    async def before(url):
        nc = await _connect(url)
        await nc.request(API + "STREAM.CREATE.S", json.dumps({
            "name": "S", "subjects": ["s.>", "t.>"], "allow_msg_schedules": True}).encode(),
            timeout=5)
        ack = json.loads((await nc.request("s.a", b"later", headers={
            "Nats-Schedule": _at(2), "Nats-Schedule-Target": "t.a"}, timeout=5)).data)
        await nc.close()
        return ack

    async def after(url):
        nc = await _connect(url)
        fired = await _last_on(nc, "S", "t.a")
        gone = json.loads((await nc.request(API + "STREAM.MSG.GET.S", json.dumps(
            {"last_by_subj": "s.a"}).encode(), timeout=5)).data)
        await nc.close()
        return fired, gone

    server = start(*args)
    try:
        assert asyncio.run(before(server.url)) == {"stream": "S", "seq": 1}
    finally:
        server.stop()
    asyncio.run(asyncio.sleep(3))    # the schedule falls due while no server runs
    server = start(*args)
    try:
        fired, gone = asyncio.run(after(server.url))
    finally:
        server.stop()
    assert fired is not None and fired["data"] == base64.b64encode(b"later").decode()
    assert fired["hdrs"] == "NATS/1.0\r\nNats-Scheduler: s.a\r\nNats-Schedule-Next: purge\r\n\r\n"
    assert gone["error"]["err_code"] == 10037


async def _r3_answers(cluster: JSCluster) -> list:
    """An R3 stream: a one-off schedule fires exactly once (one message on its target),
    a repeating one keeps firing and is cancelled; each server's own copy (direct get
    from every replica is not asked: each server is asked through its own connection
    after the leader steps down) agrees."""
    nc = await nats.connect([cluster.url(j) for j in range(3)])
    out = []
    for _ in range(5):
        try:
            r = await nc.request(API + "STREAM.CREATE.S", json.dumps({
                "name": "S", "subjects": ["s.>", "t.>"], "num_replicas": 3,
                "allow_msg_schedules": True}).encode(), timeout=10)
            break
        except nats.errors.TimeoutError:
            continue
    assert "error" not in json.loads(r.data)
    for subject, pattern, target in [("s.a", PAST, "t.a"), ("s.b", "@every 1s", "t.b")]:
        msg = await nc.request(subject, b"x", headers={"Nats-Schedule": pattern,
                                                       "Nats-Schedule-Target": target},
                               timeout=10)
        out.append(json.loads(msg.data))
    out.append(await _last_on(nc, "S", "t.a"))
    tick = await _last_on(nc, "S", "t.b")
    out.append(tick and tick["hdrs"])
    # Another leader takes over the repeating schedule.
    await nc.request(API + "STREAM.LEADER.STEPDOWN.S", b"", timeout=10)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    seen = tick["seq"]
    while loop.time() < deadline:
        try:
            m = await nc.request(API + "STREAM.MSG.GET.S",
                                 json.dumps({"last_by_subj": "t.b"}).encode(), timeout=5)
            got = json.loads(m.data).get("message")
            if got and got["seq"] > seen + 2:
                break
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass
        await asyncio.sleep(0.2)    # ticks on the schedule's own clock
    else:
        raise AssertionError("the new leader never fired the repeating schedule")
    for _ in range(20):
        try:
            msg = await nc.request("t.x", b"", headers={"Nats-Schedule-Next": "purge",
                                                        "Nats-Scheduler": "s.b"}, timeout=5)
            out.append(json.loads(msg.data).get("error"))
            break
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            await asyncio.sleep(0.2)    # waiting for the election, not a synchronisation
    info = json.loads((await nc.request(API + "STREAM.INFO.S", json.dumps(
        {"subjects_filter": "t.a"}).encode(), timeout=10)).data)
    out.append(info["state"].get("subjects"))
    await nc.close()
    return out


def test_r3_schedules_match_reference(tmp_path):
    answers = answers_on_both(tmp_path, _r3_answers)
    assert answers["natsjs"][-1] == {"t.a": 1}, "a one-off schedule fired more than once"
    diffs = compare(_untimed(answers["reference"]), _untimed(answers["natsjs"]))
    assert not diffs, "\n".join(diffs)
