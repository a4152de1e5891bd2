"""What many test files need, in one place: run a coroutine with a deadline,
connect a nats-py client to a test server, and poll until a condition holds
(the cluster converges, a log line appears) instead of sleeping a fixed time.

A file whose tests need a longer deadline binds its own:
``run = functools.partial(helpers.run, timeout=120)``.
"""
from __future__ import annotations

import asyncio
import inspect
import time

import nats


def run(coro, timeout: float | None = 60):
    """Run ``coro`` in a fresh event loop; a hang fails the test after ``timeout`` s."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def connect(server, **kw):
    """A nats-py client of ``server`` (anything with a ``url``); it does not reconnect
    unless asked, so a server that goes away fails the test at once."""
    kw.setdefault("allow_reconnect", False)
    return await nats.connect(server.url, **kw)


def wait_until(cond, what: str = "condition", timeout: float = 30.0, interval: float = 0.05):
    """Call ``cond`` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(interval)


async def until(cond, what: str = "condition", timeout: float = 20.0, step: float = 0.05):
    """``wait_until`` inside an event loop; ``cond`` may be a plain or an async callable."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s (%gs)" % (what, timeout))
        await asyncio.sleep(step)
