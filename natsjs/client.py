"""A client connection: steps 1 and 5 of a message's path.

Step 1, the read loop: bytes from the socket go to the Cython core
(``ClientCore.feed``, natsjs/_core/fanout.pyx), which parses them and appends the
resulting frames to the outbound buffers of the subscribers.  Step 5, after each
read batch: every connection written to is flushed once (``Server.flush_pcd``) --
straight from the reader with one non-blocking ``send`` when its socket has room,
else by waking that connection's write loop, which waits for the socket under the
write deadline.

Control operations (CONNECT, SUB, UNSUB, PING, PONG) come back from the core as
``_on_op`` calls; they are rare enough to live in Python.

The socket is a plain non-blocking socket driven with ``trio.lowlevel``'s
``wait_readable``/``wait_writable``: the same readiness model trio's own sockets
use, without their per-call wrapper costs on the hot path.
"""
from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

import trio

from natsjs._core import parser as P
from natsjs._core.fanout import ClientCore
from natsjs._core.parser import ProtocolError
from natsjs._core.sublist import Subscription
from natsjs.auth import (AUTHENTICATION_TIMEOUT, AUTHORIZATION_VIOLATION, PermissionChecker,
                         authenticate, new_nonce)

if TYPE_CHECKING:  # pragma: no cover
    from natsjs.server import Server

# Read buffer sizes: start small, grow while reads fill the buffer, shrink when idle
# (nats-server does the same between 512 B and 64 KB, server/client.go readLoop).
MIN_READ = 512
MAX_READ = 65536
# A producer waits at most this long per read batch for a consumer that is falling
# behind (server/client.go stallClientMaxDuration).
STALL_WAIT = 0.005

CLIENT_PROTO_INFO = 1
# How long a connection closed with an -ERR is drained so the client can read it.
LINGER = 1.0

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
MAX_CONNECTIONS = "Maximum Connections Exceeded"
AUTH_VIOLATION_REASON = "Authentication Failure"
AUTH_TIMEOUT_REASON = "Authentication Timeout"


_CONNECT_BOOLS = ("verbose", "pedantic", "echo", "headers", "no_responders", "tls_required")
_CONNECT_STRINGS = ("name", "lang", "version", "user", "pass", "auth_token", "nkey", "sig",
                    "jwt")


def _check_connect_types(opts: dict) -> None:
    """Reject what Go's json.Unmarshal into the CONNECT struct would reject."""
    for key in _CONNECT_BOOLS:
        if key in opts and opts[key] is not None and not isinstance(opts[key], bool):
            raise ProtocolError("processConnect: %s is not a boolean" % key)
    for key in _CONNECT_STRINGS:
        if key in opts and opts[key] is not None and not isinstance(opts[key], str):
            raise ProtocolError("processConnect: %s is not a string" % key)
    proto = opts.get("protocol")
    if proto is not None and (isinstance(proto, bool) or not isinstance(proto, int)):
        raise ProtocolError("processConnect: protocol is not an integer")


