"""Consumer configuration: the schema, nats-server's defaults and its validity rules.

The same shape as natsjs/jetstream/streamcfg.py for ``ConsumerConfig``
(server/consumer.go): a dict with every field, ``set_defaults`` is
setConsumerConfigDefaults, ``check_config`` is checkConsumerCfg, ``check_update`` is
checkNewConsumerConfig, and ``config_json`` drops the ``omitempty`` fields.
"""
from __future__ import annotations

import copy
import itertools
import re

from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import parse_rfc3339
from natsjs.jetstream.schema import (MAPOF_STRING, Enum, ListOf, Struct, is_empty, merged,
                                     zero_values)
from natsjs.jetstream.names import name_too_long
from natsjs.jetstream.streamcfg import (MAX_DESCRIPTION_LEN, MAX_METADATA_LEN, MAX_NAME_LEN,
                                       NS, go_duration, valid_asset_name,
                                       with_dynamic_metadata)
from natsjs.jetstream.streamcfg import set_static_metadata as _set_static_metadata
from natsjs.jetstream.subjects import (any_collide, filters_overlap, is_literal,
                                       subjects_collide, subset_match, valid_subject)

MS = 1_000_000
DEFAULT_ACK_WAIT = 30 * NS                # server/consumer.go JsAckWaitDefault
DEFAULT_MAX_ACK_PENDING = 1000            # JsDefaultMaxAckPending
DEFAULT_MAX_WAITING = 512                 # server/jetstream_api.go JSWaitQueueDefaultMax
DEFAULT_DELETE_WAIT = 5 * NS              # JsDeleteWaitTimeDefault (ephemerals)
DEFAULT_PINNED_TTL = 120 * NS             # JsDefaultPinnedTTL
SOURCE_HEALTH_HB = 1 * NS

DELIVER = Enum("DeliverPolicy", ("all", "last", "new", "by_start_sequence", "by_start_time",
                                 "last_per_subject"))
ACK = Enum("AckPolicy", ("none", "all", "explicit", "flow_control"))
REPLAY = Enum("ReplayPolicy", ("instant", "original"))
PRIORITY = Enum("PriorityPolicy", ("none", "overflow", "pinned_client", "prioritized"),
                unknown="unknown priority policy: {raw}")

CONSUMER_CONFIG_FIELDS = {
    "durable_name": "string",
    "name": "string",
    "description": "string",
    "deliver_policy": DELIVER,
    "opt_start_seq": "uint64",
    "opt_start_time": "string",
    "ack_policy": ACK,
    "ack_wait": "duration",
    "max_deliver": "int",
    "backoff": ListOf("duration"),
    "filter_subject": "string",
    "filter_subjects": ListOf("string"),
    "replay_policy": REPLAY,
    "rate_limit_bps": "uint64",
    "sample_freq": "string",
    "max_waiting": "int",
    "max_ack_pending": "int",
    "flow_control": "bool",
    "headers_only": "bool",
    "max_batch": "int",
    "max_expires": "duration",
    "max_bytes": "int",
    "deliver_subject": "string",
    "deliver_group": "string",
    "idle_heartbeat": "duration",
    "inactive_threshold": "duration",
    "num_replicas": "int",
    "mem_storage": "bool",
    "direct": "bool",
    "sourcing": "bool",
    "metadata": MAPOF_STRING,
    "pause_until": "string",
    "priority_groups": ListOf("string"),
    "priority_policy": PRIORITY,
    "priority_timeout": "duration",
}
CONSUMER_CONFIG = Struct("ConsumerConfig", CONSUMER_CONFIG_FIELDS)
CREATE_CONSUMER_REQUEST = Struct("CreateConsumerRequest", {
    "stream_name": "string",
    "config": CONSUMER_CONFIG,
    "action": Enum("ConsumerAction", ("", "create", "update"),
                   unknown="unknown consumer action: {raw}"),
    "pedantic": "bool",
})

