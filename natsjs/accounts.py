"""Accounts: isolated subject namespaces, and the exports/imports that join them.

Each account owns a ``Sublist``; a client bound to an account publishes and subscribes
in it only, so accounts are isolated by construction.  Imports are wired with
internal subscriptions (``Subscription.callback``) in the exporting or importing
account's sublist, so they ride the same match-and-deliver path as client traffic
(DESIGN.md: internal subscribers are first-class):

* a stream import (B imports ``S`` from A, optionally renamed to ``T``) is one
  internal subscription on ``S`` in A whose callback delivers into B under ``T``;
* a service import (B imports service ``S`` from A as ``T``) is an internal
  subscription on ``T`` in B, kept from the routes (each server of a cluster forwards
  its own clients' requests, so each request reaches A once); a request is
  re-published in A with a reply subject ``_R_.<prefix>.<random token>`` that A's
  internal response subscription maps back to the requester's reply in B (one
  response, as the default ``singleton`` response type; ``stream``/``chunked`` keep
  the mapping until it expires).  Tokens are random so that no one can answer in
  the responder's place, and clients may not ask for answers on ``_R_.`` subjects.

Configuration follows nats-server's ``accounts {}`` block (server/opts.go
parseAccounts, parseExportStreamOrService, parseImportStreamOrService).
"""
from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass

from natsjs._core.fanout import UNDELIVERED, ClientCore, WithProducer
from natsjs._core.interest import count_interest
from natsjs._core.sublist import Sublist, Subscription
from natsjs.auth import AuthConfigError, User, parse_users
from natsjs.clientinfo import request_info_value, with_request_info
from natsjs.conf import parse_size
from natsjs.jetstream.config import parse_account_jetstream

GLOBAL_ACCOUNT = "$G"
DEFAULT_SYSTEM_ACCOUNT = "$SYS"
# How long a service-import response mapping lives (server/accounts.go DEFAULT_TTL-ish).
RESPONSE_TTL = 120.0
# Imports may chain (A -> B -> C -> ...); Server.deliver runs the chain flat, and
# this many internal hops in a row only happen in a cycle, which must end.
MAX_IMPORT_HOPS = 64
# Service-import responses waiting for their answer; past this the oldest are
# forgotten, so requests that are never answered cannot grow memory without bound.
MAX_PENDING_RESPONSES = 100_000
# The JetStream API: exported by the system account, where the servers' API handlers
# listen, and imported by every account that may use JetStream (server/jetstream.go
# setupJetStreamExports, enableAllJetStreamServiceImportsAndMappings).
JS_API_ALL = b"$JS.API.>"
# Requests the import does not carry: a consumer answers its pull requests and a stream
# its direct gets through their own subscriptions in the account (server/client.go
# processServiceImport skips these for the JetStream import).
JS_NOT_IMPORTED = (b"$JS.API.CONSUMER.MSG.NEXT.", b"$JS.API.DIRECT.GET.")
# With a JetStream domain, ``$JS.<domain>.API.<suffix>`` is the API too: nats-server maps
# these in every JetStream account (server/jetstream_api.go generateJSMappingTable);
# ``$KV.>`` and ``$OBJ.>`` behind the prefix lose it altogether.
JS_DOMAIN_API_TOKENS = (b"STREAM", b"CONSUMER", b"DIRECT", b"META", b"SERVER", b"ACCOUNT")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


# Each random byte to one of the 62 characters: the 8 characters that 248..255 also
# give are 5/4 as likely as the others, leaving 5.95 bits a character (71 bits for a
# reply token), at a tenth of the cost of drawing each with secrets.choice.
_TO_BASE62 = bytes(ord(_BASE62[b % 62]) for b in range(256))


def _random_token(n: int) -> bytes:
    return secrets.token_bytes(n).translate(_TO_BASE62)


@dataclass(frozen=True)
class Export:
    subject: str
    service: bool
    accounts: tuple[str, ...] = ()          # empty: public
    response_type: str = "singleton"


@dataclass(frozen=True)
class Import:
    account: str
    subject: str                           # subject in the exporting account
    to: str                                # subject in the importing account
    service: bool


@dataclass(frozen=True)
class AccountConfig:
    name: str
    users: tuple[User, ...] = ()
    exports: tuple[Export, ...] = ()
    imports: tuple[Import, ...] = ()
    # ``jetstream: enabled`` or ``jetstream {limits}`` (natsjs/jetstream/config.py);
    # None: JetStream is not enabled for this account (unless it is $G).
    jetstream: object = None


