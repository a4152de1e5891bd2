"""JetStream on one server: the enabled accounts, their streams, limits and storage.

``JetStream`` is created by the server when ``-js``/``jetstream {}`` asks for it.  Its
``run`` task makes sure the store directory is usable (or stops the server with
nats-server's message), prints the banner, recovers every stream and consumer from
disk, and subscribes the API (natsjs/jetstream/api.py) in each enabled account.  All
streams' tasks live in its nursery, so shutting down JetStream is cancelling it, after
each stream has had its state written.

Internal subscriptions go through the account's sublist like any client's, so a
stream's subjects are found by the same match a PUB does (DESIGN.md: internal
subscribers are first-class); what they publish goes through ``publisher`` /
``Server.deliver``, the same Cython fan-out clients use.
"""
from __future__ import annotations

import os
import tempfile

import trio

from natsjs import NATS_VERSION
from natsjs.jetstream.config import DEFAULT_MAX_CONSUMERS, AccountJSLimits, JetStreamOptions
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import now_ns, rfc3339_nano
from natsjs.jetstream.streamcfg import API_LEVEL
from natsjs._core.fanout import Sink, WithProducer
from natsjs._core.sublist import Subscription

STREAMS_DIR = "streams"


def _friendly_bytes(n: int) -> str:
    """nats-server's friendlyBytes: 17.66 GB."""
    units = ["B", "KB", "MB", "GB", "TB", "PB", "EB"]
    f = float(n)
    i = 0
    while f >= 1024 and i < len(units) - 1:
        f /= 1024
        i += 1
    return "%d %s" % (n, "B") if i == 0 else "%.2f %s" % (f, units[i])


def _system_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 1 << 30


class JetStreamError(Exception):
    """JetStream could not start (the server stops with this message)."""


class Publisher:
    """Publish several messages from server code and flush the connections once.

    ``pub(subject, reply, msg, hdr)`` goes through the account's Cython fan-out like
    ``Server.deliver``; ``done()`` writes every connection the batch touched.
    """

    __slots__ = ("server", "account", "core")

    def __init__(self, server, account):
        self.server = server
        self.account = account
        self.core = account.publisher()
        self.core.to_routes = True

    def __call__(self, subject: bytes, reply: bytes | None, msg: bytes, hdr: int = -1,
                 shown: bytes | None = None) -> None:
        if shown is None:
            self.core.publish(subject, reply, hdr, msg)
        else:
            self.core.publish_deliver(subject, shown, reply, hdr, msg)

    def done(self) -> None:
        core = self.core
        core.stalled = None
        self.account.release_publisher(core)
        self.server.flush_pcd(core)


