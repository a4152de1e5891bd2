"""The cluster: route listener, solicitation, pooling, gossip and interest.

Servers join by routes (natsjs/route.py) into a full mesh: each server dials the
routes it is configured with and, through gossip, every other server it hears of;
messages then take exactly one hop.  Wire behaviour follows nats-server v2.10+
(server/route.go, server/server.go) so natsjs and nats-server nodes share a cluster:

* **Pooling**: ``pool_size`` connections to every peer (default 3).  An account's
  interest and messages use the connection at ``FNV-1a-32(account) % pool_size``
  (computeRoutePoolIdx); the dialler fills the slots one after another, dialling the
  next when the PONG for the previous one's PING arrives.  Pinned accounts
  (``cluster { accounts: [...] }``, plus the system account whenever pooling is on)
  get a connection of their own on which the account name is left out.  A peer
  with pooling off (``pool_size: -1``, or a pre-2.10 server) gets one connection
  carrying every account.
* **Gossip**: when the first connection to a new peer registers, its INFO is
  forwarded to the other peers, which dial it (implicit routes).  Clients get the
  cluster's client URLs in INFO ``connect_urls``.
* **Interest**: local subscriptions are counted per account (``Account.rm``); the
  transitions become RS+/RS- on the connection that carries the account toward each
  peer, and a new connection gets everything of the accounts it now carries.
  Interest that changes connection (a reload pinning accounts or resizing the pool,
  a connection lost) moves make-before-break, confirmed by PING/PONG, so a reload
  loses no message; connections no longer wanted are retired once idle.
* **Duplicates**: when two servers dial each other, the connection registered first
  keeps its slot on each side (route.go handleDuplicateRoute) and is redialled if
  the peer kept the other one; two natsjs servers keep the one dialled by the server
  whose id sorts first, so they never both close theirs.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import random
import secrets
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

from natsjs import NATS_VERSION, __version__
from natsjs._core.fanout import PeerSubs
from natsjs._core.interest import interest_lines, rm_items, rm_lines
from natsjs.auth import Permissions, PermissionChecker, SubjectPermission
from natsjs.options import (COMPRESSION_ACCEPT, COMPRESSION_OFF, COMPRESSION_S2_AUTO,
                            ClusterOptions)
from natsjs.connection import PROTOCOL_VIOLATION
from natsjs.route import DUPLICATE_ROUTE, ROUTE_REMOVED, Route, level_for_rtt

if TYPE_CHECKING:  # pragma: no cover
    from natsjs.server import Server

ROUTE_PROTO = 2          # RouteProtoV2: pooling-aware; natsjs does no message tracing
DIAL_TIMEOUT = 1.0       # server/const.go DEFAULT_ROUTE_DIAL
CONNECT_DELAY = 1.0      # DEFAULT_ROUTE_CONNECT
CONNECT_MAX_DELAY = 30.0  # DEFAULT_ROUTE_CONNECT_MAX
RECONNECT_DELAY = 1.0    # DEFAULT_ROUTE_RECONNECT
# Bounds on what a peer may ask for (the route port may have no authorization).
MAX_POOL_SIZE = 256
MAX_QUEUE_WEIGHT = 4096
SUBS_LOG_INTERVAL = 10.0       # seconds between "maximum subscriptions exceeded" lines
MAX_IMPLICIT_DIALS = 32        # gossiped routes being dialled at once


@functools.lru_cache(maxsize=4096)
def pool_index(pool_size: int, account: str) -> int:
    """server/route.go computeRoutePoolIdx: FNV-1a 32 of the name, modulo the pool."""
    if pool_size <= 1:
        return 0
    h = 0x811C9DC5
    for b in account.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % pool_size


@dataclass

class Solicit:
    """One connection this server dials (and redials)."""
    url: str
    explicit: bool
    account: str | None = None
    peer_pinned: bool = False    # a dedicated connection the peer pins (gossiped)


@dataclass
class Remote:
    """Another server of the cluster and our connections to it."""
    server_id: str
    name: str = ""
    info: dict = field(default_factory=dict)
    pool: list = field(default_factory=list)        # Route | None per pool slot
    pinned: dict = field(default_factory=dict)      # account -> Route
    no_pool: bool = False
    url: str = ""            # where we reach it (dialled, or from its INFO)
    explicit: bool = False
    client_urls: list = field(default_factory=list)
    natsjs: bool = False     # speaks natsjs's additions (retiring a connection)
    pool_size: int = 0       # its configured pool size (route_pool_size)
    # Where our interest in each account sits (the connection that carries it), and
    # connections it is moving off that keep it until the new one is confirmed.
    placed: dict = field(default_factory=dict)      # account -> Route
    leaving: dict = field(default_factory=dict)     # account -> [Route]
    retiring: list = field(default_factory=list)    # Routes out of their slot, closing
    refused: set = field(default_factory=set)       # accounts it has no route for
    subs: PeerSubs = field(default_factory=PeerSubs)   # its interest held here, and the limit
    ignored: int = 0         # RS+ ignored over max_remote_subs
    ignored_logged: float = 0.0

    @property
    def nsubs(self) -> int:
        """Its subscriptions held here, on all its connections."""
        return self.subs.count

    def routes(self) -> list[Route]:
        return [r for r in self.pool if r is not None] + list(self.pinned.values()) \
            + self.retiring

    def first(self) -> Route | None:
        for r in self.pool:
            if r is not None:
                return r
        return next(iter(self.pinned.values()), None)


def usable(route: Route | None) -> bool:
    """A registered connection that is neither closing nor being retired."""
    return route is not None and route.registered and route.closed_reason is None \
        and not route.retiring


class Cluster:
    def __init__(self, server: "Server", copts: ClusterOptions):
        self.server = server
        self.copts = copts
        self.dynamic_name = not copts.name
        self.name = copts.name or secrets.token_urlsafe(16)
        self.remotes: dict[str, Remote] = {}
        self.routes: set[Route] = set()
        # Accounts a nats-server peer asked to have dedicated connections for
        # (route_acc_add): dialled like our pinned ones.
        self.adopted: set[str] = set()
        # Implicit (gossiped) dials under way: (url, account).
        self._implicit: set[tuple[str, str | None]] = set()
        # (url, account) of every dial loop running, with the route it made.
        self._dialling: collections.Counter = collections.Counter()
        self.sublists: dict[bytes, object] = {}
        self.port = 0
        self.host = copts.host
        self._nursery: trio.Nursery | None = None
        self.perms = PermissionChecker(copts.permissions) if copts.permissions else None
        self.tls_accept = self.tls_dial = None
        if copts.tls is not None:
            from natsjs.tls import make_route_contexts
            self.tls_accept, self.tls_dial = make_route_contexts(copts.tls)
        self.accounts_changed()

    # ---- configuration-derived facts ----------------------------------------------

    @property
    def pool_size(self) -> int:
        return self.copts.pool_size

    def pinned_accounts(self) -> list[str]:
        pinned = list(self.copts.accounts)
        sysname = self.server.system_account.name
        if self.pool_size > 0 and sysname not in pinned:
            pinned.append(sysname)
        return pinned if self.pool_size > 0 else []

    def can_import(self, subject: bytes) -> bool:
        """Whether we tell peers of local interest in ``subject`` (route.go canImport:
        the import list is checked as a publish permission)."""
        return self.perms is None or self.perms.can_publish(subject)

    def can_export(self, subject: bytes) -> bool:
        """Whether we take a peer's interest in ``subject`` (route.go canExport: the
        export list is checked as a subscribe permission)."""
        return self.perms is None or self.perms.can_subscribe(subject)

    def _wanted_dedicated(self) -> set[str]:
        return set(self.pinned_accounts()) | self.adopted if self.pool_size > 0 else set()

    def accounts_changed(self) -> None:
        self.sublists = {name.encode(): acc.sublist for name, acc in self.server.accounts.items()}
        for r in self.routes:
            r.core.sublists = self.sublists

    # ---- running ---------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        copts = self.copts
        log = self.server.log
        lsock = self.server.listen(copts.host, copts.port if copts.port else -1)
        self.port = lsock.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                log.info("Cluster name is %s", self.name)
                if self.dynamic_name:
                    log.warn("Cluster name was dynamically generated, consider setting one")
                log.info("Listening for route connections on %s:%d",
                         copts.host or "0.0.0.0", self.port)
                nursery.start_soon(self._accept_loop, lsock)
                for url in copts.routes:
                    self.solicit(Solicit(url, explicit=True))
                task_status.started()
        finally:
            lsock.close()

    def solicit(self, s: Solicit, with_pinned: bool = True) -> None:
        """Dial ``s`` (and, for a pool connection, the pinned accounts alongside)."""
        if self._nursery is None:
            return
        self._nursery.start_soon(self._solicit_loop, s)
        if with_pinned and s.account is None:
            for acc in self.pinned_accounts():
                self._nursery.start_soon(self._solicit_loop, Solicit(s.url, s.explicit, acc))

    async def _accept_loop(self, lsock: socket.socket) -> None:
        await self.server.accept_connections(lsock, self._new_route, "Route")

    def _new_route(self, sock: socket.socket, addr) -> None:
        route = Route(self, sock, self.server.next_cid(), addr)
        self.routes.add(route)
        self._nursery.start_soon(route.run)

    async def _dial(self, url: str) -> tuple[socket.socket, tuple] | None:
        u = urlsplit(url if "://" in url else "nats-route://" + url)
        host = u.hostname or "127.0.0.1"
        try:
            port = u.port or 6222
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, ValueError) as exc:
            self.server.log.debug("Error resolving route %s: %s", url, exc)
            return None
        family, _, _, _, addr = random.choice(infos)
        sock = None
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(addr)
            except BlockingIOError:
                with trio.move_on_after(DIAL_TIMEOUT) as cs:
                    await trio.lowlevel.wait_writable(sock)
                if cs.cancelled_caught:
                    raise OSError("i/o timeout")
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, "connection refused")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, sock.getpeername()
        except OSError as exc:
            # Out of descriptors, a reset right after connecting...: this attempt
            # failed, the server goes on.
            self.server.log.debug("Error trying to connect to route (%s): %s", url, exc)
            if sock is not None:
                sock.close()
            return None

    async def _solicit_loop(self, s: Solicit, wait: float = 0.0) -> None:
        """Dial ``s`` until a connection is made (explicit routes: forever), run it.

        What happens after it closes is decided in ``_reconnect`` for every route,
        dialled or accepted, as nats-server decides it in one place too.
        """
        server = self.server
        copts = self.copts
        attempts = 0
        delay = CONNECT_DELAY
        key = (s.url, s.account)
        self._dialling[key] += 1
        try:
            if wait:
                await trio.sleep(wait)
            while not server.shutting_down:
                if s.explicit and s.url not in self.copts.routes:
                    return     # removed from the configuration meanwhile (routeStillValid)
                if s.account is not None and s.account not in self._wanted_dedicated() \
                        and not s.peer_pinned:
                    return     # no longer an account with a route of its own
                dialed = await self._dial(s.url)
                if dialed is None:
                    attempts += 1
                    if not s.explicit and attempts > copts.connect_retries:
                        return
                    await trio.sleep(delay)
                    if copts.connect_backoff:
                        delay = min(delay * 2, CONNECT_MAX_DELAY)
                    continue
                sock, addr = dialed
                route = Route(self, sock, server.next_cid(), addr, s)
                self.routes.add(route)
                await route.run()
                return
        finally:
            self._implicit.discard((s.url, s.account))
            self._dialling[key] -= 1
            if self._dialling[key] <= 0:
                del self._dialling[key]

    def _reconnect(self, route: Route) -> None:
        """Redial a closed route if nats-server would (server/client.go
        reconnect): dialled routes, and any connection a duplicate was resolved in
        favour of (``retry``), since the peer may have kept the other one and
        closed this; explicit routes after a second, all with up to 100 ms of jitter
        so that two servers dialling each other fall out of step."""
        s = route.solicit
        if route.no_reconnect or self.server.shutting_down or self._nursery is None:
            return
        retry_implicit = route.retry or (route.did_solicit and s is not None
                                         and not s.explicit)
        if not (route.did_solicit or retry_implicit):
            return
        if not route.registered and not (s is not None and s.explicit):
            return      # an implicit dial the peer never took: no retry loop
        if s is None:
            url = self._info_url(route.remote_info, route)
            if not url:
                return
            s = Solicit(url, explicit=False, account=route.account)
        remote = self.remotes.get(route.remote_id)
        if route.account is None and self.pool_size < 1 and remote is not None \
                and remote.routes():
            return     # no pooling: the one connection to that server is up again
        if route.remote_id == self.server.server_id:
            return
        if s.explicit or retry_implicit:
            wait = random.random() * 0.1 + (RECONNECT_DELAY if s.explicit else 0.0)
            self._nursery.start_soon(self._solicit_loop,
                                     Solicit(s.url, s.explicit, route.account), wait)

    @staticmethod
    def _info_url(info: dict, route: Route) -> str:
        """Where a peer listens for routes: its advertised ``ip``, else the address it
        connected from with the port it announced (processRouteInfo)."""
        if info.get("ip"):
            return str(info["ip"])
        port = info.get("port")
        if isinstance(port, int) and 0 < port < 65536:
            return "nats-route://%s:%d/" % (route.host, port)
        return ""

    # ---- reload -----------------------------------------------------------------------

    def reload(self, new: ClusterOptions) -> list[str]:
        """Apply a reloaded ``cluster {}`` block (server/reload.go clusterOption).

        Pinned accounts and the pool size change without dropping a message:
        dedicated and pooled connections are added next to the running ones, the
        interest moves over make-before-break (see the interest section below), and
        connections no longer wanted are retired once idle.  nats-server instead
        closes the pooled connections and drops interest while the new ones form.
        Turning pooling on or off altogether (``pool_size: -1``) still re-forms the
        routes.  A compression change between two S2 levels swaps the level in
        place; turning compression on or off (or to ``accept``) needs a new
        negotiation, so those connections are closed and re-established.  Routes
        added to the list are dialled, removed ones closed for good.  The listen
        address needs a restart.
        """
        old = self.copts
        notes = []
        if (new.host, new.port) != (old.host, old.port) or new.name != old.name:
            self.server.log.error("Config reload: not supported for cluster listen/name; "
                                  "keeping the running values")
            new = dataclasses.replace(new, host=old.host, port=old.port, name=old.name)
        old_pinned = set(self.pinned_accounts())
        self.copts = new
        for remote in self.remotes.values():
            remote.subs.limit = new.max_remote_subs
        if new.permissions != old.permissions:
            self._reload_permissions()
            notes.append("permissions")
        reform = (old.pool_size < 0) != (new.pool_size < 0)
        if new.compression != old.compression and not reform:
            renegotiate = COMPRESSION_OFF in (old.compression, new.compression) or \
                new.compression == COMPRESSION_ACCEPT
            for r in list(self.routes):
                if renegotiate:
                    r.close(ROUTE_REMOVED)
                elif r.s2_writer is not None:
                    level = new.compression
                    if level == COMPRESSION_S2_AUTO:
                        level = level_for_rtt(r.rtt, new.rtt_thresholds)
                    r.set_s2_level(level)
            notes.append("compression")
        if reform:
            for r in list(self.routes):
                if r.account is not None:
                    r.no_reconnect = True
                r.close(ROUTE_REMOVED)
            notes.append("pool_size")
        elif new.pool_size != old.pool_size or set(self.pinned_accounts()) != old_pinned:
            self._reload_pool_and_pinned(old_pinned, new.pool_size != old.pool_size)
            notes.append("pool_size/accounts")
        removed = set(old.routes) - set(new.routes)
        for r in list(self.routes):
            if r.solicit is not None and r.solicit.explicit and r.solicit.url in removed:
                r.no_reconnect = True
                r.close(ROUTE_REMOVED)
        for url in new.routes:
            if url not in old.routes:
                self.solicit(Solicit(url, explicit=True))
        if removed or set(new.routes) - set(old.routes):
            notes.append("routes")
        return notes

    def _reload_permissions(self) -> None:
        """New import/export lists (reload.go reloadClusterPermissions): interest we
        may now import goes out, interest we may no longer import is withdrawn, peer
        interest we may no longer export is dropped, and every route gets our INFO
        so that peers resend what we now take."""
        was = self.perms
        self.perms = PermissionChecker(self.copts.permissions) \
            if self.copts.permissions else None

        def could(subject: bytes) -> bool:
            return was is None or was.can_publish(subject)
        for remote in self.remotes.values():
            for account, route in remote.placed.items():
                acc = self.server.accounts.get(account)
                if acc is None or not route.registered or route.closed_reason is not None:
                    continue
                lines = []
                for subject, queue, n in rm_items(acc.rm):
                    now = self.can_import(subject)
                    if now != could(subject):
                        lines.append(self._proto(route, account, subject, queue, n, now))
                if lines:
                    route.send(b"".join(lines))
        line = self._async_info_line()
        for route in list(self.routes):
            route.update_fast_path()
            if route.registered and route.closed_reason is None:
                self._drop_remote_subs(route, [k for k, sub in route.remote_subs.items()
                                               if not self.can_export(sub.subject)])
                route.send(line)

    def _reload_pool_and_pinned(self, old_pinned: set[str], resized: bool) -> None:
        pinned = set(self.pinned_accounts())
        added, removed = pinned - old_pinned, old_pinned - pinned
        for remote in list(self.remotes.values()):
            if remote.no_pool:
                continue
            for account in added:
                remote.refused.discard(account)
                self._dial_dedicated(remote, account)
            for account in removed:
                r = remote.pinned.get(account)
                # Only a natsjs peer can be told to move off; a nats-server peer
                # may pin the account itself, and the connection stays.
                if r is not None and r.dialled and remote.natsjs:
                    self._retire(r)
            if resized:
                if remote.natsjs:
                    # Tell it our new size (before any retirement notice, which it
                    # weighs against that size): it dials or retires its share.
                    r = next((r for r in remote.pool if usable(r)), None)
                    if r is not None:
                        r.send(self._async_info_line())
                self._resize(remote)
            self.rebalance(remote)

    def _resize(self, remote: Remote) -> None:
        """Both sides' pool sizes decide how many pooled connections there are: dial
        the missing ones, retire the surplus ones we dialled (the peer retires its
        own; nats-server never has interest beyond its own pool size)."""
        if remote.no_pool or self.pool_size < 1:
            return
        target = self._pool_target(remote)
        for r in list(remote.pool[target:]):
            if r is not None and r.dialled:
                self._retire(r)
        while len(remote.pool) > target and remote.pool[-1] is None:
            remote.pool.pop()
        self._dial_pool(remote)
        self.rebalance(remote)

    # ---- handshake lines -------------------------------------------------------------

    def connect_line(self, s: Solicit) -> bytes:
        u = urlsplit(s.url if "://" in s.url else "nats-route://" + s.url)
        c = {"echo": True, "verbose": False, "pedantic": False}
        if u.username:
            c["user"] = u.username
            c["pass"] = u.password or ""
        elif self.copts.username and not s.explicit:
            # an implicit route uses our own cluster credentials (processImplicitRoute)
            c["user"] = self.copts.username
            c["pass"] = self.copts.password
        c.update({"tls_required": self.tls_dial is not None, "headers": True,
                  "name": self.server.server_id,
                  "cluster": self.name})
        if self.dynamic_name:
            c["cluster_dynamic"] = True
        c["lnoc"] = True
        return b"CONNECT " + json.dumps(c, separators=(",", ":")).encode() + b"\r\n"

    def _base_info(self) -> dict:
        server = self.server
        copts = self.copts
        host, port = copts.host or "0.0.0.0", self.port
        info = {"server_id": server.server_id, "server_name": server.name,
                "version": NATS_VERSION, "natsjs": __version__, "proto": ROUTE_PROTO,
                "go": "natsjs", "host": host, "port": port, "headers": True}
        if copts.username:
            info["auth_required"] = True
        if self.tls_accept is not None:
            info["tls_required"] = True
            info["tls_verify"] = True
        info["max_payload"] = server.opts.max_payload
        if server.jetstream is not None and server.jetstream.enabled:
            # As nats-server's route INFO: peers tell JetStream servers from plain ones.
            info["jetstream"] = True
        if copts.advertise:
            adv = copts.advertise
            info["ip"] = "nats-route://%s/" % adv
            ahost, _, aport = adv.rpartition(":")
            if ahost and aport.isdigit():
                info["host"], info["port"] = ahost, int(aport)
        info["cluster"] = self.name
        if self.dynamic_name:
            info["cluster_dynamic"] = True
        if not copts.no_advertise:
            info["connect_urls"] = server.own_client_urls()
        perms = copts.permissions
        if perms is not None:
            # Shown by peers in /routez, and used by them to resend interest when our
            # export list widens (route.go updateRemoteRoutePerms).
            for key, sp in (("import", perms.publish), ("export", perms.subscribe)):
                if sp is not None:
                    info[key] = {k: list(v) for k, v in (("allow", sp.allow),
                                                         ("deny", sp.deny)) if v}
        return info

    def _async_info_line(self) -> bytes:
        """Our INFO as an update on established routes (reload: pool size,
        permissions), as nats-server sends its route INFO then."""
        info = self._base_info()
        if self.pool_size > 0:
            info["route_pool_size"] = self.pool_size
        return b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b"\r\n"

    def info_line(self, route: Route, initial: bool, negotiated: str | None = None,
                  with_slot: bool = True) -> bytes:
        """The INFO a route connection sends (generateRouteInitialInfoJSON, addRoute)."""
        info = self._base_info()
        if initial:
            info["nonce"] = secrets.token_urlsafe(11)[:15]
            info["compression"] = self.copts.compression
        else:
            mode = negotiated or route.compression
            info["compression"] = COMPRESSION_S2_AUTO \
                if self.copts.compression == COMPRESSION_S2_AUTO else mode
        info["lnoc"] = True
        info["lnocu"] = True
        if self.pool_size > 0:
            info["route_pool_size"] = self.pool_size
        if with_slot and route.dialled and not initial and route.pool_idx > 0 \
                and route.account is None:
            info["route_pool_idx"] = route.pool_idx
        if route.dialled and route.account is not None:
            info["route_account"] = route.account
        return b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b" \r\n"

    # ---- registration ------------------------------------------------------------

    @staticmethod
    def _duplicate(existing: Route | None, new: Route, no_reconnect: bool) -> None:
        """``new`` lost to the connection already in its slot (route.go
        handleDuplicateRoute): the one registered first is kept, whoever dialled it.

        If both servers dialled at once, each may keep the other's connection and
        close its own, so both go; the kept one is therefore marked to be redialled
        (``retry``) and takes over the duplicate's URL if the duplicate was ours.
        """
        if no_reconnect:
            new.no_reconnect = True
        new.close(DUPLICATE_ROUTE)
        if existing is None:
            return
        if new.did_solicit and not existing.did_solicit:
            existing.did_solicit = True
            existing.solicit = new.solicit
        if new.solicit is not None and new.solicit.explicit and existing.solicit is not None \
                and not existing.solicit.explicit:
            existing.solicit = dataclasses.replace(existing.solicit, explicit=True)
        existing.retry = True

    def _keeps_new(self, existing: Route, new: Route, info: dict, no_reconnect: bool) -> bool:
        """Resolve ``new`` arriving for the slot ``existing`` holds: True when ``new``
        takes it (``existing`` is closed), False when ``new`` was closed.

        Two servers that dialled each other at once may each register their own
        connection first and then close the other's: both go, and the pair has no
        route until the redial a second later (nats-server's way; a subscription made
        meanwhile reaches nobody).  Two natsjs servers agree instead: the connection
        dialled by the server whose id sorts first stays, on both sides.
        """
        if "natsjs" in info and existing.dialled != new.dialled:
            ours, theirs = self.server.server_id, new.remote_id
            if (ours if new.dialled else theirs) < (ours if existing.dialled else theirs):
                self._duplicate(new, existing, no_reconnect=True)
                return True
        self._duplicate(existing, new, no_reconnect)
        return False

    @staticmethod
    def _upgrade_to_solicited(route: Route, s: Solicit | None) -> None:
        """route.go upgradeRouteToSolicited: a pool shares the dialled URL."""
        if route is None or s is None:
            return
        if not route.did_solicit or (s.explicit and not (route.solicit and
                                                         route.solicit.explicit)):
            route.solicit = Solicit(s.url, s.explicit, route.account)
        route.did_solicit = True

    @staticmethod
    def _live(route: Route | None) -> Route | None:
        return route if route is not None and route.closed_reason is None else None

    def add_route(self, route: Route, info: dict, send_delayed: bool) -> None:
        """server/route.go addRoute: place the connection, then exchange interest."""
        server = self.server
        sid = route.remote_id
        remote = self.remotes.get(sid)
        first = remote is None or not remote.routes()
        if remote is None:
            remote = Remote(sid)
        remote_pool = info.get("route_pool_size") or 0
        if not isinstance(remote_pool, int) or remote_pool > MAX_POOL_SIZE:
            route.no_reconnect = True
            route.close(ROUTE_REMOVED, "Invalid route pool size: %r" % (remote_pool,))
            return
        remote.name = info.get("server_name", "")
        remote.info = info
        remote.natsjs = "natsjs" in info
        remote.pool_size = remote_pool
        if route.dialled and route.solicit is not None:
            remote.url = route.solicit.url
            remote.explicit = remote.explicit or route.solicit.explicit
        elif not remote.url:
            remote.url = self._info_url(info, route)
        no_pool = remote_pool <= 0 or self.pool_size < 0
        account = route.account if route.dialled else info.get("route_account")
        if account:
            if no_pool:
                route.no_reconnect = True
                route.close(ROUTE_REMOVED, 'Not possible to have a dedicated route for account '
                            '"%s" between those servers' % account)
                return
            # nats-server takes a dedicated connection only for an account it pins
            # itself; natsjs takes one for any account it has, so a peer that pins
            # it (by its configuration or a reload) gets its way whatever ours says.
            if account not in self.server.accounts:
                route.no_reconnect = True
                route.close(ROUTE_REMOVED, 'No route for account "%s"' % account)
                return
            existing = self._live(remote.pinned.get(account))
            if existing is not None and \
                    not self._keeps_new(existing, route, info, no_reconnect=True):
                return
            remote.pinned[account] = route
            route.account = account
            route.core.pinned_account = account.encode()
            route.core.no_account = True
        elif no_pool:
            existing = self._live(remote.pool[0]) if remote.pool else None
            if existing is not None and \
                    not self._keeps_new(existing, route, info, no_reconnect=True):
                return
            remote.no_pool = True
            remote.pool = [route]
            route.no_pool = True
            route.pool_idx = 0
        else:
            size = max(self.pool_size, remote_pool)
            if len(remote.pool) < size:
                remote.pool.extend([None] * (size - len(remote.pool)))
            if route.dialled:
                if info.get("route_pool_idx"):
                    route.close(PROTOCOL_VIOLATION, "Route pool index should not be set "
                                "but is set to %r" % (info.get("route_pool_idx"),))
                    return
                for r in remote.pool:
                    self._upgrade_to_solicited(self._live(r), route.solicit)
                free = [i for i, r in enumerate(remote.pool[:size]) if self._live(r) is None]
                if not free:
                    server.log.debug(route.log_prefix + "Route pool size reached, closing "
                                     "extra connection to %r", sid)
                    self._duplicate(None, route, no_reconnect=True)
                    return
                idx = free[0]
            else:
                idx = info.get("route_pool_idx") or 0
                if not isinstance(idx, int) or idx < 0 or idx >= size:
                    route.close(PROTOCOL_VIOLATION, "Invalid route pool index: %r - pool "
                                "size is %d" % (idx, remote_pool))
                    return
                existing = self._live(remote.pool[idx])
                if existing is not None and \
                        not self._keeps_new(existing, route, info, no_reconnect=False):
                    return
                dialled = next((r for r in remote.pool if self._live(r) is not None
                                and r.did_solicit), None)
                if dialled is not None:
                    self._upgrade_to_solicited(route, dialled.solicit)
            remote.pool[idx] = route
            route.pool_idx = idx
        self.remotes[sid] = remote
        route.remote = remote
        route.registered = True
        route.core.peer = remote
        remote.subs.limit = self.copts.max_remote_subs
        route.core.peer_subs = remote.subs
        route.update_fast_path()
        if route.solicit is not None:
            self._implicit.discard((route.solicit.url, route.account))
        server.log.debug(route.log_prefix + "Registering remote route %r%s", sid,
                         " for account %r" % account if account else "")
        if send_delayed:
            route.send(self.info_line(route, initial=False))
        self.rebalance(remote)
        if account is not None:
            # Once the peer's interest in the account has come on this connection
            # (it sends it on registering it; its PONG follows), what it had on the
            # pool for that account is stale: nats-server moves an account wholesale.
            route.after_pong(lambda: self._drop_pooled_interest(route, account))
            if not (route.dialled and route.solicit is not None
                    and not route.solicit.explicit):
                self._gossip(remote, route, account)
        elif route.dialled and first and not remote.no_pool:
            # A connection to this server again after all had gone: its accounts'
            # own connections come back too (a pinned one closed for good while the
            # peer was away would otherwise leave the account without a route).
            for acc in self._wanted_dedicated():
                if acc not in remote.refused and not usable(remote.pinned.get(acc)) \
                        and (remote.url, acc) not in self._dialling:
                    self._dial_dedicated(remote, acc)
        if account is None and route.dialled and not remote.no_pool and \
                any(r is None for r in remote.pool[:self._pool_target(remote)]):
            # Fill the pool one connection at a time, the next once this one has
            # proved itself with a PONG (route.go addRoute, startNewRoute).
            route.after_pong(lambda: self._dial_pool(remote))
        if first:
            server.log.info(route.log_prefix + "Route connection to %s (%s) registered",
                            remote.name or sid, sid)
            if not self.copts.no_advertise:
                remote.client_urls = list(info.get("connect_urls") or [])
                server.client_urls_changed()
            if not (route.dialled and route.solicit is not None
                    and not route.solicit.explicit):
                self._gossip(remote, route)

    def _pool_target(self, remote: Remote) -> int:
        """How many pooled connections this server wants to ``remote``: the larger
        of both sides' pool sizes, as nats-server (since 2.11) allows them to differ."""
        return max(self.pool_size, remote.pool_size, 1)

    def _dial_pool(self, remote: Remote) -> None:
        """Dial one more pooled connection if a wanted slot is empty (the next one
        follows from its PONG, see add_route)."""
        if self.remotes.get(remote.server_id) is not remote or remote.no_pool \
                or not remote.url:
            return
        target = self._pool_target(remote)
        if any(r is None for r in remote.pool[:target]) or len(remote.pool) < target:
            self.solicit(Solicit(remote.url, remote.explicit), with_pinned=False)

    def _dial_dedicated(self, remote: Remote, account: str) -> None:
        if remote.no_pool or not remote.url or usable(remote.pinned.get(account)):
            return
        if self._nursery is not None:
            self._nursery.start_soon(self._solicit_loop,
                                     Solicit(remote.url, remote.explicit, account))

    def route_closed(self, route: Route) -> None:
        self.routes.discard(route)
        self._drop_remote_subs(route, list(route.remote_subs))
        if route.dialled and route.account is not None and not route.ponged \
                and route.closed_reason != DUPLICATE_ROUTE and not route.retry \
                and not (route.remote_info or {}).get("natsjs") \
                and not self.server.shutting_down:
            # Closed before it ever answered a PING: nats-server refused it (its
            # -ERR may be lost in the close).  Carry the account on the pool.  Not
            # so when the peer closed it because both of us dialled at once (it is
            # redialled) or when the peer is natsjs, which takes a dedicated
            # connection for every account it has and says so when it has not.
            route.no_reconnect = True
            self.dedicated_refused(route)
        remote = route.remote
        if remote is not None:
            self._unregister(route, remote)
            if self.remotes.get(remote.server_id) is remote:
                # Whatever this connection carried moves to one still open.
                self.rebalance(remote)
        self._reconnect(route)

    def _drop_remote_subs(self, route: Route, keys: list) -> None:
        drop = route.core.drop_remote
        for key in keys:
            drop(key)

    def _unregister(self, route: Route, remote: Remote) -> None:
        if route.account is not None and remote.pinned.get(route.account) is route:
            del remote.pinned[route.account]
        for i, r in enumerate(remote.pool):
            if r is route:
                remote.pool[i] = None
        if route in remote.retiring:
            remote.retiring.remove(route)
        for acc, routes in list(remote.leaving.items()):
            if route in routes:
                routes.remove(route)
                if not routes:
                    del remote.leaving[acc]
        if not remote.routes():
            self.remotes.pop(remote.server_id, None)
            if remote.client_urls:
                remote.client_urls = []
                self.server.client_urls_changed()
            self.server.log.info(route.log_prefix + "Route connection to %s closed",
                                 remote.name or remote.server_id)

    def dedicated_refused(self, route: Route) -> None:
        """The peer has no route for this account (an -ERR from nats-server, which
        pins only what its own configuration or a peer's reload asked for)."""
        remote = route.remote or self.remotes.get(route.remote_id)
        if remote is not None and route.account is not None:
            remote.refused.add(route.account)

    # ---- retiring connections -------------------------------------------------------

    def _retire(self, route: Route, notify: bool = True) -> None:
        """Wind a connection down without losing what is in flight on it.

        It leaves its slot (so a replacement can take it), our interest moves to
        the connections that now carry those accounts (each move confirmed by a
        PONG before the interest leaves this one), and it closes, gracefully, once
        neither side routes anything through it.  A natsjs peer is told, so that it
        moves its interest off too; nats-server peers only ever see us retire
        connections nothing of theirs uses (see reload).
        """
        remote = route.remote
        if route.retiring or remote is None or route.closed_reason is not None:
            return
        route.retiring = True
        route.update_fast_path()
        route.no_reconnect = True
        if route.account is not None and remote.pinned.get(route.account) is route:
            del remote.pinned[route.account]
        for i, r in enumerate(remote.pool):
            if r is route:
                remote.pool[i] = None
        remote.retiring.append(route)
        self.server.log.debug(route.log_prefix + "Retiring route connection")
        if notify and remote.natsjs:
            info = {"server_id": self.server.server_id, "natsjs_retire": True}
            route.send(b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b"\r\n")
        if route.account is not None and route.account in self._wanted_dedicated():
            self._dial_dedicated(remote, route.account)
        elif route.account is None and route.pool_idx < self._pool_target(remote):
            self._dial_pool(remote)
        self.rebalance(remote)
        self._retire_check(route)

    def _retire_check(self, route: Route) -> None:
        """Close a retiring connection once it is idle both ways, confirmed by a
        PONG sent after our last RS- on it."""
        remote = route.remote
        if not route.retiring or route.closed_reason is not None or remote is None:
            return
        if route.remote_subs or any(r is route for r in remote.placed.values()) or \
                any(route in rs for rs in remote.leaving.values()):
            return

        def idle():
            if route.remote_subs or any(r is route for r in remote.placed.values()) or \
                    any(route in rs for rs in remote.leaving.values()):
                return
            self.server.log.debug(route.log_prefix + "Retired route connection closed")
            route.close(ROUTE_REMOVED, graceful=True)
        route.after_pong(idle)

    # ---- gossip ------------------------------------------------------------------

    def _gossip(self, remote: Remote, via: Route, account: str | None = None) -> None:
        """Tell the other peers about a new one (forwardNewRouteInfoToKnownServers),
        or, with ``account``, about its new dedicated connection for that account, so
        that they dial theirs too (only peers that pool take those)."""
        info = dict(remote.info)
        info.pop("nonce", None)
        info.pop("route_pool_idx", None)
        info.pop("route_account", None)
        if account is not None:
            info["route_account"] = account
        if not info.get("ip"):
            info["ip"] = "nats-route://%s:%d/" % (via.host, int(info.get("port") or 0))
        line = b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b"\r\n"
        for other in list(self.remotes.values()):
            if other is remote or (account is not None and other.no_pool):
                continue
            r = other.first()
            if r is not None and r.account is None:
                r.send(line)

    def async_route_info(self, route: Route, info: dict) -> None:
        """An INFO on an established route: gossip about a peer, lame duck, a peer's
        reload (an account it now pins, its new pool size), or a natsjs peer
        retiring this connection."""
        sid = info.get("server_id", "")
        if info.get("route_acc_add_reqid"):
            self._route_acc_add(route, info)
            return
        if info.get("gateway"):
            return
        if sid and sid != route.remote_id:
            self._implicit_route(info)
            return
        remote = route.remote
        if remote is None:
            return
        if info.get("ldm") and remote.client_urls:
            remote.client_urls = []
            self.server.client_urls_changed()
        size = info.get("route_pool_size")
        if isinstance(size, int) and 0 < size <= MAX_POOL_SIZE and size != remote.pool_size \
                and not remote.no_pool:
            remote.pool_size = size
            self._resize(remote)
        if info.get("natsjs_retire") and route.registered:
            self._retire(route, notify=False)
        elif not info.get("ldm"):
            self._peer_permissions(route, info)

    @staticmethod
    def _export_checker(export) -> PermissionChecker | None:
        if not isinstance(export, dict):
            return None
        lists = [tuple(str(x) for x in export[k]) if isinstance(export.get(k), list) else None
                 for k in ("allow", "deny")]
        return PermissionChecker(Permissions(subscribe=SubjectPermission(*lists)))

    def _peer_permissions(self, route: Route, info: dict) -> None:
        """A peer's INFO changed its export list (a reload): what it ignored before
        and takes now is sent again on this connection (route.go
        updateRemoteRoutePerms)."""
        old, new = route.remote_info.get("export"), info.get("export")
        route.remote_info = dict(route.remote_info, **{"import": info.get("import"),
                                                       "export": new})
        remote = route.remote
        if old == new or remote is None:
            return
        was, now = self._export_checker(old), self._export_checker(new)

        def newly(subject: bytes) -> bool:
            return (now is None or now.can_subscribe(subject)) and not (
                was is None or was.can_subscribe(subject))
        for account, r in remote.placed.items():
            if r is route:
                lines = self._interest_lines(route, account, True, only=newly)
                if lines:
                    route.send(lines)

    def _route_acc_add(self, route: Route, info: dict) -> None:
        """A nats-server peer's reload pinned an account (route.go processRouteInfo,
        reload.go reloadClusterPoolAndAccounts): it expects that account on a
        dedicated connection from now on and waits for this INFO to come back with
        ``route_account`` cleared.  Its interest in the account stays where it is
        until the dedicated connection brings it again (_drop_pooled_interest)."""
        account = info.get("route_account")
        if not account:
            return      # the answer to a request of ours; natsjs does not send them
        reply = {k: v for k, v in info.items() if k != "route_account"}
        route.send(b"INFO " + json.dumps(reply, separators=(",", ":")).encode() + b"\r\n")
        remote = route.remote
        if not isinstance(account, str) or account not in self.server.accounts \
                or remote is None:
            return
        self.adopted.add(account)
        remote.refused.discard(account)
        self._dial_dedicated(remote, account)

    def _implicit_route(self, info: dict) -> None:
        """A peer told us of another server (route.go processImplicitRoute): dial it
        unless we are connected or have it configured.  A peer could name any
        address here, so only what looks like a cluster member is dialled: a server
        id, a nats-route:// (or nats://) URL with a host and a port, not our own
        listen address, no credentials of its choosing; and at most
        MAX_IMPLICIT_DIALS such dials are under way at once."""
        sid = info.get("server_id")
        account = info.get("route_account")
        if not self._plausible_server_id(sid) or sid == self.server.server_id:
            return
        remote = self.remotes.get(sid)
        if account:
            if self.pool_size <= 0 or not isinstance(account, str) \
                    or account not in self.server.accounts:
                return
            if remote is not None and usable(remote.pinned.get(account)):
                return
        elif remote is not None and (remote.no_pool or any(r is not None for r in remote.pool)):
            return
        url = self._gossip_url(info.get("ip"))
        if url is None:
            self.server.log.debug("Ignoring implicit route of %r: not a route URL: %r",
                                  sid, info.get("ip"))
            return
        if self._configured(url, info):
            return
        key = (url, account or None)
        if key in self._implicit:
            return
        if len(self._implicit) >= MAX_IMPLICIT_DIALS:
            self.server.log.warn("Not connecting to implicit route %s: %d implicit routes "
                                 "are being dialled already", url, len(self._implicit))
            return
        self.server.log.debug("Connecting to implicit route %s%s", url,
                              " for account %r" % account if account else "")
        self._implicit.add(key)
        if self._nursery is not None:
            self._nursery.start_soon(self._solicit_loop,
                                     Solicit(url, False, account or None, bool(account)))

    @staticmethod
    def _plausible_server_id(sid) -> bool:
        return isinstance(sid, str) and 0 < len(sid) <= 128 and \
            sid.replace("-", "").replace("_", "").isalnum()

    def _gossip_url(self, ip) -> str | None:
        if not isinstance(ip, str) or len(ip) > 512:
            return None
        try:
            u = urlsplit(ip)
            port = u.port
        except ValueError:
            return None
        if u.scheme not in ("nats-route", "nats") or not u.hostname or not port:
            return None
        host = u.hostname
        if port == self.port and host in {"127.0.0.1", "::1", "localhost",
                                          self.copts.host or "0.0.0.0",
                                          self.copts.advertise.rpartition(":")[0]}:
            return None         # ourselves
        return "nats-route://%s:%d/" % ("[%s]" % host if ":" in host else host, port)

    def _configured(self, url: str, info: dict) -> bool:
        want = {(urlsplit(url).hostname, urlsplit(url).port),
                (info.get("host"), info.get("port"))}
        for r in self.copts.routes:
            u = urlsplit(r if "://" in r else "nats-route://" + r)
            if (u.hostname, u.port) in want:
                return True
        return False

    def adopt_name(self, name: str, keep: Route) -> None:
        self.server.log.info("Cluster name updated to %s", name)
        self.name = name
        self.dynamic_name = False
        for r in list(self.routes):
            if r is not keep:
                r.close(ROUTE_REMOVED)

    def send_ldm(self) -> None:
        info = self._base_info()
        info["ldm"] = True
        line = b"INFO " + json.dumps(info, separators=(",", ":")).encode() + b" \r\n"
        for remote in self.remotes.values():
            r = remote.first()
            if r is not None:
                r.send(line)

    # ---- interest -------------------------------------------------------------------
    #
    # Our interest in an account goes to each peer on one connection (it then sends
    # us that account's messages on it): the account's dedicated connection, else the
    # pooled one at FNV-1a(account) % our pool size (computeRoutePoolIdx).  Which one
    # that is changes when connections come and go and when a reload pins accounts
    # or resizes the pool.  A move is make-before-break: the interest is sent on the
    # new connection, a PING follows, and only its PONG (the peer has it) lets RS-
    # withdraw the interest from the old one.  Meanwhile the peer sees the interest
    # on both, and its fan-out sends each message once per server (fanout.pyx
    # route_target), so nothing is lost or doubled.

    def _desired(self, remote: Remote, account: str) -> Route | None:
        if remote.no_pool:
            r = remote.pool[0] if remote.pool else None
            return r if usable(r) else None
        r = remote.pinned.get(account)
        if usable(r):
            return r
        if account in self._wanted_dedicated() and account not in remote.refused \
                and remote.url:
            return None         # its own connection is being dialled
        idx = pool_index(max(self.pool_size, 1), account)
        r = remote.pool[idx] if idx < len(remote.pool) else None
        return r if usable(r) else None

    def _carrier(self, remote: Remote, account: str) -> Route | None:
        """Where our interest in ``account`` should sit now.

        The desired connection; but toward nats-server, interest stays on the
        pooled connection it is on while that one lives, since nats-server delivers
        on every connection that holds our interest and a move would double its
        messages for a round trip (only a dedicated connection draws it over).  If
        the connection it was on went away and the desired one is not up, any
        pooled one carries it meanwhile.
        """
        want = self._desired(remote, account)
        cur = remote.placed.get(account)
        if not remote.natsjs and usable(cur) and (want is None or want.account is None):
            return cur
        if want is not None:
            return want
        if cur is None:
            return None         # never placed: its connection is on the way
        if usable(cur):
            return cur
        # A connection we were moving off still holds the interest: go back to it
        # (anything else would have nats-server deliver on both).
        back = next((r for r in remote.leaving.get(account, ()) if usable(r)), None)
        return back or next((r for r in remote.pool if usable(r)), None)

    def _interest_lines(self, route: Route, account: str, add: bool, only=None) -> bytes:
        acc = self.server.accounts.get(account)
        if acc is None:
            return b""
        if self.perms is None and only is None:
            return rm_lines(acc.rm, self._acc_prefix(route, account), add)
        return b"".join(self._proto(route, account, subject, queue, n, add)
                        for subject, queue, n in rm_items(acc.rm)
                        if self.can_import(subject) and (only is None or only(subject)))

    @staticmethod
    def _acc_prefix(route: Route, account: str) -> bytes:
        """What precedes the subject in RS+/RS- (none on a pinned connection)."""
        return b"" if route.account is not None else account.encode() + b" "

    def _place(self, remote: Remote, account: str) -> None:
        new = self._carrier(remote, account)
        old = remote.placed.get(account)
        if new is None or new is old:
            return
        lines = self._interest_lines(new, account, True)
        if lines:
            new.send(lines)
        remote.placed[account] = new
        leaving = remote.leaving.setdefault(account, [])
        if new in leaving:
            leaving.remove(new)
        if old is not None and old.closed_reason is None and old not in leaving:
            leaving.append(old)
        if not leaving:
            del remote.leaving[account]
            return
        new.after_pong(lambda: self._confirm_move(remote, account, new))

    def _confirm_move(self, remote: Remote, account: str, new: Route) -> None:
        """The peer has our interest on ``new``: withdraw it from where it was."""
        if remote.placed.get(account) is not new:
            return          # moved again meanwhile; that move finishes the job
        for old in remote.leaving.pop(account, []):
            if old.closed_reason is None:
                lines = self._interest_lines(old, account, False)
                if lines:
                    old.send(lines)
                self._retire_check(old)

    def rebalance(self, remote: Remote) -> None:
        """Put our interest for every account where it belongs now."""
        accounts = [name for name, acc in self.server.accounts.items() if acc.rm]
        accounts += [a for a in remote.placed if a not in self.server.accounts
                     or not self.server.accounts[a].rm]
        for name in accounts:
            self._place(remote, name)
        for route in list(remote.retiring):
            self._retire_check(route)

    @staticmethod
    def _proto(route: Route, account: str, subject: bytes, queue: bytes | None, n: int,
               add: bool) -> bytes:
        acc = Cluster._acc_prefix(route, account)
        if add:
            if queue is None:
                return b"RS+ " + acc + subject + b"\r\n"
            return b"RS+ " + acc + subject + b" " + queue + b" %d\r\n" % n
        if queue is None:
            return b"RS- " + acc + subject + b"\r\n"
        return b"RS- " + acc + subject + b" " + queue + b"\r\n"

    def interest_changed(self, account, subs: list, delta: int) -> None:
        """Local subscriptions came (``delta`` 1) or went (-1), as
        natsjs/_core/interest.pyx count_interest picked them: the peers hear of them,
        the lines of a whole batch in one write per connection."""
        if self.perms is not None:
            subs = [sub for sub in subs if self.can_import(sub.subject)]
        if not subs:
            return
        name = account.name
        lines: dict[bytes, bytearray] = {}
        for remote in self.remotes.values():
            self._place(remote, name)
            route = remote.placed.get(name)
            targets = ([route] if route is not None else []) + remote.leaving.get(name, [])
            for r in targets:
                if r.registered and r.closed_reason is None:
                    prefix = self._acc_prefix(r, name)
                    data = lines.get(prefix)
                    if data is None:
                        data = lines[prefix] = interest_lines(subs, account.rm, prefix, delta)
                    r.send(data)

    def _drop_pooled_interest(self, route: Route, account: str) -> None:
        """The peer's interest in ``account`` now comes on ``route`` (its dedicated
        connection): forget what it had sent for that account on pooled ones."""
        remote = route.remote
        if remote is None or remote.pinned.get(account) is not route:
            return
        prefix = account.encode() + b" "
        for r in remote.pool:
            if r is not None:
                self._drop_remote_subs(r, [k for k in r.remote_subs if k.startswith(prefix)])
                self._retire_check(r)

    def _parse_interest(self, route: Route, args: bytes, add: bool):
        parts = args.split()
        if route.account is not None:
            acc = route.account.encode()
        else:
            if not parts:
                raise ValueError("missing account")
            acc, parts = parts[0], parts[1:]
        if add and len(parts) == 1:
            return acc, parts[0], None, 1
        if add and len(parts) == 3:
            # A queue weight is listed that many times in match results: bound it.
            return acc, parts[0], parts[1], min(max(int(parts[2]), 1), MAX_QUEUE_WEIGHT)
        if not add and len(parts) in (1, 2):
            return acc, parts[0], parts[1] if len(parts) == 2 else None, 0
        raise ValueError("wrong number of arguments")

    def remote_sub(self, route: Route, args: bytes) -> None:
        from natsjs._core.parser import ProtocolError
        try:
            acc, subject, queue, weight = self._parse_interest(route, args, True)
        except ValueError as exc:
            raise ProtocolError("processRemoteSub Parse Error: %r (%s)" % (args, exc)) from None
        remote = route.remote
        if remote is None or not route.registered:
            # A peer sends interest only once it has registered the connection, which
            # is after our INFO: before ours, RS+ is a peer that skips the handshake.
            self.server.log.debug(route.log_prefix + "Ignoring remote subscription before "
                                  "the route is registered")
            return
        sl = self.sublists.get(acc)
        if sl is None:
            self.server.log.debug(route.log_prefix + "Unknown account %r for remote subject %r",
                                  acc, subject)
            return
        if not self.can_export(subject):
            self.server.log.debug(route.log_prefix + 'Can not export "%s", ignoring remote '
                                  'subscription request', subject.decode(errors="replace"))
            return
        key = acc + b" " + subject + ((b" " + queue) if queue else b"")
        sub = route.remote_subs.get(key)
        if sub is not None:
            if queue is not None and sub.qweight != weight:
                # The weight shapes cached match results: re-insert to refresh them.
                sl.remove(sub)
                sub.qweight = weight
                sl.insert(sub)
            return
        if remote.nsubs >= self.copts.max_remote_subs:
            self._too_many_subs(route, remote, acc, subject)
            return
        try:
            route.core.add_remote(sl, key, subject, queue, weight)
        except ValueError:
            self.server.log.error(route.log_prefix + "Error inserting remote subject %r", subject)

    def _too_many_subs(self, route: Route, remote: Remote, acc: bytes, subject: bytes) -> None:
        """A peer over max_remote_subs: its new interest is ignored (messages on those
        subjects are not sent to it) and the route stays up.  nats-server answers a
        client over its max_subscriptions with an error log and -ERR 'maximum
        subscriptions exceeded'; to a route an -ERR would only make the peer drop the
        connection and send everything again, so the error is logged here (at most
        every 10 s per peer) and the peer is left as it is."""
        remote.ignored += 1
        now = trio.current_time()
        if remote.ignored == 1 or now - remote.ignored_logged >= SUBS_LOG_INTERVAL:
            remote.ignored_logged = now
            self.server.log.error(
                route.log_prefix + "maximum subscriptions exceeded: %s (%s) holds %d, the "
                "most one cluster peer may hold (--cluster_max_subs); ignoring interest of "
                "account %s in %r (%d ignored so far)", remote.name or remote.server_id,
                remote.server_id, remote.nsubs, acc.decode(errors="replace"),
                subject.decode(errors="replace"), remote.ignored)

    def remote_unsub(self, route: Route, args: bytes) -> None:
        from natsjs._core.parser import ProtocolError
        try:
            acc, subject, queue, _ = self._parse_interest(route, args, False)
        except ValueError as exc:
            raise ProtocolError("processRemoteUnsub Parse Error: %r (%s)" % (args, exc)) from None
        self._drop_remote_subs(route, [acc + b" " + subject + ((b" " + queue) if queue else b"")])
        if route.retiring:
            self._retire_check(route)

    # ---- monitoring ----------------------------------------------------------------

    def registered_routes(self) -> list[Route]:
        return [r for remote in self.remotes.values() for r in remote.routes()]

    def client_urls(self) -> list[str]:
        urls = []
        for remote in self.remotes.values():
            for u in remote.client_urls:
                if u not in urls:
                    urls.append(u)
        return urls