def _no_ops(op, args):
    raise AssertionError("a server-side publisher core parses nothing")


def _pattern_covers(pattern: str, subject: str) -> bool:
    """True if every subject matched by ``subject`` is matched by ``pattern``."""
    pt, st = pattern.split("."), subject.split(".")
    for i, tok in enumerate(pt):
        if tok == ">":
            return len(st) > i
        if i >= len(st) or st[i] == ">":
            return False
        if tok != "*" and (tok != st[i]):
            return False
    return len(pt) == len(st)


def _parse_export(entry) -> Export:
    if not isinstance(entry, dict):
        raise AuthConfigError("Export Items should be a map with type entry, got %r" % (entry,))
    subject, service, accounts, rtype = None, False, (), "singleton"
    for k, v in entry.items():
        lk = k.lower()
        if lk == "stream":
            subject, service = str(v), False
        elif lk == "service":
            subject, service = str(v), True
        elif lk == "accounts":
            accounts = tuple(str(a) for a in v)
        elif lk in ("response", "response_type"):
            rtype = str(v).lower()
            if rtype not in ("singleton", "stream", "chunked"):
                raise AuthConfigError("Unknown response type: %r" % v)
        elif lk in ("latency", "response_threshold", "threshold", "account_token_position",
                    "advertise", "allow_trace"):
            continue
        else:
            raise AuthConfigError("Unknown field %r parsing export" % k)
    if subject is None:
        raise AuthConfigError("Export needs a stream or a service subject")
    return Export(subject, service, accounts, rtype)


def _parse_import(entry) -> Import:
    if not isinstance(entry, dict):
        raise AuthConfigError("Import Items should be a map with type entry, got %r" % (entry,))
    source, service, to, prefix = None, False, "", ""
    for k, v in entry.items():
        lk = k.lower()
        if lk in ("stream", "service"):
            if not isinstance(v, dict):
                raise AuthConfigError("Import %s should be a map with account and subject" % lk)
            acc = v.get("account")
            subj = v.get("subject")
            if not acc or not subj:
                raise AuthConfigError("Import %s needs an account and a subject" % lk)
            source, service = (str(acc), str(subj)), lk == "service"
        elif lk == "to":
            to = str(v)
        elif lk == "prefix":
            prefix = str(v)
        elif lk in ("share", "allow_trace"):
            continue
        else:
            raise AuthConfigError("Unknown field %r parsing import" % k)
    if source is None:
        raise AuthConfigError("Import needs a stream or a service")
    acc, subj = source
    if prefix and not to:
        to = prefix + "." + subj
    return Import(acc, subj, to or subj, service)


def parse_accounts(value) -> dict[str, AccountConfig]:
    """``accounts { A { users, exports, imports } }`` or ``accounts: [A, B]``."""
    out: dict[str, AccountConfig] = {}
    if isinstance(value, list):
        for name in value:
            out[str(name)] = AccountConfig(str(name))
        return out
    if not isinstance(value, dict):
        raise AuthConfigError("Expected accounts to be a map or an array, got %r" % (value,))
    for name, body in value.items():
        users, exports, imports, js = (), [], [], None
        if body is None or body == {}:
            out[name] = AccountConfig(name)
            continue
        if not isinstance(body, dict):
            raise AuthConfigError("Expected account %r to be a map, got %r" % (name, body))
        for k, v in body.items():
            lk = k.lower()
            if lk == "users":
                users = parse_users(v, account=name)
            elif lk == "exports":
                exports = [_parse_export(e) for e in (v or [])]
            elif lk == "imports":
                imports = [_parse_import(e) for e in (v or [])]
            elif lk == "jetstream":

                def unknown(m, key, name=name):
                    raise AuthConfigError("Unknown field %r parsing account %r jetstream"
                                          % (key, name))
                try:
                    js = parse_account_jetstream(v, parse_size, unknown)
                except ValueError as exc:
                    raise AuthConfigError(str(exc)) from None
                if not js.enabled:
                    js = None
            elif lk in ("limits", "mappings", "default_permissions", "nkey",
                        "msg_trace", "trace_dest"):
                continue
            else:
                raise AuthConfigError("Unknown field %r parsing account %r" % (k, name))
        out[name] = AccountConfig(name, users, tuple(exports), tuple(imports), js)
    return out


