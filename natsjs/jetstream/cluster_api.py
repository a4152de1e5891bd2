"""The JetStream API in a cluster: who answers what, and how changes go through the meta
group (natsjs/jetstream/cluster.py).

Every JetStream server of the cluster receives each ``$JS.API`` request of an account.
* Requests that change or list assignments (stream and consumer create, update,
  delete, names, list, account info, peer remove) are the meta leader's: it validates
  them as a single server would (natsjs/jetstream/api.py, streamcfg.py), places new
  assets, and proposes the change to the meta log.  A new stream's (or consumer's)
  first leader answers the create request once it is elected, so the answer carries
  the real cluster information (as in nats-server).
* Requests about one stream (info, purge, message get and delete, leader step-down)
  are answered by that stream's leader; about one consumer, by that consumer's leader.
* Everyone else stays silent; with no meta leader, everyone answers "JetStream system
  temporarily unavailable" (the client takes the first answer).
"""
from __future__ import annotations

import json

import trio

from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.consumer import ephemeral_name
from natsjs.jetstream.errors import BY_CONSTANT, ApiError
from natsjs.jetstream.jstime import now_ns
from natsjs.jetstream.schema import is_empty_request
from natsjs.jetstream.subjects import any_collide

T = "io.nats.jetstream.api.v1."
# Placement found too few peers (held while some member is yet to be heard from).
NO_PEERS = BY_CONSTANT["JSClusterNoPeersErrF"][2]
NAMES_LIMIT = 1024
LIST_LIMIT = 256


def _err(rtype: str, err: ApiError) -> dict:
    return {"type": T + rtype, "error": err.to_dict()}


