"""The JetStream API: ``$JS.API.>`` requests in, JSON replies out.

Requests arrive as nats-server's do: every account imports ``$JS.API.>`` from the
system account (natsjs/accounts.py wire_jetstream_import), where the API listens; the
import names the requesting account in a ``Nats-Request-Info`` header and gives the
request a reply that leads back to the requester.  The API's handler runs inside the
requester's fan-out, so nothing waits there: requests are queued, and one worker task
answers them in order, which may wait for disk (creating
a stream writes and fsyncs its metadata).  Replies are shaped like nats-server's
(server/jetstream_api.go): ``type``, the response body, and on failure ``error``
with ``code``, ``err_code`` and ``description``.

Each request is routed, decoded and checked once here (``dispatch``, ``read``; the
subjects, schemas and error reply are apicore.py's), then answered by this server's
back end (``handle``) or, in a cluster, by cluster_api.py's.

Pull requests (``CONSUMER.MSG.NEXT``) and direct gets (``DIRECT.GET``) are not API
calls here: the consumer and the stream subscribe to those subjects in the account
themselves, and the import does not carry them, as in nats-server; with neither
listening, the requester hears "no responders".
"""
from __future__ import annotations

import base64
import collections
import json
import os
import shutil

import trio

from natsjs._core.fanout import UNDELIVERED, WithProducer
from natsjs.accounts import JS_NOT_IMPORTED
from natsjs.clientinfo import request_info, service_account
from natsjs.jetstream import apicore
from natsjs.jetstream import cluster_api
from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import headers as H
from natsjs.jetstream import priority
from natsjs.jetstream import snapshot, sourcing
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.apicore import (LIST_LIMIT, MAX_SUBJECT_DETAILS, NAMES_LIMIT,
                                      RESPONSE_HEADERS, T, Request, check_msg_delete,
                                      check_new_stream_request, check_purge, err,
                                      lookup_stream, pause_response, sourcing_consumer_name)
from natsjs.jetstream.consumer import Consumer, ephemeral_name
from natsjs.jetstream.errors import ApiError, error_text
from natsjs.jetstream.gojson import go_json
from natsjs.jetstream.jstime import now_ns, rfc3339_nano
from natsjs.jetstream.schema import is_empty_request
from natsjs.jetstream.store import (MemConsumerStore, OBS,
                                    create_consumer_store, create_stream_store,
                                    open_message_log, write_meta)
from natsjs.jetstream.stream import Stream
from natsjs.jetstream.subjects import any_collide


