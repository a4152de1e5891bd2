"""Priority groups (ADR-42) and consumer pause, natsjs against nats-server.

Each scenario sends the same requests to a fresh natsjs and a fresh nats-server (the
reference binary) through tests/jsdiff.py and compares the normalized transcripts:
the configurations refused and accepted, pull requests with ``group``, ``min_pending``,
``min_ack_pending``, ``id`` and ``priority`` and the statuses they hear, the
``Nats-Pin-Id`` of delivered messages, ``$JS.API.CONSUMER.UNPIN`` with its errors, the
pinned/unpinned and pause advisories, and consumer info's ``priority_groups`` and
``paused`` state.  Pin ids are NUIDs, which the harness numbers by first appearance, so
"the same pin again" and "a new pin" are both checked.

The replicated tests run R1 and R3 consumers on clusters of three natsjs servers and of
three nats-servers and compare what a client sees: pins live with the consumer's
leader, and a new leader starts unpinned.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime, timedelta, timezone

import nats
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsdiff  # noqa: E402
from jscluster import JSCluster  # noqa: E402
from jsdiff import Scenario, compare, run_scenario  # noqa: E402

API = "$JS.API."
NEXT = API + "CONSUMER.MSG.NEXT.S."
ADV = "$JS.EVENT.ADVISORY.CONSUMER."
SCENARIOS: dict[str, Scenario] = {}
MS = 1_000_000


def scenario(fn):
    SCENARIOS[fn.__name__] = Scenario(fn.__name__, fn, (fn.__doc__ or "").strip())
    return fn


def api(s, what: str, body=None, **kw):
    return s.request(API + what, body, **kw)


def later(seconds: float) -> str:
    """An RFC 3339 time ``seconds`` from now (UTC), as clients write pause_until."""
    t = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def stream_with(s, n: int):
    await api(s, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"]})
    for i in range(n):
        await s.request("s.%d" % i, b"m%d" % i)


async def consumer(s, name: str, note: str | None = None, **cfg):
    return await api(s, "CONSUMER.CREATE.S." + name,
                     {"stream_name": "S", "config": {"durable_name": name,
                                                     "ack_policy": "explicit", **cfg}},
                     note=note)


async def wait_waiting(s, name: str, n: int):
    """Until the consumer holds ``n`` pull requests (they were queued)."""
    await s.poll(API + "CONSUMER.INFO.S." + name,
                 until=lambda r: (r.json or {}).get("num_waiting") == n)


# -- scenarios -----------------------------------------------------------------------------

@scenario
async def priority_config(s):
    """Which priority group configurations are refused, with which errors, and what an
    accepted one looks like (the pinned TTL's default)."""
    await stream_with(s, 0)
    await consumer(s, "PUSH", deliver_subject="d", priority_policy="overflow",
                   priority_groups=["A"], note="push")
    await consumer(s, "NOG", priority_policy="overflow", note="no groups")
    await consumer(s, "EMPTY", priority_policy="overflow", priority_groups=[""],
                   note="empty group name")
    await consumer(s, "BADNAME", priority_policy="overflow", priority_groups=["a b"],
                   note="bad group name")
    await consumer(s, "LONG", priority_policy="overflow", priority_groups=["A" * 17],
                   note="group name too long")
    await consumer(s, "NONE", priority_groups=["A"], note="groups without a policy")
    await consumer(s, "TTL", priority_timeout=5_000 * MS, note="a TTL without a policy")
    await consumer(s, "UNK", priority_policy="bogus", priority_groups=["A"],
                   note="unknown policy")
    await consumer(s, "NEG", priority_policy="pinned_client", priority_groups=["A"],
                   priority_timeout=-1, note="negative TTL")
    await consumer(s, "OV", priority_policy="overflow", priority_groups=["A", "b-2/=_"],
                   note="overflow")
    await consumer(s, "PIN", priority_policy="pinned_client", priority_groups=["A"],
                   note="pinned, default TTL")
    await consumer(s, "PIN5", priority_policy="pinned_client", priority_groups=["A"],
                   priority_timeout=5_000 * MS, note="pinned, 5s")
    await consumer(s, "PRI", priority_policy="prioritized", priority_groups=["A"],
                   note="prioritized")
    await consumer(s, "OVTTL", priority_policy="overflow", priority_groups=["A"],
                   priority_timeout=5_000 * MS, note="overflow with a TTL")
    await api(s, "CONSUMER.INFO.S.PIN")


@scenario
async def priority_update(s):
    """Priority settings change on update: another policy, other groups, a TTL; a pin
    taken before the change."""
    await stream_with(s, 3)
    await consumer(s, "C", priority_policy="pinned_client", priority_groups=["A"])
    await s.requests(NEXT + "C", {"batch": 1, "group": "A", "expires": 1000 * MS}, count=1,
                     note="pins")
    await consumer(s, "C", priority_policy="pinned_client", priority_groups=["A", "B"],
                   priority_timeout=10_000 * MS, note="another group, a TTL")
    await consumer(s, "C", priority_policy="overflow", priority_groups=["B"],
                   note="overflow")
    await s.requests(NEXT + "C", {"batch": 1, "group": "B", "expires": 1000 * MS}, count=1,
                     note="overflow pull")
    await consumer(s, "C", note="no policy")
    await s.requests(NEXT + "C", {"batch": 1, "group": "B", "expires": 1000 * MS}, count=1,
                     note="a group, no policy")


@scenario
async def pull_request_checks(s):
    """Pull requests whose priority fields a consumer refuses (400), by policy."""
    await stream_with(s, 1)
    await consumer(s, "PLAIN")
    await consumer(s, "OV", priority_policy="overflow", priority_groups=["A"])
    await consumer(s, "PIN", priority_policy="pinned_client", priority_groups=["A"])
    await consumer(s, "PRI", priority_policy="prioritized", priority_groups=["A"])
    for name in ("PLAIN", "OV", "PIN", "PRI"):
        for body in ({"batch": 1, "min_pending": 1}, {"batch": 1, "min_ack_pending": 1},
                     {"batch": 1, "id": "X"}, {"batch": 1, "priority": 10},
                     {"batch": 1, "priority": -1}, {"batch": 1},
                     {"batch": 1, "group": "B"}, {"batch": 1, "group": "A", "priority": 9,
                                                  "no_wait": True}):
            await s.requests(NEXT + name, body, count=2, timeout=1.0, note=name)


@scenario
async def overflow(s):
    """min_pending and min_ack_pending: a request waits until one is reached."""
    await stream_with(s, 5)
    await consumer(s, "OV", priority_policy="overflow", priority_groups=["A"])
    await s.requests(NEXT + "OV", {"batch": 1, "group": "A", "min_pending": 10,
                                   "expires": 300 * MS}, count=2, note="too few pending")
    await s.requests(NEXT + "OV", {"batch": 5, "group": "A", "min_pending": 3,
                                   "expires": 500 * MS}, count=6, note="until 3 pending")
    await s.requests(NEXT + "OV", {"batch": 1, "group": "A", "min_ack_pending": 4,
                                   "expires": 300 * MS}, count=2, note="3 unacknowledged")
    await s.requests(NEXT + "OV", {"batch": 1, "group": "A", "min_ack_pending": 3,
                                   "min_pending": 100, "expires": 300 * MS}, count=2,
                     note="either minimum")
    await s.requests(NEXT + "OV", {"batch": 1, "group": "A", "min_pending": 100,
                                   "no_wait": True}, count=2, note="no_wait, too few")
    await s.requests(NEXT + "OV", {"batch": 1, "group": "A", "expires": 300 * MS}, count=2,
                     note="no minimum")
    await api(s, "CONSUMER.INFO.S.OV")


@scenario
async def pinned_client(s):
    """The first request pins the group; others wait or hear 423; unpinning (with its
    errors) lets the next request pin anew, and the old id hears 423."""
    await stream_with(s, 6)
    pinned = await s.subscribe(ADV + "PINNED.S.PIN")
    unpinned = await s.subscribe(ADV + "UNPINNED.S.PIN")
    await consumer(s, "PIN", priority_policy="pinned_client", priority_groups=["A"])
    await api(s, "CONSUMER.INFO.S.PIN", note="nothing pinned")
    got = await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1000 * MS},
                           count=1, note="pins")
    pin = got[0].header("Nats-Pin-Id") if got else ""
    await s.collect(pinned, 1, note="pinned advisory")
    await api(s, "CONSUMER.INFO.S.PIN", note="pinned")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 300 * MS},
                     count=2, note="another client waits")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "id": "WRONG",
                                    "expires": 300 * MS}, count=2, note="a wrong id")
    await s.requests(NEXT + "PIN", {"batch": 2, "group": "A", "id": pin,
                                    "expires": 1000 * MS}, count=2, note="the pinned client")
    for body, note in ((None, "empty"), ({}, "no group"), ({"group": "a b"}, "bad name"),
                       ({"group": "B"}, "unknown group"), ("{bad", "bad JSON")):
        await api(s, "CONSUMER.UNPIN.S.PIN", body, note=note)
    await api(s, "CONSUMER.UNPIN.S.NOPE", {"group": "A"}, note="no such consumer")
    await api(s, "CONSUMER.UNPIN.NOPE.PIN", {"group": "A"}, note="no such stream")
    await api(s, "CONSUMER.UNPIN.S.PIN", {"group": "A"}, note="unpins")
    await s.collect(unpinned, 1, note="unpinned advisory")
    await api(s, "CONSUMER.INFO.S.PIN", note="unpinned")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "id": pin,
                                    "expires": 1000 * MS}, count=2, note="the old pin")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1000 * MS},
                     count=1, note="pins anew")
    await s.collect(pinned, 1, note="pinned again")
    await s.requests(NEXT + "PIN", b"1", count=1, timeout=0.5, note="a plain request")
    await api(s, "CONSUMER.UNPIN.S.PIN", {"group": "A"}, note="unpins again")
    await s.collect(unpinned, 1, note="unpinned again")
    await api(s, "CONSUMER.UNPIN.S.PIN", {"group": "A"}, note="nothing to unpin")
    await s.collect(unpinned, 1, note="unpinned without a pin")