def check_imports(configs: dict[str, AccountConfig]) -> None:
    """Each import must name an existing account with a matching export open to us."""
    for cfg in configs.values():
        for imp in cfg.imports:
            src = configs.get(imp.account)
            if src is None:
                raise AuthConfigError("%s import from unknown account %r in account %r" % (
                    "service" if imp.service else "stream", imp.account, cfg.name))
            ok = any(e.service == imp.service and _pattern_covers(e.subject, imp.subject)
                     and (not e.accounts or cfg.name in e.accounts) for e in src.exports)
            if not ok:
                raise AuthConfigError(
                    "%s import %r from account %r is not authorized by an export" % (
                        "service" if imp.service else "stream", imp.subject, imp.account))


def exact_interest(account: "Account", subject: bytes, queue: bytes = b"",
                   hops: int = 0) -> bool:
    """Whether someone subscribed to exactly ``subject`` (in the queue group ``queue``,
    if given) in ``account``: what nats-server's interest notifications count
    (server/sublist.go registerNotification), a wildcard that also matches does not.
    A stream import is an internal wildcard subscription here, where nats-server adds a
    shadow subscription per importing subscriber: it counts when the importing account
    has such a subscriber on the subject it maps to."""
    r = account.sublist.match(subject)
    if queue:
        if any(g[0].subject == subject and g[0].queue == queue for g in r.qsubs):
            return True
    elif any(s.subject == subject for s in r.psubs):
        return True
    if hops >= MAX_IMPORT_HOPS:
        return False
    for s in r.psubs:
        target = getattr(s.callback, "imports_into", None)
        if target is not None:
            dst, imp = target
            if exact_interest(dst, _map_subject(subject, imp.subject, imp.to), queue,
                              hops + 1):
                return True
    return False


def _map_subject(subject: bytes, src: str, dst: str) -> bytes:
    """Rename ``subject`` from the import's source pattern to its destination."""
    if src == dst:
        return subject
    if "*" not in src and ">" not in src:
        return dst.encode()
    # Wildcard tokens carry over position by position; a '>' tail carries over whole.
    st = subject.split(b".")
    dt = dst.split(".")
    out, wild = [], [t for i, t in enumerate(st)
                     if i < len(src.split(".")) and src.split(".")[i] in ("*", ">")]
    tail = st[len(src.split(".")) - 1:] if src.endswith(">") else []
    wi = 0
    for t in dt:
        if t == "*" and wi < len(wild):
            out.append(wild[wi])
            wi += 1
        elif t == ">":
            out.extend(tail)
        else:
            out.append(t.encode())
    return b".".join(out)


def split_js_delivery(reply: bytes | None):
    """(reply, shown subject) of what an internal subscriber got: a JetStream delivery
    carries the subject to show as ``$JS.ACK.<8 tokens>@<subject>`` (natsjs/_core/
    fanout.pyx, as routes carry it); anything else is (reply, None)."""
    if reply is None or b"@" not in reply:
        return reply, None
    dots = 0
    for i, c in enumerate(reply):
        if c == 46:
            dots += 1
        elif c == 64 and (dots >= 8 or i == 0):
            return reply[:i] or None, reply[i + 1:]
    return reply, None


