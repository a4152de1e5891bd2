"""Stream configuration: the schema, nats-server's defaults and its validity rules.

A stream's configuration is kept as a dict with every field present, in the order
and with the names of nats-server's ``StreamConfig`` (server/stream.go); durations
are integer nanoseconds as on the wire.  ``check_stream_config`` is
checkStreamCfgLocked, ``check_update`` is configUpdateCheckLocked, and
``config_json`` leaves out the ``omitempty`` fields the way Go's encoder does, so
stream info reads exactly like the reference's.
"""
from __future__ import annotations

import copy
import itertools

from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import go_duration
from natsjs.jetstream.names import MAX_NAME_LEN, name_too_long, valid_asset_name
from natsjs.subject_transform import TransformError, new_transform, validate_mapping
from natsjs.jetstream.schema import (MAPOF_STRING, RAW, Enum, ListOf, MapOf, Struct,
                                     go_quote, is_empty, merged, zero_values)
from natsjs.jetstream.subjects import (first_overlap, is_literal, subjects_collide,
                                       subset_match, valid_publish_subject, valid_subject)

NS = 1_000_000_000
MS = 1_000_000
DEFAULT_DUPLICATE_WINDOW = 120 * NS       # server/stream.go StreamDefaultDuplicatesWindow
MAX_REPLICAS = 5                          # StreamMaxReplicas
MAX_DESCRIPTION_LEN = 4 * 1024
MAX_METADATA_LEN = 128 * 1024
API_LEVEL = 5                             # server/jetstream_versioning.go JSApiLevel
REQ_LEVEL_KEY = "_nats.req.level"
VERSION_KEY = "_nats.ver"
LEVEL_KEY = "_nats.level"

RETENTION = Enum("RetentionPolicy", ("limits", "interest", "workqueue"))
DISCARD = Enum("DiscardPolicy", ("old", "new"), lower=True)
STORAGE = Enum("StorageType", ("file", "memory"))
COMPRESSION = Enum("StoreCompression", ("none", "s2"),
                   unknown="unknown compression algorithm", string_first=True)
PERSIST = Enum("PersistModeType", ("", "async"), aliases=(("default", ""),))

TRANSFORM = Struct("SubjectTransformConfig", {"src": "string", "dest": "string"})
EXTERNAL = Struct("ExternalStream", {"api": "string", "deliver": "string"})
SOURCE = Struct("StreamSource", {
    "name": "string", "opt_start_seq": "uint64", "opt_start_time": "string",
    "filter_subject": "string", "subject_transforms": ListOf(TRANSFORM),
    "external": EXTERNAL,
    "consumer": Struct("StreamConsumerSource", {"name": "string", "deliver_subject": "string"}),
})
PLACEMENT = Struct("Placement", {"cluster": "string", "tags": ListOf("string"),
                                 "preferred": "string"})
STREAM_CONFIG_FIELDS = {
    "name": "string",
    "description": "string",
    "subjects": ListOf("string"),
    "retention": RETENTION,
    "max_consumers": "int",
    "max_msgs": "int64",
    "max_bytes": "int64",
    "max_age": "duration",
    "max_msgs_per_subject": "int64",
    "max_msg_size": "int32",
    "discard": DISCARD,
    "storage": STORAGE,
    "num_replicas": "int",
    "no_ack": "bool",
    "duplicate_window": "duration",
    "placement": PLACEMENT,
    "mirror": SOURCE,
    "sources": ListOf(SOURCE),
    "compression": COMPRESSION,
    "first_seq": "uint64",
    "subject_transform": TRANSFORM,
    "republish": Struct("RePublish", {"src": "string", "dest": "string",
                                      "headers_only": "bool"}),
    "allow_direct": "bool",
    "mirror_direct": "bool",
    "discard_new_per_subject": "bool",
    "sealed": "bool",
    "deny_delete": "bool",
    "deny_purge": "bool",
    "allow_rollup_hdrs": "bool",
    "consumer_limits": Struct("StreamConsumerLimits", {"inactive_threshold": "duration",
                                                       "max_ack_pending": "int"}),
    "allow_msg_ttl": "bool",
    "subject_delete_marker_ttl": "duration",
    "allow_msg_counter": "bool",
    "allow_atomic": "bool",
    "allow_msg_schedules": "bool",
    "persist_mode": PERSIST,
    "allow_batched": "bool",
    "metadata": MAPOF_STRING,
}
STREAM_CONFIG_REQUEST = Struct("StreamConfigRequest",
                               {**STREAM_CONFIG_FIELDS, "pedantic": "bool"})
