"""Configuration file -> ``ServerOptions``.

``natsjs/conf.py`` reads the NATS configuration format into plain values; this
module turns the top-level keys nats-server knows into typed options (server/opts.go
processConfigFileLine), warning about keys it does not know.  Blocks for features
that later issues implement (cluster, jetstream, accounts, authorization, tls) are
accepted here so that the documented configurations load.
"""
from __future__ import annotations

import dataclasses
import random
import string

from natsjs import conf
from natsjs._core.sublist import valid_subject
from natsjs.accounts import check_imports, parse_accounts
from natsjs.auth import Permissions, User, parse_authorization, parse_permissions
from natsjs.conf import parse_size
from natsjs.jetstream.config import parse_jetstream
from natsjs.options import COMPRESSION_MODES, ClusterOptions, ServerOptions
from natsjs.tls import TLSConfig


def parse_duration(value) -> float:
    """A Go duration string, or a number of seconds (as nats-server's opts.go)."""
    return conf.to_duration(value)


def _listen(value: str) -> tuple[str, int]:
    host, _, port = str(value).rpartition(":")
    return host, int(port)


# Keys accepted now but implemented by later issues (or needing nothing here).
_LATER = {"leafnodes", "gateway", "websocket", "mqtt",
          "server_tags", "http_base_path", "operator", "resolver"}


# Aliases nats-server accepts for compression modes (opts.go
# validateAndNormalizeCompressionOption), for routes.
_COMPRESSION_ALIASES = {"on": "accept", "enabled": "accept", "true": "accept",
                        "disabled": "off", "false": "off", "auto": "s2_auto",
                        "fast": "s2_fast", "better": "s2_better", "best": "s2_best"}


def parse_compression(value, path: str = "") -> tuple[str, tuple[float, ...] | None]:
    """``compression: s2_fast`` / ``true`` / ``{mode: s2_auto, rtt_thresholds: [...]}``."""
    thresholds = None
    if isinstance(value, bool):
        mode = "s2_fast" if value else "off"
    elif isinstance(value, str):
        mode = value
    elif isinstance(value, dict):
        mode = "accept"
        for k, v in value.items():
            lk = k.lower()
            if lk == "mode":
                mode = str(v)
            elif lk in ("rtt_thresholds", "thresholds", "rtts", "rtt"):
                if not isinstance(v, list):
                    raise ValueError("%s: rtt_thresholds must be an array" % _where(value, k, path))
                thresholds = tuple(parse_duration(x) for x in v)
                while thresholds and thresholds[-1] == 0:
                    thresholds = thresholds[:-1]
                if len(thresholds) > 4:
                    raise ValueError("compression mode %r: at most 4 rtt thresholds" % mode)
            else:
                raise ValueError('%s: unknown field "%s"' % (_where(value, k, path), k))
    else:
        raise ValueError("compression: unexpected value %r" % (value,))
    mode = _COMPRESSION_ALIASES.get(mode.lower(), mode.lower())
    # s2_uncompressed is a level s2_auto may pick, not a mode one can configure
    # (nats-server refuses it too).
    if mode not in COMPRESSION_MODES or mode == "s2_uncompressed":
        raise ValueError('unsupported compression mode "%s"' % mode)
    return mode, thresholds


def parse_cluster_permissions(value, where: str) -> Permissions:
    """``cluster { permissions { import, export } }`` (opts.go parseCluster): import is
    kept as the publish side, export as the subscribe side, plain subjects only."""
    perms = parse_permissions(value)
    if perms.response is not None:
        raise ValueError("%s: Cluster permissions do not support dynamic responses" % where)
    for what, sp in (("import", perms.publish), ("export", perms.subscribe)):
        for kind, subjects in (("allow", sp.allow if sp else None),
                               ("deny", sp.deny if sp else None)):
            for subject in subjects or ():
                if not valid_subject(subject.encode()):
                    raise ValueError('%s: cluster %s %s: subject "%s" is not a valid subject'
                                     % (where, what, kind, subject))
    return perms