class Account:
    def __init__(self, name: str, config: AccountConfig | None = None):
        self.name = name
        self.config = config or AccountConfig(name)
        self.sublist = Sublist()
        self.is_system = False
        self.internal_subs: list[Subscription] = []
        # The subset of internal_subs whose interest routes were told about.
        self.routed_internal_subs: list[Subscription] = []
        self._responses: dict[bytes, tuple] = {}
        # server/accounts.go createRespWildcard: _R_.<6 random chars>. per account and
        # server; each request then gets an unguessable token under it.
        self._resp_prefix = b"_R_." + _random_token(6)
        self._resp_sub: Subscription | None = None
        self.client_count = 0
        # Local interest as routes see it: subject (plain) or (subject, queue) ->
        # number of local subscriptions (server/route.go acc.rm, natsjs/_core/
        # interest.pyx).  Remote subscriptions never count.
        self.rm: dict[bytes | tuple[bytes, bytes], int] = {}
        # Called with (account, subs, delta) when local interest changes; the server
        # points it at the cluster.
        self.on_interest = None
        self._publisher = None
        self._publishing = False
        # What the account's closed connections carried (in msgs, in bytes, out msgs,
        # out bytes) and its slow consumers, for the account statz (sysreq.py).
        self.closed_totals = [0, 0, 0, 0]
        self.slow_consumers = 0

    def publisher(self):
        """A core that publishes into this account for server code (Server.deliver).

        One is kept and reused; a publish that happens while it is in use (an
        internal subscriber publishing again from inside a delivery) gets its own.
        """
        core = self._publisher
        if core is None or self._publishing:
            core = ClientCore(_no_ops, None, self.sublist)
            core.verbose = core.pedantic = False
            core.headers = True
            core.account_name = self.name.encode()
            if self._publisher is None:
                self._publisher = core
        if core is self._publisher:
            self._publishing = True
        return core

    def release_publisher(self, core) -> None:
        if core is self._publisher:
            self._publishing = False

    def add_internal(self, subject: bytes, callback, queue: bytes | None = None,
                     route: bool = True, owner=None) -> Subscription:
        """An internal subscription; ``route=False`` keeps its interest from the routes
        (every server has the same one and serves its own clients with it).  Server
        code subscribes through ``Server.subscribe_internal``, which sets ``owner``."""
        sub = Subscription(subject, queue, b"", None, callback, owner=owner)
        self.sublist.insert(sub)
        self.internal_subs.append(sub)
        if not route:
            return sub
        self.routed_internal_subs.append(sub)
        if self.on_interest is not None:
            self.on_interest(self, [sub], 1)
        else:
            count_interest(self.rm, [sub], 1)
        return sub

    def clear_internal(self) -> list[Subscription]:
        """Remove every internal subscription; returns those routes were told about."""
        for sub in self.internal_subs:
            sub.closed = True
            self.sublist.remove(sub)
        routed = self.routed_internal_subs
        self.internal_subs = []
        self.routed_internal_subs = []
        return routed

    # ---- wiring of imports ------------------------------------------------------------

    def wire_imports(self, server, accounts: dict[str, "Account"], owner) -> None:
        for imp in self.config.imports:
            src = accounts[imp.account]
            if imp.service:
                self._wire_service_import(server, src, imp, owner)
            else:
                self._wire_stream_import(server, src, imp, owner)

    def _wire_stream_import(self, server, src: "Account", imp: Import, owner) -> None:
        dst = self

        def forward(sub, subject, reply, hdr, msg):
            # Local subscribers only: every server of a cluster imports for its own.
            reply, shown = split_js_delivery(reply)
            server.deliver(dst, _map_subject(subject, imp.subject, imp.to), reply, msg, hdr,
                           to_routes=False, shown=shown)
        # Where the subscription leads, for exact_interest.
        forward.imports_into = (dst, imp)
        server.subscribe_internal(src, imp.subject.encode(), forward, owner)

    def imports_streams(self) -> bool:
        return any(not imp.service for imp in self.config.imports)

    def _wire_service_import(self, server, src: "Account", imp: Import, owner) -> None:
        dst = self
        export = next((e for e in src.config.exports
                       if e.service and _pattern_covers(e.subject, imp.subject)), None)
        rtype = export.response_type if export else "singleton"
        src.ensure_response_sub(server, owner)

        def request(sub, subject, reply, hdr, msg):
            mapped = _map_subject(subject, imp.to, imp.subject)
            new_reply = src.map_reply(dst, reply, rtype) if reply else None
            server.deliver(src, mapped, new_reply, msg, hdr)
        # Not routed: each server of a cluster has this import and forwards the
        # requests of its own clients, so a request is forwarded once, as nats-server
        # keeps service-import subscriptions from the routes (addServiceImportSub).
        server.subscribe_internal(dst, imp.to.encode(), request, owner, route=False)

    def wire_jetstream_import(self, server, owner) -> None:
        """Import ``$JS.API.>`` from the system account, sharing who asks: the request
        goes on in the system account with a ``Nats-Request-Info`` header naming this
        account and a reply that leads back here.  Like every service import it is kept
        from the routes: each server imports its own clients' requests, and a request
        that arrived over a route was imported by the server it entered (a route's
        copy is no responder).  A request the system account has no interest in (no
        JetStream server in reach) is no responder either, so the requester hears
        "no responders", as from nats-server."""
        dst = self
        sys_acc = server.system_account
        sys_acc.ensure_response_sub(server, owner)

        def request(client, sub, subject, reply, hdr, msg):
            if (client is not None and client.kind == "Router") or \
                    subject.startswith(JS_NOT_IMPORTED):
                return UNDELIVERED
            r = sys_acc.sublist.match(subject)
            if not r.psubs and not r.qsubs:
                return UNDELIVERED
            hdr, msg = with_request_info(hdr, msg, request_info_value(client, dst.name, server))
            new_reply = sys_acc.map_reply(dst, reply, "singleton") if reply else None
            server.deliver(sys_acc, subject, new_reply, msg, hdr)
        server.subscribe_internal(dst, JS_API_ALL, WithProducer(request), owner, route=False)
        js = getattr(server, "jetstream", None)
        if js is None or not js.domain:
            return
        prefix = b"$JS.%s.API." % js.domain.encode()

        def domain_request(client, sub, subject, reply, hdr, msg):
            mapped = js_domain_mapped(subject[len(prefix):])
            if mapped is None:
                return UNDELIVERED
            if mapped.startswith(b"$JS.API.") and not mapped.startswith(JS_NOT_IMPORTED):
                return request(client, sub, mapped, reply, hdr, msg)
            server.deliver(dst, mapped, reply, msg, hdr)
        server.subscribe_internal(dst, prefix + b">", WithProducer(domain_request), owner,
                                  route=False)

    def reset_imports(self) -> None:
        """Forget the wiring of imports (a reload wires them again)."""
        self._resp_sub = None
        self._responses.clear()

    def ensure_response_sub(self, server, owner) -> None:
        if self._resp_sub is not None:
            return
        acc = self

        def response(sub, subject, reply, hdr, msg):
            entry = acc._responses.get(subject)
            if entry is None:
                return
            target, original, rtype, expires = entry
            if expires < time.monotonic():
                del acc._responses[subject]
                return
            if rtype == "singleton":
                del acc._responses[subject]
            # A JetStream delivery (a pull request's answer) keeps its ack reply.
            reply, shown = split_js_delivery(reply)
            server.deliver(target, original, reply if shown is not None else None, msg, hdr,
                           shown=shown)
        self._resp_sub = server.subscribe_internal(self, self._resp_prefix + b".>", response,
                                                   owner)

    def map_reply(self, requester: "Account", reply: bytes, rtype: str) -> bytes:
        """A fresh reply subject in this account that leads back to ``reply``.

        The token is random, not a counter: whoever learns one reply subject must not
        be able to answer the next request in the responder's place.
        """
        token = self._resp_prefix + b"." + _random_token(12)
        responses = self._responses
        if len(responses) >= MAX_PENDING_RESPONSES:
            now = time.monotonic()
            for k in [k for k, e in responses.items() if e[3] < now]:
                del responses[k]
            # Still full: forget the oldest (dicts keep insertion order).
            for k in list(itertools.islice(responses, len(responses) - MAX_PENDING_RESPONSES + 1)):
                del responses[k]
        responses[token] = (requester, reply, rtype, time.monotonic() + RESPONSE_TTL)
        return token


