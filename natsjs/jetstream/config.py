"""JetStream configuration: the server's ``jetstream {}`` block and per-account limits.

Parsed once into frozen option objects (STYLE.md habit 7), following nats-server's
server/opts.go parseJetStream, parseJetStreamForAccount and parseJetStreamLimits: the
same keys and aliases, and unknown keys refused like every other block.

One deliberate difference in defaults: nats-server fsyncs lazily (``sync_interval``
2 minutes) unless told ``always``; natsjs acknowledges only what is on disk by default
(group commit keeps that cheap).  ``sync_interval: <duration>`` gives the lazy
behaviour to those who ask for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# server/jetstream.go: JetStream is not allowed below these, and the defaults.
JS_MIN_MEMORY = 0
DEFAULT_MAX_CONSUMERS = 1000          # 2.15 limits.default_max_consumers (/varz)
DEFAULT_REQUEST_QUEUE_LIMIT = 10_000  # server/jetstream.go JSDefaultRequestQueueLimit
DEFAULT_MAX_OUTSTANDING_CATCHUP = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServerJSLimits:
    """``jetstream { limits {} }`` (server/opts.go JSLimitOpts)."""
    max_request_batch: int = 0
    max_ack_pending: int = 0
    max_ha_assets: int = 0
    duplicate_window: float = 0.0
    # ``batch {}``: atomic batch publish limits (0: nats-server's defaults).
    max_batch_inflight_per_stream: int = 0
    max_batch_inflight_total: int = 0
    max_batch_size: int = 0
    max_batch_timeout: float = 0.0


@dataclass(frozen=True)
class JetStreamOptions:
    enabled: bool = True
    store_dir: str = ""
    max_memory: int = -1              # -1: 75% of the machine's memory
    max_store: int = -1               # -1: 75% of the free space under store_dir
    # 0: fsync before every acknowledgement (batched); > 0: nats-server's lazy mode.
    sync_interval: float = 0.0
    domain: str = ""
    unique_tag: str = ""
    max_outstanding_catchup: int = DEFAULT_MAX_OUTSTANDING_CATCHUP
    strict: bool = True
    request_queue_limit: int = DEFAULT_REQUEST_QUEUE_LIMIT
    limits: ServerJSLimits = field(default_factory=ServerJSLimits)

    @property
    def sync_always(self) -> bool:
        return self.sync_interval <= 0


@dataclass(frozen=True)
class AccountJSLimits:
    """An account's ``jetstream {}`` (server/opts.go parseJetStreamForAccount); -1 is
    unlimited, as in nats-server's JetStreamAccountLimits."""
    enabled: bool = True
    max_memory: int = -1
    max_store: int = -1
    max_streams: int = -1
    max_consumers: int = -1
    max_ack_pending: int = -1
    memory_max_stream_bytes: int = -1
    store_max_stream_bytes: int = -1
    max_bytes_required: bool = False

    def to_json(self) -> dict:
        return {"max_memory": self.max_memory, "max_storage": self.max_store,
                "max_streams": self.max_streams, "max_consumers": self.max_consumers,
                "max_ack_pending": self.max_ack_pending,
                "memory_max_stream_bytes": self.memory_max_stream_bytes,
                "storage_max_stream_bytes": self.store_max_stream_bytes,
                "max_bytes_required": self.max_bytes_required}


def _enabled_word(value: str) -> bool:
    v = value.lower()
    if v in ("enabled", "enable"):
        return True
    if v in ("disabled", "disable"):
        return False
    raise ValueError("Expected 'enabled' or 'disabled' for string value, got '%s'" % value)


def _switch_or_map(value, kind):
    """``jetstream`` may be a bool, ``enabled``/``disabled`` or a map: the options for
    the first two, None for a map (its keys are parsed by the caller)."""
    if isinstance(value, bool):
        return kind(enabled=value)
    if isinstance(value, str):
        return kind(enabled=_enabled_word(value))
    if not isinstance(value, dict):
        raise ValueError("Expected map, bool or string to define JetStream, got %s"
                         % type(value).__name__)
    return None