@scenario
async def pin_timeout(s):
    """A pinned client that sends no request for priority_timeout loses the pin."""
    await stream_with(s, 2)
    unpinned = await s.subscribe(ADV + "UNPINNED.S.PIN")
    await consumer(s, "PIN", priority_policy="pinned_client", priority_groups=["A"],
                   priority_timeout=800 * MS)
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1000 * MS},
                     count=1, note="pins")
    await s.collect(unpinned, 1, timeout=4.0, note="times out")
    await api(s, "CONSUMER.INFO.S.PIN", note="unpinned")


@scenario
async def pin_renewed(s):
    """Each request of the pinned client starts priority_timeout again: the pin outlives
    its first deadline, then ends a timeout after the last request.  (Requests that
    wait until they expire are the clock: no sleeping.)"""
    await stream_with(s, 3)
    unpinned = await s.subscribe(ADV + "UNPINNED.S.PIN")
    await consumer(s, "PIN", priority_policy="pinned_client", priority_groups=["A"],
                   priority_timeout=2_000 * MS)
    got = await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1000 * MS},
                           count=1, note="pins")
    pin = got[0].header("Nats-Pin-Id") if got else ""
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1200 * MS},
                     count=1, note="another waits 1.2s")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "id": pin,
                                    "expires": 1000 * MS}, count=1, note="renews")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1200 * MS},
                     count=1, note="another waits past the first deadline")
    await api(s, "CONSUMER.INFO.S.PIN", note="still pinned")
    await s.collect(unpinned, 1, timeout=4.0, note="times out")