def js_domain_mapped(suffix: bytes) -> bytes | None:
    """Where ``$JS.<domain>.API.<suffix>`` leads (None: nowhere, no mapping covers it)."""
    if suffix == b"INFO":
        return b"$JS.API.INFO"
    first, dot, rest = suffix.partition(b".")
    if not rest:
        return None
    if first in JS_DOMAIN_API_TOKENS:
        return b"$JS.API." + suffix
    if first in (b"$KV", b"$OBJ"):
        return suffix
    return None


class Imports:
    """The internal-subscription owner of every account's imports (see Server.add_internal_owner)."""

    name = "imports"
    max_tasks = 0

    def install(self, server) -> None:
        for acc in server.accounts.values():
            acc.reset_imports()
        for acc in list(server.accounts.values()):
            acc.wire_imports(server, server.accounts, self)
        for acc in jetstream_importers(server):
            acc.wire_jetstream_import(server, self)


def jetstream_importers(server) -> list[Account]:
    """The accounts that import the JetStream API from the system account.

    On a server with JetStream, every account but the system account: one without
    JetStream is told so by the API.  On a server without it in a cluster (JetStream
    and plain servers mixed), the accounts configured with JetStream, or the global
    account when it is the only one, so that this server carries their requests to
    the JetStream servers (server/server.go Start, "simple mixed mode")."""
    sys_acc = server.system_account
    others = [acc for acc in server.accounts.values() if acc is not sys_acc]
    if server.jetstream is not None:
        return others
    if server.opts.cluster is None:
        return []
    with_js = [acc for acc in others if acc.config.jetstream is not None]
    if not with_js and [acc.name for acc in others] == [GLOBAL_ACCOUNT]:
        return others
    return with_js
