"""The server object in-process: internal subscriptions and their owners, work handed
out of the fan-out, and the accept loop.

These run a ``Server`` inside ``trio.run`` and talk to it over real sockets with a
tiny protocol client, so a test can register handlers the way natsjs's own
subsystems (imports, $SYS requests, JetStream) do.
"""
import io
import json
import socket

import trio

from natsjs.accounts import AccountConfig
from natsjs.log import Logger
from natsjs.options import ServerOptions
from natsjs.server import InternalOwner, Server

TIMEOUT = 10


def new_server(**opts) -> tuple[Server, io.StringIO]:
    out = io.StringIO()
    opts.setdefault("host", "127.0.0.1")
    opts.setdefault("port", -1)
    return Server(ServerOptions(**opts), Logger(logtime=False, stream=out)), out


class Conn:
    """A raw protocol connection: send lines, read until something arrives."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.buf = b""

    @classmethod
    async def open(cls, server: Server, connect: dict | None = None) -> "Conn":
        c = cls(await trio.open_tcp_stream("127.0.0.1", server.port))
        await c.until(b"\r\n")
        c.buf = b""
        opts = {"verbose": False, "pedantic": False, "protocol": 1, "headers": True}
        opts.update(connect or {})
        await c.send(b"CONNECT " + json.dumps(opts).encode() + b"\r\n")
        await c.ping()
        return c

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def until(self, marker: bytes) -> bytes:
        with trio.fail_after(TIMEOUT):
            while marker not in self.buf:
                chunk = await self.stream.receive_some(65536)
                assert chunk, "connection closed; got %r" % self.buf
                self.buf += chunk
        return self.buf

    async def ping(self) -> bytes:
        """A round trip: everything sent before it has been processed."""
        self.buf = b""
        await self.send(b"PING\r\n")
        return await self.until(b"PONG\r\n")


async def serving(server: Server, test) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        try:
            await test()
        finally:
            server.shutdown()


class Echo(InternalOwner):
    """Answers ``echo.>`` requests in the global account; ``echo.fail`` raises."""

    name = "echo"

    def __init__(self):
        self.installs = 0

    def install(self, server):
        self.installs += 1
        server.subscribe_internal(server.account, b"echo.>", self.on_request, owner=self)

    def on_request(self, sub, subject, reply, hdr, msg):
        if subject == b"echo.fail":
            raise RuntimeError("handler bug")
        self.server_deliver(reply, b"echo:" + msg)

    def server_deliver(self, reply, data):
        self.server.deliver(self.server.account, reply, None, data)


def test_a_failing_internal_handler_answers_with_an_error_and_spares_the_publisher():
    server, log = new_server()
    echo = Echo()
    echo.server = server
    server.add_internal_owner(echo)

    async def test():
        c = await Conn.open(server)
        await c.send(b"SUB reply.> 1\r\nPUB echo.fail reply.1 1\r\nx\r\n")
        out = await c.ping()
        assert b"MSG reply.1 1" in out
        body = json.loads(out.split(b"\r\n")[1])
        assert body["error"]["code"] == 500
        # the publisher is still connected and the handler still serves
        await c.send(b"PUB echo.ok reply.2 2\r\nhi\r\n")
        assert b"echo:hi" in await c.ping()
        assert "echo.fail" in log.getvalue() and "handler bug" in log.getvalue()
    trio.run(serving, server, test)


def test_internal_subscriptions_are_reinstalled_after_an_accounts_reload():
    server, log = new_server(accounts=(AccountConfig("A"),))
    echo = Echo()
    echo.server = server
    server.add_internal_owner(echo)

    async def test():
        c = await Conn.open(server)
        await c.send(b"SUB reply.> 1\r\nPUB echo.a reply.1 1\r\nx\r\n")
        assert b"echo:x" in await c.ping()
        server.reload(server.opts.replace(accounts=(AccountConfig("A"), AccountConfig("B"))))
        assert echo.installs == 2
        await c.send(b"PUB echo.b reply.2 1\r\ny\r\n")
        assert b"echo:y" in await c.ping()
        # one subscription, not one per install: reply.> and echo.>, and the system
        # imports every account has ($SYS.REQ.SERVER.PING.CONNZ...)
        from natsjs.sysreq import ACCOUNT_IMPORTS
        assert server.account.sublist.count == 2 + len(ACCOUNT_IMPORTS)
    trio.run(serving, server, test)


class Deferred(InternalOwner):
    """Hands every request to a task: the answer leaves the publisher's fan-out."""

    name = "deferred"

    def install(self, server):
        self.server = server
        server.subscribe_internal(server.account, b"later.>", self.on_request, owner=self)

    def on_request(self, sub, subject, reply, hdr, msg):
        assert self.server.spawn(self.answer, subject, reply, msg, owner=self)

    async def answer(self, subject, reply, msg):
        await trio.sleep(0)            # e.g. an fsync in a worker thread
        if subject == b"later.fail":
            raise RuntimeError("task bug")
        self.server.deliver(self.server.account, reply, None, b"done:" + msg)


def test_internal_handlers_hand_waiting_work_to_server_tasks():
    server, log = new_server()
    server.add_internal_owner(Deferred())

    async def test():
        c = await Conn.open(server)
        await c.send(b"SUB reply.> 1\r\nPUB later.fail reply.0 1\r\nz\r\n"
                     b"PUB later.x reply.1 1\r\nx\r\n")
        await c.until(b"done:x")
        await c.ping()                 # the failed task cost nothing but its log line
        assert "task bug" in log.getvalue() and "deferred" in log.getvalue()
    trio.run(serving, server, test)


