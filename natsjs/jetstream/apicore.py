"""What a JetStream API request is, before anyone answers it: its subject's operation,
the limits of list replies, the request schemas, the decoding of a body and the one
shape of an error reply.  A single server (natsjs/jetstream/api.py) and a cluster
(cluster_api.py) both answer from here, so that their replies cannot drift apart;
this module imports no other part of the API.
"""
from __future__ import annotations

from dataclasses import dataclass

from natsjs.jetstream import headers as H
from natsjs.jetstream import sourcing
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.consumercfg import pause_ns
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import ZERO_TIME, now_ns
from natsjs.jetstream.schema import RAW, DecodeError, Struct, decode_request, is_empty_request

T = "io.nats.jetstream.api.v1."
NAMES_LIMIT = 1024          # server/jetstream_api.go JSApiNamesLimit
LIST_LIMIT = 256            # JSApiListLimit
MAX_SUBJECT_DETAILS = 100_000
# A response dict may carry headers for the reply under this key (popped before sending).
RESPONSE_HEADERS = "\0headers"

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
    "stream_restore_response": {"deliver_subject": ""},
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
SNAPSHOT_REQUEST = Struct("JSApiStreamSnapshotRequest", {
    "deliver_subject": "string", "no_consumers": "bool", "chunk_size": "int",
    "window_size": "int", "jsck": "bool"})
RESTORE_REQUEST = Struct("JSApiStreamRestoreRequest", {"config": SC.STREAM_CONFIG,
                                                       "state": RAW})
STEPDOWN_REQUEST = Struct("JSApiLeaderStepdownRequest", {"placement": SC.PLACEMENT})
PEER_REMOVE_REQUEST = Struct("JSApiStreamRemovePeerRequest", {"peer": "string"})
SERVER_REMOVE_REQUEST = Struct("JSApiMetaServerRemoveRequest", {"peer": "string",
                                                                "peer_id": "string"})


def decode(body: bytes, schema: Struct) -> dict:
    """``body`` read into ``schema`` as nats-server's unmarshalRequest reads it; a body
    it cannot read raises JSInvalidJSONErr."""
    try:
        return decode_request(body, schema)
    except DecodeError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from None


def decode_required(body: bytes, schema: Struct) -> dict:
    """``decode`` for a request that must say something: no body or an empty object is
    JSBadRequestErr (server/jetstream_api.go isEmptyRequest before unmarshalRequest)."""
    if is_empty_request(body):
        raise ApiError.of("JSBadRequestErr")
    return decode(body, schema)


def err(rtype: str, error: ApiError) -> dict:
    """The one error reply: the response's type, the error, and the fields Go writes
    for that response even when it failed (ERROR_EXTRAS)."""
    return {"type": T + rtype, "error": error.to_dict(), **ERROR_EXTRAS.get(rtype, {})}


def required_level(hdr: bytes | None) -> int:
    """server/jetstream_versioning.go errorOnRequiredApiLevel: the level a request asks
    for in Nats-Required-Api-Level (unparsable asks for more than anyone has)."""
    raw = H.get(hdr, b"Nats-Required-Api-Level") if hdr else None
    if not raw:
        return 0
    raw = raw.strip()
    return int(raw) if raw.isdigit() else 1 << 30


def check_api_level(hdr: bytes | None) -> None:
    if required_level(hdr) > SC.API_LEVEL:
        raise ApiError.of("JSRequiredApiLevelErr")


def pause_response(cfg: dict) -> dict:
    """The consumer_pause_response for a consumer configuration's ``pause_until``."""
    until = pause_ns(cfg)
    now = now_ns()
    out = {"type": T + "consumer_pause_response", "paused": bool(until and now < until),
           "pause_until": cfg.get("pause_until") or ZERO_TIME}
    if out["paused"]:
        out["pause_remaining"] = until - now
    return out


def lookup_stream(jsa, name: str):
    """The account's stream ``name`` on this server, or JSStreamNotFoundErr."""
    s = jsa.streams.get(name)
    if s is None:
        raise ApiError.of("JSStreamNotFoundErr")
    return s


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


def check_new_stream_request(cfg: dict) -> None:
    """The checks of a stream create that need only its configuration
    (server/jetstream_api.go jsStreamCreateRequest, before a cluster takes it over)."""
    name = cfg["name"]
    if "\\" in name or "/" in name:
        raise ApiError.of("JSStreamNameContainsPathSeparatorsErr")
    if cfg["sealed"]:
        raise ApiError.of("JSStreamInvalidConfigF",
                          err="stream configuration for create can not be sealed")
    if cfg["mirror_direct"] and cfg["mirror"] is None:
        raise ApiError.of("JSStreamInvalidConfigF",
                          err="stream has no mirror but does have mirror direct")


def check_purge(cfg: dict) -> None:
    """A stream whose configuration forbids a purge."""
    if cfg["sealed"]:
        raise ApiError.of("JSStreamSealedErr")
    if cfg["deny_purge"]:
        raise ApiError.of("JSStreamPurgeFailedF", err="stream purge not permitted")