def parse_jetstream(value, parse_size, parse_duration, unknown) -> JetStreamOptions:
    """``jetstream: enabled`` / ``true`` / ``{ store_dir: ..., ... }``.

    ``unknown(mapping, key)`` raises the config format's unknown-field error.
    """
    simple = _switch_or_map(value, JetStreamOptions)
    if simple is not None:
        return simple
    kw: dict = {}
    for key, v in value.items():
        k = key.lower()
        if k in ("store", "store_dir", "storedir"):
            kw["store_dir"] = str(v)
        elif k in ("sync", "sync_interval"):
            if isinstance(v, str) and v.lower() == "always":
                kw["sync_interval"] = 0.0
            else:
                kw["sync_interval"] = parse_duration(v)
        elif k in ("max_memory_store", "max_mem_store", "max_mem"):
            kw["max_memory"] = parse_size(v)
        elif k in ("max_file_store", "max_file"):
            kw["max_store"] = parse_size(v)
        elif k == "domain":
            kw["domain"] = str(v)
        elif k in ("enable", "enabled"):
            kw["enabled"] = bool(v)
        elif k == "strict":
            if not isinstance(v, bool):
                raise ValueError("Expected 'true' or 'false' for bool value, got '%s'" % v)
            kw["strict"] = v
        elif k == "unique_tag":
            kw["unique_tag"] = str(v).lower().strip()
        elif k == "max_outstanding_catchup":
            kw["max_outstanding_catchup"] = parse_size(v)
        elif k == "request_queue_limit":
            kw["request_queue_limit"] = int(v)
        elif k == "limits":
            kw["limits"] = _parse_limits(v, parse_duration, unknown)
        elif k in ("key", "ek", "encryption_key", "prev_key", "prev_ek", "prev_encryption_key",
                   "cipher", "tpm"):
            raise ValueError("JetStream encryption is not supported by natsjs")
        elif k in ("extension_hint", "max_buffered_size", "max_buffered_msgs",
                   "info_queue_limit", "meta_compact", "meta_compact_size",
                   "meta_compact_sync", "max_concurrent_io"):
            continue      # tuning knobs of nats-server's implementation: accepted
        else:
            unknown(value, key)
    return JetStreamOptions(**kw)


def _parse_limits(value, parse_duration, unknown) -> ServerJSLimits:
    if not isinstance(value, dict):
        raise ValueError("Expected a map to define JetStreamLimits, got %s" % type(value).__name__)
    kw: dict = {}
    for key, v in value.items():
        k = key.lower()
        if k == "max_ack_pending":
            kw["max_ack_pending"] = int(v)
        elif k == "max_ha_assets":
            kw["max_ha_assets"] = int(v)
        elif k == "max_request_batch":
            kw["max_request_batch"] = int(v)
        elif k == "duplicate_window":
            kw["duplicate_window"] = parse_duration(v)
        elif k == "batch":
            _parse_batch_limits(v, kw, parse_duration, unknown)
        else:
            unknown(value, key)
    return ServerJSLimits(**kw)


def _parse_batch_limits(value, kw: dict, parse_duration, unknown) -> None:
    """``limits { batch { ... } }`` (server/opts.go parseJetStreamLimitsBatch)."""
    if not isinstance(value, dict):
        raise ValueError("Expected a map to define batch limits, got %s" % type(value).__name__)
    for key, v in value.items():
        k = key.lower()
        if k == "max_inflight_per_stream":
            kw["max_batch_inflight_per_stream"] = int(v)
        elif k == "max_inflight_total":
            kw["max_batch_inflight_total"] = int(v)
        elif k == "max_msgs":
            kw["max_batch_size"] = int(v)
        elif k == "timeout":
            kw["max_batch_timeout"] = parse_duration(v)
        else:
            unknown(value, key)


def parse_account_jetstream(value, parse_size, unknown) -> AccountJSLimits:
    """An account's ``jetstream: enabled`` or ``jetstream { max_memory: 1G, ... }``."""
    simple = _switch_or_map(value, AccountJSLimits)
    if simple is not None:
        return simple
    kw: dict = {}
    for key, v in value.items():
        k = key.lower()
        try:
            if k in ("max_memory", "max_mem", "mem", "memory"):
                kw["max_memory"] = parse_size(v)
            elif k in ("max_store", "max_file", "max_disk", "store", "disk"):
                kw["max_store"] = parse_size(v)
            elif k in ("max_streams", "streams"):
                kw["max_streams"] = int(v)
            elif k in ("max_consumers", "consumers"):
                kw["max_consumers"] = int(v)
            elif k in ("max_bytes_required", "max_stream_bytes", "max_bytes"):
                if not isinstance(v, bool):
                    raise ValueError("Expected a parseable bool for %r, got %r" % (key, v))
                kw["max_bytes_required"] = v
            elif k in ("mem_max_stream_bytes", "memory_max_stream_bytes"):
                kw["memory_max_stream_bytes"] = parse_size(v)
            elif k in ("disk_max_stream_bytes", "store_max_stream_bytes"):
                kw["store_max_stream_bytes"] = parse_size(v)
            elif k == "max_ack_pending":
                kw["max_ack_pending"] = int(v)
            elif k == "cluster_traffic":
                continue
            else:
                unknown(value, key)
        except (TypeError, ValueError) as exc:
            if "parseable" in str(exc) or "unknown field" in str(exc):
                raise
            raise ValueError("Expected a parseable size for %r, got %r" % (key, v)) from None
    return AccountJSLimits(**kw)