class Api:
    def __init__(self, js):
        self.js = js
        self.server = js.server
        self._queue: collections.deque = collections.deque()
        self._current = None      # the request being dispatched (see park)
        self.received = 0.0       # when it arrived (trio's clock)
        self._wake = trio.lowlevel.ParkingLot()
        self._subs = []
        # Names of streams a restore is installing on this server (snapshot.py).
        self.restoring: set = set()

    # ---- subscriptions and the worker ------------------------------------------------------

    def install(self) -> None:
        """The API listens in the system account (its interest routed, so that every
        JetStream server of a cluster receives each request); accounts reach it through
        their import of ``$JS.API.>`` (natsjs/accounts.py wire_jetstream_import), which
        names the requesting account in the request's ``Nats-Request-Info`` header."""
        self.js.subscribe(self.server.system_account, b"$JS.API.>",
                          WithProducer(self._on_request))

    # What the system account administers itself (the meta group, servers, accounts):
    # answered by the cluster's own subscriptions, or by nobody on a server without
    # one, as nats-server's apiDispatch leaves them.
    _SYSTEM_API = (b"$JS.API.META.", b"$JS.API.SERVER.", b"$JS.API.ACCOUNT.")

    def _on_request(self, client, sub, subject, reply, hdr, msg):
        if subject.startswith(JS_NOT_IMPORTED):
            # A pull request or a direct get made in the system account: answered by a
            # consumer or a stream, never by the API.
            return UNDELIVERED
        if subject.startswith(self._SYSTEM_API):
            return
        info = request_info(msg[:hdr] if hdr is not None and hdr > 0 else None)
        if info is None:
            # The system account's own request (server/jetstream_api.go apiDispatch):
            # it has no JetStream, and only the server it entered says so.
            if reply and client is not None and client.kind == "Client":
                self._not_enabled(subject, reply)
            return
        name = service_account(info)
        jsa = self.js.accounts.get(name)
        if jsa is None:
            if reply and name in self.server.accounts:
                self._not_enabled(subject, reply)
            return
        if len(self._queue) >= self.js.opts.request_queue_limit:
            self.server.log.warn("JetStream API queue limit reached, dropping %d requests",
                                 len(self._queue))
            self._queue.clear()
        if not self._queue:
            self._wake.unpark()
        self._queue.append((jsa, subject, reply, hdr, msg, info, trio.current_time()))

    def _not_enabled(self, subject: bytes, reply: bytes) -> None:
        """An account without JetStream is told so, as nats-server answers (503, 10039)."""
        rtype = "account_info_response" if subject == b"$JS.API.INFO" else "system_response"
        self.answer(reply, err(rtype, ApiError.of("JSNotEnabledForAccountErr")))

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
            jsa, subject, reply, hdr, msg, info, self.received = item
            body = msg[hdr:] if hdr is not None and hdr > 0 else msg
            h = msg[:hdr] if hdr is not None and hdr > 0 else None
            try:
                subj = subject.decode("utf-8", "replace")
                resp = await self.dispatch(jsa, subj, h, body, reply)
            except ApiError as exc:
                resp = {"type": T + "system_response", "error": exc.to_dict()}
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
                self.answer(reply, data, headers=headers)
            self._audit(jsa, subj, body, data, info)
            await trio.lowlevel.checkpoint()

    def _audit(self, jsa, subject: str, body: bytes, response: bytes, info: dict) -> None:
        """server/jetstream_api.go sendJetStreamAPIAuditAdvisory: every answered request,
        with who asked, the request and the response as text."""
        adv = "$JS.EVENT.ADVISORY.API"
        acc = jsa.account
        if not acc.sublist.match(adv.encode()).psubs and \
                not acc.sublist.match(adv.encode()).qsubs:
            return
        ev = {"server": self.server.name, "client": for_advisory(info),
              "subject": subject}
        if body:
            ev["request"] = body.decode("utf-8", "replace")
        ev["response"] = response.decode("utf-8", "replace")
        self.js.advisory(adv, "io.nats.jetstream.advisory.v1.api_audit", ev, acc)

    def answer(self, reply: bytes, resp, headers: bytes | None = None) -> None:
        """Answer an API request, whoever answers it (this worker, a new stream's or
        consumer's first leader, a restore): ``resp`` a response dict (written as Go
        writes JSON) or its bytes.  The answer goes into the system account, where the
        request was asked; its reply leads back to the requester through the account's
        JetStream import."""
        data = resp if isinstance(resp, bytes) else go_json(resp)
        sys_acc = self.server.system_account
        if headers:
            self.server.deliver(sys_acc, reply, None, headers + data, len(headers))
        else:
            self.server.deliver(sys_acc, reply, None, data)

    # ---- dispatch --------------------------------------------------------------------------

    async def dispatch(self, jsa, subject: str, hdr, body: bytes,
                       reply: bytes | None = None) -> dict | None:
        """Answer one request, or None when this server stays silent.  The subject
        names the operation (apicore.route; a subject no handler of nats-server's takes
        gets no answer at all and does not count: the account's request reaches the
        system account through the JetStream import, where an unmatched subject is
        dropped); in a cluster, cluster_api.gate says whether this server answers it;
        then the body is decoded and checked once (``read``) and handed to the
        clustered back end or to this server's, as server/jetstream_api.go hands a
        request to jsClusteredStreamRequest and the like."""
        r = apicore.route(subject, hdr, body)
        if r is None:
            return None
        clustered = self.js.cluster is not None
        if clustered:
            resp = await cluster_api.gate(self, jsa, r, reply)
            if resp is not cluster_api.PROCEED:
                return resp
        try:
            await self.read(r)
        except ApiError as exc:
            return err(r.rtype, exc)
        if clustered:
            return await cluster_api.handle(self, jsa, r, reply)
        return await self.handle(jsa, r)

    async def read(self, r: Request) -> None:
        """Decode ``r``'s body into ``r.req`` and make the checks that need nothing but
        the request (server/jetstream_api.go does them before a clustered server hands
        the request over); raises ApiError."""
        op, body = r.op, r.body
        req: dict = {}
        if op in ("STREAM.CREATE", "STREAM.UPDATE"):
            req = await self.off_loop(apicore.decode, body, SC.STREAM_CONFIG_REQUEST)
            pedantic = bool(req.pop("pedantic", False))
            cfg = SC.from_request(req)
            if op == "STREAM.CREATE":
                SC.set_static_metadata(cfg)
            req = {"cfg": cfg, "pedantic": pedantic}
            if r.stream != cfg["name"]:
                raise ApiError.of("JSStreamMismatchErr")
            if op == "STREAM.CREATE":
                check_new_stream_request(cfg)
        elif op == "STREAM.INFO":
            if body.strip()[:1] in (b"{", b"["):
                req = apicore.decode(body, apicore.STREAM_INFO_REQUEST)
        elif op == "STREAM.DELETE":
            if not is_empty_request(body):
                raise ApiError.of("JSNotEmptyRequestErr")
        elif op == "STREAM.PURGE":
            if body.strip():
                req = apicore.decode(body, apicore.PURGE_REQUEST)
            if req.get("seq") and req.get("keep"):
                raise ApiError.of("JSBadRequestErr")
        elif op in ("STREAM.NAMES", "STREAM.LIST"):
            req = apicore.decode(body, apicore.NAMES_REQUEST)
        elif op == "STREAM.MSG.GET":
            req = apicore.decode(body, apicore.MSG_GET_REQUEST)
        elif op == "STREAM.MSG.DELETE":
            if is_empty_request(body):
                raise ApiError.of("JSBadRequestErr")
            req = apicore.decode(body, apicore.MSG_DELETE_REQUEST)
        elif op == "CONSUMER.CREATE":
            req = await self.read_consumer_create(r)
        elif op in ("CONSUMER.NAMES", "CONSUMER.LIST"):
            req = apicore.decode(body, apicore.PAGED_REQUEST)
        elif op == "CONSUMER.PAUSE":
            req = apicore.decode(body, apicore.PAUSE_REQUEST)
        elif op == "CONSUMER.UNPIN":
            req = priority.read_unpin_request(r.hdr, body)
        r.req = req

    async def read_consumer_create(self, r: Request) -> dict:
        """The checks of a consumer create that need only the request
        (server/jetstream_api.go jsConsumerCreateRequest): the names in the subject and
        in the configuration agree, a filter in the subject is the configuration's."""
        req = await self.off_loop(apicore.decode, r.body, CC.CREATE_CONSUMER_REQUEST)
        ccfg = CC.from_request(req.get("config") or {})
        cname, kind = r.consumer, r.kind
        if kind == "ephemeral":
            cname = ccfg["name"]
        if r.stream != req.get("stream_name", ""):
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
        filt = r.filter
        if filt and ccfg["filter_subjects"]:
            raise ApiError.of("JSConsumerMultipleFiltersNotAllowed")
        if filt and ccfg["filter_subject"] != filt:
            raise ApiError.of("JSConsumerCreateFilterSubjectMismatchErr")
        if ccfg["num_replicas"] > 1 and self.server.cluster is None:
            raise ApiError.of("JSStreamReplicasNotSupportedErr")
        apicore.check_api_level(r.hdr)
        return {"cfg": ccfg, "name": cname, "action": req.get("action", ""),
                "pedantic": bool(req.get("pedantic"))}

    async def handle(self, jsa, r: Request) -> dict | None:
        """This server's back end: ``r`` decoded and checked, answered from the
        account's streams and consumers here."""
        op = r.op
        if op == "INFO":
            return {"type": T + "account_info_response", **jsa.account_info()}
        if op == "STREAM.NAMES":
            return self.stream_names(jsa, r.req)
        if op == "STREAM.LIST":
            return self.stream_list(jsa, r.req)
        if op == "STREAM.CREATE":
            return await self.stream_create(jsa, r.req)
        if op == "STREAM.UPDATE":
            return await self.stream_update(jsa, r.stream, r.req)
        if op == "STREAM.INFO":
            return self.stream_info(jsa, r.stream, r.req)
        if op == "STREAM.DELETE":
            return await self.stream_delete(jsa, r.stream)
        if op == "STREAM.PURGE":
            return self.stream_purge(jsa, r.stream, r.req)
        if op == "STREAM.SNAPSHOT":
            return snapshot.snapshot_request(self, jsa, r.stream, r.hdr, r.body)
        if op == "STREAM.RESTORE":
            return snapshot.restore_request(self, jsa, r.stream, r.hdr, r.body)
        if op == "STREAM.MSG.GET":
            return self.msg_get(jsa, r.stream, r.req)
        if op == "STREAM.MSG.DELETE":
            return self.msg_delete(jsa, r.stream, r.req)
        if op == "CONSUMER.CREATE":
            return await self.consumer_create(jsa, r)
        if op == "CONSUMER.NAMES":
            return self.consumer_names(jsa, r.stream, r.req)
        if op == "CONSUMER.LIST":
            return self.consumer_list(jsa, r.stream, r.req)
        if op == "CONSUMER.INFO":
            return self.consumer_info(jsa, r.stream, r.consumer)
        if op == "CONSUMER.DELETE":
            return await self.consumer_delete(jsa, r.stream, r.consumer)
        if op == "CONSUMER.PAUSE":
            return await self.consumer_pause(jsa, r.stream, r.consumer, r.req)
        if op == "CONSUMER.UNPIN":
            try:
                _, c = self._consumer(jsa, r.stream, r.consumer)
            except ApiError as exc:
                return err(r.rtype, exc)
            return priority.unpin(c, r.req)
        # leader step-down, peer remove: a cluster's
        return err(r.rtype, ApiError.of("JSClusterRequiredErr"))

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

    def check_context(self, jsa, get_stream=None, pedantic=False) -> SC.CheckContext:
        """What checking a stream configuration of ``jsa`` needs to know: the account's
        other streams' configurations (``get_stream(name)``, by default this server's),
        its limits and the server's."""
        if get_stream is None:
            def get_stream(name):
                s = jsa.streams.get(name)
                return s.cfg if s is not None else None
        lim = jsa.limits
        return SC.CheckContext(get_stream=get_stream, max_bytes_required=lim.max_bytes_required,
                               memory_max_stream_bytes=lim.memory_max_stream_bytes,
                               store_max_stream_bytes=lim.store_max_stream_bytes,
                               pedantic=pedantic,
                               server_dup_window=int(self.js.opts.limits.duplicate_window * 1e9))

    # ---- streams ------------------------------------------------------------------------

    async def stream_create(self, jsa, req: dict) -> dict:
        rtype = "stream_create_response"
        try:
            stream = await self.add_stream(jsa, req["cfg"], req["pedantic"])
        except ApiError as exc:
            return err(rtype, exc)
        return {"type": T + rtype, **stream.info(), "did_create": True}

    async def add_stream(self, jsa, config: dict, pedantic: bool = False) -> Stream:
        """server/stream.go addStream for a single server."""
        ctx = self.check_context(jsa, pedantic=pedantic)
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

    async def stream_update(self, jsa, name: str, req: dict) -> dict:
        rtype = "stream_update_response"
        try:
            cfg, pedantic = req["cfg"], req["pedantic"]
            stream = lookup_stream(jsa, name)
            md = {k: v for k, v in (cfg.get("metadata") or {}).items()
                  if k not in (SC.VERSION_KEY, SC.LEVEL_KEY, SC.REQ_LEVEL_KEY)}
            cfg["metadata"] = md
            # The level the updated configuration needs (lower again when allow_atomic
            # is turned off), as server/jetstream_api.go jsStreamUpdateRequest sets it.
            SC.set_static_metadata(cfg)
            new = await self.off_loop(SC.check_update, stream.cfg, cfg,
                                      self.check_context(jsa, pedantic=pedantic),
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
        except ApiError as exc:
            return err(rtype, exc)
        self.js.advisory("$JS.EVENT.ADVISORY.STREAM.UPDATED." + name,
                         "io.nats.jetstream.advisory.v1.stream_action",
                         {"stream": name, "action": "modify"}, jsa.account)
        return {"type": T + rtype, **stream.info()}

    def stream_info(self, jsa, name: str, req: dict) -> dict:
        rtype = "stream_info_response"
        try:
            stream = lookup_stream(jsa, name)
        except ApiError as exc:
            return err(rtype, exc)
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

    async def stream_delete(self, jsa, name: str) -> dict:
        rtype = "stream_delete_response"
        try:
            stream = lookup_stream(jsa, name)
        except ApiError as exc:
            return err(rtype, exc)
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

    def stream_purge(self, jsa, name: str, req: dict) -> dict:
        rtype = "stream_purge_response"
        try:
            stream = lookup_stream(jsa, name)
            check_purge(stream.cfg)
            n = stream.purge(req.get("filter", ""), req.get("seq", 0), req.get("keep", 0))
        except ApiError as exc:
            return err(rtype, exc)
        return {"type": T + rtype, "success": True, "purged": n}

    def _names_filter(self, jsa, subject: str) -> list:
        names = sorted(jsa.streams)
        if subject and subject != ">":
            names = [n for n in names if any(SC.subjects_collide(subject, s)
                                             for s in jsa.streams[n].cfg["subjects"] or [])]
        return names

    def stream_names(self, jsa, req: dict) -> dict:
        out = self._stream_page(jsa, req, "stream_names_response", NAMES_LIMIT,
                                lambda s: s.name)
        if "streams" in out and not out["streams"]:
            out["streams"] = None
        return out

    def stream_list(self, jsa, req: dict) -> dict:
        return self._stream_page(jsa, req, "stream_list_response", LIST_LIMIT,
                                 lambda s: s.info(dynamic=False))

    def _stream_page(self, jsa, req: dict, rtype: str, limit: int, render) -> dict:
        names = self._names_filter(jsa, req.get("subject", ""))
        offset = min(max(req.get("offset", 0), 0), len(names))
        return {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit,
                "streams": [render(jsa.streams[n]) for n in names[offset:offset + limit]]}

    def msg_get(self, jsa, name: str, req: dict) -> dict:
        rtype = "stream_msg_get_response"
        try:
            stream = lookup_stream(jsa, name)
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
        except ApiError as exc:
            return err(rtype, exc)
        mseq, subj, mhdr, mmsg, ts = rec
        m = {"subject": subj.decode("utf-8", "replace"), "seq": mseq}
        if mhdr:
            m["hdrs"] = base64.b64encode(mhdr).decode()
        if mmsg:
            m["data"] = base64.b64encode(mmsg).decode()
        m["time"] = rfc3339_nano(ts)
        return {"type": T + rtype, "message": m}

    def msg_delete(self, jsa, name: str, req: dict) -> dict:
        rtype = "stream_msg_delete_response"
        try:
            stream = lookup_stream(jsa, name)
            seq = check_msg_delete(stream, req)
            if not stream.delete_msg(seq, erase=not req.get("no_erase", False)):
                raise ApiError.of("JSSequenceNotFoundErrF", seq=seq)
        except ApiError as exc:
            return err(rtype, exc)
        return {"type": T + rtype, "success": True}

    # ---- consumers ----------------------------------------------------------------------

    async def consumer_create(self, jsa, r: Request) -> dict:
        rtype = "consumer_create_response"
        req, hdr = r.req, r.hdr
        ccfg, cname, action, pedantic = req["cfg"], req["name"], req["action"], req["pedantic"]
        try:
            stream = lookup_stream(jsa, r.stream)
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
        except ApiError as exc:
            return err(rtype, exc)
        out = {"type": T + rtype, **consumer.info()}
        if identity is not None:
            out[RESPONSE_HEADERS] = H.make(0, "", [(b"Nats-Stream-Identity", identity.encode())])
        priority.announce_paused(consumer)
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
        stream = lookup_stream(jsa, stream_name)
        c = stream.consumers.get(name)
        if c is None:
            raise ApiError.of("JSConsumerNotFoundErr")
        return stream, c

    def consumer_info(self, jsa, stream_name: str, name: str) -> dict:
        rtype = "consumer_info_response"
        try:
            _, c = self._consumer(jsa, stream_name, name)
        except ApiError as exc:
            return err(rtype, exc)
        return {"type": T + rtype, **c.info()}

    async def consumer_delete(self, jsa, stream_name: str, name: str) -> dict:
        rtype = "consumer_delete_response"
        try:
            stream, c = self._consumer(jsa, stream_name, name)
        except ApiError as exc:
            return err(rtype, exc)
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

    async def consumer_pause(self, jsa, stream_name: str, name: str, req: dict) -> dict:
        rtype = "consumer_pause_response"
        try:
            stream, c = self._consumer(jsa, stream_name, name)
        except ApiError as exc:
            return err(rtype, exc)
        cfg = dict(c.cfg)
        cfg["pause_until"] = req.get("pause_until") or ""
        CC.set_static_metadata(cfg)
        if stream.path and not cfg["mem_storage"]:
            await self._save_consumer_meta(stream, c.name, cfg, c.created)
        c.update_config(cfg)
        return pause_response(cfg)

    def consumer_names(self, jsa, stream_name: str, req: dict) -> dict:
        return self._consumer_page(jsa, stream_name, req, "consumer_names_response",
                                   NAMES_LIMIT, lambda c: c.name)

    def consumer_list(self, jsa, stream_name: str, req: dict) -> dict:
        return self._consumer_page(jsa, stream_name, req, "consumer_list_response",
                                   LIST_LIMIT, lambda c: c.info(dynamic=False))

    def _consumer_page(self, jsa, stream_name: str, req: dict, rtype: str, limit: int,
                       render) -> dict:
        try:
            stream = lookup_stream(jsa, stream_name)
        except ApiError as exc:
            return err(rtype, exc)
        names = sorted(n for n, c in stream.consumers.items() if not c.direct)
        offset = min(max(req.get("offset", 0), 0), len(names))
        return {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit,
                "consumers": [render(stream.consumers[n]) for n in names[offset:offset + limit]]}


def for_advisory(info: dict) -> dict:
    """server/events.go forAdvisory: the requester's ClientInfo without its JWT and
    alternates."""
    return {k: v for k, v in info.items() if k not in ("jwt", "alts")}


def _same_config(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _write_consumer_meta(d: str, cfg: dict, created: int) -> None:
    os.makedirs(d, exist_ok=True)
    write_meta(d, cfg, created)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


__all__ = ["Api", "H"]