STREAM_CONFIG = Struct("StreamConfig", STREAM_CONFIG_FIELDS)

# Which fields the encoder leaves out when empty (placement is a pointer: only when
# absent, None here; an empty one is written as {}).
OMITEMPTY = frozenset((
    "description", "subjects", "max_msg_size", "no_ack", "duplicate_window",
    "mirror", "sources", "first_seq", "subject_transform", "republish",
    "discard_new_per_subject", "subject_delete_marker_ttl", "allow_msg_counter",
    "allow_atomic", "allow_msg_schedules", "persist_mode", "allow_batched", "metadata"))
_ENUM_DEFAULTS = {"retention": "limits", "discard": "old", "storage": "file",
                  "compression": "none", "persist_mode": ""}


def blank_config() -> dict:
    """Every field at Go's zero value (enums at their first value)."""
    return zero_values(STREAM_CONFIG_FIELDS, _ENUM_DEFAULTS, {"consumer_limits": dict})


def from_request(req: dict) -> dict:
    return merged(blank_config(), req)


def config_json(cfg: dict) -> dict:
    """The configuration as nats-server's encoder writes it."""
    return {k: v for k, v in cfg.items()
            if v is not None and not (k in OMITEMPTY and is_empty(v))}


def _invalid(text: str) -> ApiError:
    return ApiError.of("JSStreamInvalidConfigF", err=text)


def required_api_level(cfg: dict) -> int:
    """server/jetstream_versioning.go setStaticStreamMetadata."""
    level = 0
    if cfg.get("allow_msg_ttl") or (cfg.get("subject_delete_marker_ttl") or 0) > 0:
        level = 1
    if cfg.get("allow_msg_counter") or cfg.get("allow_atomic") or \
            cfg.get("allow_msg_schedules") or cfg.get("persist_mode") == "async":
        level = max(level, 2)
    if cfg.get("allow_batched"):
        level = max(level, 4)
    return level


def set_static_metadata(cfg: dict, level=None) -> None:
    """The API level an asset needs, in its metadata (the server's own keys dropped)."""
    md = {k: v for k, v in (cfg.get("metadata") or {}).items()
          if k not in (VERSION_KEY, LEVEL_KEY)}
    md[REQ_LEVEL_KEY] = str((level or required_api_level)(cfg))
    cfg["metadata"] = md


def with_dynamic_metadata(cfg: dict, version: str) -> dict:
    """A copy for responses: server version and API level added (setDynamicStreamMetadata)."""
    out = dict(cfg)
    md = dict(cfg.get("metadata") or {})
    md[VERSION_KEY] = version
    md[LEVEL_KEY] = str(API_LEVEL)
    out["metadata"] = md
    return out


class CheckContext:
    """What the checks need from the account (other streams, limits)."""

    def __init__(self, get_stream=None, max_bytes_required=False, memory_max_stream_bytes=-1,
                 store_max_stream_bytes=-1, server_dup_window=0, pedantic=False):
        self.get_stream = get_stream or (lambda name: None)   # -> config dict or None
        self.max_bytes_required = max_bytes_required
        # The account's largest max_bytes for a stream kept in memory / in files
        # (nats-server's Account.maxBytesLimits); <= 0: no limit.
        self.memory_max_stream_bytes = memory_max_stream_bytes
        self.store_max_stream_bytes = store_max_stream_bytes
        self.server_dup_window = server_dup_window
        self.pedantic = pedantic


