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

api.Api.dispatch asks ``gate`` whether this server answers, then decodes and checks the
request once (as for a single server) and hands it to ``handle``; the subjects, request
schemas and the one error reply are apicore.py's.
"""
from __future__ import annotations

import json

import trio

from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import priority
from natsjs.jetstream import snapshot
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.apicore import (LIST_LIMIT, NAMES_LIMIT, PEER_REMOVE_REQUEST, T,
                                      Request, check_msg_delete, check_purge,
                                      decode_required, err, pause_response,
                                      sourcing_consumer_name)
from natsjs.jetstream.cluster import consumer_peers, group_name
from natsjs.jetstream.consumer import ephemeral_name
from natsjs.jetstream.errors import BY_CONSTANT, ApiError
from natsjs.jetstream.jstime import now_ns
from natsjs.jetstream.subjects import any_collide

# Placement found too few peers (held while some member is yet to be heard from).
NO_PEERS = BY_CONSTANT["JSClusterNoPeersErrF"][2]
# gate: this server answers the request, once it is decoded and checked.
PROCEED = object()

# Requests about one stream, its leader answers; those that act on it.
_STREAM_OPS = ("STREAM.INFO", "STREAM.PURGE", "STREAM.SNAPSHOT", "STREAM.MSG.GET",
               "STREAM.MSG.DELETE", "STREAM.LEADER.STEPDOWN")
_STREAM_ACTS = ("STREAM.PURGE", "STREAM.MSG.DELETE", "STREAM.LEADER.STEPDOWN")
_CONSUMER_OPS = ("CONSUMER.INFO", "CONSUMER.LEADER.STEPDOWN", "CONSUMER.UNPIN")


async def gate(api, jsa, r: Request, reply: bytes | None):
    """Whether this server answers ``r`` (api.Api.dispatch asks before decoding it):
    PROCEED; None to stay silent (another server answers, or it waits here for a
    leader); or the answer now (the stream or consumer is not there, the cluster
    has no meta leader)."""
    cl = api.js.cluster
    acc = jsa.name
    op = r.op
    if op in _STREAM_OPS:
        rep = cl.stream_replica(acc, r.stream)
        acts = op in _STREAM_ACTS
        if rep is not None and rep.is_leader() and _leads_for(api, rep, acts):
            r.replica = rep
            return PROCEED
        if not acts and _electing_here(cl, rep):
            api.park(rep)
            return None
        if cl.is_meta_leader() and ("%s %s" % (acc, r.stream)) not in cl.state.streams:
            return err(r.rtype, ApiError.of("JSStreamNotFoundErr"))
        return None
    if op in _CONSUMER_OPS:
        leader_op = op == "CONSUMER.LEADER.STEPDOWN"
        crep = cl.consumer_replica(acc, r.stream, r.consumer)
        if crep is not None and crep.is_leader() and _leads_for(api, crep, leader_op):
            r.replica = crep
            return PROCEED
        if not leader_op and _electing_here(cl, crep):
            api.park(crep)
            return None
        if cl.is_meta_leader():
            if ("%s %s" % (acc, r.stream)) not in cl.state.streams:
                return err(r.rtype, ApiError.of("JSStreamNotFoundErr"))
            if ("%s %s %s" % (acc, r.stream, r.consumer)) not in cl.state.consumers:
                return err(r.rtype, ApiError.of("JSConsumerNotFoundErr"))
        return None
    # ---- the meta leader's requests -----------------------------------------------------
    if cl.leaderless():
        if cl.hold(api, reply):
            return None
        return err(r.rtype, ApiError.of("JSClusterNotAvailErr"))
    if not cl.is_meta_leader():
        cl.pass_on_held(api.server.system_account, r.subject, reply, r.hdr, r.body)
        return None
    if not cl.first_answer(reply, r.hdr):
        return None
    return PROCEED


async def handle(api, jsa, r: Request, reply: bytes | None):
    """The clustered back end: ``r``, decoded and checked (api.Api.read), which
    ``gate`` let through."""
    cl = api.js.cluster
    op = r.op
    if op in _STREAM_OPS:
        return await _stream_request(api, jsa, r.replica, r)
    if op == "CONSUMER.INFO":
        return {"type": T + r.rtype, **r.replica.consumer.info()}
    if op == "CONSUMER.LEADER.STEPDOWN":
        return _step_down(cl, r.replica, r)
    if op == "CONSUMER.UNPIN":
        return priority.unpin(r.replica.consumer, r.req)
    if op == "INFO":
        return {"type": T + r.rtype, **_account_info(cl, jsa)}
    if op == "STREAM.CREATE":
        return await _stream_create(api, jsa, r.req, reply)
    if op == "STREAM.UPDATE":
        return await _stream_update(api, jsa, r.stream, r.req)
    if op == "STREAM.DELETE":
        return await _stream_delete(api, jsa, r.stream)
    if op in ("STREAM.NAMES", "STREAM.LIST"):
        return await _stream_page(api, jsa, r.req, op == "STREAM.LIST")
    if op == "STREAM.PEER.REMOVE":
        return await _peer_remove(api, jsa, r.stream, r.body)
    if op == "STREAM.RESTORE":
        return await _stream_restore(api, jsa, r.stream, r.hdr, r.body, reply)
    if op == "CONSUMER.CREATE":
        return await _consumer_create(api, jsa, r, reply)
    if op == "CONSUMER.DELETE":
        return await _consumer_delete(api, jsa, r.stream, r.consumer)
    if op in ("CONSUMER.NAMES", "CONSUMER.LIST"):
        return await _consumer_page(api, jsa, r.stream, r.req, op == "CONSUMER.LIST")
    if op == "CONSUMER.PAUSE":
        return await _consumer_pause(api, jsa, r.stream, r.consumer, r.req)
    return None


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


def _step_down(cl, rep, r: Request) -> dict:
    """A stream's or consumer's leader hands over (``JSCluster.step_down_target``)."""
    rtype = r.rtype
    try:
        to = cl.step_down_target(rep.raft, r.body)
    except ApiError as exc:
        return err(rtype, exc)
    try:
        rep.raft.transfer_leadership(to)
    except Exception as exc:
        return err(rtype, ApiError.of("JSRaftGeneralErrF", err=str(exc)))
    return {"type": T + rtype, "success": True}


async def _stream_request(api, jsa, rep, r: Request):
    """A request about one stream, on its leader here."""
    op, rtype, name, req = r.op, r.rtype, rep.name, r.req
    if op == "STREAM.INFO":
        return api.stream_info(jsa, name, req)
    if op == "STREAM.SNAPSHOT":
        # the leader holds every committed message: it sends the archive as a single
        # server does (snapshot.py)
        return snapshot.snapshot_request(api, jsa, name, r.hdr, r.body)
    if op == "STREAM.LEADER.STEPDOWN":
        return _step_down(api.js.cluster, rep, r)
    if op == "STREAM.PURGE":
        try:
            check_purge(rep.stream.cfg)
            n = await rep.propose_op({"op": "purge", "filter": req.get("filter", ""),
                                      "seq": req.get("seq", 0), "keep": req.get("keep", 0)})
        except ApiError as exc:
            return err(rtype, exc)
        return {"type": T + rtype, "success": True, "purged": n or 0}
    if op == "STREAM.MSG.GET":
        return api.msg_get(jsa, name, req)
    if op == "STREAM.MSG.DELETE":
        try:
            seq = check_msg_delete(rep.stream, req)
            ok = await rep.propose_op({"op": "delete", "seq": seq,
                                       "erase": not req.get("no_erase", False)})
            if not ok:
                raise ApiError.of("JSSequenceNotFoundErrF", seq=seq)
        except ApiError as exc:
            return err(rtype, exc)
        return {"type": T + rtype, "success": True}
    return None


def _account_info(cl, jsa) -> dict:
    streams = [sa for sa in cl.state.streams.values() if sa["acc"] == jsa.name]
    consumers = [ca for ca in cl.state.consumers.values() if ca["acc"] == jsa.name]
    info = jsa.account_info()
    info["streams"] = len(streams)
    info["consumers"] = len(consumers)
    return info


def _check_context(api, cl, jsa, pedantic: bool) -> SC.CheckContext:
    """Stream configurations are checked against the assignments."""
    def get_stream(name):
        sa = cl.state.streams.get("%s %s" % (jsa.name, name))
        return sa["cfg"] if sa is not None else None
    return api.check_context(jsa, get_stream, pedantic)


async def _stream_create(api, jsa, req: dict, reply):
    cl = api.js.cluster
    rtype = "stream_create_response"
    name = req["cfg"]["name"]
    try:
        cfg = await api.off_loop(SC.check_stream_config, req["cfg"],
                                 _check_context(api, cl, jsa, req["pedantic"]))
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
    except ApiError as exc:
        if exc.err_code == NO_PEERS and cl.peers_unheard() and cl.hold(api, reply):
            return None     # dispatched again when a peer is heard from
        return err(rtype, exc)
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return None     # the stream's first leader answers


async def _assign_new_stream(api, cl, jsa, cfg: dict, reply, restore: bool = False) -> None:
    """The account's limits and the other streams' subjects allow it: place a new
    stream and propose its assignment."""
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
    cl = api.js.cluster
    rtype = "stream_restore_response"
    try:
        cfg = snapshot.check_restore_request(name, hdr, body,
                                             _check_context(api, cl, jsa, False))
        if ("%s %s" % (jsa.name, name)) in cl.state.streams:
            raise ApiError.of("JSStreamNameExistRestoreFailedErr")
        await _assign_new_stream(api, cl, jsa, cfg, reply, restore=True)
    except ApiError as exc:
        return err(rtype, exc)
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return None


async def _stream_update(api, jsa, name: str, req: dict):
    cl = api.js.cluster
    rtype = "stream_update_response"
    try:
        cfg, pedantic = req["cfg"], req["pedantic"]
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
    except ApiError as exc:
        return err(rtype, exc)
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return {"type": T + rtype, **info}


async def _consumers_follow(cl, acc: str, stream: str, peers) -> None:
    """The stream's consumers move with it to the new peer set (those that inherit the
    stream's replica count change it too), keeping the peers they still share."""
    for ca in list(cl.state.consumers.values()):
        if ca["acc"] != acc or ca["stream"] != stream:
            continue
        new = consumer_peers(ca["cfg"], peers, ca["group"]["peers"])
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


