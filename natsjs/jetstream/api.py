"""The JetStream API: ``$JS.API.>`` requests in, JSON replies out.

Requests arrive through an internal subscription on ``$JS.API.>`` in each account
with JetStream (inside the requester's fan-out, so nothing waits there): they are
queued, and one worker task answers them in order, which may wait for disk (creating
a stream writes and fsyncs its metadata).  Replies are shaped like nats-server's
(server/jetstream_api.go): ``type``, the response body, and on failure ``error``
with ``code``, ``err_code`` and ``description``.

Pull requests (``CONSUMER.MSG.NEXT``) and direct gets (``DIRECT.GET``) are not API
calls here: the consumer and the stream subscribe to those subjects themselves, as in
nats-server.
"""
from __future__ import annotations

import collections
import json
import os

import trio

from natsjs._core.fanout import UNDELIVERED, WithProducer
from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import headers as H
from natsjs.jetstream import snapshot, sourcing
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.consumer import Consumer, ephemeral_name
from natsjs.jetstream.errors import ApiError, error_text
from natsjs.jetstream.gojson import go_json
from natsjs.jetstream.jstime import ZERO_TIME, now_ns, rfc3339_nano
from natsjs.jetstream.schema import DecodeError, Struct, decode_request, is_empty_request
from natsjs.jetstream.store import (MemConsumerStore, OBS,
                                    create_consumer_store, create_stream_store,
                                    open_message_log, write_meta)
from natsjs.jetstream.stream import Stream
from natsjs.jetstream.subjects import any_collide

NAMES_LIMIT = 1024          # server/jetstream_api.go JSApiNamesLimit
# A response dict may carry headers for the reply under this key (popped before sending).
RESPONSE_HEADERS = "\0headers"
LIST_LIMIT = 256            # JSApiListLimit
MAX_SUBJECT_DETAILS = 100_000

T = "io.nats.jetstream.api.v1."

# Fields a failed reply still carries: Go encodes the paging and the list of the
# response struct even when only its error is set (server/jetstream_api.go ApiPaged has
# no omitempty; the list responses start with an empty list, STREAM.NAMES with none).
_NO_PAGE = {"total": 0, "offset": 0, "limit": 0}
ERROR_EXTRAS = {
    "stream_info_response": _NO_PAGE,
    "stream_names_response": {**_NO_PAGE, "streams": None},
    "stream_list_response": {**_NO_PAGE, "streams": []},
    "consumer_names_response": {**_NO_PAGE, "consumers": []},
    "consumer_list_response": {**_NO_PAGE, "consumers": []},
    "stream_purge_response": {"purged": 0},
    "consumer_pause_response": {"paused": False, "pause_until": ZERO_TIME},
}

STREAM_INFO_REQUEST = Struct("JSApiStreamInfoRequest", {
    "offset": "int", "deleted_details": "bool", "subjects_filter": "string"})
NAMES_REQUEST = Struct("JSApiStreamNamesRequest", {"offset": "int", "subject": "string"})
PAGED_REQUEST = Struct("JSApiConsumersRequest", {"offset": "int"})
PURGE_REQUEST = Struct("JSApiStreamPurgeRequest", {"seq": "uint64", "filter": "string",
                                                   "keep": "uint64"})
MSG_GET_REQUEST = Struct("JSApiMsgGetRequest", {
    "seq": "uint64", "last_by_subj": "string", "next_by_subj": "string", "batch": "int",
    "max_bytes": "int", "start_time": "string", "multi_last": SC.ListOf("string"),
    "up_to_seq": "uint64", "up_to_time": "string", "no_hdr": "bool"})
MSG_DELETE_REQUEST = Struct("JSApiMsgDeleteRequest", {"seq": "uint64", "no_erase": "bool"})
PAUSE_REQUEST = Struct("JSApiConsumerPauseRequest", {"pause_until": "string"})
DELETE_STREAM_REQUEST = Struct("JSApiStreamDeleteRequest", {})