def test_spawn_is_refused_when_an_owner_has_too_many_tasks_running():
    server, log = new_server()
    owner = InternalOwner()
    owner.max_tasks = 2
    release = trio.Event()

    async def wait():
        await release.wait()

    async def test():
        assert server.spawn(wait, owner=owner)
        assert server.spawn(wait, owner=owner)
        assert not server.spawn(wait, owner=owner)
        release.set()
        with trio.fail_after(TIMEOUT):
            while not server.spawn(wait, owner=owner):
                await trio.sleep(0)
    trio.run(serving, server, test)


def test_accept_loop_lets_other_tasks_run_while_connections_keep_coming():
    server, log = new_server()
    progress, ticks = [], [0]
    new_client = server._new_client

    def record(sock, addr):
        progress.append(ticks[0])
        new_client(sock, addr)
    server._new_client = record          # before the accept loop binds it

    async def test():
        done = trio.Event()

        async def spin():
            while not done.is_set():
                ticks[0] += 1
                await trio.lowlevel.checkpoint()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(spin)
            # Fill the listen backlog while the server's tasks cannot run (blocking
            # connects complete in the kernel), then let the accept loop at them.
            socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(64)]
            with trio.fail_after(TIMEOUT):
                while len(progress) < len(socks):
                    await trio.sleep(0.01)
            done.set()
        for s in socks:
            s.close()
        # Between the first and the last accept of the burst, other tasks ran.
        assert progress[-1] > progress[0], progress
    trio.run(serving, server, test)


def test_keepalive_pings_clients_and_closes_the_silent_ones():
    """One server task pings every client each ping_interval; a client that answers
    stays, one that leaves max_pings_out PINGs unanswered is closed as stale."""
    server, log = new_server(ping_interval=0.3, max_pings_out=2)

    async def test():
        alive = await Conn.open(server)
        silent = await Conn.open(server)
        for _ in range(3):
            await alive.until(b"PING\r\n")
            alive.buf = b""
            await alive.send(b"PONG\r\n")
        await silent.until(b"-ERR 'Stale Connection'\r\n")
        await silent.stream.aclose()
        with trio.fail_after(TIMEOUT):
            while len(server.clients) > 1:
                await trio.sleep(0.01)
        await alive.ping()
        assert server.pinger._count == 1
    trio.run(serving, server, test)


def test_a_client_leaves_the_reactor_for_a_task_and_goes_on():
    """Plain clients are read by the server's reactor; one that has to wait (a
    consumer to drain, the rest of a read after a pause) is served by a task from then
    on, without losing what it had read, and closes as any other."""
    server, log = new_server()

    async def test():
        a = await Conn.open(server)
        b = await Conn.open(server)
        ca, cb = sorted(server.clients.values(), key=lambda c: c.cid)
        assert ca._reactor is server.reactor and cb._reactor is server.reactor
        # a: as after a stall on b (it waits for b to drain, then reads on)
        ca._leave_reactor(None, cb.core)
        # b: as after a pause, with the rest of its read still to parse
        cb.core.pause = True
        cb._leave_reactor(b"SUB x 1\r\nPING\r\n", None)
        await b.until(b"PONG\r\n")
        assert ca._reactor is None and cb._reactor is None
        await a.send(b"PUB x 2\r\nhi\r\n")
        await a.ping()
        b.buf = b""
        await b.until(b"MSG x 1 2\r\nhi\r\n")
        await a.stream.aclose()
        with trio.fail_after(TIMEOUT):
            while len(server.clients) > 1:
                await trio.sleep(0.01)
        await b.ping()
        assert ca.closed_reason == "Client Closed"
    trio.run(serving, server, test)


def test_the_reactor_backs_off_spins_that_find_nothing():
    """After a read the reactor waits a moment for the next one (Reactor.SPIN); a
    client that sends one PING at a time and waits for each PONG (here in this very
    process, so nothing can arrive during a spin) makes spins miss, and each miss
    leaves the next 1, 3, 7 ... wake-ups without one."""
    server, log = new_server()

    async def test():
        c = await Conn.open(server)
        r = server.reactor
        r.spin_hits = r.spin_misses = 0
        for _ in range(20):
            await c.ping()
        assert r.spin_hits == 0
        assert 1 <= r.spin_misses <= 6, r.spin_misses
    trio.run(serving, server, test)


def test_a_spin_ends_when_a_descriptor_a_task_waits_on_has_input():
    """Input on a descriptor served by a task (a route, the fsync thread's eventfd:
    Reactor.watch) ends a spin at once, neither a hit nor a miss: that task runs
    first."""
    server, log = new_server()

    async def test():
        c = await Conn.open(server)
        r = server.reactor
        a, b = socket.socketpair()
        try:
            r.watch(a.fileno())
            b.send(b"x")                    # never read: the descriptor stays ready
            r.spin_hits = r.spin_misses = 0
            for _ in range(5):
                await c.ping()
            assert (r.spin_hits, r.spin_misses) == (0, 0)
            r.unwatch(a.fileno())
            for _ in range(5):
                await c.ping()
            assert r.spin_misses >= 1
        finally:
            a.close()
            b.close()
    trio.run(serving, server, test)
