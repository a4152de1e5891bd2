"""JetStream clustering: the meta group that owns the API and placement.

Every JetStream server of a cluster is a member of one Raft group, the meta group
(natsjs/jetstream/raft.py, driven by raft_driver.RaftService).  Its log holds the
cluster's assignments: which streams and consumers exist, with which configuration,
and on which peers (natsjs/jetstream/placement.py chooses them).  Every server applies
the log and makes its local state match it (``reconcile``): a server named in a
stream's peer set runs a replica of that stream, itself a Raft group
(natsjs/jetstream/replicated.py); a server that is no longer named drops its replica.

Raft traffic rides the routes like any other message, as internal subscriptions in the
system account: a server listens on ``$JSC.R.<its peer id>.*`` and a message for group
G on peer P is published to ``$JSC.R.<P>.<G>``.  Peer ids are nats-server's: eight
characters of a hash of the server name (server/events.go getHash), which is why a
JetStream cluster needs unique server names.  Servers also announce themselves every
second on ``$JSC.INFO`` (name, cluster, tags, storage, what they know of the meta
group): placement uses it for who is online and how much room they have, and the meta
group forms from it the first time (``_bootstrap``).

The API in a cluster: every JetStream server receives each ``$JS.API`` request of an
account (the API listens in the system account, whose interest rides the routes;
accounts reach it through their import, natsjs/jetstream/api.py); the meta leader answers those that change or list
assignments, a stream's leader those about its stream, a consumer's leader those about
its consumer; the rest stay silent.  With no meta leader, requests get the reference's
"JetStream system temporarily unavailable".
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
from urllib.parse import urlsplit

import trio

from natsjs._core.filelog import FileLog
from natsjs.clientinfo import request_info, service_account
from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream.apicore import (SERVER_REMOVE_REQUEST, STEPDOWN_REQUEST, T, decode,
                                      decode_required)
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import now_ns, rfc3339_nano
from natsjs.jetstream.placement import Candidate, PlacementError, select_peers
from natsjs.jetstream.raft import ConfigChangeInProgress
from natsjs.jetstream.raft import NotLeader as NotLeaderError
from natsjs.jetstream.raft import RaftConfig
from natsjs.jetstream.raft_driver import RaftService, StateMachine, hand_to
from natsjs.jetstream.raft_storage import DirFiles, RaftStorage
from natsjs.jetstream.replicated import ReplicatedConsumer, ReplicatedStream

_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
META = "_meta_"
INFO_INTERVAL = 1.0          # how often a server announces itself
OFFLINE_AFTER = 3.5          # silence after which a peer counts as offline
BOOTSTRAP_STABLE = 1.0       # the known peer set must hold still this long
BOOTSTRAP_QUORUM_WAIT = 10.0  # ... or this long when only a quorum of servers is there
# The longest a meta request (stream create, account info ...) is held while the meta
# group has no leader, or cannot yet place what it asks for, before it is answered
# "temporarily unavailable": less than clients' usual 5 s request timeout.
META_HOLD = 4.0
# The header a held request carries when a server publishes it again for the meta leader.
PASSED_ON = b"Natsjs-Held: 1\r\n"
META_SNAPSHOT_EVERY = 256    # meta entries between snapshots


def peer_id(name: str) -> str:
    """server/events.go getHash: 8 base-62 characters of the name's SHA-256."""
    b = hashlib.sha256(name.encode()).digest()
    return "".join(_DIGITS[b[i] % 62] for i in range(8))


def group_name(prefix: str, replicas: int, storage: str) -> str:
    """server/jetstream_cluster.go groupName: S-R3F-<random hash>."""
    tag = "".join(random.choice(_DIGITS) for _ in range(8))
    return "%s-R%d%s-%s" % (prefix, replicas, (storage or "file")[0].upper(), tag)


def consumer_peers(cfg: dict, stream_peers, prefer=()) -> list:
    """A consumer's peers among its stream's: as many as its num_replicas (0: the
    stream's count for durables, 1 for ephemerals), those in ``prefer`` first."""
    r = cfg["num_replicas"] or (len(stream_peers) if cfg["durable_name"] else 1)
    first = [p for p in prefer if p in stream_peers]
    return (first + [p for p in stream_peers if p not in first])[:r]


class Transport:
    """Raft messages of every group on this server, over the system account."""

    def __init__(self, cluster: "JetStreamCluster"):
        self.cluster = cluster
        self.server = cluster.server
        self.inboxes: dict[str, trio.MemorySendChannel] = {}
        self.services: dict = {}      # group -> RaftService (RaftService.receive)
        self.dropped = 0

    def install(self) -> None:
        js = self.cluster.js
        sys_acc = self.server.system_account
        self._sub = js.subscribe(sys_acc, b"$JSC.R.%s.*" % self.cluster.me.encode(),
                                 self._on_message)

    def attach(self, group: str):
        send, recv = trio.open_memory_channel(65536)
        self.inboxes[group] = send
        return GroupTransport(self, group), recv

    def detach(self, group: str) -> None:
        self.services.pop(group, None)
        ch = self.inboxes.pop(group, None)
        if ch is not None:
            ch.close()

    def _on_message(self, sub, subject, reply, hdr, msg) -> None:
        group = subject[subject.rfind(b".") + 1:].decode()
        ch = self.inboxes.get(group)
        if ch is None:
            self.dropped += 1
            return
        if not hand_to(self.services.get(group), ch, msg):
            self.dropped += 1

    def send(self, group: str, peer: str, data: bytes) -> None:
        if peer == self.cluster.me:
            ch = self.inboxes.get(group)
            if ch is not None:
                try:
                    ch.send_nowait(data)
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    self.dropped += 1
            return
        self.server.deliver(self.server.system_account,
                            b"$JSC.R.%s.%s" % (peer.encode(), group.encode()), None, data)


class GroupTransport:
    __slots__ = ("_t", "_group")

    def __init__(self, t: Transport, group: str):
        self._t = t
        self._group = group

    def send(self, peer: str, data: bytes) -> None:
        self._t.send(self._group, peer, data)

    def bind(self, service) -> None:
        self._t.services[self._group] = service