_ENUM_DEFAULTS = {"deliver_policy": "all", "ack_policy": "none", "replay_policy": "instant",
                  "priority_policy": "none"}
# Fields Go's encoder writes even when zero (the rest are ``omitempty``).
_ALWAYS = frozenset(("deliver_policy", "ack_policy", "replay_policy", "num_replicas"))

_GROUP_NAME = re.compile(r"^[a-zA-Z0-9/_=-]{1,16}$")


def blank_config() -> dict:
    return zero_values(CONSUMER_CONFIG_FIELDS, _ENUM_DEFAULTS)


def from_request(req: dict) -> dict:
    return merged(blank_config(), req)


def config_json(cfg: dict) -> dict:
    out = {}
    for k, v in cfg.items():
        if k == "priority_policy":
            if v and v != "none":
                out[k] = v
        elif k in _ALWAYS or not is_empty(v):
            out[k] = v
    return out


def is_durable(cfg: dict) -> bool:
    return bool(cfg.get("durable_name"))


def partition_unique(filters: list[str], others: list) -> bool:
    """server/stream.go partitionUnique: a work-queue consumer's ``filters`` collide
    with none of ``others`` (the filter lists of the stream's other consumers), and
    each of those has filters."""
    if not filters:
        return True
    if any(not f for f in others):
        return False
    return not any_collide(filters, itertools.chain(*others))


def check_new_consumer(scfg: dict, account_limits, cfg: dict, others) -> None:
    """The rules a new consumer meets beyond its own configuration
    (server/consumer.go addConsumerWithAssignment): the stream's and the account's
    max_consumers, a work queue's policies and partitions.  ``others()``: the filter
    lists of the stream's other limitable consumers (those of mirrors and sources do
    not count, server/stream.go numLimitableConsumers), asked for only when a limit or
    a work queue needs them, so that a create does not cost the number of consumers."""
    maxc = scfg["max_consumers"]
    acc_max = account_limits.max_consumers
    if maxc <= 0 or (acc_max > 0 and acc_max < maxc):
        maxc = acc_max
    if maxc > 0 and len(others()) >= maxc:
        raise ApiError.of("JSMaximumConsumersLimitErr")
    if scfg["retention"] == "workqueue" and not cfg["direct"] and not cfg["sourcing"]:
        if cfg["ack_policy"] not in ("explicit", "flow_control"):
            raise ApiError.of("JSConsumerWQRequiresExplicitAckErr")
        if cfg["deliver_policy"] != "all":
            raise ApiError.of("JSConsumerWQConsumerNotDeliverAllErr")
        theirs = others()
        if theirs:
            filters = filters_of(cfg)
            if not filters:
                raise ApiError.of("JSConsumerWQMultipleUnfilteredErr")
            if not partition_unique(filters, theirs):
                raise ApiError.of("JSConsumerWQConsumerNotUniqueErr")


def filters_of(cfg: dict) -> list[str]:
    if cfg.get("filter_subject"):
        return [cfg["filter_subject"]]
    return list(cfg.get("filter_subjects") or [])


def pause_ns(cfg: dict) -> int:
    """When a consumer configuration's ``pause_until`` ends (0: not paused)."""
    pu = cfg.get("pause_until")
    if not pu:
        return 0
    try:
        return parse_rfc3339(pu)
    except ValueError:
        return 0


def required_api_level(cfg: dict) -> int:
    level = 0
    if cfg.get("pause_until"):
        level = 1
    if (cfg.get("priority_policy") or "none") != "none" or cfg.get("priority_timeout") or \
            cfg.get("priority_groups"):
        level = 1
    if cfg.get("ack_policy") == "flow_control":
        level = 4
    return level


def set_static_metadata(cfg: dict) -> None:
    _set_static_metadata(cfg, required_api_level)


def _pedantic(text: str) -> ApiError:
    return ApiError.of("JSPedanticErrF", err=text)