def check_stream_config(config: dict, ctx: CheckContext) -> dict:
    """nats-server's checkStreamCfgLocked: validate, then fill in the defaults."""
    pedantic = ctx.pedantic
    if not valid_asset_name(config.get("name") or ""):
        raise _invalid("stream name is required and can not contain '.', '*', '>', '\\', '/'")
    if name_too_long(config["name"]):
        raise _invalid("stream name is too long, maximum allowed is %d" % MAX_NAME_LEN)
    if len(config.get("description") or "") > MAX_DESCRIPTION_LEN:
        raise _invalid("stream description is too long, maximum allowed is %d"
                       % MAX_DESCRIPTION_LEN)
    md = config.get("metadata") or {}
    if sum(len(k) + len(v) for k, v in md.items()) > MAX_METADATA_LEN:
        raise _invalid("stream metadata exceeds maximum size of %d bytes" % MAX_METADATA_LEN)
    cfg = copy.deepcopy(config)
    if not cfg.get("storage"):
        cfg["storage"] = "file"
    if cfg["num_replicas"] == 0:
        cfg["num_replicas"] = 1
    if cfg["num_replicas"] > MAX_REPLICAS:
        raise _invalid("maximum replicas is %d" % MAX_REPLICAS)
    if cfg["num_replicas"] < 0:
        raise ApiError.of("JSReplicasCountCannotBeNegative")
    for f in ("max_msgs", "max_msgs_per_subject", "max_bytes", "max_msg_size",
              "max_consumers"):
        if cfg[f] == 0 or cfg[f] < -1:
            if pedantic and cfg[f] < -1:
                raise ApiError.of("JSPedanticErrF", err="%s must be set to -1" % f)
            cfg[f] = -1
    max_age = cfg["max_age"]
    if max_age < 0:
        raise _invalid("max age can not be negative")
    if max_age and max_age < 100 * MS:
        raise _invalid("max age needs to be >= 100ms")
    if cfg["duplicate_window"] == 0 and cfg["mirror"] is None and not cfg["sources"]:
        window = DEFAULT_DUPLICATE_WINDOW
        if ctx.server_dup_window and window > ctx.server_dup_window:
            if pedantic:
                raise ApiError.of("JSPedanticErrF", err="duplicate window limits are higher "
                                  "than current limits")
            window = ctx.server_dup_window
        if max_age and max_age < window:
            if pedantic:
                raise ApiError.of("JSPedanticErrF",
                                  err="duplicate window cannot be bigger than max age")
            cfg["duplicate_window"] = max_age
        else:
            cfg["duplicate_window"] = window
    dup = cfg["duplicate_window"]
    if dup < 0:
        raise _invalid("duplicates window can not be negative")
    if max_age and dup > max_age:
        raise _invalid("duplicates window can not be larger then max age")
    if ctx.server_dup_window and dup > ctx.server_dup_window:
        raise _invalid("duplicates window can not be larger then server limit of %s"
                       % go_duration(ctx.server_dup_window))
    if 0 < dup < 100 * MS:
        raise _invalid("duplicates window needs to be >= 100ms")
    if cfg["deny_purge"] and cfg["allow_rollup_hdrs"]:
        raise _invalid("roll-ups require the purge permission")
    if cfg["allow_msg_counter"]:
        if cfg["discard"] == "new":
            raise _invalid("counter stream cannot use discard new")
        if cfg["allow_msg_ttl"]:
            raise _invalid("counter stream cannot use message TTLs")
        if cfg["allow_msg_schedules"]:
            raise _invalid("counter stream cannot use message schedules")
        if cfg["retention"] != "limits":
            raise _invalid("counter stream can only use limits retention")
    if cfg["discard_new_per_subject"]:
        if cfg["discard"] != "new":
            raise _invalid("discard new per subject requires discard new policy to be set")
        if cfg["max_msgs_per_subject"] <= 0:
            raise _invalid("discard new per subject requires max msgs per subject > 0")
    sdm = cfg["subject_delete_marker_ttl"]
    if sdm > 0:
        if sdm < NS:
            raise _invalid("subject delete marker TTL must be at least 1 second")
        if not cfg["allow_msg_ttl"]:
            if pedantic:
                raise _invalid("subject delete marker cannot be set if message TTLs are "
                               "disabled")
            cfg["allow_msg_ttl"] = True
        if not cfg["allow_rollup_hdrs"]:
            if pedantic:
                raise _invalid("subject delete marker cannot be set if roll-ups are disabled")
            cfg["allow_rollup_hdrs"], cfg["deny_purge"] = True, False
    elif sdm < 0:
        raise _invalid("subject delete marker TTL must not be negative")
    if cfg["allow_msg_schedules"]:
        if cfg["discard"] == "new":
            raise _invalid("message scheduling cannot use discard new")
        if not cfg["allow_rollup_hdrs"]:
            if pedantic:
                raise _invalid("message scheduling cannot be set if roll-ups are disabled")
            cfg["allow_rollup_hdrs"], cfg["deny_purge"] = True, False
    if cfg["persist_mode"] == "async":
        if cfg["storage"] != "file":
            raise _invalid("async persist mode is only supported on file storage")
        if cfg["num_replicas"] > 1:
            raise _invalid("async persist mode is not supported on replicated streams")
        if cfg["allow_atomic"]:
            raise _invalid("async persist mode is not supported with atomic batch publish")
    _check_sources(cfg, ctx)
    origins = [ctx.get_stream(s["name"]) for s in
               ([cfg["mirror"]] if cfg["mirror"] else []) + (cfg["sources"] or [])
               if not s.get("external")]
    _check_external_prefixes(cfg, [subj for o in origins if o
                                    for subj in o.get("subjects") or []])
    _check_cycles(cfg, ctx)
    subjects = cfg["subjects"] or []
    if not subjects:
        if cfg["mirror"] is None and not cfg["sources"]:
            cfg["subjects"] = subjects = [cfg["name"]]
    else:
        if cfg["mirror"] is not None:
            raise ApiError.of("JSMirrorWithSubjectsErr")
        # nats-server checks each subject in turn, then whether a later one collides
        # with it; the first failure of either kind is the answer.  The per-subject
        # checks run first, to find where that loop would stop, and the collisions are
        # looked for set-wise below that point (subjects.first_overlap).
        seen = set()
        stop, problem = len(subjects), None
        for i, subj in enumerate(subjects):
            problem = _subject_problem(subj, seen, cfg)
            if problem is not None:
                stop = i
                break
            seen.add(subj)
        clash = first_overlap(subjects, stop)
        if clash is not None:
            i, j = clash
            raise _invalid('subject "%s" overlaps with "%s"' % (subjects[i], subjects[j]))
        if problem is not None:
            raise problem
    if not cfg["subjects"] and not cfg["sources"] and cfg["mirror"] is None:
        raise _invalid("stream needs at least one configured subject or be a source/mirror")
    if ctx.max_bytes_required and cfg["max_bytes"] <= 0:
        raise ApiError.of("JSStreamMaxBytesRequired")
    limit = (ctx.memory_max_stream_bytes if cfg["storage"] == "memory"
             else ctx.store_max_stream_bytes)
    if limit > 0 and cfg["max_bytes"] > limit:
        raise ApiError.of("JSStreamMaxStreamBytesExceeded")
    tr = cfg["subject_transform"]
    if tr is not None:
        src = tr.get("src", "")
        if src and not valid_subject(src):
            raise ApiError.of("JSStreamTransformInvalidSource", err="invalid subject %s" % src)
        _check_mapping(src, tr.get("dest", ""), "JSStreamTransformInvalidDestination")
    rp = cfg["republish"]
    if rp is not None:
        if not rp.get("src"):
            if pedantic:
                raise ApiError.of("JSPedanticErrF", err="republish source can not be empty")
            rp["src"] = ">"
        rp.setdefault("dest", "")
        if rp["dest"] == ">" and rp["src"] == ">" and tr is not None and \
                len(cfg["subjects"]) == 1 and tr.get("src") == cfg["subjects"][0]:
            rp["src"] = rp["dest"] = tr.get("dest", "")
        if any(subjects_collide(rp["dest"], s) for s in cfg["subjects"] or []):
            raise _invalid("stream configuration for republish destination forms a cycle")
        if not valid_subject(rp["src"]) or not valid_subject(rp["dest"]) or \
                not _republish_ok(rp["src"], rp["dest"]):
            raise _invalid("stream configuration for republish with transform from '%s' to "
                           "'%s' not valid" % (rp["src"], rp["dest"]))
    pl = cfg["placement"]
    if pl is not None and not pl.get("cluster") and not pl.get("preferred") and \
            pl.get("tags") is None:
        # Only a placement equal to Go's zero value goes: one with an empty list of
        # tags stays, as {} (server/stream.go checkStreamCfg compares with DeepEqual).
        cfg["placement"] = None
    elif pl is not None and pl.get("preferred"):
        raise _invalid("preferred server not permitted in placement")
    elif pl is not None:
        cfg["placement"] = {k: v for k, v in pl.items() if v}
    check_source_filters(cfg)
    return cfg


