"""What every connection shares: steps 1 and 5 of a message's path.

Step 1, the read loop: bytes from the transport (optionally S2-decoded, for a
compressed route) go to the connection's Cython core (``ClientCore``/``RouteCore``
in natsjs/_core/fanout.pyx), which parses them and appends the resulting frames to
the outbound buffers of the interested connections.  Step 5, after each read batch:
every connection written to is flushed once (``Server.flush_pcd``) -- straight from
the reader with one non-blocking ``send`` when the socket has room, else by waking
that connection's write loop, which waits for the socket under the write deadline.

Who does step 1: a plain client (no TLS, no authentication timeout) is read by the
server's ``Reactor``, one task over an epoll set of its own that reads whichever
sockets are ready; a connection that must wait for something (a deferred operation, a
consumer to drain), a TLS client and a route each have a task running the read loop.
The write loop, a task too, starts only the first time a socket fills.  Keepalive
PINGs for clients come from one ``Pinger`` task.  So a plain client costs no task of
its own: at thousands of connections the tasks, their cancel scopes and trio's
per-wait ``epoll_ctl`` calls were most of what setting one up cost.

The transport (natsjs/tls.py) is the plain non-blocking socket, or TLS over it,
driven with trio's ``wait_readable``/``wait_writable``: the readiness model trio's
own sockets use, without their per-call wrapper costs on the hot path.  Subclasses
(natsjs/client.py, natsjs/route.py) add the protocol: what the core's ``on_op``
callback does with CONNECT, SUB, RS+ and the like.
"""
from __future__ import annotations

import json
import math
import select
import socket
import time
import traceback
from typing import TYPE_CHECKING

import trio

from natsjs._core import parser as P
from natsjs._core.fanout import consume
from natsjs._core.parser import ProtocolError
from natsjs.tls import PlainTransport

if TYPE_CHECKING:  # pragma: no cover
    from natsjs.server import Server

# Read buffer sizes: start small, grow while reads fill the buffer, shrink when idle
# (nats-server does the same between 512 B and 64 KB, server/client.go readLoop).
MIN_READ = 512
MAX_READ = 65536
# A producer waits at most this long per read batch for a consumer that is falling
# behind (server/client.go stallClientMaxDuration).
STALL_WAIT = 0.005
# How long a connection closed with an -ERR is drained so the peer can read it.
LINGER = 1.0
# Compressed bytes decoded per step (see Connection._feed_s2).
S2_SLICE = 4096
# A compressed connection's flush waits while the producers of the moment keep adding
# to it (S2 blocks start with an empty history, so longer blocks compress better: on
# route traffic 64 KiB flushes give 2.72 at s2_fast, 1 MiB ones 2.88), until it holds
# one S2 block (the reference writer's block size) or nothing came for this many
# scheduling rounds.  Only a busy connection waits long; an idle one sends after a
# couple of rounds.
S2_FLUSH_MAX = 1 << 20
S2_QUIET_ROUNDS = 2
# Granularity of the clients' keepalive timer (Pinger).
PING_TICK = 0.25

# Reasons a connection closed, as nats-server names them in /connz.
CLIENT_CLOSED = "Client Closed"
SLOW_CONSUMER_PENDING = "Slow Consumer (Pending Bytes)"
SLOW_CONSUMER_DEADLINE = "Slow Consumer (Write Deadline)"
STALE_CONNECTION = "Stale Connection"
PROTOCOL_VIOLATION = "Protocol Violation"
MAX_PAYLOAD_EXCEEDED = "Maximum Message Payload Exceeded"
MAX_CONTROL_LINE_EXCEEDED = "Maximum Control Line Exceeded"
READ_ERROR = "Read Error"
WRITE_ERROR = "Write Error"
SERVER_SHUTDOWN = "Server Shutdown"


def json_object(args: bytes, where: str) -> dict:
    """The JSON object of a CONNECT or INFO; anything else is a protocol error."""
    try:
        obj = json.loads(args)
    except ValueError as exc:
        raise ProtocolError("%s: %s" % (where, exc)) from None
    if not isinstance(obj, dict):
        raise ProtocolError("%s: arguments are not a JSON object" % where)
    return obj


