"""Where the admin CLI connects and as whom: natscli's connection flags, the ``NATS_*``
environment variables and named contexts, resolved into one ``Settings``.

Precedence is natscli's: a flag, then its environment variable (``NATS_URL``,
``NATS_USER``, ...), then the selected context, then the defaults
(``nats://127.0.0.1:4222``, a 5 s timeout).  Contexts are JSON files with
natscontext's keys (``url``, ``user``, ``password``, ``creds``, ...), one per name in
``$XDG_CONFIG_HOME/natsjs/context/`` (``~/.config`` without it); the selected one is
named in ``natsjs/context.txt``.  natsjs keeps its own folder so that it never edits
the contexts of an installed natscli.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
from dataclasses import dataclass, field

from natsjs import __version__
from natsjs.admin.errors import CLIError, q
from natsjs.admin.render import NS, parse_duration

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_TIMEOUT = 5 * NS

# flag name -> (environment variable, context key)
FIELDS = {
    "server": ("NATS_URL", "url"),
    "user": ("NATS_USER", "user"),
    "password": ("NATS_PASSWORD", "password"),
    "token": ("NATS_TOKEN", "token"),
    "creds": ("NATS_CREDS", "creds"),
    "nkey": ("NATS_NKEY", "nkey"),
    "tlscert": ("NATS_CERT", "cert"),
    "tlskey": ("NATS_KEY", "key"),
    "tlsca": ("NATS_CA", "ca"),
    "timeout": ("NATS_TIMEOUT", None),
    "js_api_prefix": (None, "jetstream_api_prefix"),
    "js_event_prefix": (None, "jetstream_event_prefix"),
    "js_domain": (None, "jetstream_domain"),
    "inbox_prefix": (None, "inbox_prefix"),
    "tlsfirst": (None, "tls_first"),
}

# Environment variables that override a context (natscli cli.go overrideEnvVars).
OVERRIDE_ENV = [env for env, _ in FIELDS.values() if env and env != "NATS_TOKEN"]

CONTEXT_KEYS = ["description", "url", "socks_proxy", "token", "user", "password", "creds",
                "nkey", "cert", "key", "ca", "nsc", "jetstream_domain",
                "jetstream_api_prefix", "jetstream_event_prefix", "inbox_prefix",
                "user_jwt", "user_seed", "color_scheme", "tls_first"]


def add_connection_flags(parser, suppress: bool) -> None:
    """natscli's global flags; on subcommands they default to 'not given' so that a
    flag typed before or after the command name both count."""
    d = {"default": __import__("argparse").SUPPRESS} if suppress else {"default": None}
    g = parser.add_argument_group("connection options")
    g.add_argument("-s", "--server", metavar="URL",
                   help="NATS server urls, comma separated (env NATS_URL)", **d)
    g.add_argument("--user", metavar="USER", help="Username or Token (env NATS_USER)", **d)
    g.add_argument("--password", metavar="PASSWORD", help="Password (env NATS_PASSWORD)", **d)
    g.add_argument("--token", metavar="TOKEN", help="Token (env NATS_TOKEN)", **d)
    g.add_argument("--creds", metavar="FILE", help="User credentials (env NATS_CREDS)", **d)
    g.add_argument("--nkey", metavar="FILE", help="User NKEY seed file (env NATS_NKEY)", **d)
    g.add_argument("--tlscert", metavar="FILE", help="TLS public certificate (env NATS_CERT)",
                   **d)
    g.add_argument("--tlskey", metavar="FILE", help="TLS private key (env NATS_KEY)", **d)
    g.add_argument("--tlsca", metavar="FILE",
                   help="TLS certificate authority chain (env NATS_CA)", **d)
    g.add_argument("--tlsfirst", action="store_true",
                   help="Perform TLS handshake before expecting the server greeting", **d)
    g.add_argument("--timeout", metavar="DURATION",
                   help="Time to wait on responses from NATS (default 5s, env NATS_TIMEOUT)",
                   **d)
    g.add_argument("--js-api-prefix", dest="js_api_prefix", metavar="PREFIX",
                   help="Subject prefix for access to JetStream API", **d)
    g.add_argument("--js-event-prefix", dest="js_event_prefix", metavar="PREFIX",
                   help="Subject prefix for access to JetStream Advisories", **d)
    g.add_argument("--js-domain", dest="js_domain", metavar="DOMAIN",
                   help="JetStream domain to access", **d)
    g.add_argument("--inbox-prefix", dest="inbox_prefix", metavar="PREFIX",
                   help="Custom inbox prefix to use for inboxes", **d)
    g.add_argument("--context", metavar="NAME",
                   help="Configuration context (env NATS_CONTEXT)", **d)
    g.add_argument("--no-context", dest="no_context", action="store_true",
                   help="Disable the selected context", **d)
    g.add_argument("--trace", action="store_true", help="Trace API interactions", **d)
    g.add_argument("--connection-name", dest="connection_name", metavar="NAME",
                   help="Nickname to use for the underlying NATS Connection", **d)


# ---- contexts -----------------------------------------------------------------------------


def config_root() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".config")
    return os.path.join(base, "natsjs")


_NAME_RE = re.compile(r"^[A-Za-z0-9_.@:-]+$")


def valid_context_name(name: str) -> bool:
    return bool(_NAME_RE.match(name)) and name not in (".", "..") and "/" not in name


class ContextStore:
    """The context files: ``context/<name>.json`` plus ``context.txt`` naming the
    selected one and ``previous-context.txt`` the one before it."""

    def __init__(self, root: str | None = None):
        self.root = root or config_root()
        self.dir = os.path.join(self.root, "context")

    def path(self, name: str) -> str:
        if not valid_context_name(name):
            raise CLIError("invalid context name %s" % q(name))
        return os.path.join(self.dir, name + ".json")

    def names(self) -> list[str]:
        try:
            files = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(f[:-5] for f in files if f.endswith(".json"))

    def known(self, name: str) -> bool:
        return valid_context_name(name) and os.path.exists(self.path(name))

    def load(self, name: str) -> dict:
        try:
            with open(self.path(name)) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise CLIError("unknown context %s" % q(name)) from None
        except ValueError as e:
            raise CLIError("invalid context %s: %s" % (q(name), e)) from None
        if not isinstance(data, dict):
            raise CLIError("invalid context %s: not a JSON object" % q(name))
        return data

    def save(self, name: str, data: dict) -> None:
        os.makedirs(self.dir, exist_ok=True)
        tmp = self.path(name) + ".tmp"
        with open(tmp, "w") as f:
            json.dump({k: data.get(k, False if k == "tls_first" else "")
                       for k in CONTEXT_KEYS}, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path(name))

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            raise CLIError("unknown context %s" % q(name)) from None

    def _read(self, fname: str) -> str:
        try:
            with open(os.path.join(self.root, fname)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    def _write(self, fname: str, value: str) -> None:
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, fname), "w") as f:
            f.write(value)

    def selected(self) -> str:
        return self._read("context.txt")

    def previous(self) -> str:
        return self._read("previous-context.txt")

    def select(self, name: str) -> None:
        if not self.known(name):
            raise CLIError("unknown context %s" % q(name))
        current = self.selected()
        if current and current != name:
            self._write("previous-context.txt", current)
        self._write("context.txt", name)

    def unselect(self) -> None:
        current = self.selected()
        if current:
            self._write("previous-context.txt", current)
        try:
            os.unlink(os.path.join(self.root, "context.txt"))
        except FileNotFoundError:
            pass


# ---- resolved settings --------------------------------------------------------------------


@dataclass
class Settings:
    servers: list[str] = field(default_factory=lambda: [DEFAULT_URL])
    user: str = ""
    password: str = ""
    token: str = ""
    creds: str = ""
    nkey: str = ""
    tlscert: str = ""
    tlskey: str = ""
    tlsca: str = ""
    tlsfirst: bool = False
    timeout: int = DEFAULT_TIMEOUT          # nanoseconds
    js_api_prefix: str = ""
    js_event_prefix: str = ""
    js_domain: str = ""
    inbox_prefix: str = ""
    context: str = ""
    trace: bool = False
    connection_name: str = "NATSJS CLI Version " + __version__

    @property
    def timeout_s(self) -> float:
        return self.timeout / NS

    @property
    def api_prefix(self) -> str:
        if self.js_api_prefix:
            return self.js_api_prefix.rstrip(".")
        if self.js_domain:
            return "$JS.%s.API" % self.js_domain
        return "$JS.API"


def split_urls(text: str) -> list[str]:
    out = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        if "://" not in part:
            part = "nats://" + part
        out.append(part)
    return out


def explicit_values(args, env) -> dict:
    """The context keys the flags (or their environment variables) set this time."""
    given = vars(args)
    out = {}
    for flag, (envvar, key) in FIELDS.items():
        value = given.get(flag)
        if value in (None, False, "") and envvar:
            value = env.get(envvar) or None
        if value in (None, False, ""):
            continue
        out[key or flag] = value
    # natscli: a user without a password is a token
    if out.get("user") and not out.get("password") and not out.get("token"):
        out["token"] = out.pop("user")
    return out


def resolve(args, env=None) -> Settings:
    """Flags over environment over the selected (or named) context over defaults."""
    env = os.environ if env is None else env
    given = vars(args)
    s = Settings()
    ctx: dict = {}
    name = given.get("context") or env.get("NATS_CONTEXT") or ""
    if not given.get("no_context"):
        store = ContextStore()
        if name.endswith(".json") and os.path.exists(name):
            with open(name) as f:
                ctx = json.load(f)
        else:
            name = name or store.selected()
            if name:
                if not store.known(name):
                    raise CLIError("unknown context %s" % q(name))
                ctx = store.load(name)
        s.context = name if ctx else ""
    values = {k: v for k, v in ctx.items() if v not in (None, "", False)}
    explicit = explicit_values(args, env)
    if "user" in explicit or "token" in explicit:
        for k in ("user", "password", "token"):
            values.pop(k, None)
    values.update(explicit)
    for flag, (_envvar, key) in FIELDS.items():
        value = values.get(key or flag)
        if value in (None, False, ""):
            continue
        if flag == "server":
            s.servers = split_urls(value)
        elif flag == "timeout":
            try:
                s.timeout = parse_duration(value)
            except ValueError:
                raise CLIError("invalid --timeout %s" % q(value)) from None
            if s.timeout <= 0:
                raise CLIError("invalid --timeout %s" % q(value))
        elif flag == "tlsfirst":
            s.tlsfirst = bool(value)
        elif flag in ("creds", "nkey", "tlscert", "tlskey", "tlsca"):
            setattr(s, flag, os.path.expanduser(value))
        else:
            setattr(s, flag, value)
    s.trace = bool(given.get("trace"))
    if given.get("connection_name"):
        s.connection_name = given["connection_name"]
    return s


def _tls_context(s: Settings) -> ssl.SSLContext | None:
    wants_tls = s.tlscert or s.tlskey or s.tlsca or s.tlsfirst or \
        any(u.startswith("tls://") for u in s.servers)
    if not wants_tls:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if s.tlsca:
            ctx.load_verify_locations(cafile=s.tlsca)
        if s.tlscert or s.tlskey:
            if not (s.tlscert and s.tlskey):
                raise CLIError("both --tlscert and --tlskey are needed for a client certificate")
            ctx.load_cert_chain(s.tlscert, s.tlskey)
    except (OSError, ssl.SSLError) as e:
        raise CLIError("could not load TLS files: %s" % e) from None
    return ctx


async def connect(s: Settings, name: str | None = None, reconnect: bool = False):
    """A nats-py connection for the settings; a failure is one CLIError line."""
    import nats

    errors: list[BaseException] = []
    connecting = {"on": True, "fails": 0}

    async def on_error(e):
        errors.append(e)
        # nats-py retries a failed first connection (forever when reconnecting is on);
        # natscli gives up once every server was tried, and so do we.
        if connecting["on"]:
            connecting["fails"] += 1
            if connecting["fails"] >= len(s.servers):
                raise _FirstConnectFailed(e)

    kwargs = dict(servers=s.servers, name=name or s.connection_name,
                  connect_timeout=min(s.timeout_s, 10.0), allow_reconnect=reconnect,
                  max_reconnect_attempts=-1 if reconnect else 0,
                  error_cb=on_error, verbose=False)
    if reconnect:
        kwargs["reconnect_time_wait"] = 0.5

        async def quiet(*_a):
            return None
        kwargs["disconnected_cb"] = quiet
        kwargs["reconnected_cb"] = quiet
    for path, what in ((s.creds, "credentials"), (s.nkey, "nkey")):
        if path and not os.path.exists(path):
            raise CLIError("%s file %s does not exist" % (what, path))
    if s.user:
        kwargs["user"] = s.user
        kwargs["password"] = s.password
    if s.token:
        kwargs["token"] = s.token
    if s.creds:
        kwargs["user_credentials"] = s.creds
    if s.nkey:
        kwargs["nkeys_seed"] = s.nkey
    tls = _tls_context(s)
    if tls is not None:
        kwargs["tls"] = tls
        if s.tlsfirst:
            kwargs["tls_handshake_first"] = True
    if s.inbox_prefix:
        kwargs["inbox_prefix"] = s.inbox_prefix
    try:
        nc = await asyncio.wait_for(nats.connect(**kwargs),
                                    timeout=s.timeout_s * len(s.servers) + 5)
        connecting["on"] = False
        return nc
    except Exception as e:  # every failure becomes one line naming the servers
        cause = e.cause if isinstance(e, _FirstConnectFailed) else \
            (errors[-1] if errors else e)
        text = str(cause) or type(cause).__name__
        if "Authorization" in text or "authorization" in text:
            raise CLIError("nats: Authorization Violation") from None
        raise CLIError("could not connect to %s: %s" % (",".join(s.servers), text)) from None


class _FirstConnectFailed(Exception):
    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause
