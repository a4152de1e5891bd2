"""Authentication and authorization: who a connection is, and what it may do.

Before it: a client's CONNECT (natsjs/client.py).  After it: the client is bound to
an account (natsjs/accounts.py) and, when its user has permissions, gets a
``Permissions`` checker that the publish and subscribe paths consult.

Configuration follows nats-server (server/opts.go parseAuthorization, parseUsers,
parseUserPermissions, parseAccounts; server/auth.go for the checks): a token, one
user/password, a ``users`` list (with optional ``permissions`` and ``account``), nkey
users whose CONNECT carries an ed25519 signature of the INFO ``nonce``, bcrypt
hashes (``$2a$``/``$2b$``/``$2y$``) anywhere a password or token is expected, and a
``no_auth_user`` that connections without credentials are treated as.
"""
from __future__ import annotations

import base64
import hmac
import os
import time
from dataclasses import dataclass

from natsjs import conf
from natsjs._core.sublist import Sublist, Subscription

DEFAULT_AUTH_TIMEOUT = 2.0
# allow_responses defaults (server/const.go DEFAULT_ALLOW_RESPONSE_*).
DEFAULT_ALLOW_RESPONSE_MAX_MSGS = 1
DEFAULT_ALLOW_RESPONSE_EXPIRATION = 120.0

AUTHORIZATION_VIOLATION = "Authorization Violation"
AUTHENTICATION_TIMEOUT = "Authentication Timeout"


class AuthConfigError(ValueError):
    """An authorization or accounts block that nats-server would refuse."""


@dataclass(frozen=True)
class SubjectPermission:
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ResponsePermission:
    max_msgs: int = DEFAULT_ALLOW_RESPONSE_MAX_MSGS
    expires: float = DEFAULT_ALLOW_RESPONSE_EXPIRATION


@dataclass(frozen=True)
class Permissions:
    publish: SubjectPermission | None = None
    subscribe: SubjectPermission | None = None
    response: ResponsePermission | None = None


@dataclass(frozen=True)
class User:
    username: str = ""
    password: str = ""
    nkey: str = ""
    account: str = ""
    permissions: Permissions | None = None


@dataclass(frozen=True)
class AuthOptions:
    token: str = ""
    username: str = ""
    password: str = ""
    users: tuple[User, ...] = ()
    timeout: float = DEFAULT_AUTH_TIMEOUT
    default_permissions: Permissions | None = None
    no_auth_user: str = ""

    @property
    def required(self) -> bool:
        return bool(self.token or self.username or self.users)

    @property
    def has_nkeys(self) -> bool:
        return any(u.nkey for u in self.users)


# ---- configuration ------------------------------------------------------------------