def check_msg_delete(stream, req: dict) -> int:
    """The sequence a message delete request may delete from ``stream`` (raises
    ApiError when its configuration or the message forbids it)."""
    cfg = stream.cfg
    if cfg["sealed"]:
        raise ApiError.of("JSStreamSealedErr")
    if cfg["deny_delete"]:
        raise ApiError.of("JSStreamMsgDeleteFailedF", err="message delete not permitted")
    seq = req.get("seq", 0)
    refusal = stream.delete_refusal(seq)
    if refusal is not None:
        raise refusal
    return seq


# ---- what a subject asks -----------------------------------------------------------------

@dataclass
class Request:
    """One API request: ``op`` names the operation (``"STREAM.INFO"``,
    ``"CONSUMER.CREATE"``, ...), ``rtype`` its response type; ``stream``,
    ``consumer`` and ``filter`` come from the subject, ``kind`` tells a consumer
    create's three subjects apart (``ephemeral``, ``new``, ``durable``).  ``req`` is
    the decoded and checked body, filled in once before any back end sees it
    (api.Api.read)."""

    op: str
    rtype: str
    stream: str = ""
    consumer: str | None = None
    filter: str | None = None
    kind: str = ""
    hdr: bytes | None = None
    body: bytes = b""
    subject: str = ""
    req: dict | None = None
    # In a cluster: the stream's or consumer's replica here that answers it.
    replica: object = None


def route(subject: str, hdr, body: bytes) -> Request | None:
    """The operation of ``$JS.API.<subject>``; None for a subject no handler of
    nats-server's takes (server/jetstream_api.go: the API subjects are patterns with a
    fixed number of tokens)."""
    op = subject.split(".")[2:]
    n = len(op)
    if not op:
        return None

    def r(name, rtype, **kw):
        return Request(name, rtype, hdr=hdr, body=body, subject=subject, **kw)
    if op == ["INFO"]:
        return r("INFO", "account_info_response")
    head = op[0]
    kind = op[1] if n > 1 else ""
    if head == "STREAM":
        if kind in ("NAMES", "LIST") and n == 2:
            return r("STREAM." + kind, "stream_%s_response" % kind.lower())
        if n == 3 and kind in _STREAM_OPS:
            return r("STREAM." + kind, _STREAM_OPS[kind], stream=op[2])
        if kind == "MSG" and n == 4 and op[2] in ("GET", "DELETE"):
            return r("STREAM.MSG." + op[2], "stream_msg_%s_response" % op[2].lower(),
                     stream=op[3])
        if kind == "LEADER" and n == 4 and op[2] == "STEPDOWN":
            return r("STREAM.LEADER.STEPDOWN", "stream_leader_stepdown_response",
                     stream=op[3])
        if kind == "PEER" and n == 4 and op[2] == "REMOVE":
            return r("STREAM.PEER.REMOVE", "stream_remove_peer_response", stream=op[3])
        return None
    if head == "CONSUMER" and n >= 3:
        if kind == "CREATE":
            if n == 3:
                return r("CONSUMER.CREATE", "consumer_create_response", stream=op[2],
                         kind="ephemeral")
            return r("CONSUMER.CREATE", "consumer_create_response", stream=op[2],
                     consumer=op[3], filter=".".join(op[4:]) if n > 4 else None, kind="new")
        if kind == "DURABLE" and n == 5 and op[2] == "CREATE":
            return r("CONSUMER.CREATE", "consumer_create_response", stream=op[3],
                     consumer=op[4], kind="durable")
        if kind in ("NAMES", "LIST") and n == 3:
            return r("CONSUMER." + kind, "consumer_%s_response" % kind.lower(),
                     stream=op[2])
        if n == 4 and kind in _CONSUMER_OPS:
            return r("CONSUMER." + kind, _CONSUMER_OPS[kind], stream=op[2], consumer=op[3])
        if kind == "LEADER" and n == 5 and op[2] == "STEPDOWN":
            return r("CONSUMER.LEADER.STEPDOWN", "consumer_leader_stepdown_response",
                     stream=op[3], consumer=op[4])
    return None


_STREAM_OPS = {"CREATE": "stream_create_response", "UPDATE": "stream_update_response",
               "INFO": "stream_info_response", "DELETE": "stream_delete_response",
               "PURGE": "stream_purge_response", "SNAPSHOT": "stream_snapshot_response",
               "RESTORE": "stream_restore_response"}
_CONSUMER_OPS = {"INFO": "consumer_info_response", "DELETE": "consumer_delete_response",
                 "PAUSE": "consumer_pause_response", "UNPIN": "consumer_unpin_response"}

__all__ = ["T", "NAMES_LIMIT", "LIST_LIMIT", "ERROR_EXTRAS", "Request", "route", "decode",
           "err", "required_level", "check_api_level", "pause_response",
           "lookup_stream", "sourcing_consumer_name", "check_new_stream_request", "check_purge",
           "check_msg_delete"]