def _subject_problem(subj: str, seen: set, cfg: dict) -> ApiError | None:
    """server/stream.go checkStreamCfg on one of a stream's subjects, before the
    overlap with later ones: the error, or None."""
    if not valid_subject(subj):
        return _invalid("invalid subject")
    if subj in seen:
        return _invalid("duplicate subjects detected")
    if subj == ">":
        if not cfg["no_ack"]:
            return _invalid("capturing all subjects requires no-ack to be true")
        if cfg["num_replicas"] != 1:
            return _invalid("capturing all subjects requires replicas of 1")
    # Only a first token starting with '$', '*' or '>' can meet these name spaces.
    if not cfg["no_ack"] and subj[0] in "$*>":
        for ns in ("$JS.>", "$JSC.>", "$NRG.>"):
            if subjects_collide(subj, ns) and not subset_match(subj, "$JS.EVENT.>"):
                return _invalid("subjects that overlap with jetstream api require no-ack "
                                "to be true")
        if subjects_collide(subj, "$SYS.>") and not subset_match(subj, "$SYS.ACCOUNT.>"):
            return _invalid("subjects that overlap with system api require no-ack to be "
                            "true")
    return None


def _check_sources(cfg: dict, ctx: CheckContext) -> None:
    mirror = cfg["mirror"]
    if mirror is not None:
        if cfg["first_seq"] > 0:
            raise ApiError.of("JSMirrorWithFirstSeqErr")
        if cfg["subjects"]:
            raise ApiError.of("JSMirrorWithSubjectsErr")
        if cfg["sources"]:
            raise ApiError.of("JSMirrorWithSourcesErr")
        if cfg["allow_msg_counter"]:
            raise ApiError.of("JSMirrorWithCountersErr")
        if cfg["allow_atomic"]:
            raise ApiError.of("JSMirrorWithAtomicPublishErr")
        if cfg["allow_msg_schedules"]:
            raise ApiError.of("JSMirrorWithMsgSchedulesErr")
        if mirror.get("filter_subject") and mirror.get("subject_transforms"):
            raise ApiError.of("JSMirrorMultipleFiltersNotAllowed")
        if cfg["subject_delete_marker_ttl"] > 0:
            raise _invalid("subject delete markers forbidden on mirrors")
        trs = mirror.get("subject_transforms") or []
        for i, t in enumerate(trs):
            if t.get("src") and not valid_subject(t["src"]):
                raise ApiError.of("JSMirrorInvalidSubjectFilter",
                                  err="invalid subject %s" % t["src"])
            _check_mapping(t.get("src", ""), t.get("dest", ""),
                           "JSMirrorInvalidTransformDestination")
            for j, u in enumerate(trs):
                if i != j and subjects_collide(t.get("src", ">"), u.get("src", ">")):
                    raise ApiError.of("JSMirrorOverlappingSubjectFilters")
        _check_durable_source(mirror, "JSMirrorDurableConsumerCfgInvalid")
        # The origin's name becomes a token of the subjects the mirror's consumer is
        # created with, in this domain or another: valid either way (nats-server checks
        # it only for a local origin).
        if not valid_asset_name(mirror.get("name") or ""):
            raise ApiError.of("JSMirrorInvalidStreamName")
        if mirror.get("external") is None:
            origin = ctx.get_stream(mirror["name"])
            if origin is not None:
                if cfg["max_msg_size"] > 0 and origin["max_msg_size"] > 0 and \
                        cfg["max_msg_size"] < origin["max_msg_size"]:
                    raise ApiError.of("JSMirrorMaxMessageSizeTooBigErr")
                cfg["mirror_direct"] = origin["allow_direct"]
    if cfg["sources"] and cfg["allow_msg_schedules"]:
        raise ApiError.of("JSSourceWithMsgSchedulesErr")
    names = set()
    durables = set()
    for src in cfg["sources"] or []:
        if not valid_asset_name(src.get("name") or ""):
            raise ApiError.of("JSSourceInvalidStreamName")
        iname = _source_index_name(src)
        if iname in names:
            raise ApiError.of("JSSourceDuplicateDetected")
        names.add(iname)
        if src.get("filter_subject") and src.get("subject_transforms"):
            raise ApiError.of("JSSourceMultipleFiltersNotAllowed")
        if _check_durable_source(src, "JSSourceDurableConsumerCfgInvalid"):
            # server/stream.go composeCName: one durable per origin stream.
            cname = (src["name"], src["consumer"]["name"],
                     (src.get("external") or {}).get("api") or "")
            if cname in durables:
                raise ApiError.of("JSSourceDurableConsumerDuplicateDetected")
            durables.add(cname)
        trs = src.get("subject_transforms") or []
        for t in trs:
            if t.get("src") and not valid_subject(t["src"]):
                raise ApiError.of("JSSourceInvalidSubjectFilter",
                                  err="invalid subject %s" % t["src"])
            _check_mapping(t.get("src", ""), t.get("dest", ""),
                           "JSSourceInvalidTransformDestination")
        for i, t in enumerate(trs):
            for j, u in enumerate(trs):
                if i != j and subset_match(t.get("src", ">"), u.get("src", ">")):
                    raise ApiError.of("JSSourceOverlappingSubjectFilters")
        if src.get("external") is None:
            origin = ctx.get_stream(src["name"])
            if origin is not None and cfg["max_msg_size"] > 0 and \
                    origin["max_msg_size"] > 0 and cfg["max_msg_size"] < origin["max_msg_size"]:
                raise ApiError.of("JSSourceMaxMessageSizeTooBigErr")