async def dispatch(api, jsa, subject: str, hdr, body: bytes, reply: bytes | None):
    js = api.js
    cl = js.cluster
    op = subject.split(".")[2:]
    n = len(op)
    acc = jsa.name
    head = op[0] if op else ""
    kind = op[1] if n > 1 else ""

    # ---- one stream's own requests: its leader answers ----------------------------------
    if head == "STREAM" and ((n == 3 and kind in ("INFO", "PURGE", "SNAPSHOT")) or
                             (n == 4 and kind == "MSG") or
                             (n == 4 and kind == "LEADER")):
        name = op[-1]
        rep = cl.stream_replica(acc, name)
        acts = kind in ("LEADER", "PURGE") or (kind == "MSG" and op[2] == "DELETE")
        if rep is not None and rep.is_leader() and _leads_for(api, rep, acts):
            return await _stream_request(api, jsa, rep, op, body, hdr)
        if not acts and _electing_here(cl, rep):
            api.park(rep)
            return None
        if cl.is_meta_leader() and ("%s %s" % (acc, name)) not in cl.state.streams:
            rtype = {"INFO": "stream_info_response", "PURGE": "stream_purge_response",
                     "SNAPSHOT": "stream_snapshot_response",
                     "MSG": "stream_msg_get_response" if op[2] == "GET"
                     else "stream_msg_delete_response",
                     "LEADER": "stream_leader_stepdown_response"}[kind]
            return _err(rtype, ApiError.of("JSStreamNotFoundErr"))
        return None
    if head == "CONSUMER" and ((n == 4 and kind == "INFO") or (n == 5 and kind == "LEADER")):
        sname, cname = op[-2], op[-1]
        crep = _consumer_replica(cl, acc, sname, cname)
        if crep is not None and crep.is_leader() and _leads_for(api, crep, kind == "LEADER"):
            if kind == "INFO":
                return {"type": T + "consumer_info_response", **crep.consumer.info()}
            return _step_down(crep, "consumer_leader_stepdown_response")
        if kind != "LEADER" and _electing_here(cl, crep):
            api.park(crep)
            return None
        if cl.is_meta_leader():
            if ("%s %s" % (acc, sname)) not in cl.state.streams:
                err = ApiError.of("JSStreamNotFoundErr")
            elif ("%s %s %s" % (acc, sname, cname)) not in cl.state.consumers:
                err = ApiError.of("JSConsumerNotFoundErr")
            else:
                return None
            rtype = {"INFO": "consumer_info_response",
                     "LEADER": "consumer_leader_stepdown_response"}[kind]
            return _err(rtype, err)
        return None

    # ---- the meta leader's requests -----------------------------------------------------
    if cl.leaderless():
        rtype = _meta_rtype(op)
        if rtype is None or cl.hold(api, reply):
            return None
        return _err(rtype, ApiError.of("JSClusterNotAvailErr"))
    if not cl.is_meta_leader():
        cl.pass_on_held(api.server.system_account, subject, reply, hdr, body)
        return None
    if _meta_rtype(op) is not None and not cl.first_answer(reply, hdr):
        return None
    if op == ["INFO"]:
        return {"type": T + "account_info_response", **_account_info(cl, jsa)}
    if head == "STREAM":
        if kind == "CREATE" and n == 3:
            return await _stream_create(api, jsa, op[2], body, reply)
        if kind == "UPDATE" and n == 3:
            return await _stream_update(api, jsa, op[2], body)
        if kind == "DELETE" and n == 3:
            return await _stream_delete(api, jsa, op[2], body)
        if kind in ("NAMES", "LIST") and n == 2:
            return await _stream_page(api, jsa, body, kind == "LIST")
        if kind == "PEER" and n == 4 and op[2] == "REMOVE":
            return await _peer_remove(api, jsa, op[3], body)
        if kind == "RESTORE" and n == 3:
            return await _stream_restore(api, jsa, op[2], hdr, body, reply)
    if head == "CONSUMER":
        if kind == "CREATE" and n == 3:
            return await _consumer_create(api, jsa, op[2], None, None, body, reply, "ephemeral")
        if kind == "CREATE" and n >= 4:
            filt = ".".join(op[4:]) if n > 4 else None
            return await _consumer_create(api, jsa, op[2], op[3], filt, body, reply, "new")
        if kind == "DURABLE" and n == 5 and op[2] == "CREATE":
            return await _consumer_create(api, jsa, op[3], op[4], None, body, reply, "durable")
        if kind == "DELETE" and n == 4:
            return await _consumer_delete(api, jsa, op[2], op[3])
        if kind in ("NAMES", "LIST") and n == 3:
            return await _consumer_page(api, jsa, op[2], body, kind == "LIST")
        if kind == "PAUSE" and n == 4:
            return await _consumer_pause(api, jsa, op[2], op[3], body)
    return None


def _meta_rtype(op: list) -> str | None:
    head = op[0] if op else ""
    kind = op[1] if len(op) > 1 else ""
    table = {("STREAM", "CREATE"): "stream_create_response",
             ("STREAM", "UPDATE"): "stream_update_response",
             ("STREAM", "DELETE"): "stream_delete_response",
             ("STREAM", "NAMES"): "stream_names_response",
             ("STREAM", "LIST"): "stream_list_response",
             ("STREAM", "PEER"): "stream_remove_peer_response",
             ("STREAM", "RESTORE"): "stream_restore_response",
             ("CONSUMER", "CREATE"): "consumer_create_response",
             ("CONSUMER", "DURABLE"): "consumer_create_response",
             ("CONSUMER", "DELETE"): "consumer_delete_response",
             ("CONSUMER", "NAMES"): "consumer_names_response",
             ("CONSUMER", "LIST"): "consumer_list_response",
             ("CONSUMER", "PAUSE"): "consumer_pause_response"}
    if op == ["INFO"]:
        return "account_info_response"
    return table.get((head, kind))


def _electing_here(cl, rep) -> bool:
    """``rep``'s group has no leader at work, and this replica may be the next (it
    knows of no other, or leads but has not caught up yet)."""
    return rep is not None and not rep.closed and not rep.is_leader() and \
        rep.raft.leader in (None, cl.me)