def parse_cluster(value, path: str = "", warn=None) -> ClusterOptions:
    if not isinstance(value, dict):
        raise ValueError("cluster: expected a map, got %r" % (value,))
    kw: dict = {}
    auth_perms = None
    for key, v in value.items():
        k = key.lower()
        if k == "name":
            kw["name"] = str(v)
        elif k == "listen":
            host, port = _listen(v)
            if host:
                kw["host"] = host
            kw["port"] = port
        elif k in ("host", "net"):
            kw["host"] = str(v)
        elif k == "port":
            kw["port"] = int(v)
        elif k in ("cluster_advertise", "advertise"):
            kw["advertise"] = str(v)
        elif k == "no_advertise":
            kw["no_advertise"] = bool(v)
        elif k == "routes":
            if not isinstance(v, list):
                raise ValueError("%s: routes must be an array" % _where(value, key, path))
            kw["routes"] = tuple(str(r) for r in v)
        elif k == "connect_retries":
            kw["connect_retries"] = int(v)
        elif k == "connect_backoff":
            kw["connect_backoff"] = bool(v)
        elif k == "authorization":
            if not isinstance(v, dict):
                raise ValueError("cluster authorization: expected a map")
            for ak, av in v.items():
                lak = ak.lower()
                if lak in ("user", "username"):
                    kw["username"] = str(av)
                elif lak in ("pass", "password"):
                    kw["password"] = str(av)
                elif lak == "timeout":
                    kw["auth_timeout"] = parse_duration(av)
                elif lak in ("permissions", "permission"):
                    where = _where(v, ak, path)
                    auth_perms = parse_cluster_permissions(av, where)
                    if warn is not None:
                        warn('%s: setting "permissions" within cluster authorization block '
                             'is deprecated' % where)
                else:
                    raise ValueError('%s: unknown field "%s"' % (_where(v, ak, path), ak))
        elif k == "pool_size":
            kw["pool_size"] = int(v)
        elif k == "accounts":
            kw["accounts"] = tuple(str(a) for a in v)
        elif k == "compression":
            mode, thresholds = parse_compression(v, path)
            kw["compression"] = mode
            if thresholds is not None:
                kw["rtt_thresholds"] = thresholds
        elif k == "ping_interval":
            kw["ping_interval"] = parse_duration(v)
        elif k == "ping_max":
            kw["max_pings_out"] = int(v)
        elif k == "tls":
            kw["tls"] = TLSConfig.from_conf(v)
        elif k == "permissions":
            kw["permissions"] = parse_cluster_permissions(v, _where(value, key, path))
        elif k in ("write_deadline", "write_timeout"):
            continue   # not implemented yet: accepted so documented configs load
        elif isinstance(value, conf.ConfMap) and value.is_used_variable(key):
            continue
        else:
            raise ValueError('%s: unknown field "%s"' % (_where(value, key, path), key))
    if kw.get("pool_size") == 0:
        kw["pool_size"] = 3
    if auth_perms is not None and "permissions" not in kw:
        kw["permissions"] = auth_perms   # the top-level block wins (opts.go)
    return ClusterOptions(**kw)


def _unknown(mapping, key: str, path: str):
    raise ValueError('%s: unknown field "%s"' % (_where(mapping, key, path), key))


def _where(mapping, key: str, path: str) -> str:
    pos = mapping.pos(key) if isinstance(mapping, conf.ConfMap) else None
    return pos.nats() if pos is not None else (path or "config")


