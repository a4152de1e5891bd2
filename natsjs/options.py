"""Typed, frozen server options.

Command-line flags (natsjs/cli.py) and configuration files (natsjs/conf.py) are
turned into one ``ServerOptions`` before the server starts; nothing else reads raw
flags or config dictionaries.  Defaults are nats-server's (server/const.go).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from natsjs.accounts import DEFAULT_SYSTEM_ACCOUNT, AccountConfig
from natsjs.auth import AuthOptions, Permissions
from natsjs.jetstream.config import AccountJSLimits, JetStreamOptions
from natsjs.tls import TLSConfig

DEFAULT_PORT = 4222
DEFAULT_HOST = "0.0.0.0"
MAX_CONTROL_LINE_SIZE = 4096
MAX_PAYLOAD_SIZE = 1024 * 1024
MAX_PAYLOAD_MAX_SIZE = 8 * 1024 * 1024
MAX_PENDING_SIZE = 64 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 64 * 1024
DEFAULT_PING_INTERVAL = 120.0
DEFAULT_PING_MAX_OUT = 2
DEFAULT_FLUSH_DEADLINE = 10.0
DEFAULT_AUTH_TIMEOUT = 2.0
DEFAULT_LAME_DUCK_DURATION = 120.0
DEFAULT_LAME_DUCK_GRACE_PERIOD = 10.0
RANDOM_PORT = -1


DEFAULT_ROUTE_POOL_SIZE = 3
DEFAULT_RTT_THRESHOLDS = (0.010, 0.050, 0.100)
DEFAULT_MAX_REMOTE_SUBS = 1 << 20
# Route compression modes (server/route.go, server/opts.go).
COMPRESSION_OFF = "off"
COMPRESSION_ACCEPT = "accept"
COMPRESSION_S2_AUTO = "s2_auto"
COMPRESSION_S2_UNCOMPRESSED = "s2_uncompressed"
COMPRESSION_S2_FAST = "s2_fast"
COMPRESSION_S2_BETTER = "s2_better"
COMPRESSION_S2_BEST = "s2_best"
COMPRESSION_NOT_SUPPORTED = "not supported"
COMPRESSION_MODES = (COMPRESSION_OFF, COMPRESSION_ACCEPT, COMPRESSION_S2_AUTO,
                     COMPRESSION_S2_UNCOMPRESSED, COMPRESSION_S2_FAST, COMPRESSION_S2_BETTER,
                     COMPRESSION_S2_BEST)


@dataclass(frozen=True)
class ClusterOptions:
    """The ``cluster {}`` block (server/opts.go parseCluster)."""
    name: str = ""
    host: str = "0.0.0.0"
    port: int = 0
    advertise: str = ""
    no_advertise: bool = False
    routes: tuple[str, ...] = ()
    connect_retries: int = 0
    connect_backoff: bool = False
    username: str = ""
    password: str = ""
    auth_timeout: float = DEFAULT_AUTH_TIMEOUT
    pool_size: int = DEFAULT_ROUTE_POOL_SIZE
    accounts: tuple[str, ...] = ()
    compression: str = COMPRESSION_ACCEPT
    rtt_thresholds: tuple[float, ...] = DEFAULT_RTT_THRESHOLDS
    ping_interval: float = 0.0
    max_pings_out: int = 0
    tls: TLSConfig | None = None
    # What routes may import (publish: interest we send) and export (subscribe:
    # interest we accept), server/opts.go setClusterPermissions.
    permissions: Permissions | None = None
    # Subscriptions one peer server may hold here (natsjs's own bound: nats-server has
    # none, and a remote subscription costs about 2 KB here).
    max_remote_subs: int = DEFAULT_MAX_REMOTE_SUBS

    def validate(self) -> None:
        if self.compression not in COMPRESSION_MODES:
            raise ValueError('unsupported compression mode "%s"' % self.compression)
        if self.pool_size < 0 and self.accounts:
            raise ValueError("pool_size cannot be negative if pinned accounts are specified")
        if len(set(self.accounts)) != len(self.accounts):
            raise ValueError("duplicate account name in cluster accounts")
        if list(self.rtt_thresholds) != sorted(self.rtt_thresholds):
            raise ValueError("compression rtt_thresholds must be in ascending order")
        if self.max_remote_subs < 1:
            raise ValueError("cluster_max_subs must be positive")


@dataclass(frozen=True)
class ServerOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    server_name: str = ""
    http_host: str = ""
    http_port: int = 0
    max_payload: int = MAX_PAYLOAD_SIZE
    max_pending: int = MAX_PENDING_SIZE
    max_control_line: int = MAX_CONTROL_LINE_SIZE
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # Subscriptions one client connection may hold (max_subscriptions); 0: no limit.
    max_subs: int = 0
    ping_interval: float = DEFAULT_PING_INTERVAL
    max_pings_out: int = DEFAULT_PING_MAX_OUT
    write_deadline: float = DEFAULT_FLUSH_DEADLINE
    debug: bool = False
    trace: bool = False
    logtime: bool = True
    logtime_utc: bool = False
    log_file: str = ""
    pid_file: str = ""
    config_file: str = ""
    lame_duck_duration: float = DEFAULT_LAME_DUCK_DURATION
    lame_duck_grace_period: float = DEFAULT_LAME_DUCK_GRACE_PERIOD
    auth: AuthOptions = field(default_factory=AuthOptions)
    accounts: tuple[AccountConfig, ...] = ()
    system_account: str = DEFAULT_SYSTEM_ACCOUNT
    tls: TLSConfig | None = None
    cluster: ClusterOptions | None = None
    # ``-js``/``jetstream {}`` (natsjs/jetstream/config.py); None: JetStream off.
    jetstream: JetStreamOptions | None = None
    # The top-level ``store_dir`` (nats-server accepts it outside the jetstream block).
    store_dir: str = ""

    def replace(self, **changes) -> "ServerOptions":
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise ValueError for option combinations nats-server refuses."""
        if self.max_payload <= 0:
            raise ValueError("max_payload must be positive")
        if self.max_payload > self.max_pending:
            raise ValueError(
                "max_payload (%d) cannot be higher than max_pending (%d)"
                % (self.max_payload, self.max_pending))
        if self.max_control_line <= 0:
            raise ValueError("max_control_line must be positive")
        if not (self.port == RANDOM_PORT or 0 <= self.port <= 65535):
            raise ValueError("invalid port %d" % self.port)
        if self.cluster is not None:
            self.cluster.validate()
            # server/opts.go validateOptions: a JetStream cluster names its members.
            if self.jetstream is not None:
                if not self.server_name:
                    raise ValueError("jetstream cluster requires `server_name` to be set")
                if not self.cluster.name:
                    raise ValueError("jetstream cluster requires `cluster.name` to be set")
        if self.lame_duck_grace_period >= self.lame_duck_duration:
            raise ValueError("lame duck grace period (%gs) should be strictly lower than lame "
                             "duck duration (%gs)" % (self.lame_duck_grace_period,
                                                      self.lame_duck_duration))
