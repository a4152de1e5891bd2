"""Consumer reset, mirror promotion and ``persist_mode``, natsjs against nats-server.

Each scenario sends the same requests to a fresh natsjs and a fresh nats-server (the
reference binary) through tests/jsdiff.py and compares the normalized transcripts:

- ``$JS.API.CONSUMER.RESET.<stream>.<consumer>``: back to the ack floor (empty body) or to
  a sequence, what each deliver policy allows, the reply (consumer info plus
  ``reset_seq``) and what is delivered next;
- a mirror whose update drops ``mirror`` becomes a normal stream taking publishes, while
  any other change of ``mirror`` is refused;
- ``persist_mode``: the values accepted, what stream info echoes, the refusals (natsjs
  stores durably whatever the mode).

The replicated tests run the same requests on three natsjs servers and on three
nats-servers (R3 streams) and compare the answers.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys

import nats
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jsdiff  # noqa: E402
from jscluster import JSCluster, answers_on_both  # noqa: E402
from jsdiff import API, Scenario, add_stream, api, compare, registry, run_scenario  # noqa: E402

SCENARIOS: dict[str, Scenario] = {}
scenario = registry(SCENARIOS)


async def fetch(s, stream: str, consumer: str, batch: int, note: str | None = None):
    return await s.requests(API + "CONSUMER.MSG.NEXT.%s.%s" % (stream, consumer),
                            {"batch": batch, "no_wait": True}, count=batch + 1, note=note)


# -- scenarios -----------------------------------------------------------------------------

@scenario
async def persist_mode_values(s):
    """persist_mode: default, async, empty and unknown values; the file storage and
    replica rules of async; an update may not change it."""
    await add_stream(s, "D", subjects=["d"], note="no persist mode")
    await add_stream(s, "DD", subjects=["dd"], persist_mode="default", note="default")
    await add_stream(s, "E", subjects=["e"], persist_mode="", note="empty")
    await add_stream(s, "A", subjects=["a"], persist_mode="async", note="async")
    await api(s, "STREAM.INFO.A")
    await s.request("a", b"x", note="a publish to an async stream")
    await add_stream(s, "AM", subjects=["am"], persist_mode="async", storage="memory",
                     note="async on memory")
    await add_stream(s, "AB", subjects=["ab"], persist_mode="async", allow_atomic=True,
                     note="async with atomic batches")
    await add_stream(s, "X", subjects=["x"], persist_mode="sometimes", note="unknown value")
    await add_stream(s, "U", subjects=["u"], persist_mode="ASYNC", note="upper case")
    await api(s, "STREAM.UPDATE.A", {"name": "A", "subjects": ["a"]},
              note="update dropping async")
    await api(s, "STREAM.UPDATE.D", {"name": "D", "subjects": ["d"], "persist_mode": "async"},
              note="update turning async on")
    await api(s, "STREAM.UPDATE.D", {"name": "D", "subjects": ["d", "d2"],
                                     "persist_mode": "default"},
              note="update naming the default")


@scenario
async def mirror_promotion(s):
    """A mirror whose update drops ``mirror`` (with subjects of its own) becomes a normal
    stream; changing or adding a mirror is refused."""
    await add_stream(s, "O", subjects=["o.>"])
    for i in range(3):
        await s.request("o.%d" % i, b"m%d" % i)
    await add_stream(s, "M", mirror={"name": "O"})
    await s.poll(API + "STREAM.MSG.GET.M", {"seq": 3}, until=lambda r: "message" in
                 (r.json or {}), note="the mirror caught up")
    await api(s, "STREAM.UPDATE.M", {"name": "M", "mirror": {"name": "O", "filter_subject":
                                                             "o.1"}},
              note="changing the mirror's filter")
    await api(s, "STREAM.UPDATE.M", {"name": "M", "mirror": {"name": "O"},
                                     "subjects": ["m.>"]},
              note="a mirror with subjects")
    await api(s, "STREAM.UPDATE.M", {"name": "M"}, note="no mirror and no subjects")
    await api(s, "STREAM.UPDATE.M", {"name": "M", "subjects": ["o.>"]},
              note="promoted onto the origin's subjects")
    await api(s, "STREAM.UPDATE.M", {"name": "M", "subjects": ["m.>"]}, note="promoted")
    await s.request("m.1", b"own", note="the promoted stream takes publishes")
    await s.request("o.9", b"later", note="the origin goes on")
    await api(s, "STREAM.INFO.M", note="no mirror info; the origin's later message absent")
    await api(s, "STREAM.MSG.GET.M", {"seq": 4})
    await api(s, "STREAM.UPDATE.M", {"name": "M", "subjects": ["m.>"],
                                     "mirror": {"name": "O"}},
              note="making it a mirror again")
    await add_stream(s, "P", subjects=["p"])
    await api(s, "STREAM.UPDATE.P", {"name": "P", "mirror": {"name": "O"}},
              note="a normal stream made a mirror")


@scenario
async def consumer_reset(s):
    """CONSUMER.RESET: back to the ack floor, to a sequence (also beyond the last and
    below the stream's first), what is delivered next, and the refusals."""
    await add_stream(s, "S", subjects=["s.>"])
    for i in range(1, 11):
        await s.request("s.%d" % i, b"m%d" % i)
    await api(s, "STREAM.PURGE.S", {"keep": 8}, note="the stream starts at 3")
    await api(s, "CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {
        "durable_name": "C", "ack_policy": "explicit"}})
    got = await fetch(s, "S", "C", 3)
    if got:
        await s.request(got[0].subject, b"+ACK", note="ack the first")
    await api(s, "CONSUMER.RESET.S.C", None, note="an empty body: to the ack floor")
    await fetch(s, "S", "C", 2, note="delivered again from the floor")
    await api(s, "CONSUMER.RESET.S.C", {"seq": 7}, note="to sequence 7")
    await fetch(s, "S", "C", 2)
    await api(s, "CONSUMER.RESET.S.C", {"seq": 1}, note="below the stream's first")
    await fetch(s, "S", "C", 1, note="the stream's first comes next")
    await api(s, "CONSUMER.RESET.S.C", {"seq": 100}, note="beyond the last")
    await api(s, "CONSUMER.INFO.S.C")
    await api(s, "CONSUMER.RESET.S.C", {"seq": 0}, note="seq 0: the ack floor")
    await api(s, "CONSUMER.RESET.S.C", b"{nope", note="a body that is not JSON")
    await api(s, "CONSUMER.RESET.S.C", {"seq": -1}, note="a negative sequence")
    await api(s, "CONSUMER.RESET.S.NOPE", {"seq": 1}, note="no such consumer")
    await api(s, "CONSUMER.CREATE.S.BS", {"stream_name": "S", "config": {
        "durable_name": "BS", "ack_policy": "explicit", "deliver_policy": "by_start_sequence",
        "opt_start_seq": 5}})
    await api(s, "CONSUMER.RESET.S.BS", {"seq": 4}, note="below the start sequence")
    await api(s, "CONSUMER.RESET.S.BS", {"seq": 6}, note="above it")
    await api(s, "CONSUMER.CREATE.S.L", {"stream_name": "S", "config": {
        "durable_name": "L", "ack_policy": "explicit", "deliver_policy": "last"}})
    await api(s, "CONSUMER.RESET.S.L", {"seq": 5}, note="deliver last: not allowed")
    await api(s, "CONSUMER.RESET.S.L", None, note="deliver last, to the ack floor")
    await api(s, "CONSUMER.CREATE.S.N", {"stream_name": "S", "config": {
        "durable_name": "N", "ack_policy": "none", "deliver_policy": "new"}})
    await api(s, "CONSUMER.RESET.S.N", {"seq": 5}, note="deliver new: not allowed")
    await api(s, "CONSUMER.CREATE.S.PUSH", {"stream_name": "S", "config": {
        "durable_name": "PUSH", "ack_policy": "explicit", "deliver_subject": "push.in"}})
    await api(s, "CONSUMER.RESET.S.PUSH", {"seq": 4}, note="a push consumer")