def _leads_for(api, rep, acts: bool) -> bool:
    """The leader ``rep`` answers this request.  One that acts (a step-down, a purge, a
    message delete) is for the leader that led when it arrived: every replica's server
    gets the request, and one that wins an election before it reads it (the successor
    a step-down chose, on a busy machine) must not act on it again (step down again,
    or purge what was published since); nor is such a request parked to be answered
    once elected.  A group with no leader leaves it unanswered, as nats-server does."""
    return not acts or rep.raft.leader_since <= api.received


def _consumer_replica(cl, acc: str, stream: str, name: str):
    for rep in cl.replicas.values():
        if getattr(rep, "kind", "") == "consumer" and rep.ca["acc"] == acc and \
                rep.ca["stream"] == stream and rep.name == name:
            return rep
    return None


def _step_down(rep, rtype: str) -> dict:
    try:
        rep.raft.transfer_leadership()
    except Exception as exc:
        return _err(rtype, ApiError.of("JSRaftGeneralErrF", err=str(exc)))
    return {"type": T + rtype, "success": True}


async def _stream_request(api, jsa, rep, op: list, body: bytes, hdr=None):
    kind = op[1]
    name = rep.name
    if kind == "INFO":
        return api.stream_info(jsa, name, body)
    if kind == "SNAPSHOT":
        # the leader holds every committed message: it sends the archive as a single
        # server does (snapshot.py)
        from natsjs.jetstream import snapshot
        return snapshot.snapshot_request(api, jsa, name, hdr, body)
    if kind == "LEADER":
        return _step_down(rep, "stream_leader_stepdown_response")
    if kind == "PURGE":
        rtype = "stream_purge_response"
        try:
            req = api._decode(body, _purge_schema()) if body.strip() else {}
            cfg = rep.stream.cfg
            if cfg["sealed"]:
                raise ApiError.of("JSStreamSealedErr")
            if cfg["deny_purge"]:
                raise ApiError.of("JSStreamPurgeFailedF", err="stream purge not permitted")
            n = await rep.propose_op({"op": "purge", "filter": req.get("filter", ""),
                                      "seq": req.get("seq", 0), "keep": req.get("keep", 0)})
        except ApiError as err:
            return {**_err(rtype, err), "success": False, "purged": 0}
        return {"type": T + rtype, "success": True, "purged": n or 0}
    if kind == "MSG" and op[2] == "GET":
        return api.msg_get(jsa, name, body)
    if kind == "MSG" and op[2] == "DELETE":
        rtype = "stream_msg_delete_response"
        try:
            if is_empty_request(body):
                raise ApiError.of("JSBadRequestErr")
            req = api._decode(body, _delete_schema())
            cfg = rep.stream.cfg
            if cfg["sealed"]:
                raise ApiError.of("JSStreamSealedErr")
            if cfg["deny_delete"]:
                raise ApiError.of("JSStreamMsgDeleteFailedF", err="message delete not permitted")
            seq = req.get("seq", 0)
            refusal = rep.stream.delete_refusal(seq)
            if refusal is not None:
                raise refusal
            ok = await rep.propose_op({"op": "delete", "seq": seq,
                                       "erase": not req.get("no_erase", False)})
            if not ok:
                raise ApiError.of("JSSequenceNotFoundErrF", seq=seq)
        except ApiError as err:
            return _err(rtype, err)
        return {"type": T + rtype, "success": True}
    return None


def _purge_schema():
    from natsjs.jetstream.api import PURGE_REQUEST
    return PURGE_REQUEST


def _delete_schema():
    from natsjs.jetstream.api import MSG_DELETE_REQUEST
    return MSG_DELETE_REQUEST


def _account_info(cl, jsa) -> dict:
    streams = [sa for sa in cl.state.streams.values() if sa["acc"] == jsa.name]
    consumers = [ca for ca in cl.state.consumers.values() if ca["acc"] == jsa.name]
    info = jsa.account_info()
    info["streams"] = len(streams)
    info["consumers"] = len(consumers)
    return info


def _check_context(api, cl, jsa, pedantic: bool) -> SC.CheckContext:
    def get_stream(name):
        sa = cl.state.streams.get("%s %s" % (jsa.name, name))
        return sa["cfg"] if sa is not None else None
    lim = jsa.limits
    return SC.CheckContext(get_stream=get_stream, max_bytes_required=lim.max_bytes_required,
                           max_stream_bytes=-1, pedantic=pedantic,
                           server_dup_window=int(api.js.opts.limits.duplicate_window * 1e9))