def _check_durable_source(src: dict, error: str) -> bool:
    """server/stream.go checkStreamCfg on a mirror's or a source's ``consumer`` (a
    durable on the origin): a valid name, a literal deliver subject, no start point
    and no filter.  True when there is one."""
    c = src.get("consumer")
    if c is None:
        return False
    if not valid_asset_name(c.get("name") or "") or \
            not valid_publish_subject(c.get("deliver_subject") or "") or \
            src.get("opt_start_seq") or src.get("opt_start_time") or src.get("filter_subject"):
        raise ApiError.of(error)
    return True


def check_source_filters(cfg: dict) -> None:
    """server/stream.go addStream: a mirror's or a source's filter must be a valid
    subject (checked after the limits there, so with its own error, 10049); and the
    external prefixes of checkStreamCfg, which end up inside the subjects this stream's
    sourcing publishes and listens on."""
    mirror = cfg["mirror"]
    if mirror is not None and not mirror.get("subject_transforms"):
        f = mirror.get("filter_subject")
        if f and not valid_subject(f):
            raise ApiError.of("JSStreamCreateErrF",
                              err="subject filter '%s' for the mirror invalid subject" % f)
    for src in cfg["sources"] or []:
        f = src.get("filter_subject")
        if not src.get("subject_transforms") and f and not valid_subject(f):
            raise ApiError.of("JSStreamCreateErrF",
                              err="subject filter '%s' for the source: invalid subject" % f)


