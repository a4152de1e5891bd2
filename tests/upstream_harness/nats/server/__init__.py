"""A stand-in for nats.py's ``nats-server`` test harness (``nats.server``).

The nats-core client's own tests (nats.py repository, ``nats-core/tests``; PyPI ships
them in the nats-core 0.1.0 sdist) start servers through a harness package of that
repository, ``nats-server``, which is not published: PyPI's ``nats-server`` is an empty
placeholder (0.0.0). tests/test_upstream_nats_core.py runs those tests unmodified, so
this module gives them the same names, written for natsjs from the harness's interface:

- ``run(...)`` starts the ``nats-server`` found on PATH (the test points PATH at natsjs
  or at the reference) with ``--addr/--port/--jetstream/--store_dir/--config`` as
  given (port 0 meaning ``-1``), reads its stderr until ``Server is ready`` (taking the
  address from ``Listening for client connections on HOST:PORT``) and then stops
  reading it, and fails with the server's errors if it exits first.
- ``run_cluster(size=N)`` reserves a client and a route port per node, then starts the
  nodes one after another, each named ``nodeK`` in cluster ``cluster`` with routes to
  every other node, each waited for as ``run`` waits.
- ``Server.shutdown()`` sends SIGTERM and waits for the process to exit (SIGKILL after
  ``timeout``): a test that stops the server its client is on and then waits for the
  client to reconnect relies on the client still being connected until the process
  is gone.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket

_READY = re.compile(r"Server is ready")
_LISTENING = re.compile(r"Listening for client connections on (.+):(\d+)")
_FATAL = re.compile(r"\[FTL\]\s+(.*)")


class ServerError(Exception):
    """The server could not be started."""


class Server:
    """A running server process."""

    def __init__(self, process: asyncio.subprocess.Process, host: str, port: int):
        self._process: asyncio.subprocess.Process | None = process
        self._host = host
        self._port = port

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def client_url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        if ":" in host:
            host = "[%s]" % host
        return "nats://%s:%d" % (host, self._port)

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def shutdown(self, timeout: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.terminate()
            await asyncio.wait_for(process.wait(), timeout)
        except ProcessLookupError:
            pass
        except asyncio.TimeoutError:
            try:
                process.kill()
            except ProcessLookupError:
                pass
            await process.wait()

    async def __aenter__(self) -> "Server":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()


class ServerCluster:
    """Servers routed to one another."""

    def __init__(self, servers: list[Server]):
        self.servers = servers

    def client_url(self) -> str:
        return self.servers[0].client_url

    async def shutdown(self) -> None:
        await asyncio.gather(*(s.shutdown() for s in self.servers), return_exceptions=True)

    async def __aenter__(self) -> "ServerCluster":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()


async def _start(args: list[str], timeout: float) -> Server:
    binary = shutil.which("nats-server")
    if binary is None:
        raise ServerError("nats-server executable not found in PATH")
    process = await asyncio.create_subprocess_exec(
        binary, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def ready() -> Server:
        host = port = None
        errors = []
        async for raw in process.stderr:
            line = raw.decode(errors="replace").strip()
            if _READY.search(line):
                if host is None:
                    raise ServerError("ready before listening: %s" % line)
                return Server(process, host, port)
            found = _LISTENING.search(line)
            if found:
                host, port = found.group(1).strip("[]"), int(found.group(2))
            elif "[INF]" not in line:
                fatal = _FATAL.search(line)
                errors.append(fatal.group(1) if fatal else line)
        code = await process.wait()
        raise ServerError("server exited with code %s: %s" % (code, "\n".join(errors)))

    try:
        return await asyncio.wait_for(ready(), timeout)
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise


def _args(host=None, port=None, debug=False, jetstream=False, store_dir=None,
          config_path=None, cluster=None, cluster_name=None, routes=None, name=None):
    args: list[str] = []
    if host is not None:
        args += ["--addr", host]
    if port is not None:
        args += ["--port", str(-1 if port == 0 else port)]
    if debug:
        args.append("--debug")
    if jetstream:
        args.append("--jetstream")
    if store_dir is not None:
        args += ["--store_dir", store_dir]
    if config_path:
        args += ["--config", config_path]
    if cluster is not None:
        args += ["--cluster", cluster]
    if cluster_name is not None:
        args += ["--cluster_name", cluster_name]
    if routes:
        args += ["--routes", routes]
    if name is not None:
        args += ["-n", name]
    return args


async def run(*, host: str | None = None, port: int | None = None, debug: bool = False,
              jetstream: bool = False, store_dir: str | None = None,
              config_path: str | None = None, timeout: float = 10.0) -> Server:
    """One server, ready to take clients."""
    return await _start(_args(host, port, debug, jetstream, store_dir, config_path), timeout)


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


async def run_cluster(config_path: str = "", jetstream: bool = False, size: int = 3,
                      store_dir: str | None = None) -> ServerCluster:
    """``size`` servers, each routed to all the others, started one after another."""
    if size < 1:
        raise ValueError("Cluster size must be at least 1")
    ports = _free_ports(2 * size)
    client_ports, route_ports = ports[:size], ports[size:]
    servers: list[Server] = []
    try:
        for i in range(size):
            node_dir = None
            if jetstream and store_dir:
                node_dir = os.path.join(store_dir, "node%d" % (i + 1))
                os.makedirs(node_dir, exist_ok=True)
            routes = ",".join("nats://127.0.0.1:%d" % p
                              for j, p in enumerate(route_ports) if j != i)
            servers.append(await _start(_args(
                port=client_ports[i], jetstream=jetstream, store_dir=node_dir,
                config_path=config_path or None,
                cluster="nats://127.0.0.1:%d" % route_ports[i], cluster_name="cluster",
                routes=routes or None, name="node%d" % (i + 1)), 10.0))
    except Exception as exc:
        for s in servers:
            try:
                await s.shutdown()
            except Exception:
                pass
        raise ServerError("Failed to start cluster: %s" % exc) from exc
    return ServerCluster(servers)