@scenario
async def pin_edges(s):
    """A pin taken by a request that cannot take the message (max_bytes) is let go; a
    no_wait request of another client; a plain pull request; unpinning a consumer of
    another policy."""
    await stream_with(s, 3)
    pinned = await s.subscribe(ADV + "PINNED.S.PIN")
    await consumer(s, "PIN", priority_policy="pinned_client", priority_groups=["A"])
    await consumer(s, "OV", priority_policy="overflow", priority_groups=["A"])
    await consumer(s, "PLAIN")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "max_bytes": 5,
                                    "expires": 1000 * MS}, count=2, note="too small")
    await s.collect(pinned, 1, note="pinned then let go")
    await api(s, "CONSUMER.INFO.S.PIN", note="no pin")
    await s.requests(NEXT + "PIN", b"", count=1, timeout=1.0, note="an empty request")
    await api(s, "CONSUMER.INFO.S.PIN", note="after the empty request")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "expires": 1000 * MS},
                     count=1, note="pins")
    await s.collect(pinned, 1, note="pinned")
    await s.requests(NEXT + "PIN", {"batch": 1, "group": "A", "no_wait": True}, count=1,
                     note="no_wait, not pinned")
    await s.requests(NEXT + "PIN", {"batch": 5, "group": "A", "no_wait": True}, count=1,
                     note="no_wait, more than pending")
    await api(s, "CONSUMER.UNPIN.S.OV", {"group": "A"}, note="overflow")
    await api(s, "CONSUMER.UNPIN.S.PLAIN", {"group": "A"}, note="no groups")