class NodeInfo:
    """What a server last said of itself on $JSC.INFO."""

    __slots__ = ("peer", "name", "cluster", "tags", "js", "known", "meta", "seen", "natsjs",
                 "incarnation")

    def __init__(self, peer: str):
        self.peer = peer
        self.name = ""
        self.cluster = ""
        self.tags: list = []
        self.js: dict = {}
        self.known: list = []
        self.meta: dict = {}
        self.seen = 0.0
        self.natsjs = True
        self.incarnation = ""

    def online(self, now: float) -> bool:
        return now - self.seen < OFFLINE_AFTER


class MetaState(StateMachine):
    """The meta group's state machine: assignments in, local replicas reconciled."""

    def __init__(self, cluster: "JetStreamCluster"):
        self.cluster = cluster
        self.streams: dict[str, dict] = {}       # "acc stream" -> assignment
        self.consumers: dict[str, dict] = {}     # "acc stream consumer" -> assignment
        self.removed: set[str] = set()           # peers removed from the cluster
        self.applied_since_snapshot = 0

    def apply(self, entries: list) -> None:
        changed = False
        for index, term, data in entries:
            try:
                op = json.loads(data)
            except ValueError:
                continue
            if not isinstance(op, dict):
                continue
            changed = self._apply_op(op) or changed
            self.applied_since_snapshot += 1
        if changed:
            self.cluster.reconcile()
        if self.applied_since_snapshot >= META_SNAPSHOT_EVERY:
            # Every member compacts its own log (the leader's snapshot is what a
            # member far behind installs).
            self.applied_since_snapshot = 0
            self.cluster.js.spawn(self._compact)

    async def _compact(self) -> None:
        meta = self.cluster.meta
        if meta is None:
            return
        try:
            await meta.compact(meta.applied, self.snapshot_bytes())
        except Exception as exc:
            self.cluster.server.log.error("JetStream cluster: meta snapshot failed: %r", exc)

    def _apply_op(self, op: dict) -> bool:
        kind = op.get("op")
        if kind == "stream":
            key = "%s %s" % (op["acc"], op["cfg"]["name"])
            old = self.streams.get(key)
            sa = {"acc": op["acc"], "cfg": op["cfg"], "created": op.get("created") or
                  (old or {}).get("created") or now_ns(),
                  "group": op["group"], "reply": op.get("reply"), "subject": op.get("subject")}
            if op.get("restore"):
                sa["restore"] = True        # its first leader takes a backup's archive
            self.streams[key] = sa
            return True
        if kind == "stream_del":
            key = "%s %s" % (op["acc"], op["name"])
            self.streams.pop(key, None)
            for ck in [k for k in self.consumers if k.startswith(key + " ")]:
                del self.consumers[ck]
            return True
        if kind == "consumer":
            key = "%s %s %s" % (op["acc"], op["stream"], op["name"])
            old = self.consumers.get(key)
            self.consumers[key] = {"acc": op["acc"], "stream": op["stream"],
                                   "name": op["name"], "cfg": op["cfg"],
                                   "created": op.get("created") or
                                   (old or {}).get("created") or now_ns(),
                                   "group": op["group"], "reply": op.get("reply")}
            # a consumer restored from a backup: every replica starts from that state
            state = op.get("state") or (old or {}).get("state")
            if state:
                self.consumers[key]["state"] = state
            return True
        if kind == "consumer_del":
            self.consumers.pop("%s %s %s" % (op["acc"], op["stream"], op["name"]), None)
            return True
        if kind == "peer_remove":
            self.removed.add(op["peer"])
            if op["peer"] == self.cluster.me and \
                    op.get("incarnation") == self.cluster.incarnation:
                self.cluster.removed_here()      # this very process, not a replay
            return True
        if kind == "peer_add":
            # A removed server came back and asked to join: a new member.
            self.removed.discard(op["peer"])
            if op["peer"] == self.cluster.me:
                self.cluster.removed_live = False
            return True
        return False

    def snapshot_bytes(self) -> bytes:
        return json.dumps({"streams": self.streams, "consumers": self.consumers,
                           "removed": sorted(self.removed)},
                          separators=(",", ":")).encode()

    def forget(self) -> None:
        """No assignments known (a new member until the leader's state reaches it)."""
        self.streams = {}
        self.consumers = {}
        self.removed = set()
        self.applied_since_snapshot = 0

    def restore(self, storage: RaftStorage, index: int, term: int) -> None:
        try:
            d = json.loads(storage.snapshot_bytes() or b"{}")
        except ValueError:
            d = {}
        self.streams = d.get("streams", {})
        self.consumers = d.get("consumers", {})
        self.removed = set(d.get("removed", []))
        self.cluster.reconcile()

    def leader_changed(self, leader, term: int) -> None:
        self.cluster.meta_leader_changed(leader, term)


class HeldRequests:
    """Meta requests parked (Api.park) until the meta group can act on them: a leader is
    known, or a peer placement waits for was heard from (JetStreamCluster.hold)."""