async def _stream_create(api, jsa, name: str, body: bytes, reply):
    cl = api.js.cluster
    rtype = "stream_create_response"
    try:
        req = await api.off_loop(api._decode, body, SC.STREAM_CONFIG_REQUEST)
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
        cfg = await api.off_loop(SC.check_stream_config, cfg,
                                 _check_context(api, cl, jsa, pedantic))
        key = "%s %s" % (jsa.name, name)
        existing = cl.state.streams.get(key)
        if existing is not None:
            ocfg = existing["cfg"]
            md = dict(cfg.get("metadata") or {})
            if (ocfg.get("metadata") or {}).get(SC.REQ_LEVEL_KEY) is not None:
                md[SC.REQ_LEVEL_KEY] = ocfg["metadata"][SC.REQ_LEVEL_KEY]
            if json.dumps(dict(cfg, metadata=md or None), sort_keys=True) != \
                    json.dumps(ocfg, sort_keys=True):
                raise ApiError.of("JSStreamNameExistErr")
            info = await cl.remote_stream_info(jsa.name, name)
            if info is None:
                raise ApiError.of("JSClusterNotAvailErr")
            return {"type": T + rtype, **info, "did_create": True}
        await _assign_new_stream(api, cl, jsa, cfg, reply)
    except ApiError as err:
        if err.err_code == NO_PEERS and cl.peers_unheard() and cl.hold(api, reply):
            return None     # dispatched again when a peer is heard from
        return _err(rtype, err)
    except trio.TooSlowError:
        return _err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return None     # the stream's first leader answers


async def _assign_new_stream(api, cl, jsa, cfg: dict, reply, restore: bool = False) -> None:
    """The account's limits and the other streams' subjects allow it: place a new
    stream and propose its assignment."""
    from natsjs.jetstream.cluster import group_name
    lim = jsa.limits
    count = sum(1 for sa in cl.state.streams.values() if sa["acc"] == jsa.name)
    if lim.max_streams > 0 and count >= lim.max_streams:
        raise ApiError.of("JSMaximumStreamsLimitErr")
    others = [sa["cfg"] for sa in cl.state.streams.values() if sa["acc"] == jsa.name]
    if await api.off_loop(any_collide, cfg["subjects"] or [], SC.subjects_of(others)):
        raise ApiError.of("JSStreamSubjectOverlapErr")
    peers = cl.place(cfg)
    group = {"name": group_name("S", len(peers), cfg["storage"]), "peers": peers}
    op = {"op": "stream", "acc": jsa.name, "cfg": cfg, "group": group, "created": now_ns(),
          "reply": reply.decode() if reply else None}
    if restore:
        op["restore"] = True
    await cl.propose_meta(op)


async def _stream_restore(api, jsa, name: str, hdr, body: bytes, reply):
    """server/jetstream_cluster.go jsClusteredStreamRestoreRequest: the meta leader
    checks the request and assigns the stream with a restore to do; the group's first
    leader answers with the subject for the archive (snapshot.ClusterRestore)."""
    from natsjs.jetstream import snapshot
    cl = api.js.cluster
    try:
        cfg = snapshot.check_restore_request(api, jsa, name, hdr, body,
                                             _check_context(api, cl, jsa, False))
        if ("%s %s" % (jsa.name, name)) in cl.state.streams:
            raise ApiError.of("JSStreamNameExistRestoreFailedErr")
        await _assign_new_stream(api, cl, jsa, cfg, reply, restore=True)
    except ApiError as err:
        return snapshot.restore_error(api, err)
    except trio.TooSlowError:
        return snapshot.restore_error(api, ApiError.of("JSClusterNotAvailErr"))
    return None