@scenario
async def prioritized_full(s):
    """max_waiting on a prioritized consumer: the request that does not fit is refused
    whatever its priority."""
    await stream_with(s, 0)
    await consumer(s, "PRI", priority_policy="prioritized", priority_groups=["A"],
                   max_waiting=2)
    w = await s.subscribe("in.>")
    for i, prio in enumerate((5, 3)):
        await s.publish(NEXT + "PRI", {"batch": 1, "group": "A", "priority": prio,
                                       "expires": 2000 * MS}, reply="in.%d" % i)
    await wait_waiting(s, "PRI", 2)
    await s.requests(NEXT + "PRI", {"batch": 1, "group": "A", "priority": 0,
                                    "expires": 2000 * MS}, count=1, note="a third")
    await s.request("s.x", b"x")
    await s.collect(w, 1, note="priority 3 first")


@scenario
async def prioritized(s):
    """Waiting requests are served by priority, 0 first; one priority takes turns."""
    await stream_with(s, 0)
    await consumer(s, "PRI", priority_policy="prioritized", priority_groups=["A"])
    order = [("r5a", 5, 2), ("r1", 1, 1), ("r5b", 5, 2), ("r0", 0, 1), ("r9", 9, 1)]
    watches = {}
    for name, prio, batch in order:
        inbox = "in." + name
        watches[name] = await s.subscribe(inbox)
        await s.publish(NEXT + "PRI", {"batch": batch, "group": "A", "priority": prio,
                                       "expires": 3000 * MS}, reply=inbox)
        await wait_waiting(s, "PRI", len(watches))
    for i in range(7):
        await s.request("s.%d" % i, b"m%d" % i)
    for name, _, batch in order:
        await s.collect(watches[name], batch, note=name)