async def _stream_delete(api, jsa, name: str):
    cl = api.js.cluster
    rtype = "stream_delete_response"
    if ("%s %s" % (jsa.name, name)) not in cl.state.streams:
        return err(rtype, ApiError.of("JSStreamNotFoundErr"))
    try:
        await cl.propose_meta({"op": "stream_del", "acc": jsa.name, "name": name})
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return {"type": T + rtype, "success": True}


async def _stream_page(api, jsa, req: dict, full: bool):
    """server/jetstream_api.go jsStreamNamesRequest and jetstream_cluster.go
    jsClusteredStreamListRequest, with their paging as it is: the offset is kept within
    the names; the names page is null when no stream matched at all (an empty list past
    the end); a list page that comes out empty says total 0."""
    cl = api.js.cluster
    rtype = "stream_list_response" if full else "stream_names_response"
    filt = req.get("subject", "")
    names = sorted(sa["cfg"]["name"] for sa in cl.state.streams.values()
                   if sa["acc"] == jsa.name and (not filt or filt == ">" or any(
                       SC.subjects_collide(filt, s) for s in sa["cfg"]["subjects"] or [])))
    offset = min(max(req.get("offset", 0), 0), len(names))
    limit = LIST_LIMIT if full else NAMES_LIMIT
    page = names[offset:offset + limit]
    out = {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit}
    if not full:
        out["streams"] = page if names else None
        return out
    if not page:
        out["total"] = 0
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
        peer_name = decode_required(body, PEER_REMOVE_REQUEST).get("peer", "")
        if not peer_name:
            raise ApiError.of("JSBadRequestErr")
    except ApiError as exc:
        return err(rtype, exc)
    sa = cl.state.streams.get("%s %s" % (jsa.name, name))
    if sa is None:
        return err(rtype, ApiError.of("JSStreamNotFoundErr"))
    peer = cl.peer_of_name(peer_name)
    if peer is None or peer not in sa["group"]["peers"]:
        return err(rtype, ApiError.of("JSClusterPeerNotMemberErr"))
    try:
        keep = [p for p in sa["group"]["peers"] if p != peer]
        peers = cl.place(sa["cfg"], existing=keep, ignore=[peer])
    except ApiError as exc:
        return err(rtype, exc)
    await cl.propose_meta({"op": "stream", "acc": jsa.name, "cfg": sa["cfg"],
                           "group": dict(sa["group"], peers=peers), "created": sa["created"]})
    await _consumers_follow(cl, jsa.name, name, peers)
    return {"type": T + rtype, "success": True}


async def _consumer_create(api, jsa, r: Request, reply):
    cl = api.js.cluster
    rtype = "consumer_create_response"
    stream_name = r.stream
    ccfg, action, pedantic = r.req["cfg"], r.req["action"], r.req["pedantic"]
    try:
        sa = cl.state.streams.get("%s %s" % (jsa.name, stream_name))
        if sa is None:
            raise ApiError.of("JSStreamNotFoundErr")
        scfg = sa["cfg"]
        CC.set_static_metadata(ccfg)
        cfg = CC.set_defaults(ccfg, scfg, api.js.opts.limits, jsa.limits, pedantic)
        await api.off_loop(CC.check_config, cfg, scfg, api.js.opts.limits, jsa.limits)
        if cfg["direct"] or cfg["sourcing"]:
            # A mirror's or source's consumer: a new name every time on a limits stream.
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
        CC.check_new_consumer(scfg, jsa.limits, cfg,
                              lambda: _other_filters(cl, jsa.name, stream_name))
        if not name:
            name = ephemeral_name()
            cfg["name"] = name
        if not cfg["durable_name"] and cfg["inactive_threshold"] == 0:
            cfg["inactive_threshold"] = CC.DEFAULT_DELETE_WAIT
        leader = _leader_of(cl, sa)
        peers = consumer_peers(cfg, sa["group"]["peers"], [leader] if leader else [])
        group = {"name": group_name("C", len(peers), scfg["storage"]), "peers": peers}
        await cl.propose_meta({"op": "consumer", "acc": jsa.name, "stream": stream_name,
                               "name": name, "cfg": cfg, "group": group, "created": now_ns(),
                               "reply": reply.decode() if reply else None})
    except ApiError as exc:
        return err(rtype, exc)
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return None     # the consumer's first leader answers