class Api:
    def __init__(self, js):
        self.js = js
        self.server = js.server
        self._queue: collections.deque = collections.deque()
        self._current = None      # the request being dispatched (see park)
        self.received = 0.0       # when it arrived (trio's clock)
        self._wake = trio.lowlevel.ParkingLot()
        self._subs = []

    # ---- subscriptions and the worker ------------------------------------------------------

    def install(self) -> None:
        server = self.server
        enabled = self.js.accounts
        for name, acc in server.accounts.items():
            if name in enabled:
                jsa = enabled[name]
                jsa.api_sub = self.js.subscribe(acc, b"$JS.API.>",
                                                WithProducer(self._make_handler(jsa)))
            else:
                self.js.subscribe(acc, b"$JS.API.>", self._not_enabled_in(acc), route=False)

    def _make_handler(self, jsa):
        def on_request(client, sub, subject, reply, hdr, msg):
            if subject.startswith(b"$JS.API.CONSUMER.MSG.NEXT.") or \
                    subject.startswith(b"$JS.API.DIRECT.GET"):
                # Answered by the consumer or the stream itself; when neither listens
                # the requester hears "no responders" (server/client.go
                # processServiceImport skips these for the JetStream import).
                return UNDELIVERED
            if len(self._queue) >= self.js.opts.request_queue_limit:
                self.server.log.warn("JetStream API queue limit reached, dropping %d requests",
                                     len(self._queue))
                self._queue.clear()
            if not self._queue:
                self._wake.unpark()
            self._queue.append((jsa, subject, reply, hdr, msg, client,
                                trio.current_time()))
        return on_request

    # What the system account administers itself (the meta group, servers, accounts):
    # answered by the cluster, or by nobody on a server without one, as nats-server does.
    _SYSTEM_API = (b"$JS.API.META.", b"$JS.API.SERVER.", b"$JS.API.ACCOUNT.")

    def _not_enabled_in(self, account):
        """Every API request of an account without JetStream (the system account's
        included) is told so, as nats-server answers it (503, 10039)."""
        def on_request(sub, subject, reply, hdr, msg):
            if not reply or subject.startswith(b"$JS.API.CONSUMER.MSG.NEXT.") or \
                    subject.startswith(b"$JS.API.DIRECT.GET."):
                return
            if account.is_system and subject.startswith(self._SYSTEM_API):
                return
            rtype = "account_info_response" if subject == b"$JS.API.INFO" \
                else "system_response"
            err = ApiError.of("JSNotEnabledForAccountErr").to_dict()
            self.server.deliver(account, reply, None, go_json({"type": T + rtype,
                                                               "error": err}))
        return on_request

    # ---- requests waiting for a replicated stream's or consumer's leader -----------------

    PARK_FOR = 2.0       # how long a request waits for a leader being elected here

    def park(self, rep, until: float | None = None) -> None:
        """The request being dispatched concerns ``rep``, whose group is electing a
        leader that may be this server: it waits (``unpark`` when this replica leads),
        rather than go unanswered for the client's whole timeout.  ``unpark`` forgets
        it after PARK_FOR seconds, or after ``until`` (trio's clock) when given."""
        parked = rep.__dict__.setdefault("_parked", [])
        parked.append((trio.current_time() + self.PARK_FOR if until is None else until,
                       self._current))

    def unpark(self, rep) -> None:
        parked = rep.__dict__.pop("_parked", None)
        if not parked:
            return
        now = trio.current_time()
        for deadline, item in reversed(parked):
            if deadline >= now:
                self._queue.appendleft(item)
        self._wake.unpark()

    async def worker(self) -> None:
        while True:
            if not self._queue:
                await self._wake.park()
                continue
            item = self._queue.popleft()
            self._current = item
            jsa, subject, reply, hdr, msg, client, self.received = item
            body = msg[hdr:] if hdr is not None and hdr > 0 else msg
            h = msg[:hdr] if hdr is not None and hdr > 0 else None
            try:
                subj = subject.decode("utf-8", "replace")
                if self.js.cluster is not None:
                    from natsjs.jetstream import cluster_api
                    resp = await cluster_api.dispatch(self, jsa, subj, h, body, reply)
                else:
                    resp = await self.dispatch(jsa, subj, h, body)
            except ApiError as err:
                resp = {"type": T + "system_response", "error": err.to_dict()}
            except Exception as exc:   # a bug answers with an error, never kills the worker
                self.server.log.error("JetStream API error on %r: %r", subject, exc)
                resp = {"type": T + "system_response",
                        "error": ApiError.of("JSStreamGeneralErrorF", err=error_text(exc)).to_dict()}
            if resp is None:
                continue
            jsa.api_total += 1
            self.js.api_total += 1
            if "error" in resp:
                jsa.api_errors += 1
                self.js.api_errors += 1
            headers = resp.pop(RESPONSE_HEADERS, None)
            data = go_json(resp)
            if reply:
                self._send(jsa, reply, data, headers=headers)
            self._audit(jsa, subj, body, data, client)
            await trio.lowlevel.checkpoint()

    def _audit(self, jsa, subject: str, body: bytes, response: bytes, client) -> None:
        """server/jetstream_api.go sendJetStreamAPIAuditAdvisory: every answered request,
        with who asked, the request and the response as text."""
        adv = "$JS.EVENT.ADVISORY.API"
        acc = jsa.account
        if not acc.sublist.match(adv.encode()).psubs and \
                not acc.sublist.match(adv.encode()).qsubs:
            return
        ev = {"server": self.server.name, "client": requester_info(client, jsa),
              "subject": subject}
        if body:
            ev["request"] = body.decode("utf-8", "replace")
        ev["response"] = response.decode("utf-8", "replace")
        self.js.advisory(adv, "io.nats.jetstream.advisory.v1.api_audit", ev, acc)

    def _send(self, jsa, reply: bytes, resp, headers: bytes | None = None) -> None:
        data = resp if isinstance(resp, bytes) else go_json(resp)
        if headers:
            self.server.deliver(jsa.account, reply, None, headers + data, len(headers))
        else:
            self.server.deliver(jsa.account, reply, None, data)

    # ---- dispatch --------------------------------------------------------------------------

    async def dispatch(self, jsa, subject: str, hdr, body: bytes) -> dict | None:
        # A subject no handler of nats-server's takes (server/jetstream_api.go: the API
        # subjects are patterns with a fixed number of tokens) gets no answer at all:
        # the account's request reaches the system account through the JetStream
        # import, where an unmatched subject is dropped; it does not count either.
        toks = subject.split(".")
        if len(toks) < 3:
            return None
        op = toks[2:]
        n = len(op)
        if op == ["INFO"]:
            return {"type": T + "account_info_response", **jsa.account_info()}
        if op[0] == "STREAM" and n >= 2:
            kind = op[1]
            if kind == "NAMES" and n == 2:
                return self.stream_names(jsa, body)
            if kind == "LIST" and n == 2:
                return self.stream_list(jsa, body)
            if n == 3:
                name = op[2]
                if kind == "CREATE":
                    return await self.stream_create(jsa, name, body, hdr)
                if kind == "UPDATE":
                    return await self.stream_update(jsa, name, body, hdr)
                if kind == "INFO":
                    return self.stream_info(jsa, name, body)
                if kind == "DELETE":
                    return await self.stream_delete(jsa, name, body)
                if kind == "PURGE":
                    return self.stream_purge(jsa, name, body)
                if kind == "SNAPSHOT":
                    return snapshot.snapshot_request(self, jsa, name, hdr, body)
                if kind == "RESTORE":
                    return snapshot.restore_request(self, jsa, name, hdr, body)
            if kind == "MSG" and n == 4:
                if op[2] == "GET":
                    return self.msg_get(jsa, op[3], body)
                if op[2] == "DELETE":
                    return self.msg_delete(jsa, op[3], body)
            if kind == "LEADER" and n == 4 and op[2] == "STEPDOWN":
                return self._cluster_required("stream_leader_stepdown_response")
            if kind == "PEER" and n == 4 and op[2] == "REMOVE":
                return self._cluster_required("stream_remove_peer_response")
        if op[0] == "CONSUMER" and n >= 3:
            kind = op[1]
            if kind == "CREATE":
                if n == 3:
                    return await self.consumer_create(jsa, op[2], None, None, body, hdr, "ephemeral")
                filt = ".".join(op[4:]) if n > 4 else None
                return await self.consumer_create(jsa, op[2], op[3], filt, body, hdr, "new")
            if kind == "DURABLE" and n == 5 and op[2] == "CREATE":
                return await self.consumer_create(jsa, op[3], op[4], None, body, hdr, "durable")
            if kind == "NAMES" and n == 3:
                return self.consumer_names(jsa, op[2], body)
            if kind == "LIST" and n == 3:
                return self.consumer_list(jsa, op[2], body)
            if kind == "INFO" and n == 4:
                return self.consumer_info(jsa, op[2], op[3])
            if kind == "DELETE" and n == 4:
                return await self.consumer_delete(jsa, op[2], op[3])
            if kind == "PAUSE" and n == 4:
                return await self.consumer_pause(jsa, op[2], op[3], body)
            if kind == "LEADER" and n == 5 and op[2] == "STEPDOWN":
                return self._cluster_required("consumer_leader_stepdown_response")
        return None

    def _err(self, rtype: str, err: ApiError) -> dict:
        return {"type": T + rtype, "error": err.to_dict(), **ERROR_EXTRAS.get(rtype, {})}

    def _cluster_required(self, rtype: str) -> dict:
        return self._err(rtype, ApiError.of("JSClusterRequiredErr"))

    @staticmethod
    def _decode(body: bytes, schema: Struct) -> dict:
        try:
            return decode_request(body, schema)
        except DecodeError as exc:
            raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from None

    # A request this large (up to max_payload, 1 MB: 100,000 subjects) takes more than a
    # few milliseconds to decode and check: that work leaves the event loop.
    OFF_LOOP_BYTES = 32 * 1024

    async def off_loop(self, fn, *args):
        """``fn(*args)`` for the request being answered: inline, or in a worker thread
        when the request is large, so that a stream with 10,000 subjects does not stop
        every other client's traffic while it is checked (the thread gives the loop the
        interpreter every few milliseconds; nats-server answers others meanwhile too).
        ``fn`` must not await and may only read shared state, which the loop may change
        meanwhile: callers pass it what they took from shared state beforehand."""
        item = self._current
        if item is None or len(item[4]) < self.OFF_LOOP_BYTES:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)

    def _stream(self, jsa, name: str) -> Stream:
        s = jsa.streams.get(name)
        if s is None:
            raise ApiError.of("JSStreamNotFoundErr")
        return s

    def _check_context(self, jsa, pedantic=False) -> SC.CheckContext:
        def get_stream(name):
            s = jsa.streams.get(name)
            return s.cfg if s is not None else None
        lim = jsa.limits
        return SC.CheckContext(get_stream=get_stream, max_bytes_required=lim.max_bytes_required,
                               max_stream_bytes=-1, pedantic=pedantic,
                               server_dup_window=int(self.js.opts.limits.duplicate_window * 1e9))

    # ---- streams ------------------------------------------------------------------------

    async def stream_create(self, jsa, name: str, body: bytes, hdr) -> dict:
        rtype = "stream_create_response"
        try:
            req = await self.off_loop(self._decode, body, SC.STREAM_CONFIG_REQUEST)
            pedantic = bool(req.pop("pedantic", False))
            cfg = SC.from_request(req)
            SC.set_static_metadata(cfg)
            if name != cfg["name"]:
                raise ApiError.of("JSStreamMismatchErr")
            if "\\" in name or "/" in name:
                raise ApiError.of("JSStreamNameContainsPathSeparatorsErr")
            if cfg["sealed"]:
                raise ApiError.of("JSStreamInvalidConfigF",
                                  err="stream configuration for create can not be sealed")
            if cfg["mirror_direct"] and cfg["mirror"] is None:
                raise ApiError.of("JSStreamInvalidConfigF",
                                  err="stream has no mirror but does have mirror direct")
            stream = await self.add_stream(jsa, cfg, pedantic)
        except ApiError as err:
            return self._err(rtype, err)
        return {"type": T + rtype, **stream.info(), "did_create": True}

    async def add_stream(self, jsa, config: dict, pedantic: bool = False) -> Stream:
        """server/stream.go addStream for a single server."""
        ctx = self._check_context(jsa, pedantic)
        cfg = await self.off_loop(SC.check_stream_config, config, ctx)
        if cfg["num_replicas"] > 1 and self.server.cluster is None:
            raise ApiError.of("JSStreamReplicasNotSupportedErr")
        existing = jsa.streams.get(cfg["name"])
        if existing is not None:
            ocfg = existing.cfg
            md = dict(cfg.get("metadata") or {})
            old_level = (ocfg.get("metadata") or {}).get(SC.REQ_LEVEL_KEY)
            if old_level is not None:
                md[SC.REQ_LEVEL_KEY] = old_level
            cmp = dict(cfg, metadata=md or None)
            if _same_config(cmp, ocfg):
                return existing
            raise ApiError.of("JSStreamNameExistErr")
        jsa.check_new_stream(cfg)
        if await self.off_loop(any_collide, cfg["subjects"] or [],
                               SC.subjects_of(o.cfg for o in list(jsa.streams.values()))):
            raise ApiError.of("JSStreamSubjectOverlapErr")
        created = now_ns()
        path = None
        if cfg["storage"] == "file":
            path = os.path.join(jsa.dir, "streams", cfg["name"])
            try:
                store = await trio.to_thread.run_sync(create_stream_store, path, cfg, created)
            except OSError as exc:
                raise ApiError.of("JSStreamCreateErrF", err=error_text(exc)) from None
        else:
            store = open_message_log(None, cfg)
        stream = Stream(jsa, cfg, created, store, path)
        jsa.streams[cfg["name"]] = stream
        self.js.start_stream(stream)
        self.js.advisory("$JS.EVENT.ADVISORY.STREAM.CREATED." + cfg["name"],
                         "io.nats.jetstream.advisory.v1.stream_action",
                         {"stream": cfg["name"], "action": "create"}, jsa.account)
        return stream

    async def stream_update(self, jsa, name: str, body: bytes, hdr) -> dict:
        rtype = "stream_update_response"
        try:
            req = await self.off_loop(self._decode, body, SC.STREAM_CONFIG_REQUEST)
            pedantic = bool(req.pop("pedantic", False))
            cfg = SC.from_request(req)
            if name != cfg["name"]:
                raise ApiError.of("JSStreamMismatchErr")
            stream = self._stream(jsa, name)
            md = {k: v for k, v in (cfg.get("metadata") or {}).items()
                  if k not in (SC.VERSION_KEY, SC.LEVEL_KEY, SC.REQ_LEVEL_KEY)}
            old_level = (stream.cfg.get("metadata") or {}).get(SC.REQ_LEVEL_KEY)
            cfg["metadata"] = md
            SC.set_static_metadata(cfg)
            if old_level is not None and int(cfg["metadata"][SC.REQ_LEVEL_KEY]) < int(old_level):
                cfg["metadata"][SC.REQ_LEVEL_KEY] = old_level
            new = await self.off_loop(SC.check_update, stream.cfg, cfg,
                                      self._check_context(jsa, pedantic),
                                      self.server.cluster is None)
            if new["num_replicas"] > 1 and self.server.cluster is None:
                raise ApiError.of("JSStreamReplicasNotSupportedErr")
            others = [o.cfg for o in jsa.streams.values() if o is not stream]
            if await self.off_loop(any_collide, new["subjects"] or [], SC.subjects_of(others)):
                raise ApiError.of("JSStreamSubjectOverlapErr")
            jsa.check_new_stream(new, existing=stream)
            if stream.path:
                await trio.to_thread.run_sync(write_meta, stream.path, new, stream.created)
            stream.config_for_update(new)
        except ApiError as err:
            return self._err(rtype, err)
        self.js.advisory("$JS.EVENT.ADVISORY.STREAM.UPDATED." + name,
                         "io.nats.jetstream.advisory.v1.stream_action",
                         {"stream": name, "action": "modify"}, jsa.account)
        return {"type": T + rtype, **stream.info()}

    def stream_info(self, jsa, name: str, body: bytes) -> dict:
        rtype = "stream_info_response"
        try:
            req = {}
            if body.strip()[:1] in (b"{", b"["):
                req = self._decode(body, STREAM_INFO_REQUEST)
            stream = self._stream(jsa, name)
        except ApiError as err:
            return self._err(rtype, err)
        offset = max(req.get("offset", 0), 0)
        filt = req.get("subjects_filter", "")
        info = stream.info(deleted_details=req.get("deleted_details", False))
        # server/jetstream_cluster.go clusterInfo: a stream with no Raft group is led by
        # this server (STREAM.INFO is the one reply that says so).
        info.setdefault("cluster", self.js.cluster_info())
        out = {"type": T + rtype, "total": 0, "offset": 0, "limit": 0}
        if filt:
            st = stream.store.subjects(filt.encode())
            if st:
                out["offset"] = offset
                out["limit"] = MAX_SUBJECT_DETAILS
                out["total"] = len(st)
                names = sorted(st)
                page = names[offset:offset + MAX_SUBJECT_DETAILS]
                if page:
                    info["state"]["subjects"] = {k.decode("utf-8", "replace"): st[k]
                                                 for k in page}
        out.update(info)
        return out

    async def stream_delete(self, jsa, name: str, body: bytes) -> dict:
        rtype = "stream_delete_response"
        if not is_empty_request(body):
            return self._err(rtype, ApiError.of("JSNotEmptyRequestErr"))
        try:
            stream = self._stream(jsa, name)
        except ApiError as err:
            return self._err(rtype, err)
        del jsa.streams[name]
        # Its consumers go with it, each with its advisory; the durable consumers it had
        # on the origins of its mirror or sources are deleted there (server/stream.go
        # stop).
        for c in list(stream.consumers.values()):
            self.js.advisory("$JS.EVENT.ADVISORY.CONSUMER.DELETED.%s.%s" % (name, c.name),
                             "io.nats.jetstream.advisory.v1.consumer_action",
                             {"stream": name, "consumer": c.name, "action": "delete"},
                             jsa.account)
        if stream.sourcing is not None:
            stream.sourcing.delete_origin_durables()
        stream.stop(delete=False)
        if stream.path:
            await trio.to_thread.run_sync(_remove_tree, stream.path)
        self.js.advisory("$JS.EVENT.ADVISORY.STREAM.DELETED." + name,
                         "io.nats.jetstream.advisory.v1.stream_action",
                         {"stream": name, "action": "delete"}, jsa.account)
        return {"type": T + rtype, "success": True}

    def stream_purge(self, jsa, name: str, body: bytes) -> dict:
        rtype = "stream_purge_response"
        try:
            req = self._decode(body, PURGE_REQUEST) if body.strip() else {}
            stream = self._stream(jsa, name)
            if stream.cfg["sealed"]:
                raise ApiError.of("JSStreamSealedErr")
            if stream.cfg["deny_purge"]:
                raise ApiError.of("JSStreamPurgeFailedF", err="stream purge not permitted")
            if req.get("seq") and req.get("keep"):
                raise ApiError.of("JSBadRequestErr")
            n = stream.purge(req.get("filter", ""), req.get("seq", 0), req.get("keep", 0))
        except ApiError as err:
            return self._err(rtype, err)
        return {"type": T + rtype, "success": True, "purged": n}

    def _names_filter(self, jsa, subject: str) -> list:
        names = sorted(jsa.streams)
        if subject and subject != ">":
            names = [n for n in names if any(SC.subjects_collide(subject, s)
                                             for s in jsa.streams[n].cfg["subjects"] or [])]
        return names

    def stream_names(self, jsa, body: bytes) -> dict:
        out = self._stream_page(jsa, body, "stream_names_response", NAMES_LIMIT,
                                lambda s: s.name)
        if "streams" in out and not out["streams"]:
            out["streams"] = None
        return out

    def stream_list(self, jsa, body: bytes) -> dict:
        return self._stream_page(jsa, body, "stream_list_response", LIST_LIMIT,
                                 lambda s: s.info(dynamic=False))

    def _stream_page(self, jsa, body: bytes, rtype: str, limit: int, render) -> dict:
        try:
            req = self._decode(body, NAMES_REQUEST)
        except ApiError as err:
            return self._err(rtype, err)
        names = self._names_filter(jsa, req.get("subject", ""))
        offset = min(max(req.get("offset", 0), 0), len(names))
        return {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit,
                "streams": [render(jsa.streams[n]) for n in names[offset:offset + limit]]}

    def msg_get(self, jsa, name: str, body: bytes) -> dict:
        rtype = "stream_msg_get_response"
        try:
            req = self._decode(body, MSG_GET_REQUEST)
            stream = self._stream(jsa, name)
            seq, last, nxt = req.get("seq", 0), req.get("last_by_subj", ""), \
                req.get("next_by_subj", "")
            if (seq and last) or (last and nxt) or (not seq and not last and not nxt):
                raise ApiError.of("JSBadRequestErr")
            store = stream.store
            if seq and not nxt:
                rec = stream.load_for_read(seq)
                rec = (seq,) + rec if rec is not None else None
            elif nxt:
                rec = store.load_next(seq, nxt.encode())
            else:
                rec = store.load_last(last.encode())
            if rec is None or rec[0] > stream.synced_seq:
                raise ApiError.of("JSNoMessageFoundErr")
        except ApiError as err:
            return self._err(rtype, err)
        mseq, subj, mhdr, mmsg, ts = rec
        import base64
        m = {"subject": subj.decode("utf-8", "replace"), "seq": mseq}
        if mhdr:
            m["hdrs"] = base64.b64encode(mhdr).decode()
        if mmsg:
            m["data"] = base64.b64encode(mmsg).decode()
        m["time"] = rfc3339_nano(ts)
        return {"type": T + rtype, "message": m}

    def msg_delete(self, jsa, name: str, body: bytes) -> dict:
        rtype = "stream_msg_delete_response"
        try:
            if is_empty_request(body):
                raise ApiError.of("JSBadRequestErr")
            req = self._decode(body, MSG_DELETE_REQUEST)
            stream = self._stream(jsa, name)
            if stream.cfg["sealed"]:
                raise ApiError.of("JSStreamSealedErr")
            if stream.cfg["deny_delete"]:
                raise ApiError.of("JSStreamMsgDeleteFailedF", err="message delete not permitted")
            seq = req.get("seq", 0)
            refusal = stream.delete_refusal(seq)
            if refusal is not None:
                raise refusal
            if not stream.delete_msg(seq, erase=not req.get("no_erase", False)):
                raise ApiError.of("JSSequenceNotFoundErrF", seq=seq)
        except ApiError as err:
            return self._err(rtype, err)
        return {"type": T + rtype, "success": True}

    # ---- consumers ----------------------------------------------------------------------

    async def consumer_create(self, jsa, stream_name: str, cname, filt, body: bytes, hdr,
                              kind: str) -> dict:
        rtype = "consumer_create_response"
        try:
            req = await self.off_loop(self._decode, body, CC.CREATE_CONSUMER_REQUEST)
            ccfg = CC.from_request(req.get("config") or {})
            action = req.get("action", "")
            pedantic = bool(req.get("pedantic"))
            if kind == "ephemeral":
                cname = ccfg["name"]
            if stream_name != req.get("stream_name", ""):
                raise ApiError.of("JSStreamMismatchErr")
            if cname and ("\\" in cname or "/" in cname):
                raise ApiError.of("JSConsumerNameContainsPathSeparatorsErr")
            if kind == "durable":
                if not ccfg["durable_name"]:
                    raise ApiError.of("JSConsumerDurableNameNotSetErr")
                if cname != ccfg["durable_name"]:
                    raise ApiError.of("JSConsumerDurableNameNotMatchSubjectErr")
                ccfg["name"] = cname
            if kind == "new":
                if ccfg["durable_name"] and cname != ccfg["durable_name"]:
                    raise ApiError.of("JSConsumerDurableNameNotMatchSubjectErr")
                ccfg["name"] = cname
            if kind == "ephemeral" and ccfg["durable_name"]:
                raise ApiError.of("JSConsumerEphemeralWithDurableNameErr")
            if filt and ccfg["filter_subjects"]:
                raise ApiError.of("JSConsumerMultipleFiltersNotAllowed")
            if filt and ccfg["filter_subject"] != filt:
                raise ApiError.of("JSConsumerCreateFilterSubjectMismatchErr")
            if ccfg["num_replicas"] > 1 and self.server.cluster is None:
                raise ApiError.of("JSStreamReplicasNotSupportedErr")
            if required_level(hdr) > SC.API_LEVEL:
                raise ApiError.of("JSRequiredApiLevelErr")
            stream = self._stream(jsa, stream_name)
            identity = None
            if ccfg["direct"] or ccfg["sourcing"]:
                cname = sourcing_consumer_name(stream.cfg, ccfg) or cname
                identity = sourcing.stream_identity(stream.created)
                want = H.get(hdr, b"Nats-Stream-Identity") if hdr else None
                if want and want.decode("utf-8", "replace") != identity:
                    raise ApiError.of("JSConsumerStreamIdentityMismatchF", msg=identity)
            existing = stream.consumers.get(cname) if cname else None
            if existing is not None:
                ccfg["pause_until"] = existing.cfg["pause_until"]
                if ccfg["sourcing"] and ccfg["durable_name"]:
                    for k in ("deliver_policy", "opt_start_seq", "opt_start_time"):
                        ccfg[k] = existing.cfg[k]
            CC.set_static_metadata(ccfg)
            consumer = await self.add_consumer(jsa, stream, ccfg, action, pedantic)
        except ApiError as err:
            return self._err(rtype, err)
        out = {"type": T + rtype, **consumer.info()}
        if identity is not None:
            out[RESPONSE_HEADERS] = H.make(0, "", [(b"Nats-Stream-Identity", identity.encode())])
        return out

    async def add_consumer(self, jsa, stream: Stream, config: dict, action: str,
                           pedantic: bool) -> Consumer:
        """server/consumer.go addConsumerWithAssignment for a single server."""
        scfg = stream.cfg
        slim = self.js.opts.limits
        cfg = CC.set_defaults(config, scfg, slim, jsa.limits, pedantic)
        await self.off_loop(CC.check_config, cfg, scfg, slim, jsa.limits)
        name = cfg["durable_name"] or cfg["name"]
        if name:
            existing = stream.consumers.get(name)
            if existing is not None:
                if action == "create":
                    ocfg = dict(existing.cfg)
                    cmp = dict(cfg)
                    md = dict(cmp.get("metadata") or {})
                    if (ocfg.get("metadata") or {}).get(SC.REQ_LEVEL_KEY) is not None:
                        md[SC.REQ_LEVEL_KEY] = ocfg["metadata"][SC.REQ_LEVEL_KEY]
                    cmp["metadata"] = md
                    if cmp != ocfg:
                        raise ApiError.of("JSConsumerAlreadyExists")
                if scfg["retention"] == "workqueue" and not await self.off_loop(
                        CC.partition_unique, CC.filters_of(cfg),
                        self._other_filters(stream, name)):
                    raise ApiError.of("JSConsumerWQConsumerNotUniqueErr")
                CC.check_update(existing.cfg, cfg, lambda subj: bool(
                    jsa.account.sublist.match(subj.encode()).psubs))
                if not existing.cfg["durable_name"] and cfg["inactive_threshold"] <= 0:
                    # server/consumer.go updateInactiveThreshold: an ephemeral always
                    # has one.
                    cfg["inactive_threshold"] = CC.DEFAULT_DELETE_WAIT
                if existing.cfg != cfg:
                    await self._save_consumer_meta(stream, existing.name, cfg, existing.created)
                existing.update_config(cfg)
                if cfg["sourcing"]:
                    existing.reset_to_ack_floor()
                return existing
        if action == "update":
            raise ApiError.of("JSConsumerDoesNotExist")
        CC.check_new_consumer(scfg, jsa.limits, cfg, lambda: self._other_filters(stream, name))
        if not name:
            # A made-up name is the consumer's, not its config's (server/consumer.go:
            # an ephemeral's config keeps no name on a single server).
            while True:
                name = ephemeral_name()
                if name not in stream.consumers:
                    break
        if not SC.valid_asset_name(name):
            raise ApiError.of("JSConsumerBadDurableNameErr")
        if not cfg["durable_name"] and cfg["inactive_threshold"] == 0:
            cfg["inactive_threshold"] = CC.DEFAULT_DELETE_WAIT
        created = now_ns()
        if stream.path and not cfg["mem_storage"] and not cfg["direct"]:
            # A direct consumer keeps no state anywhere (server/consumer.go).
            try:
                cstore = await trio.to_thread.run_sync(
                    create_consumer_store, os.path.join(stream.path, OBS, name), cfg, created,
                    self.js.fsync)
            except OSError as exc:
                raise ApiError.of("JSConsumerStoreFailedErrF", err=error_text(exc)) from None
        else:
            cstore = MemConsumerStore()
        consumer = Consumer(stream, cfg, name, created, cstore)
        stream.add_consumer(consumer)
        self.js.advisory("$JS.EVENT.ADVISORY.CONSUMER.CREATED.%s.%s" % (stream.name, name),
                         "io.nats.jetstream.advisory.v1.consumer_action",
                         {"stream": stream.name, "consumer": name, "action": "create"},
                         jsa.account)
        return consumer

    async def _save_consumer_meta(self, stream, name: str, cfg: dict, created: int) -> None:
        d = os.path.join(stream.path, OBS, name)
        try:
            await trio.to_thread.run_sync(_write_consumer_meta, d, cfg, created)
        except OSError as exc:
            raise ApiError.of("JSConsumerStoreFailedErrF", err=error_text(exc)) from None

    @staticmethod
    def _other_filters(stream, name: str) -> list:
        """The filter lists of ``stream``'s limitable consumers other than ``name``."""
        return [c.filters for cname, c in stream.consumers.items()
                if cname != name and not c.internal]

    def _consumer(self, jsa, stream_name: str, name: str):
        stream = self._stream(jsa, stream_name)
        c = stream.consumers.get(name)
        if c is None:
            raise ApiError.of("JSConsumerNotFoundErr")
        return stream, c

    def consumer_info(self, jsa, stream_name: str, name: str) -> dict:
        rtype = "consumer_info_response"
        try:
            _, c = self._consumer(jsa, stream_name, name)
        except ApiError as err:
            return self._err(rtype, err)
        return {"type": T + rtype, **c.info()}

    async def consumer_delete(self, jsa, stream_name: str, name: str) -> dict:
        rtype = "consumer_delete_response"
        try:
            stream, c = self._consumer(jsa, stream_name, name)
        except ApiError as err:
            return self._err(rtype, err)
        await self._delete_consumer(stream, c)
        return {"type": T + rtype, "success": True}

    async def _delete_consumer(self, stream, c) -> None:
        c.stop(delete=True)
        if stream.path:
            await trio.to_thread.run_sync(_remove_tree, os.path.join(stream.path, OBS, c.name))
        self.js.advisory("$JS.EVENT.ADVISORY.CONSUMER.DELETED.%s.%s" % (stream.name, c.name),
                         "io.nats.jetstream.advisory.v1.consumer_action",
                         {"stream": stream.name, "consumer": c.name, "action": "delete"},
                         stream.jsa.account)

    def remove_consumer(self, stream, c) -> None:
        """An ephemeral consumer went inactive: delete it in the background."""
        if c.closed:
            return
        c.closed_pending = True
        self.js.spawn(self._delete_consumer, stream, c)

    async def consumer_pause(self, jsa, stream_name: str, name: str, body: bytes) -> dict:
        rtype = "consumer_pause_response"
        try:
            req = self._decode(body, PAUSE_REQUEST)
            stream, c = self._consumer(jsa, stream_name, name)
        except ApiError as err:
            return self._err(rtype, err)
        cfg = dict(c.cfg)
        cfg["pause_until"] = req.get("pause_until") or ""
        CC.set_static_metadata(cfg)
        if stream.path and not cfg["mem_storage"]:
            await self._save_consumer_meta(stream, c.name, cfg, c.created)
        c.update_config(cfg)
        return pause_response(cfg)

    def consumer_names(self, jsa, stream_name: str, body: bytes) -> dict:
        return self._consumer_page(jsa, stream_name, body, "consumer_names_response",
                                   NAMES_LIMIT, lambda c: c.name)

    def consumer_list(self, jsa, stream_name: str, body: bytes) -> dict:
        return self._consumer_page(jsa, stream_name, body, "consumer_list_response",
                                   LIST_LIMIT, lambda c: c.info(dynamic=False))

    def _consumer_page(self, jsa, stream_name: str, body: bytes, rtype: str, limit: int,
                       render) -> dict:
        try:
            req = self._decode(body, PAGED_REQUEST)
            stream = self._stream(jsa, stream_name)
        except ApiError as err:
            return self._err(rtype, err)
        names = sorted(n for n, c in stream.consumers.items() if not c.direct)
        offset = min(max(req.get("offset", 0), 0), len(names))
        return {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit,
                "consumers": [render(stream.consumers[n]) for n in names[offset:offset + limit]]}