async def assign_restored_consumers(cl, sa: dict, leader, consumers: list) -> None:
    """The consumers a restored stream's archive held, with their state, on the
    stream's peers (its leader first)."""
    from natsjs.jetstream.cluster import group_name
    stream = sa["cfg"]["name"]
    for c in consumers:
        if ("%s %s %s" % (sa["acc"], stream, c["name"])) in cl.state.consumers:
            continue
        cfg = CC.blank_config()
        cfg.update(c["config"])
        peers = _consumer_peers(cfg, sa["group"]["peers"], [leader] if leader else [])
        group = {"name": group_name("C", len(peers), sa["cfg"]["storage"]), "peers": peers}
        await cl.propose_meta({"op": "consumer", "acc": sa["acc"], "stream": stream,
                               "name": c["name"], "cfg": cfg, "group": group,
                               "created": c.get("created") or now_ns(),
                               "state": c["state"]})


async def _stream_update(api, jsa, name: str, body: bytes):
    cl = api.js.cluster
    rtype = "stream_update_response"
    try:
        req = await api.off_loop(api._decode, body, SC.STREAM_CONFIG_REQUEST)
        pedantic = bool(req.pop("pedantic", False))
        cfg = SC.from_request(req)
        if name != cfg["name"]:
            raise ApiError.of("JSStreamMismatchErr")
        key = "%s %s" % (jsa.name, name)
        sa = cl.state.streams.get(key)
        if sa is None:
            raise ApiError.of("JSStreamNotFoundErr")
        md = {k: v for k, v in (cfg.get("metadata") or {}).items()
              if k not in (SC.VERSION_KEY, SC.LEVEL_KEY, SC.REQ_LEVEL_KEY)}
        cfg["metadata"] = md
        SC.set_static_metadata(cfg)
        new = await api.off_loop(SC.check_update, sa["cfg"], cfg,
                                 _check_context(api, cl, jsa, pedantic), False)
        others = [o["cfg"] for o in cl.state.streams.values()
                  if o is not sa and o["acc"] == jsa.name]
        if await api.off_loop(any_collide, new["subjects"] or [], SC.subjects_of(others)):
            raise ApiError.of("JSStreamSubjectOverlapErr")
        peers = list(sa["group"]["peers"])
        want = new["num_replicas"]
        if want > len(peers):
            peers = cl.place(new, existing=peers)
        elif want < len(peers):
            leader = _leader_of(cl, sa)
            keep = [leader] if leader in peers else []
            peers = keep + [p for p in peers if p not in keep][:want - len(keep)]
        group = dict(sa["group"], peers=peers)
        await cl.propose_meta({"op": "stream", "acc": jsa.name, "cfg": new, "group": group,
                               "created": sa["created"]})
        await _consumers_follow(cl, jsa.name, name, peers)
        info = await _info_when_applied(cl, jsa.name, name, new)
        if info is None:
            raise ApiError.of("JSClusterNotAvailErr")
    except ApiError as err:
        return _err(rtype, err)
    except trio.TooSlowError:
        return _err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return {"type": T + rtype, **info}


def _consumer_peers(cfg: dict, stream_peers, prefer=()) -> list:
    """A consumer's peers among its stream's: as many as its num_replicas (0: the
    stream's count for durables, 1 for ephemerals), those in ``prefer`` first."""
    r = cfg["num_replicas"] or (len(stream_peers) if cfg["durable_name"] else 1)
    first = [p for p in prefer if p in stream_peers]
    return (first + [p for p in stream_peers if p not in first])[:r]


async def _consumers_follow(cl, acc: str, stream: str, peers) -> None:
    """The stream's consumers move with it to the new peer set (those that inherit the
    stream's replica count change it too), keeping the peers they still share."""
    for ca in list(cl.state.consumers.values()):
        if ca["acc"] != acc or ca["stream"] != stream:
            continue
        new = _consumer_peers(ca["cfg"], peers, ca["group"]["peers"])
        if new != ca["group"]["peers"]:
            await cl.propose_meta({"op": "consumer", "acc": acc, "stream": stream,
                                   "name": ca["name"], "cfg": ca["cfg"],
                                   "group": dict(ca["group"], peers=new),
                                   "created": ca["created"]})


