"""Subject delete markers (natsjs/jetstream/markers.py): with
``subject_delete_marker_ttl`` set, expiry by ``max_age`` or by a message TTL that takes
the last message of a subject stores a marker in its place; both servers."""
from __future__ import annotations

import asyncio

from test_jetstream import TIMEOUT, connect, js_server, run  # noqa: F401  (fixture)
from test_jetstream_sourcing import api, info, until

MARKER = {"Nats-Marker-Reason": "MaxAge", "Nats-TTL": "2s", "Nats-Rollup": "sub"}


async def contents(js, name: str):
    out = {}
    st = (await info(js._nc, name))["state"]
    for seq in range(st["first_seq"], st["last_seq"] + 1):
        try:
            m = await js.get_msg(name, seq)
        except Exception:
            continue
        out[m.subject] = (seq, m.headers, m.data)
    return out


def test_max_age_leaves_markers_for_emptied_subjects(js_server):
    async def main():
        nc, js = await connect(js_server)
        r = await api(nc, "$JS.API.STREAM.CREATE.D", {
            "name": "D", "subjects": ["d.*"], "max_age": 1_000_000_000,
            "subject_delete_marker_ttl": 2_000_000_000})
        # Markers need TTLs and rollups: the server turns both on.
        assert r["config"]["allow_msg_ttl"] and r["config"]["allow_rollup_hdrs"]
        watch = await js.subscribe("d.*", ordered_consumer=True)
        await js.publish("d.a", b"a1")
        await js.publish("d.b", b"b1")
        await js.publish("d.b", b"b2")
        for _ in range(3):
            await watch.next_msg(TIMEOUT)

        async def marked():
            # Both subjects' markers: d.b's last message was published after d.a's,
            # so it ages out (and its marker comes) a moment later.
            c = await contents(js, "D")
            return c if sorted(c) == ["d.a", "d.b"] and c["d.a"][0] > 3 and \
                c["d.b"][0] > 3 else None
        c = await until(marked, what="markers")
        assert c["d.a"][1] == MARKER and c["d.b"][1] == MARKER
        assert not c["d.a"][2] and c["d.b"][0] == 5
        # Consumers see the marker like any message.
        m = await watch.next_msg(TIMEOUT)
        assert m.headers["Nats-Marker-Reason"] == "MaxAge"
        # Markers age out in turn, without leaving markers of their own.
        await until(lambda: _empty(nc, "D"), what="markers gone")
        assert (await info(nc, "D"))["state"]["last_seq"] == 5
        await nc.close()
    run(main())


async def _empty(nc, name):
    return (await info(nc, name))["state"]["messages"] == 0


def test_message_ttl_leaves_a_marker_and_is_raised_to_the_marker_ttl(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.K", {
            "name": "K", "subjects": ["k.*"], "subject_delete_marker_ttl": 2_000_000_000})
        await js.publish("k.x", b"x", headers={"Nats-TTL": "1s"})
        await js.publish("k.y", b"y")
        # A TTL below the marker TTL is raised to it (in seconds).
        assert (await js.get_msg("K", 1)).headers == {"Nats-TTL": "2"}

        async def marked():
            c = await contents(js, "K")
            return c if "k.x" in c and c["k.x"][0] == 3 else None
        c = await until(marked, what="marker")
        assert c["k.x"][1] == MARKER and c["k.y"][2] == b"y"
        await until(lambda: _one_left(nc), what="marker expiry")
        await nc.close()
    run(main())


async def _one_left(nc):
    st = (await info(nc, "K"))["state"]
    return st["messages"] == 1 and st["last_seq"] == 3
