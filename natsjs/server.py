"""The server: owns the listeners, the accounts and every connection.

One root nursery (``Server.run``) holds the accept loop, the monitoring listener and
one task per connection; cancelling it shuts everything down.  Nothing is global, so
tests can run several servers in one process.

Where a message goes from here: a client's read loop (natsjs/client.py) feeds the
Cython core, which queues frames on the subscribers' connections; the read loop then
calls ``flush_pcd`` so each of those connections is written once per read batch.

Internal subscriptions (server code that subscribes like a client)
-----------------------------------------------------------------
Imports, the $SYS request handlers and JetStream subscribe through the same sublists
as clients; a matching message calls their handler ``handler(sub, subject, reply,
hdr, msg)`` from inside the publisher's fan-out.  The API:

* ``server.add_internal_owner(owner)``: ``owner`` (an :class:`InternalOwner`) gets
  ``owner.install(server)`` now and again after every accounts reload, which drops all
  internal subscriptions; ``install`` subscribes everything the owner needs, so a
  subsystem registers once and its subscriptions survive reloads.
* ``server.subscribe_internal(account, subject, handler, owner, queue=None,
  route=True)``: one subscription (``route=False`` keeps it from the routes when
  every server has the same one and serves only its own clients).
* A handler that raises does not hurt the publisher: the error is logged with the
  subject and owner, and a request (a message with a reply subject) is answered with
  ``owner.error_reply(subject, exc)`` (``{"error": {"code": 500, ...}}`` by default).
* A handler cannot await.  Work that must wait (an fsync, a reply that depends on
  it) goes to ``server.spawn(async_fn, *args, owner=owner)``, a task in the root
  nursery outside the fan-out; it returns False, and runs nothing, when the server
  is not running or the owner already has ``owner.max_tasks`` tasks running, so the
  handler can answer "busy" instead of growing memory.  A task's exception is logged.
* ``server.deliver(account, subject, reply, msg)`` publishes from server code.
  Called from inside a handler it runs after the current fan-out instead of
  recursing, so chains of imports of any length keep a flat stack.
"""
from __future__ import annotations

import collections
import errno
import json
import os
import platform
import secrets
import socket
import time

import trio

from natsjs import NATS_VERSION, __version__
from natsjs._core.interest import count_interest
from natsjs._core.fanout import UnsafeSubject
from natsjs.accounts import GLOBAL_ACCOUNT, MAX_IMPORT_HOPS, Account, Imports
from natsjs.client import MAX_CONNECTIONS, Client
from natsjs.connection import SERVER_SHUTDOWN, Pinger, Reactor
from natsjs.log import Logger
from natsjs.monitor import go_uptime
from natsjs.options import RANDOM_PORT, ServerOptions

PROTO = 1
# Accept loop back-off on temporary errors such as EMFILE (server/const.go
# ACCEPT_MIN_SLEEP / ACCEPT_MAX_SLEEP).
ACCEPT_MIN_SLEEP = 0.010
ACCEPT_MAX_SLEEP = 1.0

_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


class InternalOwner:
    """What owns a group of internal subscriptions (see the module docstring)."""

    name = "internal"
    # Tasks ``Server.spawn`` may run at once for this owner.
    max_tasks = 256

    def install(self, server: "Server") -> None:
        """Subscribe everything (again after a reload); must be idempotent."""

    def error_reply(self, subject: bytes, exc: Exception) -> bytes:
        """The answer to a request whose handler failed."""
        return json.dumps({"error": {"code": 500, "description": "internal error"}},
                          separators=(",", ":")).encode()


class _Handler:
    """Binds an internal subscription to its owner and account, for failures."""

    __slots__ = ("server", "owner", "account")

    def __init__(self, server: "Server", owner, account: Account):
        self.server = server
        self.owner = owner
        self.account = account

    def handler_failed(self, sub, subject: bytes, reply: bytes | None, exc: Exception) -> None:
        """Called by the fan-out (fanout.pyx Conn.deliver) when the handler raised."""
        server = self.server
        server.log.error("Internal subscription of %s on %r failed: %r",
                         getattr(self.owner, "name", "?"),
                         subject.decode("utf-8", "replace"), exc)
        if reply:
            answer = getattr(self.owner, "error_reply", None)
            payload = answer(subject, exc) if answer is not None else \
                InternalOwner.error_reply(self.owner, subject, exc)
            server.deliver(self.account, reply, None, payload)