def set_defaults(config: dict, stream_cfg: dict, server_limits, account_limits,
                 pedantic: bool = False) -> dict:
    """server/consumer.go setConsumerConfigDefaults."""
    cfg = copy.deepcopy(config)
    if cfg["max_deliver"] == 0 or cfg["max_deliver"] < -1:
        if pedantic and cfg["max_deliver"] < -1:
            raise _pedantic("max_deliver must be set to -1")
        cfg["max_deliver"] = -1
    for field, text in (("max_waiting", "max_waiting must not be negative"),
                        ("max_batch", "max_batch must not be negative"),
                        ("max_expires", "max_expires must not be negative"),
                        ("max_bytes", "max_bytes must not be negative"),
                        ("idle_heartbeat", "idle_heartbeat must not be negative"),
                        ("inactive_threshold", "inactive_threshold must not be negative"),
                        ("priority_timeout", "priority_timeout must not be negative")):
        if cfg[field] < 0:
            if pedantic:
                raise _pedantic(text)
            cfg[field] = 0
    if cfg["max_ack_pending"] < -1:
        if pedantic:
            raise _pedantic("max_ack_pending must be set to -1")
        cfg["max_ack_pending"] = -1
    if not cfg["deliver_subject"] and cfg["max_waiting"] == 0:
        cfg["max_waiting"] = DEFAULT_MAX_WAITING
    if cfg["ack_wait"] == 0 and cfg["ack_policy"] in ("explicit", "all"):
        cfg["ack_wait"] = DEFAULT_ACK_WAIT
    if cfg["backoff"]:
        if pedantic and cfg["ack_wait"] != cfg["backoff"][0]:
            raise _pedantic("first backoff value has to equal batch AckWait")
        cfg["ack_wait"] = cfg["backoff"][0]
    limits = stream_cfg.get("consumer_limits") or {}
    if cfg["max_ack_pending"] == 0:
        if pedantic and limits.get("max_ack_pending", 0) > 0:
            raise _pedantic("max_ack_pending must be set if it's configured in stream limits")
        cfg["max_ack_pending"] = limits.get("max_ack_pending", 0)
    if cfg["inactive_threshold"] == 0:
        if pedantic and limits.get("inactive_threshold", 0) > 0:
            raise _pedantic("inactive_threshold must be set if it's configured in stream limits")
        cfg["inactive_threshold"] = limits.get("inactive_threshold", 0)
    if cfg["max_ack_pending"] == 0 and cfg["ack_policy"] != "none":
        pending = DEFAULT_MAX_ACK_PENDING
        if server_limits.max_ack_pending > 0 and server_limits.max_ack_pending < pending:
            pending = server_limits.max_ack_pending
        if account_limits.max_ack_pending > 0 and account_limits.max_ack_pending < pending:
            pending = account_limits.max_ack_pending
        cfg["max_ack_pending"] = pending
    if not cfg["deliver_subject"] and cfg["max_batch"] == 0 and \
            server_limits.max_request_batch > 0:
        if pedantic:
            raise _pedantic("max_request_batch must be set if it's JetStream limits are set")
        cfg["max_batch"] = server_limits.max_request_batch
    if cfg["priority_policy"] == "pinned_client" and cfg["priority_timeout"] == 0:
        cfg["priority_timeout"] = DEFAULT_PINNED_TTL
    if cfg["ack_policy"] == "flow_control" and not pedantic:
        cfg["flow_control"] = True
        cfg["idle_heartbeat"] = SOURCE_HEALTH_HB
    return cfg


def _invalid(text: str) -> ApiError:
    return ApiError.of("JSStreamInvalidConfigF", err=text)