class JsAccount:
    """JetStream in one account: its streams, limits and usage."""

    def __init__(self, js: "JetStream", account, limits: AccountJSLimits):
        self.js = js
        self.account = account
        self.name = account.name
        self.limits = limits
        self.streams: dict = {}
        self.api_total = 0
        self.api_errors = 0
        self.dir = os.path.join(js.store_dir, account.name)

    # ---- usage and limits -------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        mem = store = 0
        for s in self.streams.values():
            b = s.store.bytes
            if s.cfg["storage"] == "memory":
                mem += b
            else:
                store += b
        return mem, store

    def reserved(self) -> tuple[int, int]:
        mem = store = 0
        for s in self.streams.values():
            mb = s.cfg["max_bytes"]
            if mb > 0:
                if s.cfg["storage"] == "memory":
                    mem += mb
                else:
                    store += mb
        return mem, store

    def num_consumers(self) -> int:
        return sum(len(s.consumers) for s in self.streams.values())

    def note_usage(self) -> None:
        """Usage changed (deletes, purges); nothing cached to refresh yet."""

    def check_storage(self, stream, size: int):
        """server/jetstream.go wouldExceedLimits for a new message; an ApiError or None."""
        lim = self.limits
        is_mem = stream.cfg["storage"] == "memory"
        cap = lim.max_memory if is_mem else lim.max_store
        if cap >= 0:
            mem, store = self.usage()
            used = mem if is_mem else store
            # A stream with max_bytes and discard old stays within its reservation.
            if stream.cfg["max_bytes"] <= 0 or stream.cfg["discard"] == "new":
                if used + size > cap:
                    return ApiError.of("JSAccountResourcesExceededErr")
        js = self.js
        if is_mem:
            if js.max_memory > 0 and js.memory_used() + size > js.max_memory:
                return ApiError.of("JSInsufficientResourcesErr")
        elif js.max_store > 0 and js.store_used() + size > js.max_store:
            return ApiError.of("JSInsufficientResourcesErr")
        return None

    def storage_budget(self, stream) -> int:
        """Bytes ``stream`` may add before a limit needs a closer look (computed once
        per batch; ``check_storage`` decides when a message would not fit)."""
        lim = self.limits
        is_mem = stream.cfg["storage"] == "memory"
        js = self.js
        budget = (js.max_memory - js.memory_used()) if is_mem else \
            (js.max_store - js.store_used())
        cap = lim.max_memory if is_mem else lim.max_store
        if cap >= 0:
            mem, store = self.usage()
            budget = min(budget, cap - (mem if is_mem else store))
        return budget

    def check_new_stream(self, cfg: dict, existing=None):
        """Limits on creating (or growing) a stream: count, reserved bytes."""
        lim = self.limits
        if existing is None and lim.max_streams > 0 and len(self.streams) >= lim.max_streams:
            raise ApiError.of("JSMaximumStreamsLimitErr")
        mb = cfg["max_bytes"]
        is_mem = cfg["storage"] == "memory"
        cap = lim.max_memory if is_mem else lim.max_store
        if mb > 0:
            rmem, rstore = self.reserved()
            used = rmem if is_mem else rstore
            if existing is not None and existing.cfg["max_bytes"] > 0 and \
                    existing.cfg["storage"] == cfg["storage"]:
                used -= existing.cfg["max_bytes"]
            if cap >= 0 and used + mb > cap:
                raise ApiError.of("JSStorageResourcesExceededErr" if not is_mem
                                  else "JSMemoryResourcesExceededErr")
            js_cap = self.js.max_memory if is_mem else self.js.max_store
            if js_cap > 0 and mb > js_cap:
                raise ApiError.of("JSStorageResourcesExceededErr" if not is_mem
                                  else "JSMemoryResourcesExceededErr")
        if cap == 0:
            raise ApiError.of("JSStorageResourcesExceededErr" if not is_mem
                              else "JSMemoryResourcesExceededErr")

    def max_consumers(self) -> int:
        return self.limits.max_consumers

    def account_info(self) -> dict:
        mem, store = self.usage()
        rmem, rstore = self.reserved()
        out = {"memory": mem, "storage": store, "reserved_memory": rmem,
               "reserved_storage": rstore, "streams": len(self.streams),
               "consumers": self.num_consumers(), "limits": self.limits.to_json()}
        if self.js.domain:
            out["domain"] = self.js.domain
        out["api"] = {"level": API_LEVEL, "total": self.api_total, "errors": self.api_errors}
        return out