def pause_response(cfg: dict) -> dict:
    """The consumer_pause_response for a consumer configuration's ``pause_until``."""
    from natsjs.jetstream.consumer import _pause_ns
    until = _pause_ns(cfg)
    now = now_ns()
    out = {"type": T + "consumer_pause_response", "paused": bool(until and now < until),
           "pause_until": cfg.get("pause_until") or ZERO_TIME}
    if out["paused"]:
        out["pause_remaining"] = until - now
    return out


def required_level(hdr: bytes | None) -> int:
    """server/jetstream_versioning.go errorOnRequiredApiLevel: the level a request asks
    for in Nats-Required-Api-Level (unparsable asks for more than anyone has)."""
    raw = H.get(hdr, b"Nats-Required-Api-Level") if hdr else None
    if not raw:
        return 0
    raw = raw.strip()
    return int(raw) if raw.isdigit() else 1 << 30


def requester_info(client, jsa) -> dict | None:
    """server/events.go ClientInfo of the connection that made a request, as advisories
    carry it (forAdvisory: no JWT, no alternates); for a request that came from
    elsewhere (a route, server code), what is known here."""
    from natsjs.jetstream.snapshot import client_info
    if client is None or getattr(client, "kind", "") != "Client":
        return client_info(jsa)
    server = jsa.js.server
    # The connection's start is kept on trio's clock: shift it to the wall clock.
    started = now_ns() - int((trio.current_time() - client.start) * 1e9)
    out = {"start": rfc3339_nano(started), "host": client.host}
    out["id"] = client.cid
    out["acc"] = client.account.name
    user = client.user
    uname = (getattr(user, "username", "") or getattr(user, "nkey", "")) if user else ""
    if uname:
        out["user"] = uname
    if client.name:
        out["name"] = client.name
    if client.lang:
        out["lang"] = client.lang
    if client.version:
        out["ver"] = client.version
    if client.rtt:
        out["rtt"] = int(client.rtt * 1e9)
    out["server"] = server.name
    if server.cluster is not None:
        out["cluster"] = server.cluster.name
    out["kind"] = "Client"
    out["client_type"] = getattr(client, "client_type", "nats") or "nats"
    return out


def sourcing_consumer_name(stream_cfg: dict, cfg: dict) -> str | None:
    """server/jetstream_api.go: a mirror's or source's consumer asks with a stable
    name; on a stream with limits retention it gets a random suffix (a new consumer
    every time), on an interest or work queue stream it becomes a durable that acks
    through its flow control replies, so that the origin keeps what the mirror or
    source has not taken yet."""
    if not (cfg["direct"] and cfg["sourcing"] and cfg["name"]):
        return None
    if stream_cfg["retention"] in ("interest", "workqueue"):
        cfg["direct"] = False
        cfg["durable_name"] = cfg["name"]
        cfg["ack_policy"] = "flow_control"
        cfg["ack_wait"] = 0
        cfg["max_deliver"] = 0
        cfg["inactive_threshold"] = 0
    else:
        cfg["name"] = "%s-%s" % (cfg["name"], sourcing.get_hash(sourcing.rand_token(22)))
    return cfg["name"]


def _same_config(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _write_consumer_meta(d: str, cfg: dict, created: int) -> None:
    os.makedirs(d, exist_ok=True)
    write_meta(d, cfg, created)


def _remove_tree(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


__all__ = ["Api", "H"]