class Client:
    """One client connection, owned by the server's nursery."""

    def __init__(self, server: "Server", sock: socket.socket, cid: int, addr):
        self.server = server
        self.sock = sock
        self.cid = cid
        self.host, self.port = addr[0], addr[1]
        opts = server.opts
        self.account = server.account
        self.core = ClientCore(
            self._on_op, self, self.account.sublist,
            opts.max_control_line, opts.max_payload, opts.max_pending)
        self.auth_required = server.auth_required
        self.core.connect_required = self.auth_required
        self.nonce = new_nonce() if opts.auth.has_nkeys or any(
            u.nkey for a in opts.accounts for u in a.users) else ""
        self.user = None
        self.perms: PermissionChecker | None = None
        self.connect_opts: dict = {}
        self.subs: dict[bytes, Subscription] = {}
        self.name = ""
        self.lang = ""
        self.version = ""
        self.protocol = 0
        self.connect_received = False
        self.first_pong_sent = False
        self.pings_out = 0
        self.write_blocked = False
        self._wake = trio.lowlevel.ParkingLot()
        self._drained = trio.lowlevel.ParkingLot()
        self._scope: trio.CancelScope | None = None
        self.closed_reason: str | None = None
        self._linger = False
        self.start = trio.current_time()
        self.last_activity = self.start
        self.log_prefix = "%s:%d - cid:%d - " % (self.host, self.port, cid)
        if server.log.trace_enabled:
            self.core.on_trace = self._trace_in

    # ---- lifecycle -------------------------------------------------------------

    async def run(self) -> None:
        log = self.server.log
        log.debug(self.log_prefix + "Client connection created")
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                self.send(self.server.client_info_line(self))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop)
                    nursery.start_soon(self._ping_loop)
                    if self.auth_required:
                        nursery.start_soon(self._auth_timeout)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
            if self._linger:
                await self._linger_close()
        finally:
            self._teardown()

    async def _linger_close(self) -> None:
        """After an -ERR, half-close and drain briefly so the client reads the error.

        Closing a socket with unread input makes the kernel send a reset, and a reset
        can destroy the -ERR before the client reads it (likely when the client is
        still sending the oversized payload that caused it).
        """
        sock = self.sock
        with trio.move_on_after(LINGER):
            while self.core.out:
                await trio.lowlevel.wait_writable(sock)
                try:
                    del self.core.out[:sock.send(self.core.out)]
                except BlockingIOError:
                    continue
                except OSError:
                    return
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                return
            while True:
                try:
                    if not sock.recv(65536):
                        return
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                except OSError:
                    return

    def close(self, reason: str, err: str | None = None) -> None:
        """Close from any task: queue ``-ERR`` if given, flush what we can, cancel."""
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        if err is not None:
            self.core.enqueue(b"-ERR '%s'\r\n" % err.encode())
            self._linger = True
        self.core.closed = True
        self._try_send()
        if self._scope is not None:
            self._scope.cancel()
        self._drained.unpark_all()

    def _teardown(self) -> None:
        if self.closed_reason is None:
            self.closed_reason = CLIENT_CLOSED
        self.core.closed = True
        sublist = self.account.sublist
        if self.connect_received:
            self.account.client_count -= 1
        for sub in self.subs.values():
            sub.closed = True
            sublist.remove(sub)
        self.subs.clear()
        self._drained.unpark_all()
        try:
            trio.lowlevel.notify_closing(self.sock)
        except Exception:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        self.server.remove_client(self)
        self.server.log.debug(self.log_prefix + "%s connection closed: %s",
                              "Client", self.closed_reason)

    # ---- reading ---------------------------------------------------------------

    async def _read_loop(self) -> None:
        sock = self.sock
        core = self.core
        server = self.server
        size = MIN_READ
        buf = bytearray(size)
        view = memoryview(buf)
        while True:
            try:
                n = sock.recv_into(buf)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError:
                self.close(READ_ERROR)
                return
            if n == 0:
                self.close(CLIENT_CLOSED)
                return
            self.last_activity = trio.current_time()
            try:
                core.feed(view[:n])
            except ProtocolError as exc:
                server.flush_pcd(core)
                self._protocol_error(exc)
                return
            except Exception as exc:  # a bug must cost one connection, not the server
                server.flush_pcd(core)
                server.log.error(self.log_prefix + "internal error: %r", exc)
                self.close(PROTOCOL_VIOLATION)
                return
            server.flush_pcd(core)
            if core.closed:
                return
            stalled = core.stalled
            if stalled is not None:
                core.stalled = None
                await stalled.conn.wait_drained(STALL_WAIT)
            else:
                await trio.lowlevel.checkpoint()
            if n == size and size < MAX_READ:
                size *= 2
                buf = bytearray(size)
                view = memoryview(buf)
            elif n < size // 2 and size > MIN_READ:
                size //= 2
                buf = bytearray(size)
                view = memoryview(buf)

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

    def on_trace_changed(self) -> None:
        self.core.on_trace = self._trace_in if self.server.log.trace_enabled else None

    def _trace_in(self, line: bytes) -> None:
        self.server.log.trace(self.log_prefix + "<<- [%s]", line.decode("utf-8", "replace"))

    # ---- writing ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue protocol bytes and flush them now if the socket has room."""
        self.core.enqueue(data)
        self.flush()

    def flush(self) -> None:
        """Called once per read batch for every connection written to."""
        if not self.write_blocked:
            self._try_send()

    def _try_send(self) -> None:
        out = self.core.out
        if not out or self.write_blocked:
            return
        try:
            n = self.sock.send(out)
        except BlockingIOError:
            n = 0
        except OSError:
            del out[:]
            self.close(WRITE_ERROR)
            return
        if n:
            del out[:n]
        if out:
            self.write_blocked = True
            self._wake.unpark()

    async def _write_loop(self) -> None:
        sock = self.sock
        out = self.core.out
        deadline = self.server.opts.write_deadline
        while True:
            if not self.write_blocked:
                await self._wake.park()
            while out:
                with trio.move_on_after(deadline) as cs:
                    await trio.lowlevel.wait_writable(sock)
                if cs.cancelled_caught:
                    self.server.note_slow_consumer(self)
                    self.server.log.info(
                        self.log_prefix + "Slow Consumer Detected: WriteDeadline of %gs exceeded "
                        "with %d chunks of %d total bytes.", deadline, 1, len(out))
                    del out[:]
                    self.close(SLOW_CONSUMER_DEADLINE)
                    return
                try:
                    n = sock.send(out)
                except BlockingIOError:
                    continue
                except OSError:
                    del out[:]
                    self.close(WRITE_ERROR)
                    return
                del out[:n]
            self.write_blocked = False
            self._drained.unpark_all()

    async def wait_drained(self, timeout: float) -> None:
        """Let a producer wait (briefly) for this connection to catch up."""
        if self.write_blocked and self.closed_reason is None:
            with trio.move_on_after(timeout):
                await self._drained.park()

    # ---- events from the core ----------------------------------------------------

    def slow_consumer(self) -> None:
        """The core found our pending output over max_pending."""
        self.server.note_slow_consumer(self)
        self.server.log.info(self.log_prefix + "Slow Consumer Detected: MaxPending of %d Exceeded",
                             self.core.max_pending)
        del self.core.out[:]
        self.close(SLOW_CONSUMER_PENDING)

    def auto_unsubscribe(self, sub: Subscription) -> None:
        """A subscription reached its UNSUB max."""
        if self.subs.get(sub.sid) is sub:
            del self.subs[sub.sid]
        sub.closed = True
        self.account.sublist.remove(sub)

    # ---- control operations --------------------------------------------------------

    def _on_op(self, op: int, args: bytes) -> None:
        if op == P.PING:
            self._process_ping()
        elif op == P.PONG:
            self.pings_out = 0
        elif op == P.SUB:
            self._process_sub(args)
        elif op == P.UNSUB:
            self._process_unsub(args)
        elif op == P.CONNECT:
            self._process_connect(args)
        elif op == P.ERR:
            # server/client.go processErr: log it and close, without a reply.
            self.server.log.error(self.log_prefix + "Client Error %s", args.decode("utf-8", "replace"))
            self.close(PROTOCOL_VIOLATION)
        elif op in (P.INFO, P.OK):
            pass  # nats-server ignores these from a client
        else:
            raise ProtocolError("unexpected operation %d" % op, P.ERR_UNKNOWN_OP)

    def _ok(self) -> None:
        if self.core.verbose:
            self.core.enqueue(b"+OK\r\n")
            self._mark_pending()

    def _mark_pending(self) -> None:
        # Flushed with the rest of the read batch.
        core = self.core
        if not core.pending:
            core.pending = True
            core.pcd.append(core)

    def _process_connect(self, args: bytes) -> None:
        try:
            opts = json.loads(args)
            if not isinstance(opts, dict):
                raise ValueError("CONNECT arguments are not a JSON object")
        except ValueError as exc:
            raise ProtocolError("processConnect: %s" % exc) from None
        _check_connect_types(opts)
        self.connect_opts = opts
        core = self.core
        core.verbose = bool(opts.get("verbose", core.verbose))
        core.pedantic = bool(opts.get("pedantic", core.pedantic))
        core.echo = bool(opts.get("echo", core.echo))
        core.headers = bool(opts.get("headers", core.headers))
        core.no_responders = bool(opts.get("no_responders", core.no_responders))
        self.name = str(opts.get("name", "") or "")
        self.lang = str(opts.get("lang", "") or "")
        self.version = str(opts.get("version", "") or "")
        try:
            self.protocol = int(opts.get("protocol", 0) or 0)
        except (TypeError, ValueError):
            self.protocol = -1
        if self.auth_required and not self._authenticate(opts):
            return
        self.connect_received = True
        self.account.client_count += 1
        if self.protocol < 0 or self.protocol > CLIENT_PROTO_INFO:
            self.close(PROTOCOL_VIOLATION, "invalid client protocol")
            return
        if core.no_responders and not core.headers:
            self.close(PROTOCOL_VIOLATION, "no responders requires headers support")
            return
        self._ok()

    def _authenticate(self, connect: dict) -> bool:
        server = self.server
        user = authenticate(server.opts.auth, server.users_by_account(), connect, self.nonce)
        if user is None:
            server.log.error(self.log_prefix + "authentication error%s",
                             " - User %r" % connect["user"] if connect.get("user") else "")
            self.close(AUTH_VIOLATION_REASON, AUTHORIZATION_VIOLATION)
            return False
        account = server.lookup_account(user.account) if user.account else server.account
        if account is None:
            self.close(AUTH_VIOLATION_REASON, AUTHORIZATION_VIOLATION)
            return False
        self.account = account
        self.core.sublist = account.sublist
        self.core.connect_required = False
        self.bind_user(user)
        return True

    def bind_user(self, user) -> None:
        """Apply ``user``'s permissions (at CONNECT, and again on a config reload)."""
        self.user = user
        self.perms = PermissionChecker(user.permissions) if user.permissions else None
        self.core.pub_check = self._check_publish if self.perms and self.perms.checks_publish \
            else None
        self.core.on_reply = self.perms.note_reply if self.perms and self.perms.response \
            else None

    def reauthorize(self) -> None:
        """After a reload: close the connection if its credentials no longer pass."""
        server = self.server
        if not self.connect_received:
            return
        if not server.auth_required:
            if self.account is not server.account:
                self.close(AUTH_VIOLATION_REASON, AUTHORIZATION_VIOLATION)
            else:
                self.bind_user(type(self.user)()) if self.user is not None else None
            return
        user = authenticate(server.opts.auth, server.users_by_account(), self.connect_opts,
                            self.nonce)
        account = None
        if user is not None:
            account = server.lookup_account(user.account) if user.account else server.account
        if user is None or account is not self.account:
            server.log.error(self.log_prefix + "authentication error after reload")
            self.close(AUTH_VIOLATION_REASON, AUTHORIZATION_VIOLATION)
            return
        self.bind_user(user)
        # Subscriptions the new permissions forbid are dropped, as nats-server does.
        if self.perms is not None:
            for sid, sub in list(self.subs.items()):
                if not self.perms.can_subscribe(sub.subject, sub.queue):
                    self.auto_unsubscribe(sub)

    def send_async_info(self, **extra) -> None:
        """INFO to a client that understands async INFO (protocol >= 1)."""
        if self.protocol >= CLIENT_PROTO_INFO and self.closed_reason is None:
            self.send(self.server.client_info_line(self, **extra))

    def _check_publish(self, subject: bytes) -> bool:
        if self.perms.can_publish(subject):
            return True
        text = "Permissions Violation for Publish to %s" % json.dumps(
            subject.decode("utf-8", "replace"))
        self.server.log.error(self.log_prefix + "Publish Violation - %s, Subject %r",
                              self._user_label(), subject.decode("utf-8", "replace"))
        self.core.enqueue(b"-ERR '%s'\r\n" % text.encode())
        self._mark_pending()
        return False

    def _user_label(self) -> str:
        u = self.user
        if u is None:
            return "User \"\""
        return "User %r" % (u.username or u.nkey)

    async def _auth_timeout(self) -> None:
        await trio.sleep(self.server.opts.auth.timeout)
        if self.user is None:
            self.server.log.debug(self.log_prefix + "Authentication Timeout")
            self.close(AUTH_TIMEOUT_REASON, AUTHENTICATION_TIMEOUT)

    def _process_ping(self) -> None:
        self.core.enqueue(b"PONG\r\n")
        self._mark_pending()
        # The first PING after CONNECT from a client that understands async INFO
        # gets an INFO with connect_info (server/client.go processPing).
        if self.connect_received and not self.first_pong_sent:
            self.first_pong_sent = True
            if self.protocol >= CLIENT_PROTO_INFO:
                self.core.enqueue(self.server.client_info_line(self, connect_info=True))

    def _process_sub(self, args: bytes) -> None:
        parts = args.split()
        if len(parts) == 2:
            subject, queue, sid = parts[0], None, parts[1]
        elif len(parts) == 3:
            subject, queue, sid = parts
        else:
            raise ProtocolError("processSub Parse Error: %r" % args)
        if sid in self.subs:
            self._ok()
            return
        if self.perms is not None and not self.perms.can_subscribe(subject, queue):
            s = json.dumps(subject.decode("utf-8", "replace"))
            if queue is not None:
                text = "Permissions Violation for Subscription to %s using queue %s" % (
                    s, json.dumps(queue.decode("utf-8", "replace")))
            else:
                text = "Permissions Violation for Subscription to %s" % s
            self.server.log.error(self.log_prefix + "Subscription Violation - %s, Subject %r",
                                  self._user_label(), subject.decode("utf-8", "replace"))
            self.core.enqueue(b"-ERR '%s'\r\n" % text.encode())
            self._mark_pending()
            return
        sub = Subscription(subject, queue, sid, self.core)
        try:
            self.account.sublist.insert(sub)
        except ValueError:
            self.core.enqueue(b"-ERR 'Invalid Subject'\r\n")
            self._mark_pending()
            return
        self.subs[sid] = sub
        self._ok()

    def _process_unsub(self, args: bytes) -> None:
        parts = args.split()
        if len(parts) == 1:
            sid, max_msgs = parts[0], 0
        elif len(parts) == 2:
            sid = parts[0]
            # parseSize semantics: anything but digits is -1, i.e. unsubscribe now.
            max_msgs = int(parts[1]) if parts[1].isdigit() and len(parts[1]) <= 9 else -1
        else:
            raise ProtocolError("processUnsub Parse Error: %r" % args)
        sub = self.subs.get(sid)
        if sub is not None:
            if max_msgs > 0 and sub.nmsgs < max_msgs:
                sub.max_msgs = max_msgs
            else:
                self.auto_unsubscribe(sub)
        self._ok()

    # ---- keepalive ---------------------------------------------------------------

    async def _ping_loop(self) -> None:
        opts = self.server.opts
        while True:
            await trio.sleep(opts.ping_interval)
            if self.pings_out + 1 > opts.max_pings_out:
                self.server.log.debug(self.log_prefix + "Stale Client Connection - Closing")
                self.close(STALE_CONNECTION, "Stale Connection")
                return
            self.pings_out += 1
            self.send(b"PING\r\n")

    # ---- monitoring --------------------------------------------------------------

    def pending_bytes(self) -> int:
        return len(self.core.out)
