"""Fixtures for the nats-jetstream and nats-key-value clients' own tests.

Their sdists on PyPI (nats-jetstream 0.1.0, nats-key-value 0.1.0) ship ``tests/`` without
the ``conftest.py`` those tests take their fixtures from. tests/test_upstream_jetstream.py
loads this module as a pytest plugin (``-p upstream_js_fixtures``) in its place. The
fixtures have the names and meaning the tests use, written here:

- ``store_dir``: a fresh folder for the server's JetStream store, removed afterwards;
- ``server``: one server with JetStream, on a free port, through ``nats.server.run``
  (the stand-in beside this file starts the ``nats-server`` on PATH: natsjs or the
  reference, as the test chose), stopped afterwards;
- ``client``: a ``nats.client`` connection to it, closed afterwards;
- ``jetstream``: ``nats.jetstream.new(client, strict=True)`` on that connection.
"""
from __future__ import annotations

import tempfile

import pytest
import pytest_asyncio
from nats.client import connect
from nats.jetstream import new as new_jetstream
from nats.server import run


@pytest.fixture
def store_dir():
    with tempfile.TemporaryDirectory() as path:
        yield path


@pytest_asyncio.fixture
async def server(store_dir):
    async with await run(port=0, jetstream=True, store_dir=store_dir) as started:
        yield started


@pytest_asyncio.fixture
async def client(server):
    conn = await connect(server.client_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest_asyncio.fixture
async def jetstream(client):
    return new_jetstream(client, strict=True)