class JetStream:
    """Per-server JetStream: owned by the Server, started in its nursery."""

    def __init__(self, server, opts: JetStreamOptions):
        self.server = server
        self.opts = opts
        base = opts.store_dir or server.opts.store_dir
        self.temp_dir = not base
        if not base:
            base = os.path.join(tempfile.gettempdir(), "nats")
        self.store_dir = os.path.join(base, "jetstream")
        self.domain = opts.domain
        self.version = NATS_VERSION
        self.sync_always = opts.sync_always
        self.sync_interval = opts.sync_interval
        self.enabled = True
        self.accounts: dict[str, JsAccount] = {}
        # Push consumers by account name and deliver subject, so that a subscription
        # coming or going looks at the consumers it concerns, not at all of them
        # (nats-server registers a notification per deliver subject, sublist.go).
        self._push: dict[str, dict[bytes, set]] = {}
        self.api_total = 0
        self.api_errors = 0
        self.max_memory = opts.max_memory
        self.max_store = opts.max_store
        self._nursery: trio.Nursery | None = None
        self.api = None
        self.started = 0
        self._syncer = None
        self.cluster = None          # JetStreamCluster when the server is clustered
        self._fsync_waiters: dict = {}

    # ---- start-up -----------------------------------------------------------------------

    def _check_store_dir(self) -> None:
        d = self.store_dir
        if os.path.exists(d) and not os.path.isdir(d):
            raise JetStreamError("storage directory is not a directory")
        parent = os.path.dirname(d)
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise JetStreamError("storage directory is not a directory")
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as exc:
            raise JetStreamError("could not create storage directory - %s" % _go_mkdir_err(
                exc, d)) from None
        if not os.access(d, os.W_OK):
            raise JetStreamError("storage directory is not writable")

    def _limits(self) -> None:
        if self.max_memory < 0:
            self.max_memory = _system_memory() * 3 // 4
        if self.max_store < 0:
            try:
                st = os.statvfs(self.store_dir)
                self.max_store = min(st.f_bavail * st.f_frsize * 3 // 4, 1 << 40)
            except OSError:  # pragma: no cover
                self.max_store = 1 << 40

    def _banner(self) -> None:
        log = self.server.log
        log.info("Starting JetStream")
        if self.temp_dir:
            log.warn("Temporary storage directory used, data could be lost on system reboot")
        for line in ("    _ ___ _____ ___ _____ ___ ___   _   __  __",
                     " _ | | __|_   _/ __|_   _| _ \\ __| /_\\ |  \\/  |",
                     "| || | _|  | | \\__ \\ | | |   / _| / _ \\| |\\/| |",
                     " \\__/|___| |_| |___/ |_| |_|_\\___/_/ \\_\\_|  |_|",
                     "",
                     "         https://docs.nats.io/jetstream",
                     "",
                     "---------------- JETSTREAM ----------------"):
            log.info("%s", line)
        log.info("  Strict:          %s", "true" if self.opts.strict else "false")
        log.info("  Max Memory:      %s", _friendly_bytes(self.max_memory))
        log.info("  Max Storage:     %s", _friendly_bytes(self.max_store))
        log.info("  Store Directory: \"%s\"", self.store_dir)
        log.info("  Sync:            %s", "always (fsync before every acknowledgement, "
                 "batched)" if self.sync_always else "every %gs" % self.sync_interval)
        if self.domain:
            log.info("  Domain:          %s", self.domain)
        log.info("  API Level:       %d", API_LEVEL)
        log.info("-------------------------------------------")

    def enabled_accounts(self) -> list:
        """Which accounts get JetStream (server/jetstream.go enableJetStreamAccounts):
        with no accounts configured but the system account, the global one; otherwise
        those that ask for it."""
        server = self.server
        out = []
        configured = server.opts.accounts
        if all(cfg.name == server.system_account.name for cfg in configured):
            out.append((server.accounts["$G"], AccountJSLimits()))
            return out
        for cfg in configured:
            if cfg.jetstream is not None and cfg.name != server.system_account.name:
                acc = server.accounts.get(cfg.name)
                if acc is not None:
                    out.append((acc, cfg.jetstream))
        return out

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        t0 = trio.current_time()
        self._check_store_dir()
        self._limits()
        self._banner()
        from natsjs._core.syncer import Syncer
        from natsjs.jetstream.api import Api
        self.api = Api(self)
        self._syncer = Syncer()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._collect_fsyncs)
            for acc, limits in self.enabled_accounts():
                jsa = JsAccount(self, acc, limits)
                self.accounts[acc.name] = jsa
                if self.server.cluster is None:
                    await self._recover_account(jsa)
            if self.server.cluster is not None:
                # Clustered: the meta group's assignments say which streams live here.
                from natsjs.jetstream.cluster import JetStreamCluster
                self.cluster = JetStreamCluster(self)
                await nursery.start(self.cluster.run)
            self.api.install()
            nursery.start_soon(self.api.worker)
            self.started = now_ns()
            self.server.log.info("Took %.3fms to start JetStream",
                                 (trio.current_time() - t0) * 1000)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self.shutdown()

    def shutdown(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self.server.log.info("Initiating JetStream Shutdown...")
        if self.cluster is not None:
            self.cluster.stop()
        for jsa in self.accounts.values():
            for s in list(jsa.streams.values()):
                s.stop()
        if self._syncer is not None:
            self._syncer.close()
        self.server.log.info("JetStream Shutdown")

    async def _recover_account(self, jsa: JsAccount) -> None:
        from natsjs.jetstream import recovery
        sdir = os.path.join(jsa.dir, STREAMS_DIR)
        if not os.path.isdir(sdir):
            return
        await recovery.recover_streams(self, jsa, sdir)

    # ---- the pieces streams and consumers use ---------------------------------------------

    async def fsync(self, sync) -> None:
        """Make a store's Sync durable on the fsync thread (natsjs/_core/syncer.pyx);
        OSError when the disk refused it."""
        done = trio.Event()
        errs = []

        def finished(s, err: int) -> None:
            errs.append(err)
            done.set()

        self.fsync_submit(sync, finished)
        await done.wait()
        if errs[0]:
            raise OSError(errs[0], os.strerror(errs[0]))

    def fsync_submit(self, sync, on_done) -> None:
        """Start making ``sync`` durable and return at once; ``on_done(sync, errno)``
        is called from the task that collects the fsync thread's completions (errno 0:
        durable).  Raft's driver starts its syncs this way, without a task hop."""
        if sync.files == 0:
            sync.run()          # nothing written: no system call, nothing to wait for
            on_done(sync, 0)
            return
        self._fsync_waiters[id(sync)] = on_done
        try:
            self._syncer.submit(sync)
        except BaseException:
            del self._fsync_waiters[id(sync)]
            raise

    async def _collect_fsyncs(self) -> None:
        syncer = self._syncer
        log = self.server.log
        if self.server.reactor is not None:
            self.server.reactor.watch(syncer.fd)    # a finished fsync ends a spin
        while True:
            await trio.lowlevel.wait_readable(syncer.fd)
            for s, err in syncer.collect():
                cb = self._fsync_waiters.pop(id(s), None)
                if cb is None:
                    continue
                try:
                    cb(s, err)
                except Exception as exc:    # one waiter's bug must not stop the others
                    log.error("JetStream fsync completion failed: %r", exc)

    def spawn(self, fn, *args) -> None:
        self._nursery.start_soon(fn, *args)

    def start_stream(self, stream) -> None:
        stream.start(self._nursery)
        # Mirrors and sources waiting for a stream of that name go at once.
        for other in stream.jsa.streams.values():
            if other.sourcing is not None and other is not stream:
                other.sourcing.origin_created(stream.name)

    def subscribe(self, account, subject: bytes, callback, queue: bytes | None = None,
                  route: bool = True):
        """An internal subscription of JetStream's in ``account`` (interest is
        propagated to routes like a client's, unless ``route`` is false: every server
        has the same one and serves its own clients with it)."""
        if not isinstance(callback, Sink):
            callback = self._guard(callback, subject)
        sub = Subscription(subject, queue, b"", None, callback)
        account.sublist.insert(sub)
        if route:
            self.server.route_interest(account, [sub], 1)
        return sub

    def unsubscribe(self, account, sub) -> None:
        sub.closed = True
        if account.sublist.remove(sub):
            self.server.route_interest(account, [sub], -1)

    def subscribe_all(self, account, subjects, callback) -> list:
        """``subscribe`` for each of ``subjects`` with one callback (a stream's capture),
        their interest counted and routed at once: a stream of 10,000 subjects
        is one pass, not 10,000."""
        if not isinstance(callback, Sink):
            callback = self._guard(callback, b"")
        subs = []
        for subject in subjects:
            sub = Subscription(subject.encode(), None, b"", None, callback)
            account.sublist.insert(sub)
            subs.append(sub)
        self.server.route_interest(account, subs, 1)
        return subs

    def unsubscribe_all(self, account, subs) -> None:
        gone = []
        for sub in subs:
            sub.closed = True
            if account.sublist.remove(sub):
                gone.append(sub)
        self.server.route_interest(account, gone, -1)

    def _guard(self, callback, subject: bytes):
        """A handler that fails logs and answers nothing, instead of taking the
        publishing connection down with it."""
        log = self.server.log
        if isinstance(callback, WithProducer):
            return WithProducer(self._guard(callback.fn, subject))

        def guarded(*args):
            try:
                return callback(*args)
            except Exception as exc:
                log.error("JetStream internal handler for %r failed on %r: %r",
                          subject.decode("utf-8", "replace"), args[-4], exc)
        return guarded

    def publisher(self, account) -> Publisher:
        return Publisher(self.server, account)

    def advisory(self, subject: str, type_: str, body: dict, account) -> None:
        """An advisory event (server/jetstream_events.go), published in ``account``."""
        import json
        import secrets
        ev = {"type": type_, "id": secrets.token_hex(11), "timestamp": rfc3339_nano(now_ns())}
        ev.update(body)
        if self.domain:
            ev.setdefault("domain", self.domain)
        acc = account
        if not acc.sublist.match(subject.encode()).psubs and \
                not acc.sublist.match(subject.encode()).qsubs:
            return
        self.server.deliver(acc, subject.encode(), None,
                            json.dumps(ev, separators=(",", ":")).encode())

    def cluster_info(self) -> dict:
        server = self.server
        out = {}
        if server.cluster is not None:
            out["name"] = server.cluster.name
        out["leader"] = server.name
        return out

    def memory_used(self) -> int:
        return sum(jsa.usage()[0] for jsa in self.accounts.values())

    def store_used(self) -> int:
        return sum(jsa.usage()[1] for jsa in self.accounts.values())

    def out_of_storage(self, stream) -> None:
        self.server.log.error("JetStream out of storage writing '%s > %s'",
                              stream.jsa.name, stream.name)

    def recheck_interest(self, stream) -> None:
        """A consumer went away: messages nobody is interested in any more go too."""
        if stream.cfg["retention"] == "limits":
            return
        store = stream.store
        seq = store.first_seq
        while True:
            rec = store.load_next(seq)
            if rec is None:
                break
            stream.check_interest_retention(rec[0], rec[1])
            seq = rec[0] + 1

    def delete_consumer(self, stream, consumer, reason: str = "") -> None:
        self.api.remove_consumer(stream, consumer)

    def watch_deliver(self, consumer, subject: str | None) -> None:
        """``consumer`` (a push consumer of ``consumer.stream.jsa``) delivers to
        ``subject`` from now on, or to nothing (None): interest changes there are
        passed to its ``check_interest``."""
        index = self._push.setdefault(consumer.stream.jsa.name, {})
        old = consumer.watched
        if old is not None:
            watchers = index.get(old)
            if watchers is not None:
                watchers.discard(consumer)
                if not watchers:
                    del index[old]
        consumer.watched = subject.encode() if subject else None
        if consumer.watched is not None:
            index.setdefault(consumer.watched, set()).add(consumer)

    def interest_changed(self, account, subs=None) -> None:
        """Local interest in ``account`` changed (``subs`` came or went; None: it may
        have changed anywhere): push consumers look again.  Only a subscription on a
        deliver subject itself counts for a consumer (natsjs/accounts.py
        exact_interest), so a literal subscription wakes the consumers delivering to
        it and a wildcard none; when ``account`` imports streams its subscribers count
        for the exporters' consumers, and every consumer looks."""
        if subs is not None and not account.imports_streams():
            index = self._push.get(account.name)
            if not index:
                return
            for sub in subs:
                for c in list(index.get(sub.subject, ())):
                    c.check_interest()
            return
        if account.imports_streams():
            jsas = list(self.accounts.values())
        else:
            jsa = self.accounts.get(account.name)
            jsas = [jsa] if jsa is not None else []
        for jsa in jsas:
            for s in jsa.streams.values():
                for c in s.consumers.values():
                    if c.push:
                        c.check_interest()

    # ---- monitoring -------------------------------------------------------------------

    def config_json(self) -> dict:
        out = {"max_memory": self.max_memory, "max_storage": self.max_store,
               "store_dir": self.store_dir}
        if self.sync_always:
            out["sync_always"] = True
        else:
            out["sync_interval"] = int(self.sync_interval * 1e9)
        if self.domain:
            out["domain"] = self.domain
        if self.opts.unique_tag:
            out["unique_tag"] = self.opts.unique_tag
        out["strict"] = self.opts.strict
        return out

    def stats(self) -> dict:
        mem = self.memory_used()
        store = self.store_used()
        rmem = sum(j.reserved()[0] for j in self.accounts.values())
        rstore = sum(j.reserved()[1] for j in self.accounts.values())
        return {"memory": mem, "storage": store, "reserved_memory": rmem,
                "reserved_storage": rstore, "accounts": len(self.accounts), "ha_assets": 0,
                "api": {"level": API_LEVEL, "total": self.api_total, "errors": self.api_errors}}

    def varz(self) -> dict:
        return {"config": self.config_json(), "stats": self.stats(),
                "limits": {"default_max_consumers": DEFAULT_MAX_CONSUMERS}}

    def jsz(self, opts: dict) -> dict:
        """The body of /jsz (server/monitor.go JSInfo), without server_id/now."""
        out = self.stats()
        out["config"] = self.config_json()
        out["limits"] = {"default_max_consumers": DEFAULT_MAX_CONSUMERS}
        streams = consumers = messages = nbytes = 0
        for jsa in self.accounts.values():
            streams += len(jsa.streams)
            for s in jsa.streams.values():
                consumers += len(s.consumers)
                messages += s.store.msgs
                nbytes += s.store.bytes
        out.update({"streams": streams, "consumers": consumers, "messages": messages,
                    "bytes": nbytes})
        want_acc = opts.get("accounts") or opts.get("streams") or opts.get("consumers") \
            or opts.get("config")
        only = opts.get("acc")
        details = []
        if want_acc or only:
            for jsa in self.accounts.values():
                if only and jsa.name != only:
                    continue
                details.append(self._account_detail(jsa, opts))
            offset, limit = opts.get("offset", 0), opts.get("limit", 1024)
            out["account_details"] = details[offset:offset + limit]
        out["total"] = len(self.accounts)
        if self.cluster is not None:
            out["meta_cluster"] = self.cluster.meta_cluster_info()
        return out

    def _account_detail(self, jsa: JsAccount, opts: dict) -> dict:
        mem, store = jsa.usage()
        d = {"name": jsa.name, "id": jsa.name, "memory": mem, "storage": store,
             "reserved_memory": 0, "reserved_storage": 0, "accounts": 0, "ha_assets": 0,
             "api": {"level": 0, "total": jsa.api_total, "errors": jsa.api_errors}}
        if opts.get("streams") or opts.get("consumers") or opts.get("config"):
            sd = []
            for s in jsa.streams.values():
                rep = s.replica
                cluster = rep.cluster_info() if rep is not None else self.cluster_info()
                if opts.get("stream-leader-only") and cluster.get("leader") != self.server.name:
                    continue
                info = {"name": s.name, "created": rfc3339_nano(s.created),
                        "cluster": cluster}
                if opts.get("config"):
                    from natsjs.jetstream.streamcfg import config_json
                    info["config"] = config_json(s.cfg)
                info["state"] = s.state()
                if getattr(rep, "resetting", None) is not None:
                    # Not in nats-server's StreamDetail (its replica resets out of
                    # sight): this replica failed to apply an entry and is taking the
                    # leader's contents (replicated.ReplicatedStream._reset); the error.
                    info["resetting"] = rep.resetting
                if opts.get("consumers"):
                    cd = []
                    for c in s.consumers.values():
                        ci = c.info()
                        if not opts.get("config"):
                            ci.pop("config", None)
                        cd.append(ci)
                    if cd:
                        info["consumer_detail"] = cd
                if opts.get("raft") and rep is not None:
                    info["stream_raft_group"] = rep.group
                    groups = [{"name": c.name, "raft_group": c.replica.group}
                              for c in s.consumers.values() if c.replica is not None]
                    if groups:
                        info["consumer_raft_groups"] = groups
                sd.append(info)
            d["stream_detail"] = sd
        return d

    def healthz(self, options: dict) -> tuple[int, dict]:
        if not self.enabled:
            return 503, {"status": "unavailable", "status_code": 503,
                         "error": "JetStream is not enabled"}
        if self.cluster is not None and self.cluster.leaderless():
            # server/monitor.go healthz: a clustered server is healthy once it has a
            # meta leader.
            return 503, {"status": "unavailable", "status_code": 503,
                         "error": "JetStream has not established contact with a meta leader"}
        return 200, {"status": "ok"}


def _go_mkdir_err(exc: OSError, path: str) -> str:
    return "mkdir %s: %s" % (path, (exc.strerror or str(exc)).lower())


