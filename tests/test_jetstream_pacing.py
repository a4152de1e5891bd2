"""Consumer pacing (natsjs/jetstream/pacing.py): ``replay_policy: original`` keeps the
stored messages' spacing until the consumer has caught up, and ``rate_limit_bps``
holds a push consumer to a byte rate.  Both servers; the checks are lower bounds
(a pace cannot be beaten), never targets."""
from __future__ import annotations

import asyncio
import time

from nats.js.api import ConsumerConfig, ReplayPolicy

from test_jetstream import TIMEOUT, connect, js_server, run  # noqa: F401  (fixture)
from test_jetstream_sourcing import api


def test_replay_original_keeps_the_spacing(js_server):
    async def main():
        nc, js = await connect(js_server)
        await api(nc, "$JS.API.STREAM.CREATE.R", {"name": "R", "subjects": ["r"]})
        for i in range(3):
            await js.publish("r", b"%d" % i)
            if i < 2:
                await asyncio.sleep(0.6)     # the spacing to replay, not a wait for it
        arrivals = []
        got = asyncio.Queue()

        async def cb(m):
            arrivals.append(time.monotonic())
            await got.put(m.data)
        await js.subscribe("r", cb=cb, config=ConsumerConfig(
            replay_policy=ReplayPolicy.ORIGINAL))
        for i in range(3):
            assert await asyncio.wait_for(got.get(), TIMEOUT) == b"%d" % i
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        assert all(g >= 0.45 for g in gaps), gaps
        # Caught up: what comes now is not held back by the old spacing.
        await js.publish("r", b"new")
        assert await asyncio.wait_for(got.get(), TIMEOUT) == b"new"
        await nc.close()
    run(main())


def test_rate_limit_bps_holds_a_push_consumer_to_its_rate(js_server):
    async def main():
        nc, js = await connect(js_server)
        # Bucket: max_msg_size (1000 bytes); rate 2000 bytes/s.
        await api(nc, "$JS.API.STREAM.CREATE.L", {"name": "L", "subjects": ["l"],
                                                  "max_msg_size": 1000})
        for i in range(6):
            await js.publish("l", b"x" * 500)
        got = asyncio.Queue()

        async def cb(m):
            await got.put(time.monotonic())
        t0 = time.monotonic()
        await js.subscribe("l", cb=cb, config=ConsumerConfig(rate_limit_bps=16000))
        times = [await asyncio.wait_for(got.get(), TIMEOUT) for _ in range(6)]
        # About 3300 bytes went out; 1000 could go at once, the rest at 2000/s.
        assert times[-1] - t0 >= 0.9, times[-1] - t0
        r = await api(nc, "$JS.API.CONSUMER.CREATE.L", {"stream_name": "L", "config": {
            "rate_limit_bps": 8000}})
        assert r["error"]["err_code"] == 10086      # pull consumers may not be limited
        await nc.close()
    run(main())