def options_from_mapping(mapping: dict, base: ServerOptions, warn=None,
                         path: str = "") -> ServerOptions:
    changes: dict = {}
    no_auth_user = None
    for key, value in mapping.items():
        k = key.lower()
        if k in ("port",):
            changes["port"] = int(value)
        elif k in ("host", "net", "addr"):
            changes["host"] = str(value)
        elif k == "listen":
            host, port = _listen(value)
            if host:
                changes["host"] = host
            changes["port"] = port
        elif k in ("server_name",):
            changes["server_name"] = str(value)
        elif k in ("http_port", "monitor_port"):
            changes["http_port"] = int(value)
        elif k == "http":
            host, port = _listen(value)
            if host:
                changes["http_host"] = host
            changes["http_port"] = port
        elif k == "max_payload":
            changes["max_payload"] = parse_size(value)
        elif k == "max_pending":
            changes["max_pending"] = parse_size(value)
        elif k in ("max_control_line",):
            changes["max_control_line"] = parse_size(value)
        elif k in ("max_connections", "max_conn"):
            changes["max_connections"] = int(value)
        elif k in ("max_subscriptions", "max_subs"):
            changes["max_subs"] = int(value)
        elif k == "ping_interval":
            changes["ping_interval"] = parse_duration(value)
        elif k == "ping_max":
            changes["max_pings_out"] = int(value)
        elif k == "write_deadline":
            changes["write_deadline"] = parse_duration(value)
        elif k == "debug":
            changes["debug"] = bool(value)
        elif k == "trace":
            changes["trace"] = bool(value)
        elif k == "logtime":
            changes["logtime"] = bool(value)
        elif k == "logtime_utc":
            changes["logtime_utc"] = bool(value)
        elif k in ("log_file", "logfile"):
            changes["log_file"] = str(value)
        elif k in ("pid_file", "pidfile"):
            changes["pid_file"] = str(value)
        elif k == "lame_duck_duration":
            ldd = parse_duration(value)
            if ldd < 30:
                raise ValueError("%s: invalid lame_duck_duration of %s, minimum is 30 seconds"
                                 % (_where(mapping, key, path), value))
            changes["lame_duck_duration"] = ldd
        elif k == "lame_duck_grace_period":
            changes["lame_duck_grace_period"] = parse_duration(value)
        elif k == "cluster":
            changes["cluster"] = parse_cluster(value, path, warn)
        elif k == "tls":
            changes["tls"] = TLSConfig.from_conf(value, warn=warn)
        elif k == "jetstream":
            js = parse_jetstream(value, parse_size, parse_duration,
                                 lambda m, key: _unknown(m, key, path))
            if js.store_dir and changes.get("store_dir"):
                raise ValueError("%s: Duplicate 'store_dir' configuration"
                                 % _where(mapping, key, path))
            changes["jetstream"] = js if js.enabled else None
        elif k in ("store_dir", "storedir"):
            js = changes.get("jetstream")
            if js is not None and js.store_dir:
                raise ValueError("%s: Duplicate 'store_dir' configuration"
                                 % _where(mapping, key, path))
            changes["store_dir"] = str(value)
        elif k == "authorization":
            changes["auth"] = parse_authorization(value)
        elif k == "accounts":
            accounts = parse_accounts(value)
            check_imports(accounts)
            changes["accounts"] = tuple(accounts.values())
        elif k == "system_account":
            changes["system_account"] = str(value)
        elif k == "no_auth_user":
            no_auth_user = str(value)
            continue
        elif k in _LATER:
            continue
        elif isinstance(mapping, conf.ConfMap) and mapping.is_used_variable(key):
            continue   # a key defined only to be used as $key is not a field
        else:
            # nats-server refuses unknown fields (server/opts.go unknownConfigFieldErr).
            raise ValueError('%s: unknown field "%s"' % (_where(mapping, key, path), key))
    if no_auth_user is None and "authorization" not in {k.lower() for k in mapping}:
        _sys_only_no_auth_user(changes, base)
    if no_auth_user is not None:
        auth = changes.get("auth", base.auth)
        changes["auth"] = dataclasses.replace(auth, no_auth_user=no_auth_user)
        users = list(changes["auth"].users) + [
            u for a in changes.get("accounts", base.accounts) for u in a.users]
        if not any(u.username == no_auth_user for u in users):
            raise ValueError("no_auth_user: %r not present as user or nkey in authorization "
                             "block or account configuration" % no_auth_user)
    return base.replace(config_file=path, **changes)


# nats-server's name for the user it invents below: random, once per process, so a
# reload keeps the clients that connected as it (server/server.go sysAccOnlyNoAuthUser).
_SYS_ONLY_USER = "nats-" + "".join(random.choice(string.ascii_letters + string.digits)
                                   for _ in range(8))


def _sys_only_no_auth_user(changes: dict, base: ServerOptions) -> None:
    """Accounts that configure only the system account (to give it a user, as the
    JetStream clustering documentation does) leave clients without credentials in the
    global account, as nats-server arranges it: a user of the global account, and
    no_auth_user naming it."""
    accounts = changes.get("accounts")
    system = changes.get("system_account", base.system_account)
    if not accounts or [a.name for a in accounts] != [system]:
        return
    auth = changes.get("auth", base.auth)
    if auth.no_auth_user:
        return
    changes["auth"] = dataclasses.replace(
        auth, users=auth.users + (User(_SYS_ONLY_USER, _SYS_ONLY_USER[6:]),),
        no_auth_user=_SYS_ONLY_USER)


def load_config(path: str, base: ServerOptions | None = None, warn=None) -> ServerOptions:
    data = conf.parse_file(path)
    return options_from_mapping(data, base or ServerOptions(), warn, path)