def _check_cycles(cfg: dict, ctx: CheckContext) -> None:
    """server/stream.go checkStreamCfg: following sources and mirrors from this stream
    must not come back to a stream already seen through a filter that takes its
    subjects (a stream sourcing itself, or two sourcing each other), nor through a
    mirror at all."""
    def overlaps(subjects, flt) -> bool:
        return not flt or any(subjects_collide(s, flt) for s in subjects or [])

    to_visit = [cfg]
    visited = set()
    while to_visit:
        c = to_visit.pop(0)
        visited.add(c["name"])
        for src in c.get("sources") or []:
            if src.get("external"):
                continue
            if src.get("name") in visited:
                if overlaps(c.get("subjects"), src.get("filter_subject")):
                    raise _invalid("detected cycle")
            else:
                origin = ctx.get_stream(src.get("name"))
                if origin is not None:
                    to_visit.append(origin)
        m = c.get("mirror")
        if m and not m.get("external"):
            if m.get("name") in visited:
                raise _invalid("detected cycle")
            origin = ctx.get_stream(m.get("name"))
            if origin is not None:
                to_visit.append(origin)


def _check_external_prefixes(cfg: dict, origin_subjects) -> None:
    """server/stream.go checkStreamCfg: external delivery prefixes are literal subjects
    that capture none of the origins' subjects, API prefixes literal subjects clear of
    this domain's API."""
    exts = [s.get("external") for s in ([cfg["mirror"]] if cfg["mirror"] else []) +
            (cfg["sources"] or [])]
    exts = [e for e in exts if e]
    for ext in exts:
        pfx = ext.get("deliver")
        if not pfx:
            continue
        if not valid_publish_subject(pfx):
            raise ApiError.of("JSStreamInvalidExternalDeliverySubjErrF", prefix=pfx)
        for sub in origin_subjects:
            if subjects_collide(sub, "%s.%s" % (pfx, sub)):
                raise ApiError.of("JSStreamExternalDelPrefixOverlapsErrF", prefix=pfx,
                                  subject=sub)
    for ext in exts:
        pfx = ext.get("api")
        if not pfx:
            continue
        if not valid_publish_subject(pfx):
            raise _invalid("stream external api prefix %s must be a valid subject without "
                           "wildcards" % go_quote(pfx))
        if subjects_collide(pfx, "$JS.API"):
            raise ApiError.of("JSStreamExternalApiOverlapErrF", prefix=pfx, subject="$JS.API")


