"""A route connection: the cluster protocol on top of ``Connection``.

Messages never come back here: a route's Cython core (``RouteCore``,
natsjs/_core/fanout.pyx) delivers RMSG/HMSG to local subscribers only (one hop), and
clients' cores write RMSG frames straight into a route's outbound buffer.  This
module does the rest, as nats-server v2.10+ does it on the wire (server/route.go):

* the handshake: the acceptor sends INFO at once and wants CONNECT first; the
  dialler sends CONNECT and, when compression is configured or the connection is
  pooled, delays its INFO until it knows which pool slot it takes;
* compression negotiation (``select_compression``): the dialler's first INFO goes
  out in the clear, then both sides switch to S2 (natsjs/_core/s2.pyx) and exchange
  a second, compressed INFO before the route is registered;
* RS+/RS- (remote interest, stored as subscriptions whose client is this route's
  core, so a local publish finds them in the same sublist match);
* PING/PONG with the route timings (first PING after 1-1.2 s, then at most every
  30 s) and the RTT that ``s2_auto`` picks its level from.

Registration, pooling, gossip and interest propagation live in natsjs/cluster.py.
"""
from __future__ import annotations

import collections
import random
import socket
from typing import TYPE_CHECKING

import trio

from natsjs._core import parser as P
from natsjs._core.fanout import RouteCore
from natsjs._core.parser import ProtocolError
from natsjs.connection import PROTOCOL_VIOLATION, Connection, json_object
from natsjs.options import (COMPRESSION_ACCEPT, COMPRESSION_NOT_SUPPORTED, COMPRESSION_OFF,
                            COMPRESSION_S2_AUTO, COMPRESSION_S2_BEST, COMPRESSION_S2_BETTER,
                            COMPRESSION_S2_FAST, COMPRESSION_S2_UNCOMPRESSED)

if TYPE_CHECKING:  # pragma: no cover
    from natsjs.cluster import Cluster, Solicit

# Routes carry accounts, replies and queue names: nats-server gives them no payload
# limit (mpay -1); ours is the largest size a PUB may have anywhere.
ROUTE_MAX_PAYLOAD = 64 * 1024 * 1024
FIRST_PING_INTERVAL = 1.0
ROUTE_MAX_PING_INTERVAL = 30.0

# Close reasons (server/monitor.go ClosedState names).
DUPLICATE_ROUTE = "Duplicate Route"
CLUSTER_NAME_CONFLICT = "Cluster Name Conflict"
DUPLICATE_SERVER_NAME = "Duplicate Server Name"
ROUTE_REMOVED = "Route Removed"
AUTH_VIOLATION = "Authentication Failure"

S2_LEVELS = {COMPRESSION_S2_UNCOMPRESSED: "uncompressed", COMPRESSION_S2_FAST: "fast",
             COMPRESSION_S2_BETTER: "better", COMPRESSION_S2_BEST: "best"}


def needs_compression(mode: str) -> bool:
    return mode not in (COMPRESSION_OFF, COMPRESSION_NOT_SUPPORTED, "")


def select_compression(local: str, remote: str | None) -> str:
    """The mode this side uses, from its own and the peer's INFO (server.go
    selectCompressionMode).  ``s2_auto`` is returned as such; the caller turns it
    into a level from the RTT.  Raises ValueError for a mode nobody knows."""
    if not remote or remote == COMPRESSION_NOT_SUPPORTED:
        return COMPRESSION_NOT_SUPPORTED
    if remote == COMPRESSION_OFF:
        return COMPRESSION_OFF
    if remote == COMPRESSION_ACCEPT:
        return COMPRESSION_OFF if local == COMPRESSION_ACCEPT else local
    if remote in (COMPRESSION_S2_AUTO, COMPRESSION_S2_UNCOMPRESSED, COMPRESSION_S2_FAST,
                  COMPRESSION_S2_BETTER, COMPRESSION_S2_BEST):
        if local == COMPRESSION_ACCEPT:
            return COMPRESSION_S2_FAST if remote == COMPRESSION_S2_AUTO else remote
        return local
    raise ValueError('unsupported route compression mode "%s"' % remote)


def level_for_rtt(rtt: float, thresholds: tuple[float, ...]) -> str:
    """s2_auto: the level for a round-trip time (server/route.go selectS2AutoModeBasedOnRTT)."""
    levels = (COMPRESSION_S2_UNCOMPRESSED, COMPRESSION_S2_FAST, COMPRESSION_S2_BETTER,
              COMPRESSION_S2_BEST)
    for i, t in enumerate(thresholds):
        if t > 0 and rtt <= t:
            return levels[i]
    return COMPRESSION_S2_BEST if len(thresholds) >= 3 else levels[max(len(thresholds) - 1, 0)]