def _subjects(value, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise AuthConfigError("Expected subject permissions to be a subject, or array of "
                          "subjects, got %r (%s)" % (value, what))


def _subject_permission(value, what: str) -> SubjectPermission:
    if isinstance(value, dict):
        allow = deny = None
        for k, v in value.items():
            lk = k.lower()
            if lk == "allow":
                allow = _subjects(v, what)
            elif lk == "deny":
                deny = _subjects(v, what)
            else:
                raise AuthConfigError(
                    "Unknown field name %r parsing subject permissions, only 'allow' or "
                    "'deny' are permitted" % k)
        return SubjectPermission(allow, deny)
    return SubjectPermission(allow=_subjects(value, what))


def parse_permissions(value) -> Permissions:
    if not isinstance(value, dict):
        raise AuthConfigError("Expected permissions to be a map/struct, got %r" % (value,))
    pub = sub = resp = None
    for k, v in value.items():
        lk = k.lower()
        if lk in ("pub", "publish", "import"):
            pub = _subject_permission(v, "publish")
        elif lk in ("sub", "subscribe", "export"):
            sub = _subject_permission(v, "subscribe")
        elif lk in ("publish_allow_responses", "allow_responses"):
            if isinstance(v, bool):
                resp = ResponsePermission() if v else None
            elif isinstance(v, dict):
                max_msgs, expires = DEFAULT_ALLOW_RESPONSE_MAX_MSGS, DEFAULT_ALLOW_RESPONSE_EXPIRATION
                for rk, rv in v.items():
                    lrk = rk.lower()
                    if lrk in ("max", "max_msgs", "max_messages", "max_responses"):
                        max_msgs = int(rv) or max_msgs
                    elif lrk in ("expires", "expiration", "ttl"):
                        expires = conf.parse_duration(str(rv)) or expires
                    else:
                        raise AuthConfigError("Unknown field %r parsing permissions" % rk)
                resp = ResponsePermission(max_msgs, expires)
            else:
                raise AuthConfigError(
                    "error parsing response permissions, expected a boolean or a map")
        else:
            raise AuthConfigError("Unknown field %r parsing permissions" % k)
    if resp is not None:
        # Responses are only meaningful on top of a publish allow list (opts.go).
        if pub is None:
            pub = SubjectPermission(allow=())
        elif pub.allow is None:
            pub = SubjectPermission(allow=(), deny=pub.deny)
    return Permissions(pub, sub, resp)


def parse_users(value, account: str = "") -> tuple[User, ...]:
    if not isinstance(value, list):
        raise AuthConfigError("Expected users field to be an array, got %r" % (value,))
    users = []
    for entry in value:
        if not isinstance(entry, dict):
            raise AuthConfigError("Expected user entry to be a map/struct, got %r" % (entry,))
        username = password = nkey = ""
        perms = None
        acc = account
        for k, v in entry.items():
            lk = k.lower()
            if lk in ("user", "username"):
                username = str(v)
            elif lk in ("pass", "password"):
                password = str(v)
            elif lk == "nkey":
                nkey = str(v)
            elif lk in ("permission", "permissions", "authorization"):
                perms = parse_permissions(v)
            elif lk in ("account", "acc"):
                acc = str(v)
            elif lk in ("allowed_connection_types", "connection_types", "clients"):
                continue
            else:
                raise AuthConfigError("Unknown field %r parsing users" % k)
        if nkey:
            if username or password:
                raise AuthConfigError("Nkey users do not take usernames or passwords")
            if not nkey.startswith("U"):
                raise AuthConfigError("Not a valid public nkey for a user: %r" % nkey)
        elif not username:
            raise AuthConfigError("User entry requires a user")
        users.append(User(username, password, nkey, acc, perms))
    return tuple(users)


def parse_authorization(value) -> AuthOptions:
    if not isinstance(value, dict):
        raise AuthConfigError("Expected authorization to be a map/struct, got %r" % (value,))
    kw: dict = {}
    default_perms = None
    users: tuple[User, ...] = ()
    for k, v in value.items():
        lk = k.lower()
        if lk in ("user", "username"):
            kw["username"] = str(v)
        elif lk in ("pass", "password"):
            kw["password"] = str(v)
        elif lk == "token":
            kw["token"] = str(v)
        elif lk == "timeout":
            kw["timeout"] = conf.to_duration(v)
        elif lk == "users":
            users = parse_users(v)
        elif lk in ("default_permission", "default_permissions", "permissions"):
            default_perms = parse_permissions(v)
        else:
            raise AuthConfigError("unknown field %r in authorization" % k)
    if default_perms is not None:
        users = tuple(u if u.permissions is not None else
                      User(u.username, u.password, u.nkey, u.account, default_perms)
                      for u in users)
    if users and (kw.get("username") or kw.get("token")):
        raise AuthConfigError("Can not have a single user/pass or token and a users array")
    if kw.get("username") and kw.get("token"):
        raise AuthConfigError("Can not have a token and a user/pass")
    return AuthOptions(users=users, default_permissions=default_perms, **kw)


# ---- checking credentials --------------------------------------------------------------

def is_bcrypt(secret: str) -> bool:
    return secret.startswith(("$2a$", "$2b$", "$2x$", "$2y$"))


def compare_secret(configured: str, given: str) -> bool:
    """True if ``given`` is the secret ``configured`` (plain, or a bcrypt hash).

    A bcrypt comparison costs tens of milliseconds to seconds by design: connection
    code checks such secrets with ``check_secret`` instead, off the event loop.
    """
    if is_bcrypt(configured):
        import bcrypt
        try:
            return bcrypt.checkpw(given.encode(), configured.encode())
        except ValueError:
            return False
    return hmac.compare_digest(configured.encode(), given.encode())


async def check_secret(configured: str, given: str, limiter=None) -> bool:
    """``compare_secret`` that keeps the event loop free: a bcrypt hash is checked in
    a worker thread (the bcrypt library releases the GIL), so other connections are
    served meanwhile, as nats-server checks in the connection's own goroutine."""
    if not is_bcrypt(configured):
        return compare_secret(configured, given)
    import trio
    return await trio.to_thread.run_sync(compare_secret, configured, given, limiter=limiter,
                                         abandon_on_cancel=True)


def new_nonce() -> str:
    """11 random bytes, base64url without padding, as nats-server's nonces look."""
    return base64.urlsafe_b64encode(os.urandom(11)).rstrip(b"=").decode()


_USER_PREFIX = 20 << 3   # nkey prefix byte of a user public key ('U')


def _crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def decode_user_nkey(public: str) -> bytes:
    """The raw ed25519 key inside a 'U...' public nkey (base32, prefix byte, CRC16)."""
    try:
        raw = base64.b32decode(public + "=" * (-len(public) % 8))
    except (ValueError, TypeError) as exc:
        raise ValueError("invalid nkey encoding") from exc
    if len(raw) != 35 or raw[0] != _USER_PREFIX:
        raise ValueError("not a user nkey")
    if _crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise ValueError("nkey checksum mismatch")
    return raw[1:33]


def verify_nkey(public: str, nonce: str, sig: str) -> bool:
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey
    try:
        key = decode_user_nkey(public)
        pad = "=" * (-len(sig) % 4)
        try:
            raw_sig = base64.urlsafe_b64decode(sig + pad)
        except ValueError:
            raw_sig = base64.b64decode(sig + pad)
        VerifyKey(key).verify(nonce.encode(), raw_sig)
        return True
    except (ValueError, BadSignatureError, TypeError):
        return False


def identify(auth: AuthOptions, users_by_account: dict, connect: dict,
             nonce: str) -> tuple[User | None, str | None, str]:
    """Who a CONNECT claims to be: ``(user, secret, given)``.

    ``user`` is None when nobody matches; otherwise the CONNECT authenticates as
    ``user`` if ``given`` (its password or token) matches the configured ``secret``,
    or at once when ``secret`` is None (a verified nkey signature, no_auth_user).
    Splitting the cheap lookup from the secret check lets callers run a bcrypt check
    off the event loop.  ``users_by_account`` holds the users declared inside
    ``accounts {}`` blocks (their ``account`` field set); ``auth.users`` those of the
    ``authorization`` block.
    """
    all_users = list(auth.users) + [u for us in users_by_account.values() for u in us]
    token = str(connect.get("auth_token") or "")
    username = str(connect.get("user") or "")
    password = str(connect.get("pass") or "")
    nkey = str(connect.get("nkey") or "")
    if nkey:
        for u in all_users:
            if u.nkey and hmac.compare_digest(u.nkey, nkey):
                sig = str(connect.get("sig") or "")
                ok = nonce and sig and verify_nkey(nkey, nonce, sig)
                return (u if ok else None), None, ""
        return None, None, ""
    if username:
        for u in all_users:
            if u.username and u.username == username and not u.nkey:
                return u, u.password, password
        if auth.username and auth.username == username:
            return User(auth.username), auth.password, password
        return None, None, ""
    if auth.token:
        return (User() if token else None), auth.token, token
    if auth.no_auth_user and not token and not password:
        for u in all_users:
            if u.username == auth.no_auth_user:
                return u, None, ""
    return None, None, ""


def authenticate(auth: AuthOptions, users_by_account: dict, connect: dict,
                 nonce: str) -> User | None:
    """The user a CONNECT authenticates as, or None (``identify`` plus the check)."""
    user, secret, given = identify(auth, users_by_account, connect, nonce)
    if user is None or (secret is not None and not compare_secret(secret, given)):
        return None
    return user


# ---- permissions at run time ---------------------------------------------------------

def _sublist_of(subjects) -> Sublist | None:
    if subjects is None:
        return None
    sl = Sublist()
    for s in subjects:
        parts = s.split()
        # subscribe permissions may name a queue: "subject queue"
        sl.insert(Subscription(parts[0].encode(), parts[1].encode() if len(parts) > 1 else None))
    return sl


class PermissionChecker:
    """Allow/deny lists as subject tries; results cached per subject (server/client.go)."""

    CACHE_MAX = 1024

    def __init__(self, perms: Permissions):
        self.perms = perms
        pub = perms.publish or SubjectPermission()
        sub = perms.subscribe or SubjectPermission()
        self._pub_allow = _sublist_of(pub.allow)
        self._pub_deny = _sublist_of(pub.deny)
        self._sub_allow = _sublist_of(sub.allow)
        self._sub_deny = _sublist_of(sub.deny)
        self._pub_cache: dict[bytes, bool] = {}
        self._deliver_cache: dict[bytes, bool] = {}
        self.response = perms.response
        # reply subject -> [remaining messages, expiry (monotonic seconds)]
        self.replies: dict[bytes, list] = {}

    @property
    def checks_publish(self) -> bool:
        return self._pub_allow is not None or self._pub_deny is not None

    @staticmethod
    def _matches(sl: Sublist | None, subject: bytes, queue: bytes | None = None) -> bool:
        if sl is None:
            return False
        r = sl.match(subject)
        if r.psubs:
            return True
        if queue is not None:
            return any(g[0].queue == queue for g in r.qsubs)
        return False

    def can_publish(self, subject: bytes) -> bool:
        ok = self._pub_cache.get(subject)
        if ok is None:
            ok = (self._pub_allow is None or self._matches(self._pub_allow, subject)) and \
                not self._matches(self._pub_deny, subject)
            if len(self._pub_cache) >= self.CACHE_MAX:
                self._pub_cache.clear()
            self._pub_cache[subject] = ok
        if ok:
            return True
        return self._use_reply(subject)

    def _use_reply(self, subject: bytes) -> bool:
        entry = self.replies.get(subject)
        if entry is None:
            return False
        if entry[1] < time.monotonic():
            del self.replies[subject]
            return False
        entry[0] -= 1
        if entry[0] <= 0:
            del self.replies[subject]
        return True

    def note_reply(self, reply: bytes) -> None:
        if self.response is not None:
            if len(self.replies) >= 4 * self.CACHE_MAX:
                now = time.monotonic()
                for k in [k for k, e in self.replies.items() if e[1] < now]:
                    del self.replies[k]
            self.replies[reply] = [self.response.max_msgs,
                                   time.monotonic() + self.response.expires]

    @property
    def checks_subscribe(self) -> bool:
        return self._sub_allow is not None or self._sub_deny is not None

    @property
    def checks_delivery(self) -> bool:
        return self._sub_deny is not None

    def can_deliver(self, subject: bytes) -> bool:
        """A message may reach this client: its subject is not subscribe-denied.

        Needed because a wildcard subscription (``>``) may be allowed while it covers
        denied subjects (server/client.go checkDenySub).
        """
        ok = self._deliver_cache.get(subject)
        if ok is None:
            ok = not self._matches(self._sub_deny, subject)
            if len(self._deliver_cache) >= self.CACHE_MAX:
                self._deliver_cache.clear()
            self._deliver_cache[subject] = ok
        return ok

    def can_subscribe(self, subject: bytes, queue: bytes | None = None) -> bool:
        if self._sub_allow is not None:
            allowed = self._matches(self._sub_allow, subject) or (
                queue is not None and self._matches(self._sub_allow, subject, queue))
            if not allowed:
                return False
        if self._sub_deny is not None:
            if self._matches(self._sub_deny, subject):
                return False
            if queue is not None and self._matches(self._sub_deny, subject, queue):
                return False
        return True