@scenario
async def pause(s):
    """A consumer created paused, pull requests while paused, the advisories of a timed
    resume, of pausing and of resuming through the API."""
    await stream_with(s, 2)
    adv = await s.subscribe(ADV + "PAUSE.S.P")
    await consumer(s, "P", pause_until=later(1.5), note="created paused")
    await s.collect(adv, 1, note="paused on create")
    await api(s, "CONSUMER.INFO.S.P", note="paused")
    await s.requests(NEXT + "P", {"batch": 1, "no_wait": True}, count=1, note="no_wait")
    await s.requests(NEXT + "P", {"batch": 1, "expires": 200 * MS}, count=1, note="expires")
    await s.collect(adv, 1, timeout=4.0, note="resumes on time")
    await s.requests(NEXT + "P", {"batch": 1, "expires": 1000 * MS}, count=1, note="resumed")
    await api(s, "CONSUMER.PAUSE.S.P", {"pause_until": later(30)}, note="pauses")
    await s.collect(adv, 1, note="paused advisory")
    await api(s, "CONSUMER.INFO.S.P", note="paused again")
    await api(s, "CONSUMER.PAUSE.S.P", {"pause_until": later(60)}, note="longer")
    await s.collect(adv, 1, note="paused longer")
    await api(s, "CONSUMER.PAUSE.S.P", None, note="resumes")
    await s.collect(adv, 1, note="resumed advisory")
    await api(s, "CONSUMER.PAUSE.S.P", None, note="resumes again")
    await s.collect(adv, 1, timeout=0.5, note="no change, no advisory")
    await api(s, "CONSUMER.PAUSE.S.P", {"pause_until": "2001-01-01T00:00:00Z"},
              note="a pause in the past")
    await s.collect(adv, 1, note="past advisory")
    await api(s, "CONSUMER.INFO.S.P", note="not paused")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_natsjs_matches_reference(name):
    expected = run_scenario(SCENARIOS[name], "reference")
    actual = run_scenario(SCENARIOS[name], "natsjs")
    assert any(step.get("reply") or step.get("replies") for step in expected["steps"])
    diffs = compare(jsdiff.checked(expected), jsdiff.checked(actual))
    assert not diffs, "%d differences (reference != natsjs):\n%s" % (len(diffs),
                                                                    "\n".join(diffs[:60]))


# -- replicated consumers ------------------------------------------------------------------

async def _ask(nc, subject: str, body=None, timeout: float = 10.0):
    """An API request, asked again while unanswered (a cluster that just elected a
    leader, nats-server's too, may drop the first one); the reply's JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    for _ in range(5):
        try:
            msg = await nc.request(subject, data, timeout=timeout)
        except nats.errors.TimeoutError:
            continue
        return json.loads(msg.data)
    raise TimeoutError("%s never answered" % subject)


async def _pull(nc, consumer: str, body: dict, wait: float = 3.0):
    """One pull request: (status, its text or the payload, Nats-Pin-Id) of its first
    answer, or None."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(NEXT + consumer, json.dumps(body).encode(), reply=inbox)
    try:
        msg = await sub.next_msg(timeout=wait)
    except nats.errors.TimeoutError:
        return None
    finally:
        await sub.unsubscribe()
    h = msg.headers or {}
    if h.get("Status"):
        return h["Status"], h.get("Description", ""), None
    return None, msg.data.decode(), h.get("Nats-Pin-Id")


async def _publish(nc, subject: str, data: bytes):
    """A publish that waits for its PubAck, asked again while the new stream's interest
    has not reached the server yet (no responders)."""
    for _ in range(50):
        try:
            return await nc.request(subject, data, timeout=10)
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.1)      # polling for the stream's interest
    raise TimeoutError("no stream took %s" % subject)


class Pins:
    """Pin ids as the order they were made in (pin1, pin2, ...)."""

    def __init__(self):
        self.seen: dict[str, str] = {}

    def __call__(self, pin):
        if not pin:
            return pin
        return self.seen.setdefault(pin, "pin%d" % (len(self.seen) + 1))