def _leader_of(cl, sa: dict):
    rep = cl.stream_replica(sa["acc"], sa["cfg"]["name"])
    if rep is not None:
        return rep.raft.leader
    return None


def _user_config(cfg: dict) -> dict:
    """A stream configuration less the ``_nats.*`` metadata the server adds on its own."""
    md = {k: v for k, v in (cfg.get("metadata") or {}).items() if not k.startswith("_nats.")}
    return dict(cfg, metadata=md)


async def _info_when_applied(cl, acc: str, name: str, cfg: dict, timeout: float = 5.0):
    """Stream info from the leader once it runs with ``cfg`` (all of it: an update that
    changes only a limit must not answer with the configuration before it)."""
    want = _user_config(SC.config_json(cfg))
    with trio.move_on_after(timeout):
        while True:
            info = await cl.remote_stream_info(acc, name, timeout=1.0)
            if info is not None and _user_config(info["config"]) == want:
                return info
            await trio.sleep(0.05)
    return await cl.remote_stream_info(acc, name, timeout=1.0)


async def _stream_delete(api, jsa, name: str, body: bytes):
    cl = api.js.cluster
    rtype = "stream_delete_response"
    if not is_empty_request(body):
        return _err(rtype, ApiError.of("JSNotEmptyRequestErr"))
    if ("%s %s" % (jsa.name, name)) not in cl.state.streams:
        return _err(rtype, ApiError.of("JSStreamNotFoundErr"))
    try:
        await cl.propose_meta({"op": "stream_del", "acc": jsa.name, "name": name})
    except trio.TooSlowError:
        return _err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return {"type": T + rtype, "success": True}


async def _stream_page(api, jsa, body: bytes, full: bool):
    cl = api.js.cluster
    rtype = "stream_list_response" if full else "stream_names_response"
    try:
        from natsjs.jetstream.api import NAMES_REQUEST
        req = api._decode(body, NAMES_REQUEST)
    except ApiError as err:
        return _err(rtype, err)
    filt = req.get("subject", "")
    names = sorted(sa["cfg"]["name"] for sa in cl.state.streams.values()
                   if sa["acc"] == jsa.name and (not filt or filt == ">" or any(
                       SC.subjects_collide(filt, s) for s in sa["cfg"]["subjects"] or [])))
    offset = max(req.get("offset", 0), 0)
    limit = LIST_LIMIT if full else NAMES_LIMIT
    page = names[offset:offset + limit]
    out = {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit}
    if not full:
        out["streams"] = page or None
        return out
    infos = []
    missing = []
    for name in page:
        info = await cl.remote_stream_info(jsa.name, name, timeout=1.0)
        if info is None:
            missing.append(name)
        else:
            infos.append(info)
    out["streams"] = infos
    if missing:
        out["missing"] = missing
    return out


async def _peer_remove(api, jsa, name: str, body: bytes):
    """$JS.API.STREAM.PEER.REMOVE: the named peer leaves the stream's group, a new one is
    placed by the same rules and caught up by Raft."""
    cl = api.js.cluster
    rtype = "stream_remove_peer_response"
    try:
        req = json.loads(body or b"{}")
        peer_name = req.get("peer", "")
    except ValueError as exc:
        return _err(rtype, ApiError.of("JSInvalidJSONErr", err=str(exc)))
    sa = cl.state.streams.get("%s %s" % (jsa.name, name))
    if sa is None:
        return _err(rtype, ApiError.of("JSStreamNotFoundErr"))
    peer = cl.peer_of_name(peer_name)
    if peer is None or peer not in sa["group"]["peers"]:
        return _err(rtype, ApiError.of("JSClusterPeerNotMemberErr"))
    try:
        keep = [p for p in sa["group"]["peers"] if p != peer]
        peers = cl.place(sa["cfg"], existing=keep, ignore=[peer])
    except ApiError as err:
        return _err(rtype, err)
    await cl.propose_meta({"op": "stream", "acc": jsa.name, "cfg": sa["cfg"],
                           "group": dict(sa["group"], peers=peers), "created": sa["created"]})
    await _consumers_follow(cl, jsa.name, name, peers)
    return {"type": T + rtype, "success": True}


