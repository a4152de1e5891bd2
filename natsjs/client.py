"""A client connection: the NATS client protocol on top of ``Connection``.

The read and write loops, flushing and back-pressure live in natsjs/connection.py;
the Cython core (``ClientCore``) turns PUB/HPUB into MSG/HMSG frames without coming
back here.  This module handles what the core hands up through ``_on_op``: CONNECT
(authentication, natsjs/auth.py), SUB/UNSUB (permissions, the account's sublist),
PING/PONG, and the INFO the client gets on connect and on changes.
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
from natsjs.connection import PROTOCOL_VIOLATION, Connection, json_object
from natsjs.auth import (AUTHENTICATION_TIMEOUT, AUTHORIZATION_VIOLATION, PermissionChecker,
                         check_secret, compare_secret, identify, is_bcrypt, new_nonce)

if TYPE_CHECKING:  # pragma: no cover
    from natsjs.server import Server

CLIENT_PROTO_INFO = 1
MAX_CONNECTIONS = "Maximum Connections Exceeded"
AUTH_VIOLATION_REASON = "Authentication Failure"
AUTH_TIMEOUT_REASON = "Authentication Timeout"


_CONNECT_BOOLS = ("verbose", "pedantic", "echo", "headers", "no_responders", "tls_required")
_CONNECT_STRINGS = ("name", "lang", "version", "user", "pass", "auth_token", "nkey", "sig",
                    "jwt")


def _go_quote(data: bytes) -> str:
    """Go's %q of a byte string, as nats-server prints payloads in traces."""
    out = []
    for b in data:
        c = chr(b)
        if c == '"' or c == "\\":
            out.append("\\" + c)
        elif 32 <= b < 127:
            out.append(c)
        elif c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        else:
            out.append("\\x%02x" % b)
    return '"' + "".join(out) + '"'


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