def check_config(cfg: dict, stream_cfg: dict, server_limits, account_limits,
                 recovering: bool = False) -> None:
    """server/consumer.go checkConsumerCfg."""
    if cfg["name"] and not valid_asset_name(cfg["name"]):
        raise _invalid("consumer name can not contain '.', '*', '>', '\\', '/'")
    if cfg["durable_name"] and not valid_asset_name(cfg["durable_name"]):
        raise _invalid("consumer durable name can not contain '.', '*', '>', '\\', '/'")
    if name_too_long(cfg["name"]) or name_too_long(cfg["durable_name"]):
        # A name becomes a directory of its own: one longer than a file name may be (in
        # bytes) is refused for every consumer, not only a durable as nats-server does.
        raise ApiError.of("JSConsumerNameTooLongErrF", max=MAX_NAME_LEN)
    if cfg["num_replicas"] > 0 and cfg["num_replicas"] > stream_cfg["num_replicas"]:
        raise ApiError.of("JSConsumerReplicasExceedsStream")
    if cfg["num_replicas"] < 0:
        raise ApiError.of("JSReplicasCountCannotBeNegative")
    if stream_cfg["retention"] in ("interest", "workqueue") and not recovering and \
            cfg["num_replicas"] != 0 and cfg["num_replicas"] != stream_cfg["num_replicas"]:
        raise ApiError.of("JSConsumerReplicasShouldMatchStream")
    if any(b < 0 for b in cfg["backoff"] or []):
        raise ApiError.of("JSConsumerBackOffNegativeErr")
    if cfg["ack_wait"] < 0:
        raise ApiError.of("JSConsumerAckWaitNegativeErr")
    if cfg["ack_policy"] == "flow_control":
        if not cfg["deliver_subject"]:
            raise ApiError.of("JSConsumerAckFCRequiresPushErr")
        if not cfg["flow_control"]:
            raise ApiError.of("JSConsumerAckFCRequiresFCErr")
        if cfg["idle_heartbeat"] != SOURCE_HEALTH_HB:
            raise _invalid("flow control ack policy heartbeat needs to be 1s")
        if cfg["max_ack_pending"] <= 0:
            raise ApiError.of("JSConsumerAckFCRequiresMaxAckPendingErr")
        if cfg["ack_wait"] != 0 or cfg["backoff"]:
            raise ApiError.of("JSConsumerAckFCRequiresNoAckWaitErr")
        if cfg["max_deliver"] > 0:
            raise ApiError.of("JSConsumerAckFCRequiresNoMaxDeliverErr")
    nbo = len(cfg["backoff"] or [])
    if nbo and cfg["max_deliver"] != -1 and nbo > cfg["max_deliver"]:
        raise ApiError.of("JSConsumerMaxDeliverBackoffErr")
    if len(cfg["description"]) > MAX_DESCRIPTION_LEN:
        raise ApiError.of("JSConsumerDescriptionTooLongErrF", max=MAX_DESCRIPTION_LEN)
    ds = cfg["deliver_subject"]
    if ds:
        if not is_literal(ds):
            raise ApiError.of("JSConsumerDeliverToWildcardsErr")
        if not valid_subject(ds):
            raise ApiError.of("JSConsumerInvalidDeliverSubject")
        if _delivery_forms_cycle(stream_cfg, ds):
            raise ApiError.of("JSConsumerDeliverCycleErr")
        if cfg["max_waiting"] != 0:
            raise ApiError.of("JSConsumerPushMaxWaitingErr")
        if cfg["max_ack_pending"] > 0 and cfg["ack_policy"] == "none":
            raise ApiError.of("JSConsumerMaxPendingAckPolicyRequiredErr")
        if 0 < cfg["idle_heartbeat"] < 100 * MS:
            raise ApiError.of("JSConsumerSmallHeartbeatErr")
    else:
        if cfg["ack_policy"] == "none" and stream_cfg["retention"] == "workqueue":
            raise ApiError.of("JSConsumerPullRequiresAckErr")
        if cfg["rate_limit_bps"] > 0:
            raise ApiError.of("JSConsumerPullWithRateLimitErr")
        if cfg["max_waiting"] < 0:
            raise ApiError.of("JSConsumerMaxWaitingNegativeErr")
        if cfg["idle_heartbeat"] > 0:
            raise ApiError.of("JSConsumerHBRequiresPushErr")
        if cfg["flow_control"]:
            raise ApiError.of("JSConsumerFCRequiresPushErr")
        if cfg["max_batch"] < 0:
            raise ApiError.of("JSConsumerMaxRequestBatchNegativeErr")
        if cfg["max_expires"] != 0 and cfg["max_expires"] < MS:
            raise ApiError.of("JSConsumerMaxRequestExpiresTooSmall")
        if server_limits.max_request_batch > 0 and \
                cfg["max_batch"] > server_limits.max_request_batch:
            raise ApiError.of("JSConsumerMaxRequestBatchExceededF",
                              limit=server_limits.max_request_batch)
    if server_limits.max_ack_pending > 0 and cfg["max_ack_pending"] > server_limits.max_ack_pending:
        raise ApiError.of("JSConsumerMaxPendingAckExcessErrF", limit=server_limits.max_ack_pending)
    if account_limits.max_ack_pending > 0 and \
            cfg["max_ack_pending"] > account_limits.max_ack_pending:
        raise ApiError.of("JSConsumerMaxPendingAckExcessErrF",
                          limit=account_limits.max_ack_pending)
    limits = stream_cfg.get("consumer_limits") or {}
    if limits.get("max_ack_pending", 0) > 0 and cfg["max_ack_pending"] > limits["max_ack_pending"]:
        raise ApiError.of("JSConsumerMaxPendingAckExcessErrF", limit=limits["max_ack_pending"])
    if limits.get("inactive_threshold", 0) > 0 and \
            cfg["inactive_threshold"] > limits["inactive_threshold"]:
        raise ApiError.of("JSConsumerInactiveThresholdExcess",
                          limit=go_duration(limits["inactive_threshold"]))
    if cfg["direct"]:
        if not ds:
            raise ApiError.of("JSConsumerDirectRequiresPushErr")
        if is_durable(cfg):
            raise ApiError.of("JSConsumerDirectRequiresEphemeralErr")
    if cfg["filter_subject"] and cfg["filter_subjects"]:
        raise ApiError.of("JSConsumerDuplicateFilterSubjects")
    if cfg["filter_subject"] and not valid_subject(cfg["filter_subject"]):
        raise _invalid("invalid subject")
    for f in cfg["filter_subjects"] or []:
        if not f:
            raise ApiError.of("JSConsumerEmptyFilter")
    filters = filters_of(cfg)
    # nats-server validates each filter in turn, then whether it lies within another
    # one: the overlap counts only before the first invalid filter.
    bad = next((i for i, s in enumerate(filters) if not valid_subject(s)), len(filters))
    if filters_overlap(filters, bad):
        raise ApiError.of("JSConsumerOverlappingSubjectFilters")
    if bad < len(filters):
        raise _invalid("invalid subject")
    dp = cfg["deliver_policy"]
    seq, start = cfg["opt_start_seq"], cfg["opt_start_time"]

    def bad_start(name, what):
        return ApiError.of("JSConsumerInvalidPolicyErrF",
                           err="consumer delivery policy is deliver %s, but optional start %s "
                               "is also set" % (name, what))

    def not_set(name, what):
        return ApiError.of("JSConsumerInvalidPolicyErrF",
                           err="consumer delivery policy is deliver %s, but optional %s is not "
                               "set" % (name, what))
    names = {"all": "all", "last": "last", "last_per_subject": "last per subject", "new": "new"}
    if dp in names:
        if seq > 0:
            raise bad_start(names[dp], "sequence")
        if start:
            raise bad_start(names[dp], "time")
        if dp == "last_per_subject" and not filters:
            raise not_set("last per subject", "filter subject")
    elif dp == "by_start_sequence":
        if seq == 0:
            raise not_set("by start sequence", "start sequence")
        if start:
            raise bad_start("by start sequence", "time")
    elif dp == "by_start_time":
        if not start:
            raise not_set("by start time", "start time")
        if seq != 0:
            raise bad_start("by start time", "start sequence")
    if cfg["sample_freq"]:
        s = cfg["sample_freq"].rstrip("%")
        if not s.isdigit():
            raise ApiError.of("JSConsumerInvalidSamplingErrF",
                              err='strconv.Atoi: parsing "%s": invalid syntax' % s)
    if cfg["flow_control"] and cfg["idle_heartbeat"] == 0:
        raise ApiError.of("JSConsumerWithFlowControlNeedsHeartbeats")
    if cfg["durable_name"] and cfg["name"] and cfg["name"] != cfg["durable_name"]:
        raise ApiError.of("JSConsumerCreateDurableAndNameMismatch")
    md = cfg["metadata"] or {}
    if sum(len(k) + len(v) for k, v in md.items()) > MAX_METADATA_LEN:
        raise ApiError.of("JSConsumerMetadataLengthErrF", limit="%dKB" % (MAX_METADATA_LEN // 1024))
    if cfg["priority_policy"] != "none":
        if ds:
            raise ApiError.of("JSConsumerPushWithPriorityGroupErr")
        groups = cfg["priority_groups"] or []
        if not groups:
            raise ApiError.of("JSConsumerPriorityPolicyWithoutGroup")
        for g in groups:
            if not g:
                raise ApiError.of("JSConsumerEmptyGroupName")
            if not _GROUP_NAME.match(g):
                raise ApiError.of("JSConsumerInvalidGroupNameErr")
    else:
        if cfg["priority_groups"]:
            raise ApiError.of("JSConsumerPriorityGroupWithPolicyNone")
        if cfg["priority_timeout"] > 0:
            raise ApiError.of("JSConsumerPinnedTTLWithoutPriorityPolicyNone")


def _delivery_forms_cycle(stream_cfg: dict, deliver_subject: str) -> bool:
    """server/consumer.go deliveryFormsCycle: the deliver subject lies within one of the
    stream's subjects."""
    return any(subset_match(deliver_subject, s) for s in stream_cfg.get("subjects") or [])


def check_update(old: dict, new: dict, deliver_has_interest) -> None:
    """server/consumer.go checkNewConsumerConfig: what an update may change."""
    if old == new:
        return

    def fail(text):
        raise ApiError.of("JSConsumerCreateErrF", err=text)
    if old["deliver_policy"] != new["deliver_policy"]:
        fail("deliver policy can not be updated")
    if old["mem_storage"] != new["mem_storage"]:
        fail("storage type can not be updated")
    if old["direct"] != new["direct"]:
        fail("direct can not be updated")
    if old["sourcing"] != new["sourcing"]:
        fail("sourcing can not be updated")
    if old["opt_start_seq"] != new["opt_start_seq"]:
        fail("start sequence can not be updated")
    if (old["opt_start_time"] or "") != (new["opt_start_time"] or ""):
        fail("start time can not be updated")
    if old["ack_policy"] != new["ack_policy"]:
        fail("ack policy can not be updated")
    if old["replay_policy"] != new["replay_policy"]:
        fail("replay policy can not be updated")
    if old["idle_heartbeat"] != new["idle_heartbeat"]:
        fail("heart beats can not be updated")
    if old["flow_control"] != new["flow_control"]:
        fail("flow control can not be updated")
    if old["deliver_subject"] != new["deliver_subject"]:
        if not old["deliver_subject"]:
            fail("can not update pull consumer to push based")
        if not new["deliver_subject"]:
            fail("can not update push consumer to pull based")
        if deliver_has_interest(old["deliver_subject"]):
            raise ApiError.of("JSConsumerNameExistErr")
    if old["max_waiting"] != new["max_waiting"]:
        fail("max waiting can not be updated")
    nbo = len(new["backoff"] or [])
    if nbo and new["max_deliver"] != -1 and nbo > new["max_deliver"]:
        raise ApiError.of("JSConsumerMaxDeliverBackoffErr")


__all__ = ["CONSUMER_CONFIG", "CREATE_CONSUMER_REQUEST", "set_defaults", "check_config",
           "check_update", "config_json", "from_request", "blank_config", "is_durable",
           "filters_of", "subjects_collide", "MAX_NAME_LEN"]