def _source_index_name(src: dict) -> str:
    """server/stream.go composeIName: name, external api prefix, filters and transforms."""
    parts = [src.get("name", "")]
    ext = src.get("external") or {}
    if ext.get("api"):
        parts.append(ext["api"])
    if src.get("filter_subject"):
        parts.append(src["filter_subject"])
    for t in src.get("subject_transforms") or []:
        parts.append("%s>%s" % (t.get("src", ""), t.get("dest", "")))
    return " ".join(parts)


def _check_mapping(src: str, dest: str, err: str) -> None:
    """server/sublist.go ValidateMapping, reported as the API error ``err``."""
    try:
        validate_mapping(src, dest)
    except TransformError as exc:
        raise ApiError.of(err, err=str(exc)) from None


def _republish_ok(src: str, dest: str) -> bool:
    try:
        new_transform(src, dest)
    except TransformError:
        return False
    return True


def subjects_of(configs):
    """Every subject of the stream ``configs``, one after another (what a new or
    updated stream's subjects must not collide with: subjects.any_collide)."""
    return itertools.chain.from_iterable(c["subjects"] or () for c in configs)


def check_update(old: dict, new: dict, ctx: CheckContext, single_server: bool) -> dict:
    """nats-server's configUpdateCheckLocked: what a stream update may change."""
    cfg = check_stream_config(new, ctx)
    if cfg["name"] != old["name"]:
        raise _invalid("stream configuration name must match original")
    if single_server and cfg["num_replicas"] > 1:
        raise ApiError.of("JSStreamReplicasNotSupportedErr")
    if cfg["storage"] != old["storage"]:
        raise _invalid("stream configuration update can not change storage type")
    if cfg["retention"] != old["retention"] and "workqueue" in (cfg["retention"],
                                                                   old["retention"]):
        raise _invalid("stream configuration update can not change retention policy to/from "
                       "workqueue")
    if not cfg["sealed"] and old["sealed"]:
        raise _invalid("stream configuration update can not unseal a sealed stream")
    if not cfg["deny_delete"] and old["deny_delete"]:
        raise _invalid("stream configuration update can not cancel deny message deletes")
    if not cfg["deny_purge"] and old["deny_purge"]:
        raise _invalid("stream configuration update can not cancel deny purge")
    if cfg["mirror"] is not None and cfg["mirror"] != old["mirror"]:
        raise ApiError.of("JSStreamMirrorNotUpdatableErr")
    if old["allow_msg_ttl"] and not cfg["allow_msg_ttl"]:
        raise _invalid("message TTL status can not be disabled")
    if cfg["allow_msg_counter"] != old["allow_msg_counter"]:
        raise _invalid("stream configuration update can not change message counter setting")
    if old["allow_msg_schedules"] and not cfg["allow_msg_schedules"]:
        raise _invalid("message schedules can not be disabled")
    if old["persist_mode"] != cfg["persist_mode"]:
        raise _invalid("stream configuration update can not change persist mode")
    if cfg["sealed"]:
        cfg["max_age"] = 0
        cfg["discard"] = "new"
        cfg["deny_delete"] = cfg["deny_purge"] = True
        cfg["allow_rollup_hdrs"] = False
    return cfg


__all__ = ["STREAM_CONFIG_REQUEST", "STREAM_CONFIG", "check_stream_config", "check_update",
           "config_json", "from_request", "blank_config", "valid_asset_name",
           "set_static_metadata", "with_dynamic_metadata", "go_duration", "is_literal",
           "valid_publish_subject", "MapOf", "RAW"]