class JetStreamCluster:
    """The clustered side of a JetStream server (created by the engine when the server
    has a cluster block)."""

    def __init__(self, js):
        self.js = js
        self.server = js.server
        self.name = self.server.cluster.name
        self.me = peer_id(self.server.name)
        self.transport = Transport(self)
        self.nodes: dict[str, NodeInfo] = {}
        self._warned_foreign: set = set()
        self.meta: RaftService | None = None
        self.state = MetaState(self)
        self.replicas: dict[str, object] = {}      # group name -> replica (stream/consumer)
        self._nursery: trio.Nursery | None = None
        self._meta_scope = trio.CancelScope()
        self.removed_live = False       # removed from the cluster while running
        self.incarnation = "%016x" % random.getrandbits(64)   # this process (INFO)
        self._readding: set = set()
        self._finishing = False
        self._finish_again = False
        self._bootstrapped = trio.Event()
        self._leader_event = trio.Event()
        self.meta_dir = os.path.join(js.store_dir, self.server.system_account.name, "_js_",
                                     META)
        self.tags = list(getattr(self.server.opts, "server_tags", ()) or ())
        self.started = trio.current_time()
        self.held = HeldRequests()
        self._held_replies: dict[bytes, float] = {}   # reply subject -> held until
        self._answered: dict[bytes, float] = {}       # meta leader: reply -> remembered until

    # ---- running ----------------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.transport.install()
            sys_acc = self.server.system_account
            self.js.subscribe(sys_acc, b"$JSC.INFO", self._on_info)
            self.js.subscribe(sys_acc, b"$JSC.JOIN.%s" % self.me.encode(), self._on_join)
            self.js.subscribe(sys_acc, b"$JSC.SINFO.*", self._on_stream_info_request)
            self.js.subscribe(sys_acc, b"$JSC.GV.*", self._on_group_voters)
            self.js.subscribe(sys_acc, b"$JSC.CINFO.*", self._on_consumer_info_request)
            # The system account's JetStream requests (a $SYS user administers the meta
            # group): leader step-down and server removal.
            self.js.subscribe(sys_acc, b"$JS.API.META.LEADER.STEPDOWN", self._on_meta_stepdown)
            self.js.subscribe(sys_acc, b"$JS.API.SERVER.REMOVE", self._on_server_remove)
            # A stream leader's report on the backup it restored (snapshot.ClusterRestore).
            self.js.subscribe(sys_acc, b"$JSC.RESTORED", self._on_restored)
            nursery.start_soon(self._info_loop)
            nursery.start_soon(self._meta_loop)
            nursery.start_soon(self._membership_watch)
            task_status.started()

    def stop(self) -> None:
        for rep in list(self.replicas.values()):
            try:
                rep.stop()
            except Exception as exc:   # pragma: no cover - shutting down anyway
                self.server.log.error("JetStream cluster: stopping %s: %r", rep, exc)
        self.replicas.clear()

    # ---- who is out there ---------------------------------------------------------------

    def _info(self) -> dict:
        js = self.js
        mem, store = js.memory_used(), js.store_used()
        meta = {}
        if self.meta is not None:
            meta = {"leader": self.meta.leader, "term": self.meta.term,
                    "peers": sorted(self._meta_voters())}
        return {"peer": self.me, "name": self.server.name, "cluster": self.name,
                "tags": self.tags, "natsjs": True, "incarnation": self.incarnation,
                "js": {"max_memory": js.max_memory, "max_store": js.max_store,
                       "memory": mem, "store": store},
                "known": sorted(self.js_peers()),
                "meta": meta}

    async def _info_loop(self) -> None:
        while True:
            self._publish_info()
            self._not_meta_peers()        # reports a nats-server JetStream peer once
            await trio.sleep(INFO_INTERVAL)

    def _publish_info(self) -> None:
        self.server.deliver(self.server.system_account, b"$JSC.INFO", None,
                            json.dumps(self._info(), separators=(",", ":")).encode())

    def _on_info(self, sub, subject, reply, hdr, msg) -> None:
        try:
            d = json.loads(msg)
            peer = d["peer"]
        except (ValueError, KeyError, TypeError):
            return
        first = peer not in self.nodes
        n = self.nodes.get(peer) or NodeInfo(peer)
        n.name = d.get("name", "")
        n.cluster = d.get("cluster", "")
        n.tags = d.get("tags") or []
        n.js = d.get("js") or {}
        n.known = d.get("known") or []
        n.meta = d.get("meta") or {}
        n.incarnation = d.get("incarnation") or ""
        n.seen = trio.current_time()
        self.nodes[peer] = n
        if first and peer != self.me:
            # Answer at once so a new server learns about us without waiting a second.
            self._publish_info()
            # A create held for want of peers may be placeable now.
            self.js.api.unpark(self.held)

    def js_peers(self) -> set[str]:
        """Peers of the JetStream cluster this server knows (itself included)."""
        now = trio.current_time()
        out = {self.me}
        for p, n in self.nodes.items():
            if n.cluster == self.name and n.online(now) and p not in self.state.removed:
                out.add(p)
        return out

    def node_name(self, peer: str) -> str:
        if peer == self.me:
            return self.server.name
        n = self.nodes.get(peer)
        return n.name if n is not None else peer

    def peer_of_name(self, name: str) -> str | None:
        if name == self.server.name:
            return self.me
        for p, n in self.nodes.items():
            if n.name == name:
                return p
        return None

    def online(self, peer: str) -> bool:
        if peer == self.me:
            return True
        n = self.nodes.get(peer)
        return n is not None and n.online(trio.current_time())

    # ---- the meta group -----------------------------------------------------------------

    def _expected_size(self) -> int:
        """How many servers to wait for before forming the meta group the first time:
        the configured routes name the rest of the cluster (as the documentation's
        configurations do; a route to ourselves does not count)."""
        cl = self.server.cluster
        own_host = (cl.copts.host or "0.0.0.0")
        local = {own_host, "127.0.0.1", "localhost", "0.0.0.0", "::1", "::"}
        others = set()
        for r in cl.copts.routes:
            u = urlsplit(r if "://" in r else "nats-route://" + r)
            if u.port == (cl.port or cl.copts.port) and (u.hostname or "") in local:
                continue
            others.add((u.hostname, u.port))
        # Connected servers that will never be meta peers: plain ones (their route INFO
        # has no "jetstream") and nats-server JetStream servers (not supported).
        return max(len(others) + 1 - len(self._not_meta_peers()), 1)

    def _not_meta_peers(self) -> list:
        out = []
        for remote in list(self.server.cluster.remotes.values()):
            if not remote.routes():
                continue
            info = remote.info or {}
            if not info.get("jetstream"):
                out.append(remote)
            elif not remote.natsjs:
                out.append(remote)
                if remote.name not in self._warned_foreign:
                    self._warned_foreign.add(remote.name)
                    self.server.log.error(
                        "JetStream cluster: server %s is a nats-server with JetStream "
                        "enabled; it cannot be a peer of a natsjs JetStream cluster. It "
                        "keeps its own JetStream data and natsjs keeps its own, but clients "
                        "may get answers from both: run it without JetStream or in its "
                        "own cluster", remote.name or remote.server_id)
        return out

    async def _meta_loop(self) -> None:
        files = DirFiles(self.meta_dir)
        try:
            state = files.read_json("state.json")
        except (OSError, ValueError):
            state = None     # damaged: RaftStorage.recover says so and the node repairs
        peers = None
        if not state or not state.get("peers"):
            peers = await self._bootstrap()
        while True:
            self._meta_scope = trio.CancelScope()
            with self._meta_scope:
                await self._start_meta(files, peers)
            # The meta group no longer counts this server (it was removed while down):
            # start over as a new member with no meta state and ask to be added.
            meta, self.meta = self.meta, None
            self.transport.detach(META)
            meta.stop()
            try:
                meta.storage.close()
            except Exception:
                pass
            shutil.rmtree(self.meta_dir, ignore_errors=True)
            files = DirFiles(self.meta_dir)
            self.state.forget()
            peers = []

    def removed_here(self) -> None:
        """This server's removal from the cluster was applied while it runs (the
        operator said it will not return): it stays out until restarted."""
        if not self.removed_live:
            self.removed_live = True
            self.server.log.error("JetStream cluster: this server was removed from the "
                                  "cluster; restart it to join again as a new member")

    async def _membership_watch(self) -> None:
        """A server that was removed from the meta group while it was down comes back
        believing it is a member, and no leader talks to it.  When it hears no leader
        but the others name one, it asks that leader; left out of the committed voters,
        it drops its meta state and joins as a new member (its old stream replicas
        leave their groups once the assignments reach it)."""
        quiet_since = None
        while True:
            await trio.sleep(INFO_INTERVAL)
            meta = self.meta
            if meta is None or self.removed_live or meta.leader is not None or \
                    self.me not in meta.node.voters:
                quiet_since = None
                continue
            now = trio.current_time()
            quiet_since = quiet_since or now
            if now - quiet_since < OFFLINE_AFTER:
                continue
            if not any(n.meta.get("leader") not in (None, self.me) and n.online(now)
                       for n in self.nodes.values()):
                continue
            voters = await self.group_voters(META)
            if voters is None or self.me in voters or self.meta is not meta or \
                    meta.leader is not None:
                continue
            self.server.log.warn("JetStream cluster: the meta group no longer counts this "
                                 "server (removed while it was away): joining it again as "
                                 "a new member")
            quiet_since = None
            self._meta_scope.cancel()

    async def _bootstrap(self) -> list[str]:
        """Form the meta group the first time: wait until the JetStream servers this one
        knows all know the same set (and it is as large as the configured routes say),
        so every one of them starts the group with the same members.  A server that
        finds a meta group already running asks its leader to be added instead."""
        want = self._expected_size()
        stable_since = None
        last = None
        while True:
            now = trio.current_time()
            for n in self.nodes.values():
                if n.meta.get("leader") and n.online(now) and n.peer != self.me:
                    # A group exists: join it (an empty start; the leader adds us).
                    self.server.log.info("JetStream cluster: joining the existing meta "
                                         "group (leader %s)", self.node_name(n.meta["leader"]))
                    return []
            known = self.js_peers()
            agree = all(set(self.nodes[p].known) == known for p in known if p != self.me
                        and p in self.nodes)
            if known != last:
                last = known
                stable_since = now
            if now - getattr(self, "_last_dbg", 0) > 2:
                self._last_dbg = now
                self.server.log.debug("JetStream cluster: waiting to form the meta group: "
                                      "know %s, want %d, agree %s", sorted(known), want, agree)
            want = self._expected_size()
            if agree and (len(known) >= want and now - stable_since >= BOOTSTRAP_STABLE or
                          len(known) >= want // 2 + 1 and
                          now - stable_since >= BOOTSTRAP_QUORUM_WAIT):
                # Every expected server, or (after a longer wait) a quorum of them: the
                # rest join the group when they come.
                self.server.log.info("JetStream cluster: forming the meta group with %s",
                                     ", ".join(sorted(self.node_name(p) for p in known)))
                return sorted(known)
            await trio.sleep(0.1)

    async def _start_meta(self, files: DirFiles, peers) -> None:
        log = FileLog(os.path.join(self.meta_dir, "log"))
        storage = RaftStorage(log, files)
        transport, inbox = self.transport.attach(META)
        self.meta = RaftService(self.me, storage, transport, self.state,
                                peers=peers or (), config=RaftConfig(), fsync=self.js.fsync,
                                fsync_submit=self.js.fsync_submit)
        self.report_damage("the meta group", storage)
        if peers == []:
            self._nursery.start_soon(self._ask_to_join)
        self._bootstrapped.set()
        await self.meta.run(inbox)

    async def _ask_to_join(self) -> None:
        """Until we are a member: ask the meta leader (from the INFO it sends) to add us."""
        while self.meta is not None and self.me not in self._meta_voters():
            leader = None
            for n in self.nodes.values():
                if n.meta.get("leader"):
                    leader = n.meta["leader"]
            if leader and leader != self.me:
                self.server.deliver(self.server.system_account,
                                    b"$JSC.JOIN.%s" % leader.encode(), None,
                                    json.dumps({"peer": self.me}).encode())
            await trio.sleep(1.0)

    def _meta_voters(self) -> set:
        if self.meta is None:
            return set()
        return set(self.meta.node.voters)

    def _on_join(self, sub, subject, reply, hdr, msg) -> None:
        if self.meta is None or not self.meta.is_leader():
            return
        try:
            peer = json.loads(msg)["peer"]
        except (ValueError, KeyError, TypeError):
            return
        if peer in self._meta_voters():
            return
        if peer in self.state.removed:
            # A removed server restarted and asks in: it comes back as a new member.
            if peer not in self._readding:
                self._readding.add(peer)
                self._nursery.start_soon(self._readd, peer)
            return
        try:
            self.meta.add_peer(peer)
            self.server.log.info("JetStream cluster: adding %s to the meta group",
                                 self.node_name(peer))
        except Exception as exc:
            self.server.log.debug("JetStream cluster: add %s later: %r", peer, exc)

    def report_damage(self, what: str, storage: RaftStorage) -> None:
        """Log what a group's Raft storage found damaged on start (never used; the
        node repairs from the leader before it votes: natsjs/jetstream/raft.py)."""
        if storage.damage:
            self.server.log.error("JetStream cluster: %s: damaged Raft storage: %s%s", what,
                                  "; ".join(storage.damage),
                                  "; repairing from the leader before voting"
                                  if storage.repair else "")

    async def _readd(self, peer: str) -> None:
        try:
            await self.propose_meta({"op": "peer_add", "peer": peer})
            self.server.log.info("JetStream cluster: %s, removed earlier, is back",
                                 self.node_name(peer))
        except (trio.TooSlowError, NotLeaderError, trio.ClosedResourceError):
            pass
        finally:
            self._readding.discard(peer)

    def meta_leader_changed(self, leader, term: int) -> None:
        if leader is not None:
            self.server.log.info("JetStream cluster new metadata leader: %s/%s",
                                 self.node_name(leader), self.name)
            ev, self._leader_event = self._leader_event, trio.Event()
            ev.set()
            self.js.api.unpark(self.held)
        if leader == self.me:
            self._nursery.start_soon(self._after_election)

    async def _after_election(self) -> None:
        """A new meta leader finishes what removals its predecessor left half done."""
        with trio.move_on_after(30):
            await self.meta.wait_applied(self.meta.node.last_index)
        if self.meta is not None and self.meta.is_leader() and self.state.removed:
            await self._finish_removals()

    # ---- system account requests ----------------------------------------------------------

    def _sys_reply(self, reply: bytes, rtype: str, err: ApiError | None = None) -> None:
        body = {"type": T + rtype}
        if err is not None:
            body["error"] = err.to_dict()
        else:
            body["success"] = True
        self.server.deliver(self.server.system_account, reply, None,
                            json.dumps(body, separators=(",", ":")).encode())

    def _from_system_account(self, what: str, hdr, msg: bytes) -> bool:
        """Whether a request to administer the meta group was made in the system
        account: another account's arrives here too, through its JetStream import, and
        names that account in its ``Nats-Request-Info`` (nats-server ignores it with
        this warning)."""
        info = request_info(msg[:hdr] if hdr and hdr > 0 else None)
        name = service_account(info) if info is not None else ""
        if not name or name == self.server.system_account.name:
            return True
        self.server.log.warn("JetStream API %s request from non-system account: %r user: %r",
                             what, name, info.get("user", ""))
        return False

    def _on_meta_stepdown(self, sub, subject, reply, hdr, msg) -> None:
        """$JS.API.META.LEADER.STEPDOWN: the meta leader hands over (optionally to the
        server named in ``placement.preferred``).  Only the leader answers, as in
        nats-server: a follower that has not yet heard of a newly elected leader used
        to answer "temporarily unavailable", and its answer could come first."""
        rtype = "meta_leader_stepdown_response"
        if not reply or self.meta is None or not self.meta.is_leader() or \
                not self._from_system_account("stepdown", hdr, msg):
            return
        body = msg[hdr:] if hdr and hdr > 0 else msg
        try:
            to = self.step_down_target(self.meta, body)
        except ApiError as exc:
            return self._sys_reply(reply, rtype, exc)
        try:
            self.meta.transfer_leadership(to)
        except Exception as exc:
            return self._sys_reply(reply, rtype, ApiError.of("JSRaftGeneralErrF", err=str(exc)))
        self._sys_reply(reply, rtype)

    def step_down_target(self, raft, body: bytes) -> str | None:
        """Who a leader of ``raft`` hands over to, as a step-down request's ``body``
        says (server/jetstream_api.go: isJSONObjectOrArray, then
        getStepDownPreferredPlacement): the server ``placement.preferred`` names, or
        an online peer of the placement's cluster and tags; None (no body) for the most
        caught-up voter.  ApiError: bad JSON, or no such peer."""
        if body.lstrip()[:1] not in (b"{", b"["):
            return None
        placement = decode(body, STEPDOWN_REQUEST).get("placement")
        if placement is None:
            return None
        peers = raft.node.voters
        preferred = placement.get("preferred")
        if preferred:
            peer = self.peer_of_name(preferred)
            if peer == raft.id:
                raise ApiError.of("JSClusterNoPeersErrF", err="preferred server %s is "
                                  "already leader" % json.dumps(preferred))
            if peer is None or peer not in peers:
                raise ApiError.of("JSClusterNoPeersErrF", err="preferred server %s not "
                                  "known" % json.dumps(preferred))
            return peer
        tags = placement.get("tags") or []
        possible = [p for p in peers if p != raft.id and p in self.nodes and self.online(p)
                    and placement.get("cluster", "") in ("", self.nodes[p].cluster)
                    and all(t in self.nodes[p].tags for t in tags)]
        if not possible:
            raise ApiError.of("JSClusterNoPeersErrF", err="no replacement peer connected")
        return random.choice(possible)

    def _on_server_remove(self, sub, subject, reply, hdr, msg) -> None:
        """$JS.API.SERVER.REMOVE: a server that will never return leaves the meta group;
        what it held is placed elsewhere and caught up."""
        if not reply or self.meta is None or not self.meta.is_leader() or \
                not self._from_system_account("server remove", hdr, msg):
            return
        body = msg[hdr:] if hdr and hdr > 0 else msg
        try:
            req = decode_required(body, SERVER_REMOVE_REQUEST)
        except ApiError as exc:
            return self._sys_reply(reply, "meta_server_remove_response", exc)
        peer = req.get("peer_id") or self.peer_of_name(req.get("peer", ""))
        self._nursery.start_soon(self._server_remove, peer, reply)

    async def _server_remove(self, peer, reply: bytes) -> None:
        rtype = "meta_server_remove_response"
        if peer is None or peer not in self._meta_voters():
            return self._sys_reply(reply, rtype, ApiError.of("JSClusterServerNotMemberErr"))
        n = self.nodes.get(peer)
        try:
            await self.propose_meta({"op": "peer_remove", "peer": peer,
                                     "incarnation": n.incarnation if n is not None else ""})
        except (trio.TooSlowError, NotLeaderError):
            return self._sys_reply(reply, rtype, ApiError.of("JSClusterNotAvailErr"))
        self._sys_reply(reply, rtype)
        await self._finish_removals()

    async def _finish_removals(self) -> None:
        """On the meta leader: every removed server leaves the meta group's voters (one
        configuration change at a time) and every stream or consumer it held is placed
        elsewhere.  Run after a removal and by each new leader (the last one may have
        died half way)."""
        if self._finishing:
            self._finish_again = True
            return
        self._finishing = True
        try:
            while True:
                self._finish_again = False
                meta = self.meta
                for peer in sorted(self.state.removed):
                    with trio.move_on_after(10):
                        while meta is self.meta and meta.is_leader() and \
                                peer in meta.node.voters and peer in self.state.removed:
                            try:
                                if not meta.node.changing_membership():
                                    meta.remove_peer(peer)
                            except (ConfigChangeInProgress, NotLeaderError, ValueError):
                                pass
                            await trio.sleep(0.05)
                    if not (meta is self.meta and meta.is_leader()):
                        return
                    if peer in self.state.removed:
                        await self.replace_peer(peer)
                if not self._finish_again:
                    return
        except (trio.TooSlowError, NotLeaderError, trio.ClosedResourceError) as exc:
            self.server.log.warn("JetStream cluster: finishing server removals: %r", exc)
        finally:
            self._finishing = False

    def _on_restored(self, sub, subject, reply, hdr, msg) -> None:
        """``$JSC.RESTORED``: the leader of a stream assigned with a backup to restore
        says how it went: the archive's consumers to assign, or that it failed (the
        stream goes).  The meta leader answers once that is applied; the stream's
        leader asks again until it gets an answer."""
        if not reply or not self.is_meta_leader():
            return
        try:
            req = json.loads(msg)
            key = "%s %s" % (req["acc"], req["stream"])
        except (ValueError, KeyError, TypeError):
            return
        self._nursery.start_soon(self._restored, key, req, reply)

    async def _restored(self, key: str, req: dict, reply: bytes) -> None:
        sa = self.state.streams.get(key)
        try:
            # Only about the assignment it restored (not a stream made since).
            if sa is not None and sa["group"]["name"] == req.get("group"):
                if req.get("failed"):
                    await self.propose_meta({"op": "stream_del", "acc": sa["acc"],
                                             "name": sa["cfg"]["name"]})
                else:
                    await self._assign_restored_consumers(sa, req.get("leader"),
                                                          req.get("consumers") or [])
        except (trio.TooSlowError, NotLeaderError):
            return
        self.server.deliver(self.server.system_account, reply, None, b'{"ok":true}')

    async def _assign_restored_consumers(self, sa: dict, leader, consumers: list) -> None:
        """The consumers a restored stream's archive held, with their state, on the
        stream's peers (its leader first)."""
        stream = sa["cfg"]["name"]
        for c in consumers:
            if ("%s %s %s" % (sa["acc"], stream, c["name"])) in self.state.consumers:
                continue
            cfg = CC.blank_config()
            cfg.update(c["config"])
            peers = consumer_peers(cfg, sa["group"]["peers"], [leader] if leader else [])
            group = {"name": group_name("C", len(peers), sa["cfg"]["storage"]),
                     "peers": peers}
            await self.propose_meta({"op": "consumer", "acc": sa["acc"], "stream": stream,
                                     "name": c["name"], "cfg": cfg, "group": group,
                                     "created": c.get("created") or now_ns(),
                                     "state": c["state"]})

    async def replace_peer(self, peer: str) -> None:
        """Every stream (and its consumers) that had ``peer`` gets another one, placed by
        the usual rules; Raft catches the new replica up."""
        for sa in list(self.state.streams.values()):
            peers = sa["group"]["peers"]
            if peer not in peers:
                continue
            keep = [p for p in peers if p != peer]
            try:
                new = self.place(sa["cfg"], existing=keep, ignore=[peer])
            except ApiError as err:
                self.server.log.warn("JetStream cluster: no replacement for %s in stream "
                                     "'%s > %s': %s", self.node_name(peer), sa["acc"],
                                     sa["cfg"]["name"], err.description)
                new = keep
            await self.propose_meta({"op": "stream", "acc": sa["acc"], "cfg": sa["cfg"],
                                     "group": dict(sa["group"], peers=new),
                                     "created": sa["created"]})
            for ca in list(self.state.consumers.values()):
                if ca["acc"] == sa["acc"] and ca["stream"] == sa["cfg"]["name"] and \
                        peer in ca["group"]["peers"]:
                    cpeers = [p for p in ca["group"]["peers"] if p != peer]
                    cpeers += [p for p in new if p not in cpeers][:1]
                    await self.propose_meta({"op": "consumer", "acc": ca["acc"],
                                             "stream": ca["stream"], "name": ca["name"],
                                             "cfg": ca["cfg"],
                                             "group": dict(ca["group"], peers=cpeers),
                                             "created": ca["created"]})

    @property
    def meta_leader(self):
        return self.meta.leader if self.meta is not None else None

    def is_meta_leader(self) -> bool:
        return self.meta is not None and self.meta.is_leader()

    def leaderless(self) -> bool:
        return self.meta is None or self.meta.leader is None

    def hold(self, api, reply: bytes | None) -> bool:
        """Hold the meta request ``api`` is dispatching until the meta group may act on
        it (a leader is elected, a peer is heard from): it is dispatched again then.
        False once it has been held META_HOLD seconds: answer it now.

        Servers say they are ready before their meta group has formed or elected (a
        cluster's servers start one by one; each must listen before the next can
        route to it), so a request made right after start would otherwise be told
        "temporarily unavailable", which nats-server, whose group forms within
        milliseconds, never says there."""
        until = api.received + META_HOLD
        if not reply or trio.current_time() >= until or self.server.shutting_down:
            return False
        held = self._held_replies
        if len(held) > 1024:
            now = trio.current_time()
            for r in [r for r, t in held.items() if t < now]:
                del held[r]
        held[reply] = until
        # Not answered yet after all: when it comes back it is answered (first_answer
        # took it for answered as it was let through, before this hold).
        self._answered.pop(reply, None)
        # Never forgotten while parked: dispatched again at the latest at ``until``,
        # when it is answered whatever the meta group's state.
        api.park(self.held, until=math.inf)
        self._nursery.start_soon(self._release_held, api, until)
        return True

    def pass_on_held(self, account, subject: str, reply: bytes | None, hdr, body: bytes) -> None:
        """A request held here while there was no meta leader, and another server leads
        now: publish it again. Routes that were still forming when it was first
        published may have kept it from the new leader; the leader answers each reply
        subject once (``first_answer``), so the copies other holders pass on are not
        answered twice."""
        if reply is None or self._held_replies.pop(reply, None) is None:
            return
        if hdr:
            hdr = hdr[:-2] + PASSED_ON + b"\r\n"
        else:
            hdr = b"NATS/1.0\r\n" + PASSED_ON + b"\r\n"
        self.server.deliver(account, subject.encode(), reply, hdr + body, hdr=len(hdr))

    def first_answer(self, reply: bytes | None, hdr: bytes | None) -> bool:
        """On the meta leader: False for a request passed on (``pass_on_held``) whose
        reply subject it has answered already, as it held it too or another server
        passed it on first."""
        if reply is None:
            return True
        passed_on = hdr is not None and PASSED_ON in hdr
        if not passed_on and self._held_replies.pop(reply, None) is None:
            return True         # an ordinary request: reply subjects may be reused
        now = trio.current_time()
        seen = self._answered
        if len(seen) > 1024:
            for r in [r for r, t in seen.items() if t < now]:
                del seen[r]
        if seen.get(reply, 0) >= now:
            return False
        seen[reply] = now + 3 * META_HOLD
        return True

    async def _release_held(self, api, when: float) -> None:
        await trio.sleep_until(when)
        api.unpark(self.held)

    def peers_unheard(self) -> bool:
        """Soon after start, some member of the meta group has not been heard from yet:
        placement may find more peers within a second or two."""
        if trio.current_time() - self.started > 2 * OFFLINE_AFTER:
            return False
        return any(p not in self.nodes for p in self._meta_voters() if p != self.me)

    async def propose_meta(self, op: dict) -> None:
        """Propose an assignment and wait until this server has applied it."""
        index = self.meta.propose(json.dumps(op, separators=(",", ":")).encode())
        with trio.fail_after(10):
            await self.meta.wait_applied(index)

    # ---- making local state match the assignments ---------------------------------------

    def reconcile(self) -> None:
        """Start the replicas this server is assigned, stop those it no longer is."""
        want = {}
        for key, sa in self.state.streams.items():
            if self.me in sa["group"]["peers"]:
                want[sa["group"]["name"]] = ("stream", sa)
        for key, ca in self.state.consumers.items():
            if self.me in ca["group"]["peers"]:
                want[ca["group"]["name"]] = ("consumer", ca)
        groups = {a["group"]["name"] for a in self.state.streams.values()} | \
            {a["group"]["name"] for a in self.state.consumers.values()}
        for g in [g for g in self.replicas if g not in want]:
            rep = self.replicas[g]
            if g in groups:
                rep.leave()           # the group goes on without us: leave it in order
            else:
                self.drop_replica(rep)
        for g, (kind, a) in want.items():
            rep = self.replicas.get(g)
            if rep is not None and rep.leaving:
                rep.leaving = False         # back in the group before it left: stay
            if rep is None:
                if kind == "stream":
                    rep = ReplicatedStream.create(self, a)
                else:
                    srep = self.stream_replica(a["acc"], a["stream"])
                    if srep is None:
                        continue    # the stream's replica comes first
                    rep = ReplicatedConsumer.create(self, srep, a)
                if rep is None:
                    continue
                self.replicas[g] = rep
            else:
                rep.assignment_changed(a)

    def drop_replica(self, rep) -> None:
        """Stop a replica this server no longer holds and delete its files."""
        if self.replicas.get(rep.group) is rep:
            del self.replicas[rep.group]
        rep.stop(delete=True)

    def stream_replica(self, acc: str, name: str):
        for rep in self.replicas.values():
            if getattr(rep, "kind", "") == "stream" and rep.acc_name == acc and \
                    rep.name == name:
                return rep
        return None

    def consumer_replica(self, acc: str, stream: str, name: str):
        for rep in self.replicas.values():
            if getattr(rep, "kind", "") == "consumer" and rep.ca["acc"] == acc and \
                    rep.ca["stream"] == stream and rep.name == name:
                return rep
        return None

    def _on_consumer_info_request(self, sub, subject, reply, hdr, msg) -> None:
        """$JSC.CINFO.*: a consumer's leader answers with its info (for the meta leader)."""
        self._answer_info(reply, msg, lambda req: self.consumer_replica(
            req["acc"], req["stream"], req["name"]), lambda crep: crep.consumer.info())

    # ---- placement ------------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        now = trio.current_time()
        out = []
        js = self.js
        members = self._meta_voters() or {self.me}
        counts: dict[str, list] = {}
        for sa in self.state.streams.values():
            for p in sa["group"]["peers"]:
                c = counts.setdefault(p, [0, 0])
                c[0] += 1
                if len(sa["group"]["peers"]) > 1:
                    c[1] += 1
        for p in members:
            if p in self.state.removed:
                continue
            if p == self.me:
                info = {"max_memory": js.max_memory, "max_store": js.max_store,
                        "memory": js.memory_used(), "store": js.store_used()}
                online, tags, name = True, self.tags, self.server.name
            else:
                n = self.nodes.get(p)
                if n is None:
                    continue
                info, online, tags, name = n.js, n.online(now), n.tags, n.name
            c = counts.get(p, [0, 0])
            out.append(Candidate(id=p, name=name, cluster=self.name, tags=frozenset(tags),
                                 online=online, max_memory=info.get("max_memory", 0),
                                 max_store=info.get("max_store", 0),
                                 memory=info.get("memory", 0), store=info.get("store", 0),
                                 streams=c[0], ha_assets=c[1]))
        return out

    def place(self, cfg: dict, existing=(), ignore=()) -> list[str]:
        r = cfg.get("num_replicas") or 1
        placement = cfg.get("placement") or {}
        cluster = placement.get("cluster") or self.name
        try:
            return select_peers(r, cluster, cfg, self.candidates(), existing=list(existing),
                                ignore=list(ignore), unique_tag=self.js.opts.unique_tag,
                                max_ha_assets=self.js.opts.limits.max_ha_assets)
        except PlacementError as err:
            raise ApiError.of("JSClusterNoPeersErrF", err=str(err)) from None

    # ---- info for monitoring and stream info ------------------------------------------------

    def cluster_info(self, rep) -> dict:
        """The ``cluster`` block of stream and consumer info, and of /jsz's stream detail,
        as this server sees the group (server/jetstream_cluster.go clusterInfo): its
        Raft group, leader (and since when, on the leader), and every other member by
        name.  An R1 asset has no Raft group in nats-server: its server leads it."""
        svc = rep.raft if rep is not None else None
        if svc is None or len(rep.peers) < 2:
            return {"name": self.name, "leader": self.server.name}
        out = {"name": self.name, "raft_group": rep.group}
        leader = svc.leader
        if leader is not None:
            out["leader"] = self.node_name(leader)
            if leader == self.me and svc.leader_since_ns is not None:
                out["leader_since"] = rfc3339_nano(svc.leader_since_ns)
        out["system_account"] = True            # Raft traffic rides the system account
        out["traffic_account"] = self.server.system_account.name
        info = {p["name"]: p for p in svc.peer_info()}
        me = self.me if leader is not None else None    # leaderless: everyone is listed
        replicas = []
        for p in rep.peers:
            if p == me:
                continue
            pi = info.get(p, {})
            entry = {"name": self.node_name(p),
                     "current": p == self.me or bool(pi.get("current", False))}
            if not self.online(p) or pi.get("offline"):
                entry["offline"] = True
            active = pi.get("active")
            entry["active"] = 0 if active is None else _active_ns(active)
            if pi.get("lag"):
                entry["lag"] = pi["lag"]
            entry["peer"] = p
            replicas.append(entry)
        if replicas:
            out["replicas"] = sorted(replicas, key=lambda e: e["name"])
        return out

    def meta_cluster_info(self) -> dict:
        """/jsz's ``meta_cluster`` (server/monitor.go MetaClusterInfo)."""
        out = {"name": self.name}
        if self.meta is None:
            out["cluster_size"] = 0
            return out
        leader = self.meta.leader
        if leader is not None:
            out["leader"] = self.node_name(leader)
        out["peer"] = self.me
        info = {p["name"]: p for p in self.meta.peer_info()} if self.meta.is_leader() else {}
        replicas = []
        for p in sorted(self._meta_voters()):
            if p == leader:
                continue
            pi = info.get(p, {})
            entry = {"name": self.node_name(p), "current": bool(pi.get("current")),
                     "peer": p}
            if not self.online(p):
                entry["offline"] = True
            if pi.get("active") is not None:
                entry["active"] = _active_ns(pi["active"])
            if pi.get("lag"):
                entry["lag"] = pi["lag"]
            replicas.append(entry)
        if replicas:
            out["replicas"] = replicas
        out["cluster_size"] = len(self._meta_voters())
        out["pending"] = 0
        return out

    # ---- stream info across the cluster (for listings by the meta leader) -----------------

    def _on_stream_info_request(self, sub, subject, reply, hdr, msg) -> None:
        """$JSC.SINFO.*: a stream's leader answers with its info (for the meta leader)."""
        self._answer_info(reply, msg, lambda req: self.stream_replica(req["acc"], req["name"]),
                          lambda rep: rep.stream.info())

    def _answer_info(self, reply, msg: bytes, find, info) -> None:
        """The replica ``find(request)`` answers with ``info(replica)`` when it leads."""
        if not reply:
            return
        try:
            rep = find(json.loads(msg))
        except (ValueError, KeyError, TypeError):
            return
        if rep is None or not rep.is_leader():
            return
        self.server.deliver(self.server.system_account, reply, None,
                            json.dumps(info(rep), separators=(",", ":")).encode())

    def _on_group_voters(self, sub, subject, reply, hdr, msg) -> None:
        """$JSC.GV.<group>: the group's leader answers with the voters of its latest
        committed configuration (a member taken out of the group asks before it goes)."""
        group = subject[subject.rfind(b".") + 1:].decode()
        if group == META:
            svc = self.meta
        else:
            rep = self.replicas.get(group)
            svc = rep.raft if rep is not None and not rep.closed else None
        if not reply or svc is None or not svc.is_leader():
            return
        self.server.deliver(self.server.system_account, reply, None, json.dumps(
            {"voters": list(svc.node.committed_voters())}).encode())

    async def group_voters(self, group: str, timeout: float = 1.0):
        """The committed voters of ``group`` as its leader knows them (None without an
        answer)."""
        d = await self.request(b"$JSC.GV.%s" % group.encode(), {}, timeout)
        return d.get("voters") if isinstance(d, dict) else None

    async def remote_stream_info(self, acc: str, name: str, timeout: float = 2.0):
        """Stream info from the stream's leader, wherever it is (None if it does not
        answer in time)."""
        rep = self.stream_replica(acc, name)
        if rep is not None and rep.is_leader():
            return rep.stream.info()
        return await self.request(b"$JSC.SINFO.%s" % self.me.encode(),
                                  {"acc": acc, "name": name}, timeout)

    async def request(self, subject: bytes, payload: dict, timeout: float):
        """A request in the system account from server code; the decoded JSON reply."""
        raw = await self.request_raw(subject, payload, timeout)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    async def request_raw(self, subject: bytes, payload: dict, timeout: float):
        """A request in the system account from server code; the reply's bytes."""
        sys_acc = self.server.system_account
        inbox = b"_INBOX.JSC.%s.%d" % (self.me.encode(), random.getrandbits(48))
        got = []
        ev = trio.Event()

        def on_reply(sub, subj, reply, hdr, msg):
            if not got:
                got.append(msg)
                ev.set()
        sub = self.js.subscribe(sys_acc, inbox, on_reply)
        try:
            self.server.deliver(sys_acc, subject, inbox,
                                json.dumps(payload, separators=(",", ":")).encode())
            with trio.move_on_after(timeout):
                await ev.wait()
        finally:
            self.js.unsubscribe(sys_acc, sub)
        return got[0] if got else None


__all__ = ["JetStreamCluster", "peer_id", "group_name", "rfc3339_nano"]


def _active_ns(seconds: float) -> int:
    """A peer's ``active`` in nanoseconds.  The Raft clock moves in ticks, so a peer
    heard within the current tick is 0 s ago; nats-server (time.Since) never says 0 for
    a peer it heard, and clients (natscli, natsjs) print 0 as 'not seen'."""
    return max(int(seconds * 1e9), 1)