async def _consumer_create(api, jsa, stream_name: str, cname, filt, body: bytes, reply,
                           kind: str):
    from natsjs.jetstream.cluster import group_name
    cl = api.js.cluster
    rtype = "consumer_create_response"
    try:
        req = await api.off_loop(api._decode, body, CC.CREATE_CONSUMER_REQUEST)
        ccfg = CC.from_request(req.get("config") or {})
        action = req.get("action", "")
        pedantic = bool(req.get("pedantic"))
        if kind == "ephemeral":
            cname = ccfg["name"]
        if stream_name != req.get("stream_name", ""):
            raise ApiError.of("JSStreamMismatchErr")
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
        sa = cl.state.streams.get("%s %s" % (jsa.name, stream_name))
        if sa is None:
            raise ApiError.of("JSStreamNotFoundErr")
        scfg = sa["cfg"]
        CC.set_static_metadata(ccfg)
        cfg = CC.set_defaults(ccfg, scfg, api.js.opts.limits, jsa.limits, pedantic)
        await api.off_loop(CC.check_config, cfg, scfg, api.js.opts.limits, jsa.limits)
        if cfg["direct"] or cfg["sourcing"]:
            # A mirror's or source's consumer: a new name every time on a limits stream.
            from natsjs.jetstream.api import sourcing_consumer_name
            sourcing_consumer_name(scfg, cfg)
        name = cfg["durable_name"] or cfg["name"]
        existing = cl.state.consumers.get("%s %s %s" % (jsa.name, stream_name, name)) \
            if name else None
        if existing is not None:
            if action == "create" and existing["cfg"] != cfg:
                raise ApiError.of("JSConsumerAlreadyExists")
            CC.check_update(existing["cfg"], cfg, lambda s: False)
            await cl.propose_meta({"op": "consumer", "acc": jsa.name, "stream": stream_name,
                                   "name": name, "cfg": cfg, "group": existing["group"],
                                   "created": existing["created"]})
            info = await _consumer_info(cl, jsa.name, stream_name, name)
            if info is None:
                raise ApiError.of("JSClusterNotAvailErr")
            return {"type": T + rtype, **info}
        if action == "update":
            raise ApiError.of("JSConsumerDoesNotExist")
        if not name:
            name = ephemeral_name()
            cfg["name"] = name
        if not cfg["durable_name"] and cfg["inactive_threshold"] == 0:
            cfg["inactive_threshold"] = CC.DEFAULT_DELETE_WAIT
        maxc = scfg["max_consumers"]
        count = sum(1 for ca in cl.state.consumers.values()
                    if ca["acc"] == jsa.name and ca["stream"] == stream_name)
        if maxc > 0 and count >= maxc:
            raise ApiError.of("JSMaximumConsumersLimitErr")
        leader = _leader_of(cl, sa)
        peers = _consumer_peers(cfg, sa["group"]["peers"], [leader] if leader else [])
        group = {"name": group_name("C", len(peers), scfg["storage"]), "peers": peers}
        await cl.propose_meta({"op": "consumer", "acc": jsa.name, "stream": stream_name,
                               "name": name, "cfg": cfg, "group": group, "created": now_ns(),
                               "reply": reply.decode() if reply else None})
    except ApiError as err:
        return _err(rtype, err)
    except trio.TooSlowError:
        return _err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return None     # the consumer's first leader answers


async def _consumer_info(cl, acc: str, stream: str, name: str, timeout: float = 2.0):
    crep = _consumer_replica(cl, acc, stream, name)
    if crep is not None and crep.is_leader():
        return crep.consumer.info()
    return await cl.request(b"$JSC.CINFO.%s" % cl.me.encode(),
                            {"acc": acc, "stream": stream, "name": name}, timeout)