def _other_filters(cl, acc: str, stream: str) -> list:
    """The filter lists of the stream's limitable consumers (assigned; those of mirrors
    and sources do not count)."""
    return [CC.filters_of(ca["cfg"]) for ca in cl.state.consumers.values()
            if ca["acc"] == acc and ca["stream"] == stream and
            not (ca["cfg"].get("direct") or ca["cfg"].get("sourcing"))]


async def _consumer_info(cl, acc: str, stream: str, name: str, timeout: float = 2.0):
    crep = cl.consumer_replica(acc, stream, name)
    if crep is not None and crep.is_leader():
        return crep.consumer.info()
    return await cl.request(b"$JSC.CINFO.%s" % cl.me.encode(),
                            {"acc": acc, "stream": stream, "name": name}, timeout)


async def _consumer_delete(api, jsa, stream: str, name: str):
    cl = api.js.cluster
    rtype = "consumer_delete_response"
    if ("%s %s" % (jsa.name, stream)) not in cl.state.streams:
        return err(rtype, ApiError.of("JSStreamNotFoundErr"))
    if ("%s %s %s" % (jsa.name, stream, name)) not in cl.state.consumers:
        return err(rtype, ApiError.of("JSConsumerNotFoundErr"))
    try:
        await cl.propose_meta({"op": "consumer_del", "acc": jsa.name, "stream": stream,
                               "name": name})
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
    return {"type": T + rtype, "success": True}


async def _consumer_page(api, jsa, stream: str, req: dict, full: bool):
    """server/jetstream_api.go jsConsumerNamesRequest and jetstream_cluster.go
    jsClusteredConsumerListRequest, with their paging as it is: the offset is kept
    within the names; the list asks for no stream (one that is not there has no
    consumers), and a list page that comes out empty says total 0."""
    cl = api.js.cluster
    rtype = "consumer_list_response" if full else "consumer_names_response"
    if not full and ("%s %s" % (jsa.name, stream)) not in cl.state.streams:
        return err(rtype, ApiError.of("JSStreamNotFoundErr"))
    names = sorted(ca["name"] for ca in cl.state.consumers.values()
                   if ca["acc"] == jsa.name and ca["stream"] == stream and
                   not ca["cfg"].get("direct"))
    offset = min(max(req.get("offset", 0), 0), len(names))
    limit = LIST_LIMIT if full else NAMES_LIMIT
    page = names[offset:offset + limit]
    out = {"type": T + rtype, "total": len(names), "offset": offset, "limit": limit}
    if not full:
        out["consumers"] = page
        return out
    if not page:
        out["total"] = 0
    infos = []
    for name in page:
        info = await _consumer_info(cl, jsa.name, stream, name, timeout=1.0)
        if info is not None:
            infos.append(info)
    out["consumers"] = infos
    return out


async def _consumer_pause(api, jsa, stream: str, name: str, req: dict):
    """server/jetstream_api.go jsConsumerPauseRequest in a cluster: the meta leader
    proposes the consumer's assignment with the new ``pause_until``, so every replica
    (and whichever leads next) pauses alike."""
    cl = api.js.cluster
    rtype = "consumer_pause_response"
    try:
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
    except ApiError as exc:
        return err(rtype, exc)
    except trio.TooSlowError:
        return err(rtype, ApiError.of("JSClusterNotAvailErr"))
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