class Route(Connection):
    kind = "Router"

    def __init__(self, cluster: "Cluster", sock: socket.socket, rid: int, addr,
                 solicit: "Solicit | None" = None):
        server = cluster.server
        opts = server.opts
        core = RouteCore(self._on_op, self, cluster.sublists, opts.max_control_line,
                         ROUTE_MAX_PAYLOAD, opts.max_pending)
        super().__init__(server, sock, rid, addr, core)
        self.cluster = cluster
        self.solicit = solicit
        # ``dialled``: this server opened the TCP connection (fixed; the handshake
        # depends on it).  ``did_solicit`` is nats-server's flag of the same name: it
        # starts equal, and a kept connection takes it over from a duplicate that we
        # dialled, so that the kept one is redialled if it drops (route.go
        # handleDuplicateRoute, upgradeRouteToSolicited).
        self.dialled = solicit is not None
        self.did_solicit = self.dialled
        self.retry = False               # redial this one even if accepted (see above)
        self.account = solicit.account if solicit is not None else None
        self.remote_id = ""
        self.remote_name = ""
        self.remote_info: dict = {}
        self.remote = None               # cluster.Remote once registered
        self.pool_idx = 0
        self.no_pool = False
        self._registered = False
        self.info_received = False
        self.compression = COMPRESSION_OFF
        self.compression_negotiated = False
        self.no_reconnect = False
        # Being wound down (a reload shrank the pool or unpinned the account): nothing
        # new is placed on it, and it closes once neither side routes through it.
        self._retiring = False
        self.ponged = False              # the peer has answered a PING of ours
        self._pings_sent = 0
        self._checking = False           # a bcrypt check of the CONNECT is running
        # One entry per PING in flight, in order: what to do when its PONG comes
        # (None for keepalives).  A PONG means the peer has processed everything we
        # sent before the PING, and everything it sent before the PONG is here.
        self._pong_waiters: collections.deque = collections.deque()
        self.log_prefix = "%s:%d - rid:%d - " % (self.host, self.port, rid)
        if not self.dialled:
            core.connect_required = True   # the acceptor wants CONNECT first

    # ---- state the core's fast path depends on ----------------------------------------

    @property
    def registered(self) -> bool:
        return self._registered

    @registered.setter
    def registered(self, value: bool) -> None:
        self._registered = value
        self.update_fast_path()

    @property
    def retiring(self) -> bool:
        return self._retiring

    @retiring.setter
    def retiring(self, value: bool) -> None:
        self._retiring = value
        self.update_fast_path()

    @property
    def remote_subs(self) -> dict:
        """The peer's interest that came on this connection (RouteCore.remote_subs)."""
        return self.core.remote_subs

    def update_fast_path(self) -> None:
        """RS+/RS- stay in the core while nothing here must look at each one: the
        connection is registered, not being retired, and no cluster permissions
        decide what we take."""
        self.core.interest_ok = self._registered and not self._retiring and \
            self.cluster.perms is None


    async def on_start(self) -> bool:
        cluster = self.cluster
        self.server.log.info(self.log_prefix + "Route connection created")
        if cluster.tls_accept is not None and not await self._tls_handshake():
            return False
        if self.dialled:
            self.send(cluster.connect_line(self.solicit))
            if not self._delay_info():
                self.send(cluster.info_line(self, initial=True))
        else:
            self.send(cluster.info_line(self, initial=True))
        return True

    async def _tls_handshake(self) -> bool:
        """Routes do TLS before anything else (server/route.go createRoute)."""
        from urllib.parse import urlsplit

        from natsjs.tls import TLS_HANDSHAKE_FAILURE, TLSHandshakeError, TLSTransport
        cluster = self.cluster
        if self.dialled:
            url = self.solicit.url
            host = urlsplit(url if "://" in url else "nats-route://" + url).hostname
            t = TLSTransport(self.sock, cluster.tls_dial, server_side=False,
                             server_hostname=host)
        else:
            t = TLSTransport(self.sock, cluster.tls_accept)
        try:
            await t.handshake(cluster.copts.tls.timeout)
        except TLSHandshakeError as exc:
            self.server.log.error(self.log_prefix + "TLS route handshake error: %s", exc)
            self.closed_reason = TLS_HANDSHAKE_FAILURE
            return False
        self.transport = t
        return True

    def _delay_info(self) -> bool:
        copts = self.cluster.copts
        return self.dialled and (needs_compression(copts.compression) or (
            self.account is None and copts.pool_size >= 1))

    def start_tasks(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._ping_loop)
        if not self.dialled and self.cluster.copts.username:
            nursery.start_soon(self._auth_timeout)

    async def _auth_timeout(self) -> None:
        await trio.sleep(self.cluster.copts.auth_timeout)
        # A CONNECT whose password is still being checked disarmed the timer.
        if self.core.connect_required and not self._checking:
            self.close(AUTH_VIOLATION, "Authentication Timeout")

    def on_closed(self) -> None:
        self.cluster.route_closed(self)

    # ---- pings and RTT -------------------------------------------------------------

    def ping_settings(self) -> tuple[float, int]:
        copts = self.cluster.copts
        opts = self.server.opts
        interval = min(copts.ping_interval or opts.ping_interval, ROUTE_MAX_PING_INTERVAL)
        if self._pings_sent == 0:
            # server/route.go setFirstPingTimer: soon after the handshake, jittered.
            interval = min(interval, FIRST_PING_INTERVAL) * (1 + random.random() * 0.2)
        return interval, copts.max_pings_out or opts.max_pings_out

    def send_ping(self, waiter=None) -> None:
        self._pings_sent += 1
        self._pong_waiters.append(waiter)
        super().send_ping()

    def after_pong(self, waiter) -> None:
        """Call ``waiter()`` once the peer has answered a PING sent now."""
        self.send_ping(waiter)

    def _process_pong(self) -> None:
        measured = bool(self._ping_at)
        self.ponged = True
        self.note_pong()
        if measured and self.cluster.copts.compression == COMPRESSION_S2_AUTO \
                and self.s2_writer:
            self.set_s2_level(level_for_rtt(self.rtt, self.cluster.copts.rtt_thresholds))
        waiter = self._pong_waiters.popleft() if self._pong_waiters else None
        if waiter is not None and self.closed_reason is None:
            waiter()

    # ---- compression -----------------------------------------------------------

    def set_s2_level(self, mode: str) -> None:
        """Compress what we write from now on at ``mode``: the first call starts the
        connection's S2 stream, later ones change its level in place."""
        from natsjs._core.s2 import S2Writer
        self.compression = mode
        if self.s2_writer is not None:
            self.s2_writer.level = S2_LEVELS[mode]
            return
        # Whatever is still queued went out before the switch: it stays uncompressed.
        self._zout += self.core.out
        del self.core.out[:]
        self.s2_writer = S2Writer(S2_LEVELS[mode])

    def switch_reader(self) -> None:
        """Everything after the INFO being processed arrives as an S2 stream."""
        from natsjs._core.s2 import S2Reader
        # nats-server writes 1 MiB blocks (klauspost/compress s2 default); refusing
        # larger ones bounds what one chunk can expand to.
        self.s2_reader = S2Reader(max_block_size=1 << 20)
        self.core.pause = True

    # ---- protocol ------------------------------------------------------------------

    def _on_op(self, op: int, args: bytes) -> None:
        if op == P.RS_PLUS:
            self.cluster.remote_sub(self, args)
        elif op == P.RS_MINUS:
            self.cluster.remote_unsub(self, args)
        elif op == P.PING:
            self.core.enqueue(b"PONG\r\n")
            self.mark_pending()
        elif op == P.PONG:
            self._process_pong()
        elif op == P.INFO:
            self._process_info(args)
        elif op == P.CONNECT:
            self._process_connect(args)
        elif op == P.ERR:
            err = args.decode("utf-8", "replace")
            self.server.log.error(self.log_prefix + "Route Error %s", err)
            if "Invalid route pool index" in err:
                self.no_reconnect = True     # the peer's pool is smaller than we thought
            if self.account is not None and "No route for account" in err:
                # The peer does not pin this account (route.go addRoute): carry it on
                # the pool to that server rather than redial forever.
                self.no_reconnect = True
                self.cluster.dedicated_refused(self)
            self.close(PROTOCOL_VIOLATION)
        elif op in (P.OK, P.LS_PLUS, P.LS_MINUS):
            pass   # leafnode interest: nothing here uses it
        else:
            raise ProtocolError("unexpected route operation %d" % op, P.ERR_UNKNOWN_OP)

    def _process_connect(self, args: bytes) -> None:
        cluster = self.cluster
        copts = cluster.copts
        c = json_object(args, "processRouteConnect")
        if "lang" in c:
            self.close(PROTOCOL_VIOLATION, "attempted to connect to route port")
            return
        if c.get("gateway"):
            self.close(PROTOCOL_VIOLATION, 'Rejecting connection from gateway "%s" on the Route '
                       'port' % c.get("gateway"))
            return
        if copts.username:
            from natsjs.auth import compare_secret, is_bcrypt
            given = str(c.get("pass") or "")
            if c.get("user") == copts.username and is_bcrypt(copts.password):
                # A bcrypt check runs in a worker thread (Connection.defer).
                self._checking = True
                self.defer(self._check_then_connect, c, copts.password, given)
                return
            if c.get("user") != copts.username or not compare_secret(copts.password, given):
                self._refuse_credentials()
                return
        self._connect_accepted(c)

    async def _check_then_connect(self, c: dict, secret: str, given: str) -> None:
        from natsjs.auth import check_secret
        if await check_secret(secret, given, self.server.password_checks):
            self._connect_accepted(c)
        else:
            self._refuse_credentials()

    def _refuse_credentials(self) -> None:
        self.server.log.error(self.log_prefix + "authentication error")
        self.close(AUTH_VIOLATION, "Authorization Violation")

    def _connect_accepted(self, c: dict) -> None:
        cluster = self.cluster
        theirs = str(c.get("cluster") or "")
        if theirs and theirs != cluster.name:
            if cluster.dynamic_name and (not c.get("cluster_dynamic") or cluster.name < theirs):
                cluster.adopt_name(theirs, keep=self)
            else:
                self.close(CLUSTER_NAME_CONFLICT,
                           'Rejecting connection, cluster name "%s" does not match "%s"'
                           % (theirs, cluster.name))
                return
        self.remote_id = str(c.get("name") or "")
        self.core.connect_required = False

    def _process_info(self, args: bytes) -> None:
        info = json_object(args, "processRouteInfo")
        cluster = self.cluster
        server = self.server
        sid = info.get("server_id", "")
        if sid == server.server_id:
            self.no_reconnect = True
            self.close(DUPLICATE_ROUTE)
            return
        theirs = info.get("cluster") or ""
        if theirs and theirs != cluster.name:
            if cluster.dynamic_name and (not info.get("cluster_dynamic") or cluster.name < theirs):
                cluster.adopt_name(theirs, keep=self)
            else:
                self.close(CLUSTER_NAME_CONFLICT)
                return
        if self.info_received:
            cluster.async_route_info(self, info)
            return
        if not self.dialled and info.get("server_name") == server.name:
            server.log.error(self.log_prefix + "Remote server has a duplicate name: %r",
                             server.name)
            self.close(DUPLICATE_SERVER_NAME)
            return
        local = cluster.copts.compression
        if needs_compression(local):
            if not self.compression_negotiated:
                self.compression_negotiated = True
                try:
                    mode = select_compression(local, info.get("compression"))
                except ValueError as exc:
                    self.close(PROTOCOL_VIOLATION, str(exc))
                    return
                if mode == COMPRESSION_S2_AUTO:
                    # The handshake's duration stands in for the RTT until the first PONG.
                    mode = level_for_rtt(trio.current_time() - self.start,
                                         cluster.copts.rtt_thresholds)
                if mode in S2_LEVELS:
                    self._start_compression(mode)
                    return
                self.compression = mode
            send_delayed = self.dialled
        else:
            self.compression = COMPRESSION_NOT_SUPPORTED if not info.get("compression") \
                else COMPRESSION_OFF
            send_delayed = self._delay_info()
        self.info_received = True
        self.remote_info = info
        self.remote_id = sid
        self.remote_name = info.get("server_name", "")
        self.core.headers = bool(info.get("headers", False))
        cluster.add_route(self, info, send_delayed)

    def _start_compression(self, mode: str) -> None:
        """Switch this connection to S2 (server/route.go negotiateRouteCompression).

        The dialler sends its first INFO in the clear and then writes S2; the acceptor
        creates its writer first, so its reply INFO is the first compressed data.
        Both read S2 from the byte after the INFO being processed.
        """
        cluster = self.cluster
        if self.dialled:
            self.send(cluster.info_line(self, initial=False, negotiated=mode, with_slot=False))
            self.set_s2_level(mode)
        else:
            self.set_s2_level(mode)
            self.send(cluster.info_line(self, initial=False, negotiated=mode, with_slot=False))
        self.switch_reader()

    # ---- monitoring (natsjs/monitor.py /routez reads these) ----------------------

    @property
    def is_configured(self) -> bool:
        return bool(self.solicit is not None and self.solicit.explicit)

    @property
    def subs(self) -> dict:
        return self.core.remote_subs