def new_server_id() -> str:
    """A 56-character id that looks like a server nkey (prefix N), as clients expect."""
    return "N" + "".join(secrets.choice(_B32) for _ in range(55))


class Server:
    def __init__(self, opts: ServerOptions, log: Logger | None = None):
        opts.validate()
        self.opts = opts
        self._flags_for = None            # _auth_flags: the options they are for
        self._flags = (False, False)
        self._info_cache = None           # client_info_line: (options, key, common part)
        self.log = log or Logger(debug=opts.debug, trace=opts.trace, logtime=opts.logtime,
                                 utc=opts.logtime_utc, path=opts.log_file)
        self.server_id = new_server_id()
        self.name = opts.server_name or self.server_id
        self.cluster = None
        # Set before the imports are wired: wiring subscribes, which tells JetStream.
        self.jetstream = None
        self.accounts: dict[str, Account] = {GLOBAL_ACCOUNT: Account(GLOBAL_ACCOUNT)}
        for cfg in opts.accounts:
            self.accounts[cfg.name] = Account(cfg.name, cfg)
        if opts.system_account not in self.accounts:
            self.accounts[opts.system_account] = Account(opts.system_account)
        for acc in self.accounts.values():
            acc.on_interest = self.route_interest
        self.system_account = self.accounts[opts.system_account]
        self.system_account.is_system = True
        self.account = self.accounts[GLOBAL_ACCOUNT]
        self.tls_context = None
        if opts.tls is not None:
            from natsjs.tls import make_server_context
            self.tls_context = make_server_context(opts.tls)
        if opts.jetstream is not None:
            from natsjs.jetstream.engine import JetStream
            self.jetstream = JetStream(self, opts.jetstream)
        # Server.deliver: deliveries asked for from inside a fan-out wait here.
        self._delivering = False
        self._hops = 0
        self._deliveries: collections.deque = collections.deque()
        self._own_urls: list[str] | None = None
        self._sys_seq = 0
        self._owners: list = []
        # Password (bcrypt) checks running in worker threads at once.
        self.password_checks = trio.CapacityLimiter(max(2, os.cpu_count() or 1))
        self._owner_tasks: dict[int, int] = {}
        from natsjs import sysreq
        self.add_internal_owner(Imports())
        self.add_internal_owner(sysreq.SysRequests())
        if opts.cluster is not None:
            from natsjs.cluster import Cluster
            self.cluster = Cluster(self, opts.cluster)
        self.clients: dict[int, Client] = {}
        # The last closed connections, for /connz?state=closed (nats-server keeps 10000).
        self.closed_clients: collections.deque = collections.deque(maxlen=10000)
        self._cid = 0
        self.total_connections = 0
        self.slow_consumers = 0
        # Totals of connections that have closed, so /varz counts survive them.
        self._closed_in = [0, 0]
        self._closed_out = [0, 0]
        self.start_time = time.time()
        self.port = 0
        self.http_port = 0
        self._nursery: trio.Nursery | None = None
        self._listener: socket.socket | None = None
        self.ready = trio.Event()
        self.stopped = trio.Event()
        self.shutting_down = False
        self.lame_duck = False
        self._accept_scope = trio.CancelScope()
        # Stopped clients' sockets, closed as the last step of a shutdown; when the
        # server is its process's whole life (natsjs-server), the process exit closes
        # them (natsjs/cli.py main).
        self._held_sockets: list = []
        self.exits_with_process = False
        # Keepalive PINGs of every client, and the reads of plain clients, each from
        # one task (natsjs/connection.py).
        self.pinger = Pinger()
        self.reactor: Reactor | None = None

    # ---- running ---------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        opts = self.opts
        log = self.log
        log.info("Starting natsjs-server")
        log.info("  Version:  %s (NATS feature level %s)", __version__, NATS_VERSION)
        log.info("  Name:     %s", self.name)
        log.info("  ID:       %s", self.server_id)
        if opts.config_file:
            log.info("Using configuration file: %s", opts.config_file)
        if self.shutting_down:      # a signal arrived before we got this far
            self.stopped.set()
            task_status.started(self)
            return
        lsock = self.listen(opts.host, opts.port)
        self._listener = lsock
        self.port = lsock.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # Made now, run once clients may come: routes and JetStream started
                # before then register what ends its spins (Reactor.watch).
                reactor = Reactor()
                self.reactor = reactor
                if opts.http_port:
                    from natsjs import monitor
                    await nursery.start(monitor.serve, self)
                if self.jetstream is not None:
                    from natsjs.jetstream.engine import JetStreamError
                    try:
                        await nursery.start(self.jetstream.run)
                    except JetStreamError as exc:
                        log.fatal("Can't start JetStream: %s", exc)
                        raise
                log.info("Listening for client connections on %s:%d",
                         _display_host(opts.host), self.port)
                if self.cluster is not None:
                    await nursery.start(self.cluster.run)
                self._accept_scope = trio.CancelScope()
                nursery.start_soon(self.pinger.run)
                nursery.start_soon(reactor.run)
                nursery.start_soon(self._accept_loop, lsock)
                log.info("Server is ready")
                self.ready.set()
                task_status.started(self)
        finally:
            lsock.close()
            log.info("Server Exiting..")
            if not self.exits_with_process:
                self._close_held_sockets()
            self.stopped.set()

    def _close_held_sockets(self) -> None:
        """The last step of a shutdown: close the clients' sockets (``shutdown``)."""
        held, self._held_sockets = self._held_sockets, []
        for transport in held:
            transport.close()

    def shutdown(self) -> None:
        """Stop everything; ``run`` returns when it is all gone.

        Clients are stopped at once, but their sockets are closed last, after the
        slow work (routes, Raft, JetStream's stores) is done, just before ``run``
        returns and the process exits, as nats-server's Shutdown closes its client
        connections after JetStream and Raft (server/server.go). A client that sees
        its server go and reconnects elsewhere then finds it gone too: a harness
        that stops a server and then waits for the reconnection does not miss it.
        """
        if self.shutting_down:
            return
        self.shutting_down = True
        self.log.info("Initiating Shutdown...")
        self._stop_accepting()
        for c in list(self.clients.values()):
            c.hold_socket = self._held_sockets
            c.close(SERVER_SHUTDOWN)
        if self.cluster is not None:
            for r in list(self.cluster.routes):
                r.close(SERVER_SHUTDOWN)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def graceful_shutdown(self, timeout: float = 2.0) -> None:
        """Stop accepting, give pending output a moment to drain, then shut down."""
        self._stop_accepting()
        with trio.move_on_after(timeout):
            for c in list(self.clients.values()):
                c.flush()
                await c.wait_drained(timeout)
        self.shutdown()

    async def enter_lame_duck_mode(self) -> None:
        """Stop accepting, tell clients (INFO ldm), then close them spread over time.

        The shape of nats-server's lameDuckMode (server/server.go): clients get an INFO
        with ``ldm: true`` so they reconnect elsewhere; after the grace period the
        remaining connections are closed one by one over the rest of
        lame_duck_duration (at most a second apart), then the server shuts down.
        """
        if self.lame_duck or self.shutting_down:
            return
        self.lame_duck = True
        opts = self.opts
        self.log.info("Entering lame duck mode, stop accepting new clients")
        self._stop_accepting()
        if self.cluster is not None:
            self.cluster.send_ldm()
        clients = list(self.clients.values())
        if not clients:
            self.shutdown()
            return
        for c in clients:
            c.send_async_info(ldm=True)
        await trio.sleep(opts.lame_duck_grace_period)
        self.log.info("Closing existing clients")
        clients = list(self.clients.values())
        spread = max(opts.lame_duck_duration - opts.lame_duck_grace_period, 1.0)
        interval = min(spread / max(len(clients), 1), 1.0)
        for i, c in enumerate(clients):
            c.close(SERVER_SHUTDOWN)
            if i < len(clients) - 1:
                await trio.sleep(interval * (0.5 + secrets.randbelow(1000) / 2000))
        self.shutdown()

    def _stop_accepting(self) -> None:
        """Stop taking clients and close the listener now.

        A client that tries this server while it drains or stops is refused at once
        and moves on to the next server, instead of completing a TCP handshake with
        the listen backlog and waiting for an INFO that never comes (nats-server
        closes its listener first, server/server.go Shutdown and lameDuckMode).
        """
        self._accept_scope.cancel()
        lsock, self._listener = self._listener, None
        if lsock is None:
            return
        try:
            trio.lowlevel.notify_closing(lsock)
        except RuntimeError:        # not in trio (a stop before run): nothing waits on it
            pass
        lsock.close()

    def reload(self, opts: ServerOptions) -> list[str]:
        """Apply a re-read configuration to the running server; returns what changed.

        Logging, limits, authorization and accounts take effect on live connections;
        connections whose credentials no longer pass are closed, the others keep their
        subscriptions.  Listen addresses and the server name need a restart (nats-server
        refuses to reload them too), so they are kept and reported.
        """
        opts.validate()
        old = self.opts
        fixed = [k for k in ("host", "port", "server_name", "http_port", "http_host")
                 if getattr(old, k) != getattr(opts, k)]
        if fixed:
            self.log.error("Config reload: not supported for %s; keeping the running values",
                           ", ".join(fixed))
            opts = opts.replace(**{k: getattr(old, k) for k in fixed})
        if (old.cluster is None) != (opts.cluster is None):
            self.log.error("Config reload: adding or removing the cluster block needs a "
                           "restart; keeping the running values")
            opts = opts.replace(cluster=old.cluster)
        changed = [f for f in opts.__dataclass_fields__ if getattr(old, f) != getattr(opts, f)]
        self.opts = opts
        self.log.debug_enabled = opts.debug
        self.log.trace_enabled = opts.trace
        if opts.log_file != old.log_file or opts.logtime != old.logtime:
            self.log.reopen(path=opts.log_file, logtime=opts.logtime)
        if opts.accounts != old.accounts or opts.system_account != old.system_account:
            self._reload_accounts(opts)
        if self.cluster is not None and opts.cluster != old.cluster:
            self.cluster.reload(opts.cluster)
            opts = opts.replace(cluster=self.cluster.copts)
            self.opts = opts
        for c in list(self.clients.values()):
            core = c.core
            core.max_payload = opts.max_payload
            core.max_control_line = opts.max_control_line
            core.max_pending = opts.max_pending
            core.max_subs = opts.max_subs
            c.on_trace_changed()
            if opts.auth != old.auth or opts.accounts != old.accounts:
                c.reauthorize()
        self.log.info("Reloaded server configuration%s",
                      (": " + ", ".join(changed)) if changed else "")
        return changed

    def _reload_accounts(self, opts: ServerOptions) -> None:
        for acc in self.accounts.values():
            self.route_interest(acc, acc.clear_internal(), -1)
        for cfg in opts.accounts:
            acc = self.accounts.get(cfg.name)
            if acc is None:
                acc = self.accounts[cfg.name] = Account(cfg.name, cfg)
                acc.on_interest = self.route_interest
            else:
                acc.config = cfg
        if opts.system_account not in self.accounts:
            acc = self.accounts[opts.system_account] = Account(opts.system_account)
            acc.on_interest = self.route_interest
        for acc in self.accounts.values():
            acc.is_system = acc.name == opts.system_account
        if self.cluster is not None:
            self.cluster.accounts_changed()
        self.system_account = self.accounts[opts.system_account]
        for owner in self._owners:
            owner.install(self)

    # ---- internal subscriptions (see the module docstring) ----------------------------

    def add_internal_owner(self, owner) -> None:
        """Install ``owner``'s subscriptions now and after every accounts reload."""
        self._owners.append(owner)
        owner.install(self)

    def subscribe_internal(self, account: Account | str, subject: bytes, handler, owner,
                           queue: bytes | None = None, route: bool = True):
        """Subscribe ``handler(sub, subject, reply, hdr, msg)`` in ``account``."""
        if isinstance(account, str):
            account = self.accounts[account]
        return account.add_internal(subject, handler, queue, route,
                                    _Handler(self, owner, account))

    def spawn(self, fn, *args, owner=None) -> bool:
        """Run ``await fn(*args)`` in a server task, outside the current fan-out.

        False (nothing started) when the server is not running or stopping, or when
        ``owner`` already has ``owner.max_tasks`` tasks running.
        """
        if self._nursery is None or self.shutting_down:
            return False
        key = id(owner)
        running = self._owner_tasks.get(key, 0)
        if owner is not None and running >= getattr(owner, "max_tasks", 0):
            return False
        self._owner_tasks[key] = running + 1
        self._nursery.start_soon(self._run_task, fn, args, owner, key)
        return True

    async def _run_task(self, fn, args, owner, key) -> None:
        try:
            await fn(*args)
        except Exception as exc:
            self.log.error("Task %s of %s failed: %r", getattr(fn, "__name__", fn),
                           getattr(owner, "name", "the server"), exc)
        finally:
            left = self._owner_tasks.pop(key, 1) - 1
            if left > 0:
                self._owner_tasks[key] = left

    def start_connection_task(self, fn, *args) -> None:
        """Run ``await fn(*args)`` in the root nursery: a task of a connection that has
        none of its own (it sees the task end before it is torn down)."""
        self._nursery.start_soon(fn, *args)

    def next_cid(self) -> int:
        """A new connection id: clients and routes draw from one sequence, so an id
        names one connection of this server (as nats-server's ``cid``s do)."""
        self._cid += 1
        return self._cid

    def listen(self, host: str, port: int) -> socket.socket:
        """A bound, listening, non-blocking TCP socket on ``host:port`` (port -1: any
        free port; ``getsockname`` tells which), with SO_REUSEADDR; the caller closes
        it.  Errors binding (address in use...) are raised as OSError."""
        if port == RANDOM_PORT:
            port = 0
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        lsock = socket.socket(family, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(addr)
        lsock.listen(1024)
        lsock.setblocking(False)
        return lsock

    async def _accept_loop(self, lsock: socket.socket) -> None:
        with self._accept_scope:
            await self.accept_connections(lsock, self._new_client, "Client")

    async def accept_connections(self, lsock: socket.socket, on_socket, what: str) -> None:
        """Accept on ``lsock`` forever, handing each socket to ``on_socket(sock, addr)``.

        Running out of file descriptors or buffers is temporary: log, back off and
        go on, as trio's and nats-server's accept loops do (ACCEPT_MIN/MAX_SLEEP).
        """
        delay = ACCEPT_MIN_SLEEP
        while True:
            try:
                sock, addr = lsock.accept()
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(lsock)
                except trio.ClosedResourceError:
                    return          # closed by _stop_accepting
                continue
            except OSError as exc:
                if lsock.fileno() < 0:
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log.error("Temporary %s Accept Error(%s), sleeping %dms",
                                   what, exc, int(delay * 1000))
                    await trio.sleep(delay)
                    delay = min(delay * 2, ACCEPT_MAX_SLEEP)
                    continue
                if self.shutting_down:
                    return
                # Anything else (ECONNABORTED, EPROTO, EPERM ...) concerns one
                # connection attempt, not the listener (nats-server acceptError).
                self.log.error("%s Accept Error: %s", what, exc)
                await trio.sleep(ACCEPT_MIN_SLEEP)
                continue
            delay = ACCEPT_MIN_SLEEP
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            on_socket(sock, addr)
            # A burst of connections must not starve the connections already served.
            await trio.lowlevel.checkpoint()

    def _new_client(self, sock: socket.socket, addr) -> None:
        client = Client(self, sock, self.next_cid(), addr)
        if len(self.clients) >= self.opts.max_connections:
            self.log.error(client.log_prefix + "maximum connections exceeded")
            client.send(self.client_info_line(client))
            client.close(MAX_CONNECTIONS, "maximum connections exceeded")
            sock.close()
            return
        self.clients[client.cid] = client
        self.total_connections += 1
        client.serve(self._nursery)

    # ---- connections -----------------------------------------------------------

    def route_interest(self, account, subs, delta: int) -> None:
        """Local interest changed (``subs`` all added, ``delta`` 1, or all removed, -1):
        count it, and tell the routes when clustered."""
        if not subs:
            return
        changed = count_interest(account.rm, subs, delta)
        if self.cluster is not None and changed:
            self.cluster.interest_changed(account, changed, delta)
        if self.jetstream is not None:
            self.jetstream.interest_changed(account, subs)

    def remove_connection(self, client) -> None:
        if self.clients.pop(client.cid, None) is not None:
            core = client.core
            self._closed_in[0] += core.in_msgs
            self._closed_in[1] += core.in_bytes
            self._closed_out[0] += core.out_msgs
            self._closed_out[1] += core.out_bytes
            acc = getattr(client, "account", None)
            if acc is not None:
                t = acc.closed_totals
                t[0] += core.in_msgs
                t[1] += core.in_bytes
                t[2] += core.out_msgs
                t[3] += core.out_bytes

    def note_slow_consumer(self, client: Client) -> None:
        self.slow_consumers += 1
        acc = getattr(client, "account", None)
        if acc is not None:
            acc.slow_consumers += 1

    @staticmethod
    def flush_pcd(core) -> None:
        """Write out every connection the last read batch queued frames for."""
        for target in core.take_pcd():
            target.conn.flush()

    def deliver(self, account: Account, subject: bytes, reply: bytes | None, msg: bytes,
                hdr: int = -1, to_routes: bool = True, shown: bytes | None = None) -> None:
        """Publish from server code into ``account``: imports, $SYS replies, services.

        The message goes through the same Cython fan-out as a client's PUB, from a
        publisher core of the account's; every connection written to is flushed once.
        A delivery asked for by a handler inside another one is queued and run when
        that one is done, so import chains keep a flat stack whatever their length;
        only a cycle reaches MAX_IMPORT_HOPS, and what it drops is logged.
        """
        if self._delivering:
            hops = self._hops + 1
            if hops > MAX_IMPORT_HOPS:
                self.log.error("Dropping message on %r after %d internal deliveries in a "
                               "row (an import cycle?)", subject.decode("utf-8", "replace"),
                               MAX_IMPORT_HOPS)
                return
            self._deliveries.append((account, subject, reply, msg, hdr, to_routes, shown, hops))
            return
        self._delivering = True
        try:
            self._fan_out(account, subject, reply, msg, hdr, to_routes, shown)
            while self._deliveries:
                *item, self._hops = self._deliveries.popleft()
                self._fan_out(*item)
        finally:
            self._delivering = False
            self._hops = 0
            self._deliveries.clear()

    def _fan_out(self, account: Account, subject: bytes, reply: bytes | None, msg: bytes,
                 hdr: int, to_routes: bool, shown: bytes | None = None) -> None:
        core = account.publisher()
        core.to_routes = to_routes
        try:
            if shown is None:
                core.publish(subject, reply, hdr, msg)
            else:
                # A JetStream delivery passed on (imports): routed by ``subject``,
                # shown with the stored message's.
                core.publish_deliver(subject, shown, reply, hdr, msg)
        except UnsafeSubject as exc:
            # Whatever let it in is a bug to fix at that entry; the message goes nowhere.
            self.log.error("Dropping a message of account %s: %s", account.name, exc)
        finally:
            core.stalled = None     # server code does not wait for slow consumers
            account.release_publisher(core)
            self.flush_pcd(core)

    def lookup_account(self, name: str) -> Account | None:
        return self.accounts.get(name)

    @property
    def routes(self) -> list:
        """Registered route connections (for /routez and /varz)."""
        return self.cluster.registered_routes() if self.cluster is not None else []

    def _varz_cluster(self) -> dict:
        return _varz_cluster_block(self)

    @property
    def auth_required(self) -> bool:
        return self._auth_flags()[0]

    @property
    def nonce_wanted(self) -> bool:
        """Clients get a nonce in their INFO (someone may sign it with an nkey)."""
        return self._auth_flags()[1]

    def _auth_flags(self) -> tuple[bool, bool]:
        """(authentication required, nonce wanted) for the options in force: computed
        once per options object, not once per connection."""
        opts = self.opts
        if self._flags_for is not opts:
            self._flags = (opts.auth.required or any(a.users for a in opts.accounts),
                           opts.auth.has_nkeys or any(u.nkey for a in opts.accounts
                                                      for u in a.users))
            self._flags_for = opts
        return self._flags

    def users_by_account(self) -> dict:
        return {a.name: a.users for a in self.opts.accounts}

    def own_client_urls(self) -> list[str]:
        """Where clients reach this server (``host:port``; each address when on 0.0.0.0)."""
        if self._own_urls is None:
            host = self.opts.host
            if host in ("", "0.0.0.0", "::"):
                addrs = []
                try:
                    for a in socket.gethostbyname_ex(socket.gethostname())[2]:
                        if not a.startswith("127.") and a not in addrs:
                            addrs.append(a)
                except OSError:
                    pass
                hosts = addrs or ["127.0.0.1"]
            else:
                hosts = [host]
            self._own_urls = ["%s:%d" % (h, self.port) for h in hosts]
        return self._own_urls

    def connect_urls(self) -> list[str]:
        if self.cluster is None or self.opts.cluster.no_advertise:
            return []
        others = self.cluster.client_urls()
        if not others:
            return []
        own = self.own_client_urls()
        return own + [u for u in others if u not in own]

    def client_urls_changed(self) -> None:
        """The cluster's client URLs changed: tell clients that take async INFO."""
        for c in list(self.clients.values()):
            if c.first_pong_sent:
                c.send_async_info()

    def info(self) -> dict:
        opts = self.opts
        info = {
            "server_id": self.server_id,
            "server_name": self.name,
            "version": NATS_VERSION,
            "proto": PROTO,
            "go": "natsjs",
            "host": opts.host,
            "port": self.port,
            "headers": True,
            "max_payload": opts.max_payload,
            "natsjs": __version__,
        }
        urls = self.connect_urls()
        if urls:
            info["connect_urls"] = urls
        if self.cluster is not None:
            info["cluster"] = self.cluster.name
        if self.jetstream is not None:
            info["jetstream"] = True
        return info

    def client_info_line(self, client: Client, connect_info: bool = False,
                         ldm: bool = False) -> bytes:
        urls = self.connect_urls()
        key = (ldm, self.cluster.name if self.cluster is not None else None, urls)
        cached = self._info_cache
        if cached is None or cached[0] is not self.opts or cached[1] != key:
            # What every client is told alike is encoded once (until the options,
            # the cluster's name or its URLs change); each INFO adds its own fields.
            info = self.info()
            if self.opts.tls is not None:
                from natsjs.tls import info_fields
                info.update(info_fields(self.opts.tls))
            if ldm:
                info["ldm"] = True
            if self.auth_required:
                info["auth_required"] = True
            cached = self._info_cache = (self.opts, key, b"INFO " + json.dumps(
                info, separators=(",", ":")).encode()[:-1])
        own = ',"client_id":%d,"client_ip":%s' % (client.cid, json.dumps(client.host))
        if client.nonce:
            own += ',"nonce":%s' % json.dumps(client.nonce)
        if connect_info:
            own += ',"connect_info":true,"remote_account":%s' % json.dumps(client.account.name)
            if client.account.is_system:
                own += ',"acc_is_sys":true'
        return cached[2] + own.encode() + b"} \r\n"

    # ---- statistics ----------------------------------------------------------

    def totals(self) -> dict:
        in_msgs, in_bytes = self._closed_in
        out_msgs, out_bytes = self._closed_out
        for c in self.clients.values():
            core = c.core
            in_msgs += core.in_msgs
            in_bytes += core.in_bytes
            out_msgs += core.out_msgs
            out_bytes += core.out_bytes
        return {"in_msgs": in_msgs, "in_bytes": in_bytes,
                "out_msgs": out_msgs, "out_bytes": out_bytes}

    def varz(self) -> dict:
        opts = self.opts
        now = time.time()
        t = self.totals()
        try:
            import resource
            ru = resource.getrusage(resource.RUSAGE_SELF)
            mem = ru.ru_maxrss * 1024
            cpu_seconds = ru.ru_utime + ru.ru_stime
        except Exception:  # pragma: no cover - non-POSIX
            mem, cpu_seconds = 0, 0.0
        uptime = now - self.start_time
        return {
            "server_id": self.server_id,
            "server_name": self.name,
            "version": NATS_VERSION,
            "natsjs": __version__,
            "proto": PROTO,
            "go": "python" + platform.python_version(),
            "host": opts.host,
            "port": self.port,
            "max_connections": opts.max_connections,
            "ping_interval": int(opts.ping_interval * 1e9),
            "ping_max": opts.max_pings_out,
            "http_host": opts.http_host or opts.host,
            "http_port": self.http_port,
            "http_base_path": "",
            "https_port": 0,
            "auth_timeout": 2,
            "max_control_line": opts.max_control_line,
            "max_payload": opts.max_payload,
            "max_pending": opts.max_pending,
            **({"max_subscriptions": opts.max_subs} if opts.max_subs else {}),
            "cluster": self._varz_cluster(),
            "gateway": {},
            "leaf": {},
            "mqtt": {},
            "websocket": {},
            "jetstream": self.jetstream.varz() if self.jetstream is not None else {},
            "tls_timeout": 2,
            "write_deadline": int(opts.write_deadline * 1e9),
            "start": _rfc3339(self.start_time),
            "now": _rfc3339(now),
            "uptime": go_uptime(uptime),
            "mem": mem,
            "cores": os.cpu_count() or 1,
            "gomaxprocs": 1,
            "cpu": round(100.0 * cpu_seconds / uptime, 2) if uptime > 0 else 0.0,
            "connections": len(self.clients),
            "total_connections": self.total_connections,
            "routes": len(self.routes),
            "remotes": 0,
            "leafnodes": 0,
            "in_msgs": t["in_msgs"],
            "out_msgs": t["out_msgs"],
            "in_bytes": t["in_bytes"],
            "out_bytes": t["out_bytes"],
            "slow_consumers": self.slow_consumers,
            "subscriptions": sum(a.sublist.count - len(a.internal_subs)
                                 for a in self.accounts.values()),
            "config_load_time": _rfc3339(self.start_time),
            "system_account": self.system_account.name,
        }


def _varz_cluster_block(server) -> dict:
    c = server.cluster
    if c is None:
        return {}
    copts = c.copts
    out = {"name": c.name, "addr": copts.host or "0.0.0.0", "cluster_port": c.port,
           "auth_timeout": copts.auth_timeout, "tls_timeout": 2,
           "pool_size": copts.pool_size, "compression": copts.compression}
    if copts.routes:
        out["urls"] = [r.split("://", 1)[-1].split("@")[-1].rstrip("/") for r in copts.routes]
    if copts.accounts:
        out["accounts"] = list(copts.accounts)
    return out


def _display_host(host: str) -> str:
    return host if host else "0.0.0.0"


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + ".%06dZ" % int((ts % 1) * 1e6)