class Connection:
    """A socket, its Cython core and the tasks that move bytes; owned by the server."""

    kind = "Client"

    def __init__(self, server: "Server", sock: socket.socket, cid: int, addr, core):
        self.server = server
        self.sock = sock
        self.transport = PlainTransport(sock)
        self.cid = cid
        self.host, self.port = addr[0], addr[1]
        self.core = core
        self.write_blocked = False
        self.pings_out = 0
        self.rtt = 0.0
        # Its ClientInfo as requests through a sharing service import carry it
        # (natsjs/clientinfo.py request_info_value): (key, JSON) once made.
        self.request_info = None
        self._ping_at = 0.0
        self.ping_slot = 0                # the Pinger's, for a client
        # The write loop waits on _wake; producers wait on _drained for it to catch up
        # (both made when first needed).
        self._wake: trio.lowlevel.ParkingLot | None = None
        self._drained: trio.lowlevel.ParkingLot | None = None
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._writing = False             # the write loop is running
        self._writer_scope: trio.CancelScope | None = None
        self._writer_done: trio.Event | None = None
        self._started = False             # being served (by a task or the reactor)
        self._reactor: "Reactor | None" = None
        # The peer says nothing before our INFO (a client): the read loop starts by
        # waiting instead of with a read that can only fail.
        self.wait_first = False
        self.closed_reason: str | None = None
        # Set by a stopping server: the socket is handed to it at teardown instead of
        # closed, and the server closes it last, just before it exits (Server.shutdown).
        self.hold_socket: list | None = None
        self._linger = False
        self._deferred = None             # (step, args) set by defer()
        # S2 stream framing (compressed routes): bytes are compressed from core.out
        # into _zout when flushed, and decoded before the parser on the way in.
        self.s2_reader = None
        self.s2_writer = None
        self._zout = bytearray()
        self.start = trio.current_time()
        self.last_activity = self.start
        self.log_prefix = "%s:%d - cid:%d - " % (self.host, self.port, cid)

    # ---- lifecycle -------------------------------------------------------------

    def serve(self, nursery: trio.Nursery) -> None:
        """Serve the connection: in the server's reactor when it can be served without
        a task of its own (``start_in_reactor``), else in a task of ``nursery``."""
        if not self.start_in_reactor():
            nursery.start_soon(self.run)

    def start_in_reactor(self) -> bool:
        """Greet the peer and hand the socket to the reactor; False when this
        connection needs a task (TLS, tasks of its own)."""
        return False

    async def run(self) -> None:
        self.server.log.debug("%s%s connection created", self.log_prefix, self.kind)
        self._started = True
        try:
            with trio.CancelScope() as scope:
                self._scope = scope            # what close() cancels
                if self.closed_reason is None and await self.on_start():
                    if self.needs_tasks():
                        async with trio.open_nursery() as nursery:
                            self._nursery = nursery
                            self.start_tasks(nursery)
                            await self._read_loop()
                            nursery.cancel_scope.cancel()
                    else:
                        await self._read_loop()
            await self._finish()
        finally:
            self._teardown()

    async def _finish(self) -> None:
        """After the reads: the write loop ends, an -ERR is drained to the peer."""
        await self._stop_writer()
        if self._linger:
            await self._linger_close()

    # ---- in the reactor ----------------------------------------------------------

    def on_readable(self, buf: bytearray) -> None:
        """The reactor saw the socket readable: one read, parsed, flushed.

        ``buf`` is the reactor's, shared by every connection it serves (the parser
        copies what a read leaves unfinished).  What needs to wait -- a handler that
        deferred the end of its operation, a consumer to drain -- moves the
        connection to a task of its own for the rest of its life.
        """
        core = self.core
        n = self._recv(buf)
        if n <= 0:
            return
        rest = self._parse(buf, n)
        if rest is False:
            return
        self.server.flush_pcd(core)
        if rest is not True:
            self._leave_reactor(rest, None)
        elif not core.closed and core.stalled is not None:
            stalled, core.stalled = core.stalled, None
            self._leave_reactor(None, stalled)

    def _leave_reactor(self, rest: bytes | None, stalled) -> None:
        self._reactor.remove(self)
        self._reactor = None
        self.server.start_connection_task(self._serve_in_task, rest, stalled)

    async def _serve_in_task(self, rest: bytes | None, stalled) -> None:
        """The rest of a connection that left the reactor, as ``run`` serves one."""
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                if self.closed_reason is None:
                    if rest is not None:
                        await self._resume(rest)
                    elif stalled is not None:
                        await stalled.conn.wait_drained(STALL_WAIT)
                    if not self.core.closed:
                        await self._read_loop()
            await self._finish()
        finally:
            self._teardown()

    async def _resume(self, rest: bytes) -> None:
        """Parse on after a pause, as the read loop does (rest: what followed it)."""
        core = self.core
        try:
            core.pause = True
            await self._after_pause(rest, 0)
        except Exception as exc:
            self.server.flush_pcd(core)
            self._read_failed(exc)
            return
        self.server.flush_pcd(core)

    async def _finish_closed(self) -> None:
        """A connection closed while in the reactor: finish and tear down in a task."""
        try:
            await self._finish()
        finally:
            self._teardown()

    async def on_start(self) -> bool:
        """Greet the peer (INFO, TLS); False closes the connection."""
        return True

    def needs_tasks(self) -> bool:
        """Whether ``start_tasks`` has tasks to start (then the connection gets a
        nursery of its own)."""
        return True

    def start_tasks(self, nursery: trio.Nursery) -> None:
        """Extra per-connection tasks (auth timeout, route keepalive)."""

    def on_closed(self) -> None:
        """Release what the connection held (subscriptions, registrations)."""

    def defer(self, step, *args) -> None:
        """Finish the operation being parsed with ``await step(*args)``.

        The parser stops after this operation; the read loop awaits the step and
        then parses what followed.  For work that must not hold the event loop, such
        as a bcrypt password check: this connection waits for it, no other does.
        """
        self._deferred = (step, args)
        self.core.pause = True

    def close(self, reason: str, err: str | None = None, graceful: bool = False) -> None:
        """Close from any task: queue ``-ERR`` if given, flush what we can, cancel.

        With an error, or ``graceful``, everything queued is written and the socket
        half-closed and drained before it is closed (``_linger_close``).
        """
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        if err is not None:
            self.core.enqueue(b"-ERR '%s'\r\n" % err.encode())
        if err is not None or graceful:
            self._linger = True
        self.core.closed = True
        self._try_send()
        if self._scope is not None:
            self._scope.cancel()
        elif self._reactor is not None:
            # Out of the reactor at once (its fd would stay readable), finished in a
            # task: the write loop may have to end and an -ERR to drain first.
            self._reactor.remove(self)
            self._reactor = None
            self.server.start_connection_task(self._finish_closed)
        if self._drained is not None:
            self._drained.unpark_all()

    async def _linger_close(self) -> None:
        """After an -ERR, half-close and drain briefly so the peer reads the error.

        Closing a socket with unread input makes the kernel send a reset, and a reset
        can destroy the -ERR before the peer reads it (likely when the client is
        still sending the oversized payload that caused it).
        """
        t = self.transport
        with trio.move_on_after(LINGER):
            while True:
                out = self._outgoing()
                if not out:
                    break
                await t.wait_writable()
                try:
                    consume(out, t.send(out))
                except BlockingIOError:
                    continue
                except OSError:
                    return
            try:
                t.shutdown_write()
            except OSError:
                return
            buf = bytearray(65536)
            while True:
                try:
                    if not t.recv_into(buf):
                        return
                except BlockingIOError:
                    await t.wait_readable()
                except OSError:
                    return

    def _teardown(self) -> None:
        if self.closed_reason is None:
            self.closed_reason = CLIENT_CLOSED
        self.core.closed = True
        if self._drained is not None:
            self._drained.unpark_all()
        try:
            self.on_closed()
        finally:
            if self.hold_socket is not None:
                self.hold_socket.append(self.transport)
            else:
                self.transport.close()
            self.server.remove_connection(self)
            self.server.log.debug(self.log_prefix + "%s connection closed: %s",
                                  self.kind, self.closed_reason)

    # ---- reading ---------------------------------------------------------------

    async def _read_loop(self) -> None:
        # The reactor stops a spin when this connection has something to read (a
        # route's PubAcks must not wait for a client that waits for them).
        reactor = self.server.reactor
        fd = self.sock.fileno() if reactor is not None and self.sock is not None else -1
        if fd >= 0:
            reactor.watch(fd)
        try:
            await self._reads()
        finally:
            if fd >= 0:
                reactor.unwatch(fd)

    async def _reads(self) -> None:
        t = self.transport
        core = self.core
        server = self.server
        size = MIN_READ
        buf = bytearray(size)
        if self.wait_first:
            await t.wait_readable()
        while True:
            n = self._recv(buf)
            if n < 0:
                return
            if n == 0:
                await t.wait_readable()
                continue
            rest = self._parse(buf, n)
            if rest is False:
                return
            if rest is not True:
                try:
                    await self._after_pause(rest, 0)
                except Exception as exc:
                    server.flush_pcd(core)
                    self._read_failed(exc)
                    return
            server.flush_pcd(core)
            if core.closed:
                return
            stalled = core.stalled
            if stalled is not None:
                core.stalled = None
                await stalled.conn.wait_drained(STALL_WAIT)
            elif n < size:
                # A short read drained the socket: wait for more (which also lets the
                # other tasks run) instead of a read that would only fail.
                await t.wait_readable()
            else:
                await trio.lowlevel.checkpoint()
            if n == size and size < MAX_READ:
                size *= 2
                buf = bytearray(size)
            elif n < size // 2 and size > MIN_READ:
                size //= 2
                buf = bytearray(size)

    def _recv(self, buf: bytearray) -> int:
        """One read into ``buf``: the bytes read, 0 when there is nothing to read now,
        -1 when the connection ended (it is closing)."""
        try:
            n = self.transport.recv_into(buf)
        except BlockingIOError:
            return 0
        except OSError:
            self.close(READ_ERROR)
            return -1
        if n == 0:
            self.close(CLIENT_CLOSED)
            return -1
        self.last_activity = trio.current_time()
        return n

    def _parse(self, buf: bytearray, n: int) -> bytes | bool:
        """Parse a read: True when done, the bytes after a pause when a handler paused
        the parser (``_after_pause`` goes on), False when the read failed (the batch
        was flushed and the connection is closing)."""
        core = self.core
        try:
            if self.s2_reader is not None:
                self._feed_s2(memoryview(buf)[:n])
                return True
            used = core.feed(buf, n)
            return bytes(buf[used:n]) if core.pause else True
        except Exception as exc:
            self.server.flush_pcd(core)
            self._read_failed(exc)
            return False

    async def _after_pause(self, data: bytes, used: int) -> None:
        """A handler paused the parser (``core.pause``): it deferred the end of its
        operation (defer()), or switched the stream (S2 from the next byte on).
        ``data[used:]`` is what followed in the read."""
        core = self.core
        while core.pause:
            core.pause = False
            data = data[used:]
            if self._deferred is not None:
                step, args = self._deferred
                self._deferred = None
                self.server.flush_pcd(core)
                await step(*args)
                if core.closed:
                    return
            if not data:
                return
            if self.s2_reader is not None:
                self._feed_s2(data)
                return
            used = core.feed(data)

    def _read_failed(self, exc: Exception) -> None:
        if isinstance(exc, ProtocolError):
            self._protocol_error(exc)
        elif isinstance(exc, ValueError):      # S2Error: a corrupt compressed stream
            self.server.log.error(self.log_prefix + "%s", exc)
            self.close(PROTOCOL_VIOLATION)
        else:   # a bug must cost one connection, not the server
            self.server.log.error(self.log_prefix + "internal error: %r", exc)
            self.server.log.debug("%s", "".join(traceback.format_exception(exc)))
            self.close(PROTOCOL_VIOLATION)

    def _feed_s2(self, data) -> None:
        """Decode an S2 stream a slice at a time, parsing as we go.

        A compressed block can expand 50 000 times (4 MiB of zeros in ~80 bytes), so
        a whole read is never decoded at once: memory stays bounded by what one
        slice of the wire can expand to, whatever a peer sends.
        """
        reader = self.s2_reader
        core = self.core
        for i in range(0, len(data), S2_SLICE):
            out = reader.feed(data[i:i + S2_SLICE])
            if out:
                core.feed(out)
                if core.closed:
                    return

    def _protocol_error(self, exc: ProtocolError) -> None:
        err = exc.client_error
        self.server.log.error(self.log_prefix + "%s", exc)
        if err == P.ERR_MAX_PAYLOAD:
            reason = MAX_PAYLOAD_EXCEEDED
        elif err == P.ERR_MAX_CONTROL_LINE:
            reason = MAX_CONTROL_LINE_EXCEEDED
        else:
            reason = PROTOCOL_VIOLATION
        self.close(reason, err)

    # ---- writing ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue protocol bytes and flush them now if the socket has room."""
        self.core.enqueue(data)
        self.flush()

    def flush(self) -> None:
        """Called once per read batch for every connection written to."""
        if self.write_blocked:
            return
        if self.s2_writer is not None:
            # The write loop gathers more before compressing (see S2_FLUSH_MAX).
            self.write_blocked = True
            self._wake_writer()
            return
        self._try_send()

    def _outgoing(self) -> bytearray:
        """The bytes to put on the wire next (compressing what the core queued)."""
        if self.s2_writer is None:
            return self.core.out
        out = self.core.out
        if out:
            self._zout += self.s2_writer.compress(bytes(out))
            del out[:]
        return self._zout

    def _try_send(self) -> None:
        if self.write_blocked:
            return
        out = self._outgoing()
        if not out:
            return
        try:
            n = self.transport.send(out)
        except BlockingIOError:
            n = 0
        except OSError:
            del out[:]
            self.close(WRITE_ERROR)
            return
        if n:
            consume(out, n)
        if out:
            self.write_blocked = True
            self._wake_writer()

    def _wake_writer(self) -> None:
        """Hand what is queued to the write loop, which waits for the socket.

        The loop starts the first time it is needed: most connections never fill
        their socket buffer, and a task fewer per connection is less to create and
        less for the cyclic GC to walk.
        """
        if self._writing:
            self._wake.unpark()
        elif self._started and self.closed_reason is None:
            self._start_writer()

    def _start_writer(self) -> None:
        self._writing = True
        self._wake = trio.lowlevel.ParkingLot()
        if self._nursery is not None:
            self._nursery.start_soon(self._write_loop)
            return
        # No nursery of our own: the loop runs in the server's, under a cancel scope
        # of ours, and run() waits for it to end before the socket is closed.
        self._writer_scope = trio.CancelScope()
        self._writer_done = trio.Event()
        self.server.start_connection_task(self._detached_write_loop)

    async def _detached_write_loop(self) -> None:
        try:
            with self._writer_scope:
                await self._write_loop()
        finally:
            self._writer_done.set()

    async def _stop_writer(self) -> None:
        if self._writer_done is None:
            return
        self._writer_scope.cancel()
        with trio.CancelScope(shield=True):
            await self._writer_done.wait()

    async def _write_loop(self) -> None:
        t = self.transport
        deadline = self.server.opts.write_deadline
        while True:
            if not self.write_blocked:
                await self._wake.park()
            if self.s2_writer is not None:
                await self._gather()
            while True:
                out = self._outgoing()
                if not out:
                    break
                with trio.move_on_after(deadline) as cs:
                    await t.wait_writable()
                if cs.cancelled_caught:
                    self.server.note_slow_consumer(self)
                    self.server.log.info(
                        self.log_prefix + "Slow Consumer Detected: WriteDeadline of %gs "
                        "exceeded with %d chunks of %d total bytes.", deadline, 1, len(out))
                    del out[:]
                    self.close(SLOW_CONSUMER_DEADLINE)
                    return
                try:
                    n = t.send(out)
                except BlockingIOError:
                    continue
                except OSError:
                    del out[:]
                    self.close(WRITE_ERROR)
                    return
                consume(out, n)
            self.write_blocked = False
            if self._drained is not None:
                self._drained.unpark_all()

    async def _gather(self) -> None:
        """Let a compressed flush grow while producers keep adding to it."""
        out = self.core.out
        size = len(out)
        quiet = 0
        while size < S2_FLUSH_MAX and quiet < S2_QUIET_ROUNDS:
            await trio.lowlevel.checkpoint()
            grown = len(out)
            quiet = quiet + 1 if grown == size else 0
            size = grown

    async def wait_drained(self, timeout: float) -> None:
        """Let a producer wait (briefly) for this connection to catch up."""
        if self.write_blocked and self.closed_reason is None:
            if self._drained is None:
                self._drained = trio.lowlevel.ParkingLot()
            with trio.move_on_after(timeout):
                await self._drained.park()

    def slow_consumer(self) -> None:
        """The core found our pending output over max_pending."""
        self.server.note_slow_consumer(self)
        self.server.log.info(self.log_prefix + "Slow Consumer Detected: MaxPending of %d "
                             "Exceeded", self.core.max_pending)
        del self.core.out[:]
        self.close(SLOW_CONSUMER_PENDING)

    def mark_pending(self) -> None:
        """Queue this connection for the flush at the end of the current read batch."""
        core = self.core
        if not core.pending:
            core.pending = True
            core.pcd.append(core)

    # ---- keepalive ---------------------------------------------------------------

    def ping_settings(self) -> tuple[float, int]:
        opts = self.server.opts
        return opts.ping_interval, opts.max_pings_out

    async def _ping_loop(self) -> None:
        """Keepalive in a task of the connection's own (routes; clients share a
        ``Pinger``)."""
        while True:
            interval, _ = self.ping_settings()
            await trio.sleep(interval)
            if not self.ping_due():
                return

    def ping_due(self) -> bool:
        """The ping interval passed: PING, or close the connection if too many went
        unanswered (False)."""
        _, max_out = self.ping_settings()
        if self.pings_out + 1 > max_out:
            self.server.log.debug(self.log_prefix + "Stale %s Connection - Closing", self.kind)
            self.close(STALE_CONNECTION, "Stale Connection")
            return False
        self.pings_out += 1
        self.send_ping()
        return True

    def send_ping(self) -> None:
        self._ping_at = time.monotonic()
        self.send(b"PING\r\n")

    def note_pong(self) -> None:
        """A PONG: nothing outstanding any more, and a fresh round-trip time."""
        self.pings_out = 0
        if self._ping_at:
            self.rtt = time.monotonic() - self._ping_at
            self._ping_at = 0.0

    # ---- monitoring --------------------------------------------------------------

    def pending_bytes(self) -> int:
        return len(self.core.out) + len(self._zout)