async def _consumer_delete(api, jsa, stream: str, name: str):
    cl = api.js.cluster
    rtype = "consumer_delete_response"
    if ("%s %s" % (jsa.name, stream)) not in cl.state.streams:
        return _err(rtype, ApiError.of("JSStreamNotFoundErr"))
    if ("%s %s %s" % (jsa.name, stream, name)) not in cl.state.consumers:
        return _err(rtype, ApiError.of("JSConsumerNotFoundErr"))
    try:
        await cl.propose_meta({"op": "consumer_del", "acc": jsa.name, "stream": stream,
                               "name": name})
    except trio.TooSlowError:
        return _err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return {"type": T + rtype, "success": True}


async def _consumer_page(api, jsa, stream: str, body: bytes, full: bool):
    cl = api.js.cluster
    rtype = "consumer_list_response" if full else "consumer_names_response"
    try:
        from natsjs.jetstream.api import PAGED_REQUEST
        req = api._decode(body, PAGED_REQUEST)
    except ApiError as err:
        return _err(rtype, err)
    if ("%s %s" % (jsa.name, stream)) not in cl.state.streams:
        return _err(rtype, ApiError.of("JSStreamNotFoundErr"))
    names = sorted(ca["name"] for ca in cl.state.consumers.values()
                   if ca["acc"] == jsa.name and ca["stream"] == stream and
                   not ca["cfg"].get("direct"))
    offset = max(req.get("offset", 0), 0)
    limit = LIST_LIMIT if full else NAMES_LIMIT
    page = names[offset:offset + limit]
    out = {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit}
    if not full:
        out["consumers"] = page
        return out
    infos = []
    for name in page:
        info = await _consumer_info(cl, jsa.name, stream, name, timeout=1.0)
        if info is not None:
            infos.append(info)
    out["consumers"] = infos
    return out


async def _consumer_pause(api, jsa, stream: str, name: str, body: bytes):
    """server/jetstream_api.go jsConsumerPauseRequest in a cluster: the meta leader
    proposes the consumer's assignment with the new ``pause_until``, so every replica
    (and whichever leads next) pauses alike."""
    from natsjs.jetstream.api import PAUSE_REQUEST, pause_response
    cl = api.js.cluster
    rtype = "consumer_pause_response"
    try:
        req = api._decode(body, PAUSE_REQUEST)
        if ("%s %s" % (jsa.name, stream)) not in cl.state.streams:
            raise ApiError.of("JSStreamNotFoundErr")
        ca = cl.state.consumers.get("%s %s %s" % (jsa.name, stream, name))
        if ca is None:
            raise ApiError.of("JSConsumerNotFoundErr")
        cfg = dict(ca["cfg"])
        cfg["pause_until"] = req.get("pause_until") or ""
        CC.set_static_metadata(cfg)
        await cl.propose_meta({"op": "consumer", "acc": jsa.name, "stream": stream,
                               "name": name, "cfg": cfg, "group": ca["group"],
                               "created": ca["created"]})
    except ApiError as err:
        return api._err(rtype, err)
    except trio.TooSlowError:
        return api._err(rtype, ApiError.of("JSClusterNotAvailErr"))
    # Answer once the consumer's leader runs with it, so the info a client asks for
    # next shows the pause (or its end); nats-server answers on proposing.
    want = cfg["pause_until"]
    with trio.move_on_after(2.0):
        while True:
            info = await _consumer_info(cl, jsa.name, stream, name, timeout=1.0)
            if info is not None and (info.get("config") or {}).get("pause_until", "") == want:
                break
            await trio.sleep(0.02)
    return pause_response(cfg)


def on_consumer_info_request(cl, sub, subject, reply, hdr, msg) -> None:
    """$JSC.CINFO.*: a consumer's leader answers with its info (for the meta leader)."""
    if not reply:
        return
    try:
        req = json.loads(msg)
        crep = _consumer_replica(cl, req["acc"], req["stream"], req["name"])
    except (ValueError, KeyError, TypeError):
        return
    if crep is None or not crep.is_leader():
        return
    cl.server.deliver(cl.server.system_account, reply, None,
                      json.dumps(crep.consumer.info(), separators=(",", ":")).encode())