class Client(Connection):
    """One client connection, owned by the server's nursery."""

    kind = "Client"

    def __init__(self, server: "Server", sock: socket.socket, cid: int, addr):
        opts = server.opts
        self.account = server.account
        core = ClientCore(self._on_op, self, self.account.sublist,
                          opts.max_control_line, opts.max_payload, opts.max_pending)
        core.max_subs = opts.max_subs
        super().__init__(server, sock, cid, addr, core)
        self.auth_required = server.auth_required
        core.connect_required = self.auth_required
        self.nonce = new_nonce() if server.nonce_wanted else ""
        self.user = None
        # The configured secret this connection's credentials were found to match:
        # a reload that keeps it needs no second (bcrypt) check.
        self.verified_secret: str | None = None
        self.perms: PermissionChecker | None = None
        self.connect_opts: dict = {}
        # sid -> Subscription, kept by the core, which handles SUB and UNSUB itself
        # while the connection has no subscribe permissions to check.
        self.subs: dict[bytes, Subscription] = core.subs
        core.on_interest = self._interest_changed
        self.name = ""
        self.lang = ""
        self.version = ""
        self.protocol = 0
        self.connect_received = False
        self.first_pong_sent = False
        self.wait_first = True
        self.on_trace_changed()

    # ---- lifecycle -------------------------------------------------------------

    async def on_start(self) -> bool:
        server = self.server
        info = server.client_info_line(self)
        server.pinger.add(self)
        if server.tls_context is None:
            self.send(info)
            return True
        from natsjs.tls import TLS_HANDSHAKE_FAILURE, TLSHandshakeError, accept_tls
        try:
            self.transport = await accept_tls(self.sock, server.tls_context, server.opts.tls,
                                              info)
        except TLSHandshakeError as exc:
            log = server.log.debug if exc.probe else server.log.error
            log(self.log_prefix + "TLS handshake error: %s", exc)
            self.closed_reason = TLS_HANDSHAKE_FAILURE
            return False
        self.flush()
        return True

    def needs_tasks(self) -> bool:
        return self.auth_required

    def start_in_reactor(self) -> bool:
        server = self.server
        if server.tls_context is not None or self.auth_required or server.reactor is None:
            return False
        server.log.debug("%s%s connection created", self.log_prefix, self.kind)
        self._started = True
        server.pinger.add(self)
        self.send(server.client_info_line(self))
        server.reactor.add(self)
        return True

    def start_tasks(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._auth_timeout)

    def on_closed(self) -> None:
        self.server.pinger.discard(self)
        if self.connect_received:
            self.account.client_count -= 1
        # What the core gathered before the connection failed goes out first, so
        # that the counts the routes see stay right.
        self.core.flush_interest()
        self.server.route_interest(self.account, self.core.drop_all(self.account.sublist,
                                                                     keep=True), -1)
        # Kept as it was at close for /connz?state=closed (the subscriptions are no
        # longer in any sublist; the output buffer is released).
        self.stop = trio.current_time()
        del self.core.out[:]
        self.core.release()
        self.server.closed_clients.append(self)

    def on_trace_changed(self) -> None:
        """Wire the core's trace hooks to the log when -V is on (nothing otherwise)."""
        on = self.server.log.trace_enabled
        self.core.on_trace = self._trace_in if on else None
        self.core.on_trace_payload = self._trace_payload_in if on else None
        self.core.on_trace_out = self._trace_msg_out if on else None
        self._update_fast_subs()

    def _update_fast_subs(self) -> None:
        """SUB/UNSUB stay in the core unless the trace must show what is sent back;
        subscribe permissions are checked from the core, as publish ones are."""
        perms = getattr(self, "perms", None)
        self.core.fast_subs = self.core.on_trace is None
        self.core.sub_check = perms.can_subscribe if perms is not None and \
            perms.checks_subscribe else None

    def _interest_changed(self, subs: list, delta: int) -> None:
        """The core's batch of SUBs (or UNSUBs) of one read."""
        self.server.route_interest(self.account, subs, delta)

    def _trace(self, direction: str, text: str) -> None:
        self.server.log.trace(self.log_prefix + "%s %s", direction, text)

    def _trace_in(self, line: bytes) -> None:
        self._trace("<<-", "[%s]" % line.decode("utf-8", "replace"))

    def _trace_payload_in(self, payload: bytes) -> None:
        self._trace("<<-", "MSG_PAYLOAD: [%s]" % _go_quote(payload))

    def _trace_msg_out(self, line: bytes, payload: bytes) -> None:
        self._trace("->>", "[%s]" % line.decode("utf-8", "replace"))
        self._trace("->>", "MSG_PAYLOAD: [%s]" % _go_quote(payload))

    def queue_proto(self, data: bytes) -> None:
        """Queue a protocol line for the flush at the end of this read batch."""
        if self.core.on_trace is not None:
            self._trace("->>", "[%s]" % data.rstrip(b"\r\n").decode("utf-8", "replace"))
        self.core.enqueue(data)
        self.mark_pending()

    # ---- events from the core ----------------------------------------------------

    def auto_unsubscribe(self, sub: Subscription) -> None:
        """A subscription reached its UNSUB max (or lost its permission)."""
        self.core.unsubscribe(sub)
        self.core.flush_interest()

    # ---- control operations --------------------------------------------------------

    def _on_op(self, op: int, args: bytes) -> None:
        if op == P.PING:
            self._process_ping()
        elif op == P.PONG:
            self.note_pong()
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
            self.queue_proto(b"+OK\r\n")

    def _process_connect(self, args: bytes) -> None:
        opts = json_object(args, "processConnect")
        _check_connect_types(opts)
        self.connect_opts = opts
        if not self.rtt:
            # A first estimate, from accept to CONNECT (server/client.go processConnect);
            # PONGs refine it.
            self.rtt = max(trio.current_time() - self.start, 1e-9)
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
        if not self.auth_required:
            self._connected(self.account)
            return
        user, secret, given = self._identify(opts)
        if user is not None and secret is not None and is_bcrypt(secret):
            # Checked in a worker thread; this client's next operations wait for the
            # verdict, nobody else's do.
            self.defer(self._check_then_connect, user, secret, given)
            return
        if secret is not None and not compare_secret(secret, given):
            user = None
        self._authorized(user, secret)

    async def _check_then_connect(self, user, secret: str, given: str) -> None:
        ok = await check_secret(secret, given, self.server.password_checks)
        self._authorized(user if ok else None, secret)

    def _authorized(self, user, secret: str | None) -> None:
        """The rest of CONNECT once the credentials were checked (user None: refused)."""
        previous = self.account
        if not self._bind(user, self.connect_opts):
            return
        self.verified_secret = secret
        self._connected(previous)

    def _connected(self, previous) -> None:
        core = self.core
        if self.connect_received:
            if self.account is not previous:
                # A second CONNECT moved us to another account: what we subscribed to
                # in the old one goes (server/client.go clearAccountSubs).
                self.core.flush_interest()
                self.server.route_interest(previous, self.core.drop_all(previous.sublist), -1)
                previous.client_count -= 1
                self.account.client_count += 1
        else:
            self.account.client_count += 1
        self.connect_received = True
        if self.protocol < 0 or self.protocol > CLIENT_PROTO_INFO:
            self.close(PROTOCOL_VIOLATION, "invalid client protocol")
            return
        if core.no_responders and not core.headers:
            self.close(PROTOCOL_VIOLATION, "no responders requires headers support")
            return
        self._ok()

    def _identify(self, connect: dict):
        """(user, secret, given) as auth.identify; verify_and_map maps the certificate."""
        server = self.server
        tls = server.opts.tls
        if tls is not None and tls.verify_and_map and getattr(self.transport, "is_tls", False):
            return self._tls_mapped_user(), None, ""
        return identify(server.opts.auth, server.users_by_account(), connect, self.nonce)

    def _bind(self, user, connect: dict) -> bool:
        """Bind the connection to ``user`` and its account; close it if there is none."""
        server = self.server
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
        self.core.account_name = account.name.encode()
        self.core.connect_required = False
        self.bind_user(user)
        return True

    def _tls_mapped_user(self):
        """verify_and_map: the user named by the client certificate (server/auth.go)."""
        from natsjs.tls import client_identity
        ident = client_identity(self.transport)
        if ident is None:
            return None
        server = self.server
        users = list(server.opts.auth.users) + [u for us in server.users_by_account().values()
                                                for u in us]
        name = ident.match(u.username for u in users if u.username)
        return next((u for u in users if u.username == name), None) if name else None

    def bind_user(self, user) -> None:
        """Apply ``user``'s permissions (at CONNECT, and again on a config reload)."""
        self.user = user
        self.perms = PermissionChecker(user.permissions) if user.permissions else None
        self.core.pub_check = self._check_publish if self.perms and self.perms.checks_publish \
            else None
        self.core.on_reply = self.perms.note_reply if self.perms and self.perms.response \
            else None
        self.core.deliver_filter = self.perms.can_deliver \
            if self.perms and self.perms.checks_delivery else None
        self._update_fast_subs()

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
        user, secret, given = self._identify(self.connect_opts)
        account = None
        if user is not None:
            account = server.lookup_account(user.account) if user.account else server.account
        if user is None or account is not self.account:
            self._refused_after_reload()
            return
        if secret is not None and secret != self.verified_secret:
            # The configured secret changed: check again, a bcrypt hash off the loop
            # (the connection keeps working meanwhile and is closed if it fails).
            if is_bcrypt(secret):
                server.spawn(self._recheck, secret, given)
            elif not compare_secret(secret, given):
                self._refused_after_reload()
                return
            else:
                self.verified_secret = secret
        self.bind_user(user)
        # Subscriptions the new permissions forbid are dropped, as nats-server does.
        if self.perms is not None:
            for sid, sub in list(self.subs.items()):
                if not self.perms.can_subscribe(sub.subject, sub.queue):
                    self.auto_unsubscribe(sub)

    async def _recheck(self, secret: str, given: str) -> None:
        if await check_secret(secret, given, self.server.password_checks):
            self.verified_secret = secret
        elif self.closed_reason is None:
            self._refused_after_reload()

    def _refused_after_reload(self) -> None:
        self.server.log.error(self.log_prefix + "authentication error after reload")
        self.close(AUTH_VIOLATION_REASON, AUTHORIZATION_VIOLATION)

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
        self.queue_proto(b"-ERR '%s'\r\n" % text.encode())
        return False

    def reply_violation(self, reply: bytes) -> None:
        """A PUB asked for its answers on a reserved reply subject; it is dropped."""
        text = json.dumps(reply.decode("utf-8", "replace"))
        self.server.log.error(self.log_prefix + "Publish Violation - Reply %s", text)
        self.queue_proto(b"-ERR 'Permissions Violation for Publish with Reply of %s'\r\n"
                         % text.encode())

    def _user_label(self) -> str:
        u = self.user
        if u is None:
            return "User \"\""
        return "User %r" % (u.username or u.nkey)

    async def _auth_timeout(self) -> None:
        await trio.sleep(self.server.opts.auth.timeout)
        # A CONNECT disarms the timer (server/client.go processConnect clearAuthTimer):
        # a password check still running is not a client that failed to authenticate.
        if self.user is None and not self.connect_opts:
            self.server.log.debug(self.log_prefix + "Authentication Timeout")
            self.close(AUTH_TIMEOUT_REASON, AUTHENTICATION_TIMEOUT)

    def _process_ping(self) -> None:
        self.queue_proto(b"PONG\r\n")
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
        # In nats-server's order (server/client.go processSubEx): permissions, the
        # limit, then a sid already in use.
        if self.perms is not None and not self.perms.can_subscribe(subject, queue):
            s = json.dumps(subject.decode("utf-8", "replace"))
            if queue is not None:
                text = "Permissions Violation for Subscription to %s using queue %s" % (
                    s, json.dumps(queue.decode("utf-8", "replace")))
            else:
                text = "Permissions Violation for Subscription to %s" % s
            self.server.log.error(self.log_prefix + "Subscription Violation - %s, Subject %r",
                                  self._user_label(), subject.decode("utf-8", "replace"))
            self.queue_proto(b"-ERR '%s'\r\n" % text.encode())
            return
        if self.core.max_subs and len(self.subs) >= self.core.max_subs:
            self.server.log.error(self.log_prefix + "maximum subscriptions exceeded")
            self.queue_proto(b"-ERR 'maximum subscriptions exceeded'\r\n")
            return
        if sid in self.subs:
            self._ok()
            return
        try:
            self.core.add_sub(subject, queue, sid)
        except ValueError:
            self.queue_proto(b"-ERR 'Invalid Subject'\r\n")
            return
        self.core.flush_interest()
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