async def _replicated_story(cluster: JSCluster, replicas: int) -> list:
    """What a client sees of a pinned, then paused, consumer with ``replicas`` replicas
    on an R3 stream (a step-down of its leader on the way when it is R3)."""
    nc = await nats.connect([cluster.url(j) for j in range(3)])
    out: list = []
    pins = Pins()
    adv = []
    try:
        async def note(msg):
            adv.append((msg.subject, json.loads(msg.data)))
        sub = await nc.subscribe(ADV + "*.S.C", cb=note)
        await nc.flush()
        reply = await _ask(nc, API + "STREAM.CREATE.S",
                           {"name": "S", "subjects": ["s.>"], "num_replicas": 3})
        assert "error" not in reply, reply
        for i in range(8):
            await _publish(nc, "s.%d" % i, b"m%d" % i)
        reply = await _ask(nc, API + "CONSUMER.CREATE.S.C", {
            "stream_name": "S", "config": {
                "durable_name": "C", "ack_policy": "explicit", "num_replicas": replicas,
                "priority_policy": "pinned_client", "priority_groups": ["A"]}})
        assert "error" not in reply, reply
        out.append(("created", reply["config"]["priority_timeout"]))

        async def pull(note, **body):
            got = await _pull(nc, "C", {"batch": 1, "group": "A", "expires": 1_000 * MS,
                                        **body})
            if got is not None and got[2]:
                got = got[:2] + (pins(got[2]),)
            out.append((note, got))
            return got

        async def info(note):
            r = await _ask(nc, API + "CONSUMER.INFO.S.C")
            pg = r["priority_groups"][0]
            out.append((note, pins(pg.get("pinned_client_id")),
                        pg["pinned_ts"] != "0001-01-01T00:00:00Z", r.get("paused", False)))
            return r

        got = await pull("pins")
        pin = next(k for k, v in pins.seen.items() if v == got[2])
        await info("pinned")
        await pull("a wrong id", id="WRONG")
        await pull("the pinned client", id=pin)
        out.append(("unpin", await _ask(nc, API + "CONSUMER.UNPIN.S.C", {"group": "A"})))
        await pull("the old pin", id=pin)
        got = await pull("pins anew")
        pin = next(k for k, v in pins.seen.items() if v == got[2])
        out.append(("pause", (await _ask(nc, API + "CONSUMER.PAUSE.S.C",
                                         {"pause_until": later(30)}))["paused"]))
        await _until_paused(nc, True)
        await info("paused")
        await pull("while paused", id=pin, expires=300 * MS)
        if replicas > 1:
            # A new leader of a paused consumer has no pin (and does not say again
            # that it is paused).
            before = (await _ask(nc, API + "CONSUMER.INFO.S.C"))["cluster"]["leader"]
            reply = await _ask(nc, API + "CONSUMER.LEADER.STEPDOWN.S.C")
            out.append(("step-down", reply.get("success"), reply.get("error")))
            for _ in range(100):
                r = await _ask(nc, API + "CONSUMER.INFO.S.C")
                if r.get("cluster", {}).get("leader") not in (None, before):
                    break
                await asyncio.sleep(0.1)      # polling for the new leader, not a sync
            await info("a new leader")
        out.append(("resume", (await _ask(nc, API + "CONSUMER.PAUSE.S.C"))["paused"]))
        await _until_paused(nc, False)
        await pull("the pin from before", id=pin)
        await pull("no id")
        await nc.flush()
        await asyncio.sleep(0.5)      # advisories still on their way (none is awaited)
        await sub.unsubscribe()
    finally:
        await nc.close()
    out.append(("advisories", sorted(_advisory_summary(a, pins) for a in adv
                                     if a[0].split(".")[4] in ("PINNED", "UNPINNED",
                                                               "PAUSE"))))
    return out


async def _until_paused(nc, paused: bool):
    """nats-server answers a pause once proposed: its info shows it a little later
    (polling, not a synchronisation)."""
    for _ in range(50):
        if (await _ask(nc, API + "CONSUMER.INFO.S.C")).get("paused", False) == paused:
            return
        await asyncio.sleep(0.1)


def _advisory_summary(a, pins) -> str:
    subject, ev = a
    kind = subject.split(".")[4]
    if kind in ("PINNED", "UNPINNED"):
        return "%s %s %s %s" % (kind, ev["group"], pins(ev.get("pinned_id")),
                                ev.get("reason"))
    return "PAUSE %s" % ev["paused"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_replicated_pins_and_pauses_as_reference(tmp_path, replicas):
    """R1 and R3 consumers on an R3 stream: natsjs's cluster shows a client what a
    cluster of nats-servers shows (pins, 423s, the pin a new leader forgets, pauses and
    their advisories, each sent once)."""
    stories = {}
    for kind in ("reference", "natsjs"):
        (tmp_path / kind).mkdir()
        with JSCluster(tmp_path / kind, 3, reference=kind == "reference") as cluster:
            cluster.start()
            stories[kind] = asyncio.run(_replicated_story(cluster, replicas))
    expected, actual = stories["reference"], stories["natsjs"]
    assert ("pins", (None, "m0", "pin1")) in expected
    assert actual == expected