# -- the tests -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SCENARIOS))
def test_natsjs_matches_reference(name):
    expected = run_scenario(SCENARIOS[name], "reference")
    actual = run_scenario(SCENARIOS[name], "natsjs")
    assert any(step.get("reply") for step in expected["steps"])
    diffs = compare(jsdiff.checked(expected), jsdiff.checked(actual))
    assert not diffs, "%d differences (reference != natsjs):\n%s" % (len(diffs),
                                                                    "\n".join(diffs[:60]))


# -- replicated: the same requests to three natsjs servers and to three nats-servers -------

async def _request(nc, subject: str, body=None, timeout: float = 10):
    """A request asked again while unanswered: a cluster that just elected a leader
    (nats-server's too) may drop the first one."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
    for _ in range(5):
        try:
            msg = await nc.request(subject, data, timeout=timeout)
        except nats.errors.TimeoutError:
            continue
        return json.loads(msg.data) if msg.data else {}
    raise TimeoutError("%s never answered" % subject)


def _positions(reply: dict) -> dict:
    """What a consumer reply says about where the consumer stands."""
    if "error" in reply:
        return {"error": reply["error"]}
    return {"reset_seq": reply.get("reset_seq"),
            "delivered": {k: reply["delivered"][k] for k in ("consumer_seq", "stream_seq")},
            "ack_floor": {k: reply["ack_floor"][k] for k in ("consumer_seq", "stream_seq")},
            "num_pending": reply["num_pending"], "num_ack_pending": reply["num_ack_pending"]}


# What a request sent while a group elects its leader may meet (asked again then).
ELECTING = (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError,
            nats.js.errors.NoStreamResponseError)


async def _fetch_data(js, n: int) -> list:
    sub = await js.pull_subscribe_bind("C", "S")
    for _ in range(50):
        try:
            msgs = await sub.fetch(n, timeout=5)
            break
        except nats.errors.TimeoutError:
            return []
        except ELECTING:
            await asyncio.sleep(0.1)    # waiting for the election, not a synchronisation
    return [(m.subject, m.data.decode(), m.metadata.sequence.stream) for m in msgs]


async def _r3_reset_answers(cluster: JSCluster) -> list:
    nc = await nats.connect([cluster.url(j) for j in range(3)])
    js = nc.jetstream(timeout=10)
    out = []
    await _request(nc, API + "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"],
                                                  "num_replicas": 3})
    for i in range(1, 11):
        await js.publish("s.%d" % i, b"m%d" % i)
    await _request(nc, API + "STREAM.PURGE.S", {"keep": 8})
    await _request(nc, API + "CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {
        "durable_name": "C", "ack_policy": "explicit", "num_replicas": 3}})
    sub = await js.pull_subscribe_bind("C", "S")
    msgs = await sub.fetch(3, timeout=5)
    out.append([m.data.decode() for m in msgs])
    await msgs[0].ack_sync()
    out.append(_positions(await _request(nc, API + "CONSUMER.RESET.S.C")))
    out.append(await _fetch_data(js, 2))
    out.append(_positions(await _request(nc, API + "CONSUMER.RESET.S.C", {"seq": 7})))
    out.append(_positions(await _request(nc, API + "CONSUMER.RESET.S.C", {"seq": 1})))
    # Another replica leads: it starts where the group's reset left the consumer.
    await _request(nc, API + "CONSUMER.LEADER.STEPDOWN.S.C")
    info = {}
    for _ in range(50):
        info = await _request(nc, API + "CONSUMER.INFO.S.C")
        if "error" not in info and info.get("cluster", {}).get("leader"):
            break
        await asyncio.sleep(0.1)    # waiting for the election, not a synchronisation
    out.append(_positions(info))
    out.append(await _fetch_data(js, 2))
    out.append(_positions(await _request(nc, API + "CONSUMER.RESET.S.C", {"seq": -1})))
    await nc.close()
    return out


async def _r3_promotion_answers(cluster: JSCluster) -> list:
    nc = await nats.connect([cluster.url(j) for j in range(3)])
    js = nc.jetstream(timeout=10)
    out = []
    await _request(nc, API + "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"],
                                                  "num_replicas": 3})
    for i in range(3):
        await js.publish("o.%d" % i, b"m%d" % i)
    await _request(nc, API + "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"},
                                                  "num_replicas": 3})
    for _ in range(100):
        info = await _request(nc, API + "STREAM.INFO.M")
        if info.get("state", {}).get("messages") == 3:
            break
        await asyncio.sleep(0.1)    # the mirror catching up on its own clock
    upd = await _request(nc, API + "STREAM.UPDATE.M", {
        "name": "M", "num_replicas": 3, "mirror": {"name": "O", "filter_subject": "o.1"}})
    out.append(upd.get("error"))
    upd = await _request(nc, API + "STREAM.UPDATE.M", {"name": "M", "num_replicas": 3,
                                                        "subjects": ["m.>"]})
    out.append((upd.get("error"), "mirror" in upd.get("config", {}), upd.get("mirror")))
    ack = await js.publish("m.1", b"own")
    out.append((ack.stream, ack.seq))
    await js.publish("o.9", b"later")
    info = await _request(nc, API + "STREAM.INFO.M")
    out.append((info["state"]["messages"], info["state"]["last_seq"], "mirror" in info))
    await _request(nc, API + "STREAM.LEADER.STEPDOWN.M")
    for _ in range(50):
        try:
            ack = await js.publish("m.2", b"after")
            break
        except ELECTING + (nats.errors.TimeoutError,):
            await asyncio.sleep(0.1)    # waiting for the election, not a synchronisation
    out.append((ack.stream, ack.seq))
    await nc.close()
    return out


@pytest.mark.parametrize("run", [_r3_reset_answers, _r3_promotion_answers])
def test_r3_answers_match_reference(tmp_path, run):
    answers = answers_on_both(tmp_path, run)
    diffs = compare(answers["reference"], answers["natsjs"])
    assert not diffs, "\n".join(diffs)