class Reactor:
    """Readiness for many connections from one task: a plain client needs no task.

    A task per connection, with its cancel scope and the two ``epoll_ctl`` calls
    trio makes for every wait, is most of what a new connection costs.  The reactor
    keeps one epoll set of its own (level-triggered: a socket stays ready until it is
    read dry), waits for it in one trio task, and for each ready socket calls
    ``Connection.on_readable``: one read into a buffer shared by all of them, parsed
    and flushed as the read loop does.  What has to wait moves the connection to a
    task (see ``on_readable``).  TLS connections, routes and clients with tasks of
    their own (an authentication timeout) keep a task from the start.
    """

    # Read size: the largest read loop buffer.
    BUF = MAX_READ

    # After a read, wait up to this long for the next one in this task before going back to
    # the event loop, as Go's scheduler spins before it parks.  A request's reply
    # usually comes within it, and the wake-up it saves (the loop's epoll and its
    # scheduler pass) was most of natsjs's extra latency in request/reply.  Only when no
    # other task is ready to run; a spin that finds nothing is not tried again for the
    # next 1, 3, 7 ... 255 wake-ups, so a server with sparse traffic does not burn CPU.
    SPIN = 100e-6

    def __init__(self, spin: float | None = None):
        self.spin = self.SPIN if spin is None else spin
        self._epoll = select.epoll()
        # What a spin waits on: the reactor's own sockets, and the descriptors that
        # tasks wait on (``watch``), which end it.
        self._spin_ep = select.epoll()
        self._spin_ep.register(self._epoll.fileno(), select.EPOLLIN)
        self._conns: dict[int, Connection] = {}
        self._buf = bytearray(self.BUF)
        self._backoff = 0
        self.spin_hits = 0
        self.spin_misses = 0

    def add(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        self._epoll.register(fd, select.EPOLLIN)
        self._conns[fd] = conn
        conn._reactor = self

    def watch(self, fd: int) -> None:
        """Input on ``fd`` (served by a task) ends a spin."""
        try:
            self._spin_ep.register(fd, select.EPOLLIN)
        except (OSError, ValueError):       # already watched, closed, or stopped
            pass

    def unwatch(self, fd: int) -> None:
        try:
            self._spin_ep.unregister(fd)
        except (OSError, ValueError):
            pass

    def remove(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        if self._conns.get(fd) is conn:
            del self._conns[fd]
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):     # closed socket, or the reactor stopped
                pass

    def _serve(self, events) -> None:
        """One read, parsed and flushed, for each ready connection."""
        conns = self._conns
        buf = self._buf
        for fd, _ in events:
            conn = conns.get(fd)
            if conn is not None:
                conn.on_readable(buf)

    async def run(self) -> None:
        epoll = self._epoll
        conns = self._conns
        try:
            spin = self.spin
            spin_ep = self._spin_ep
            efd = epoll.fileno()
            clock = time.perf_counter
            stats = trio.lowlevel.current_statistics
            skip = 0
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                self._serve(epoll.poll(0))
                if not spin:
                    continue
                if skip:
                    skip -= 1
                    continue
                if stats().tasks_runnable:
                    continue
                end = clock() + spin
                ready = None
                while clock() < end:
                    ready = spin_ep.poll(0)
                    if ready:
                        break
                if not ready:
                    self.spin_misses += 1
                    skip = self._backoff = min(self._backoff * 2 + 1, 255)
                    continue
                if len(ready) > 1 or ready[0][0] != efd:
                    continue        # a watched descriptor: its task goes first
                self.spin_hits += 1
                self._backoff = 0
                self._serve(epoll.poll(0))
        finally:
            # The server is stopping: what is still here goes without a goodbye.
            for conn in list(conns.values()):
                self.remove(conn)
                conn._reactor = None
                conn.closed_reason = conn.closed_reason or SERVER_SHUTDOWN
                conn._teardown()
            epoll.close()
            self._spin_ep.close()


class Pinger:
    """Keepalive for many connections from one task (the server's clients).

    A task per connection that sleeps between PINGs costs each connection a task, its
    timer and the objects they hold; here connections wait in buckets of PING_TICK
    seconds by when their next PING is due, and one task wakes each tick to ping what
    is due.  A PING may come up to one tick late; a closed connection leaves its
    bucket at once.
    """

    def __init__(self):
        self._buckets: dict[int, set] = {}
        self._lot = trio.lowlevel.ParkingLot()
        self._count = 0

    def add(self, conn: "Connection") -> None:
        interval, _ = conn.ping_settings()
        slot = math.ceil((trio.current_time() + interval) / PING_TICK)
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = set()
        bucket.add(conn)
        conn.ping_slot = slot
        self._count += 1
        if self._count == 1:
            self._lot.unpark_all()

    def discard(self, conn: "Connection") -> None:
        bucket = self._buckets.get(conn.ping_slot)
        if bucket is not None and conn in bucket:
            bucket.discard(conn)
            self._count -= 1
            if not bucket:
                del self._buckets[conn.ping_slot]

    async def run(self) -> None:
        while True:
            if not self._count:
                await self._lot.park()
                continue
            await trio.sleep(PING_TICK)
            now = math.floor(trio.current_time() / PING_TICK)
            for slot in sorted(k for k in self._buckets if k <= now):
                for conn in self._buckets.pop(slot):
                    self._count -= 1
                    if conn.closed_reason is None and conn.ping_due():
                        self.add(conn)
