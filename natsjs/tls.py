"""TLS for client connections: a transport with the plain socket's surface.

``client.py`` drives a non-blocking socket with ``recv_into``/``send`` and trio's
``wait_readable``/``wait_writable``.  This module gives it two transports with that
same small surface, so one read loop and one write loop serve both:

* :class:`PlainTransport` -- the socket itself.  ``recv_into``/``send`` are the
  socket's bound methods, stored as instance attributes, so a plain connection pays
  one attribute lookup and nothing else; the waiters hand back trio's own.
* :class:`TLSTransport` -- an ``ssl.SSLObject`` over two ``ssl.MemoryBIO``\\ s on the
  same non-blocking socket.  ``recv_into`` returns decrypted bytes; ``send`` takes
  plaintext and reports how much of it is *on the wire*.

How nats-server sequences TLS for clients (server/server.go ``createClientEx``)
------------------------------------------------------------------------------
1. Without ``handshake_first``: the server sends ``INFO`` **in the clear**, with
   ``"tls_required": true`` (and ``"tls_verify": true`` when client certificates are
   verified); the client reads it and starts the TLS handshake; from then on
   everything, starting with the client's ``CONNECT``, goes through TLS.
2. With ``handshake_first``: the handshake comes first and ``INFO`` is the first
   thing sent *through* TLS.  With a fallback delay (``handshake_first: "300ms"``,
   or ``"auto"`` = 50ms) the server waits that long for the client to send
   anything; if nothing comes it falls back to 1. (INFO in the clear, then the
   handshake).
3. The handshake has ``tls { timeout }`` seconds (default 2); on failure the
   connection is closed with the reason ``"TLS Handshake Failure"``.  The read and
   write loops, the ping timer and the auth timer all start *after* the handshake.
4. ``tls_available: true`` (instead of ``tls_required``) only appears with
   ``allow_non_tls``, where the server sniffs the first byte (0x16 = TLS).  Use
   :func:`peek_first_byte` for that; :func:`info_fields` gives the INFO keys.

:func:`accept_tls` does 1-3 in one call.  In ``client.py`` (sketch)::

    # Client.run(), inside the cancel scope, before the loops start:
    info = self.server.client_info_line(self)       # carries tls_required/tls_verify
    if server.tls_config is None:
        self.transport = PlainTransport(self.sock)
        self.send(info)
    else:
        try:
            self.transport = await accept_tls(self.sock, server.tls_context,
                                              server.tls_config, info)
        except TLSHandshakeError as exc:
            log = server.log.debug if exc.probe else server.log.error
            log(self.log_prefix + "TLS handshake error: %s", exc)
            self.closed_reason = TLS_HANDSHAKE_FAILURE  # "TLS Handshake Failure"
            return                                  # finally: _teardown() closes
        self.flush()            # anything queued meanwhile (normally nothing)

    # read loop: unchanged except sock -> transport
    t = self.transport
    while True:
        try:
            n = t.recv_into(buf)
        except BlockingIOError:
            await t.wait_readable()
            continue
        except OSError:                      # TLSError is an OSError too
            self.close(READ_ERROR); return
        if n == 0: ...

    # _try_send / write loop: unchanged except sock -> transport
    n = self.transport.send(out)   # BlockingIOError -> 0; OSError -> WRITE_ERROR
    del out[:n]
    ...
    await self.transport.wait_writable()

``send`` contract: ``send(data)`` consumes a prefix of ``data`` and returns its length
(``BlockingIOError`` when it can consume nothing, exactly like a socket).  Bytes count
as consumed only once their ciphertext is entirely in the kernel, so ``out`` stays
non-empty, ``write_blocked`` stays set and the write loop keeps waiting until TLS
output really left -- nothing is stranded in a user-space buffer.  In exchange, the
next call must pass the same stream continued (the bytes not yet reported, then
anything new), which is what ``del out[:n]; send(out)`` does.  Encrypted output the
socket did not take (at most ``SEND_BATCH`` of plaintext's worth) is kept and written
first by the next ``send``/``wait_writable``; progress is reported per TLS record
(16 KB of plaintext) as their ciphertext drains.

Anything that goes wrong raises an ``OSError`` subclass (:class:`TLSError`), so the
existing ``except OSError`` paths close the connection; ``ssl.SSLWantReadError``
never escapes.  Renegotiation is refused (``OP_NO_RENEGOTIATION``).  ``close()``
sends close_notify when it can do so without blocking; ``shutdown_write()`` sends it
and half-closes (for the ``-ERR`` linger path).
"""
from __future__ import annotations

import errno
import hashlib
import socket
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

import trio

from natsjs import conf
from natsjs.conf import ConfigError

__all__ = [
    "TLS_TIMEOUT", "HANDSHAKE_FIRST_FALLBACK", "TLS_HANDSHAKE_FAILURE",
    "TLSConfig", "TLSConfigError", "TLSError", "TLSHandshakeError",
    "PlainTransport", "TLSTransport", "ClientIdentity",
    "make_server_context", "accept_tls", "peek_first_byte", "info_fields",
    "client_identity", "parse_dn",
]

# server/const.go TLS_TIMEOUT and DEFAULT_TLS_HANDSHAKE_FIRST_FALLBACK_DELAY.
TLS_TIMEOUT = 2.0
HANDSHAKE_FIRST_FALLBACK = 0.05
# The /connz closed reason for a failed handshake (server/monitor.go).
TLS_HANDSHAKE_FAILURE = "TLS Handshake Failure"

# Plaintext per SSLObject.write: one full TLS record, the unit send() reports.
RECORD_SIZE = 16384
# Plaintext encrypted per send() call and written with one socket send; bounds the
# ciphertext kept when the socket is full.
SEND_BATCH = 131072
# Socket read size for ciphertext (a TLS record is at most ~16.7 KB).
READ_CHUNK = 65536


# ---------------------------------------------------------------------------------
# Errors


class TLSConfigError(ConfigError):
    """A ``tls { }`` block or its files are unusable (raised at start-up)."""


class TLSError(OSError):
    """A TLS failure on an established connection (an OSError: closes it)."""


class TLSHandshakeError(TLSError):
    """The server-side handshake failed or timed out.

    ``probe`` is True for what nats-server logs at debug level only
    (isClientProbeTLSHandshakeError): a timeout, or a first record that is not
    TLS at all (a plaintext client, a load balancer's health check).
    """

    def __init__(self, message: str, probe: bool = False):
        super().__init__(message)
        self.probe = probe

    def __str__(self) -> str:
        return self.args[0]


# ---------------------------------------------------------------------------------
# Configuration

# Keys nats-server's parseTLS knows that natsjs does not implement.  Those that only
# tune or relax things are accepted with a warning; those that would tighten
# security are refused rather than silently ignored.
_IGNORED_KEYS = {"cipher_suites", "curve_preferences", "allow_insecure_cipher_suites",
                 "insecure", "connection_rate_limit"}
_REFUSED_KEYS = {"pinned_certs", "verify_cert_and_check_known_urls", "cert_store",
                 "cert_match_by", "cert_match", "ca_certs_match", "cert_match_skip_invalid",
                 "ocsp_peer", "certs", "certificates"}


@dataclass(frozen=True)
class TLSConfig:
    """The client ``tls { }`` block (server/opts.go parseTLS, TLSConfigOpts)."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    verify: bool = False
    timeout: float = TLS_TIMEOUT
    handshake_first: bool = False
    # Seconds to wait for a TLS-first client before sending INFO in the clear and
    # doing a normal handshake; 0 = no fallback (``handshake_first: true``).
    handshake_first_fallback: float = 0.0
    verify_and_map: bool = False
    min_version: str = "1.2"

    @classmethod
    def from_conf(cls, block: Mapping[str, Any],
                  warn: Optional[Callable[[str], None]] = None) -> "TLSConfig":
        """Read a parsed ``tls { ... }`` block (a ``conf.ConfMap`` or a plain dict).

        Raises :class:`TLSConfigError` (with the key's position when the block
        carries positions) for unknown keys, wrong types and bad values, with
        nats-server's wording where it has one.
        """
        if not isinstance(block, Mapping):
            raise TLSConfigError("tls: expected a map, got %s" % type(block).__name__)
        pos_of = getattr(block, "pos", lambda _k: None)
        kw: dict[str, Any] = {}
        verify_and_map = False
        for key, value in block.items():
            k = key.lower()
            pos = pos_of(key)

            def bad(msg: str) -> TLSConfigError:
                return TLSConfigError(msg, pos)

            if k in ("cert_file", "key_file", "ca_file"):
                if not isinstance(value, str):
                    raise bad("error parsing tls config, expected '%s' to be filename" % k)
                kw[k] = value
            elif k == "verify":
                if not isinstance(value, bool):
                    raise bad("error parsing tls config, expected 'verify' to be a boolean")
                kw["verify"] = value
            elif k == "verify_and_map":
                if not isinstance(value, bool):
                    raise bad("error parsing tls config, "
                              "expected 'verify_and_map' to be a boolean")
                verify_and_map = value
            elif k == "timeout":
                kw["timeout"] = _parse_timeout(value, bad)
            elif k in ("handshake_first", "first", "immediate"):
                kw["handshake_first"], kw["handshake_first_fallback"] = \
                    _parse_handshake_first(key, value, bad)
            elif k == "min_version":
                if value not in ("1.2", "1.3"):
                    raise bad("error parsing tls config: unsupported TLS version: %s" % value)
                kw["min_version"] = value
            elif k in _IGNORED_KEYS:
                if warn is not None:
                    warn("%stls option %r is not supported by natsjs and is ignored"
                         % ("%s: " % pos if pos else "", key))
            elif k in _REFUSED_KEYS:
                raise bad("tls option %r is not supported by natsjs" % key)
            else:
                raise bad("error parsing tls config, unknown field %r" % key)
        if verify_and_map:
            kw["verify"] = True
        kw["verify_and_map"] = verify_and_map
        cfg = cls(**kw)
        if cfg.cert_file and not cfg.key_file:
            raise TLSConfigError("missing 'key_file' in TLS configuration", pos_of("cert_file"))
        if cfg.key_file and not cfg.cert_file:
            raise TLSConfigError("missing 'cert_file' in TLS configuration", pos_of("key_file"))
        return cfg


def _parse_timeout(value: Any, bad) -> float:
    # parseTLS: int64 or float64 seconds, or a Go duration string.  0 means the
    # default (setBaselineOptions).  trio cannot wait a negative time.
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad("error parsing tls config, 'timeout' wrong type")
    if isinstance(value, str):
        try:
            secs = conf.parse_duration(value)
        except ValueError as exc:
            raise bad("error parsing tls config, 'timeout' %s" % exc) from None
    else:
        secs = float(value)
    if secs < 0:
        raise bad("error parsing tls config, 'timeout' cannot be negative")
    return secs or TLS_TIMEOUT


def _parse_handshake_first(key: str, value: Any, bad) -> tuple[bool, float]:
    # parseTLS: a boolean, "true"/"on", "false"/"off", "auto"/"auto_fallback" (50ms
    # fallback), or a duration string (handshake first, with that fallback delay).
    if isinstance(value, bool):
        return value, 0.0
    if not isinstance(value, str):
        raise bad("field %r should be a boolean or a string, got %s"
                  % (key, type(value).__name__))
    v = value.lower()
    if v in ("true", "on"):
        return True, 0.0
    if v in ("false", "off"):
        return False, 0.0
    if v in ("auto", "auto_fallback"):
        return True, HANDSHAKE_FIRST_FALLBACK
    try:
        delay = conf.parse_duration(value)
    except ValueError:
        raise bad("field %r's value %r is invalid" % (key, value)) from None
    return True, max(delay, 0.0)


def _check_readable(what: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TLSConfigError("tls: cannot read %s %r: %s"
                             % (what, path, exc.strerror or exc)) from None


def make_server_context(cfg: TLSConfig) -> ssl.SSLContext:
    """An ``ssl.SSLContext`` for accepting clients (server/opts.go GenTLSConfig).

    TLS 1.2 minimum; ``verify`` requires a client certificate signed by ``ca_file``
    (or the system CAs when there is none).  File problems raise
    :class:`TLSConfigError` naming the file.
    """
    if not cfg.cert_file or not cfg.key_file:
        raise TLSConfigError("tls: a server certificate needs both 'cert_file' and "
                             "'key_file' (got cert_file=%r, key_file=%r)"
                             % (cfg.cert_file, cfg.key_file))
    _check_readable("cert_file", cfg.cert_file)
    _check_readable("key_file", cfg.key_file)
    if cfg.ca_file:
        _check_readable("ca_file", cfg.ca_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if cfg.min_version == "1.3"
                           else ssl.TLSVersion.TLSv1_2)
    ctx.options |= (ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
                    | getattr(ssl, "OP_NO_RENEGOTIATION", 0))
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except ssl.SSLError as exc:
        raise TLSConfigError("error parsing X509 certificate/key pair (cert_file %r, "
                             "key_file %r): %s" % (cfg.cert_file, cfg.key_file,
                                                   _ssl_reason(exc))) from None
    except OSError as exc:
        raise TLSConfigError("tls: cannot load cert_file %r / key_file %r: %s"
                             % (cfg.cert_file, cfg.key_file, exc)) from None
    if cfg.ca_file:
        try:
            ctx.load_verify_locations(cafile=cfg.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError("failed to parse root ca certificate in ca_file %r: %s"
                                 % (cfg.ca_file, _ssl_reason(exc))) from None
    if cfg.verify:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not cfg.ca_file:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return ctx


def make_route_contexts(cfg: TLSConfig) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Contexts for ``cluster { tls {} }``: (accepting, dialling).

    Routes always verify both ways (server/opts.go parseCluster forces verify): the
    acceptor wants the dialler's certificate, the dialler checks the acceptor's
    against ``ca_file`` and the host it dialled.
    """
    import dataclasses
    server_ctx = make_server_context(dataclasses.replace(cfg, verify=True))
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if cfg.min_version == "1.3"
                                  else ssl.TLSVersion.TLSv1_2)
    client_ctx.options |= ssl.OP_NO_COMPRESSION | getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    client_ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    if cfg.ca_file:
        client_ctx.load_verify_locations(cafile=cfg.ca_file)
    else:
        client_ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    return server_ctx, client_ctx


def info_fields(cfg: Optional[TLSConfig], allow_non_tls: bool = False) -> dict:
    """The INFO keys for TLS (server/server.go NewServer; all ``omitempty``)."""
    if cfg is None:
        return {}
    fields: dict = {}
    if allow_non_tls and not cfg.handshake_first:
        fields["tls_available"] = True
    else:
        fields["tls_required"] = True
    if cfg.verify:
        fields["tls_verify"] = True
    return fields


# ---------------------------------------------------------------------------------
# Transports


class PlainTransport:
    """The plain socket, with the transport surface and no per-call overhead."""

    __slots__ = ("sock", "recv_into", "send")
    is_tls = False

    def __init__(self, sock: socket.socket):
        self.sock = sock
        # Bound once: these two run for every read and write.
        self.recv_into = sock.recv_into
        self.send = sock.send

    # Plain functions handing back trio's coroutine: no frame of their own.
    def wait_readable(self):
        return trio.lowlevel.wait_readable(self.sock)

    def wait_writable(self):
        return trio.lowlevel.wait_writable(self.sock)

    def fileno(self) -> int:
        return self.sock.fileno()

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        _close_socket(self.sock)


def _close_socket(sock: socket.socket) -> None:
    try:
        trio.lowlevel.notify_closing(sock)
    except Exception:  # not in trio, or already closed
        pass
    try:
        sock.close()
    except OSError:
        pass


class TLSTransport:
    """TLS over a non-blocking socket, server side, via ``SSLObject`` + ``MemoryBIO``.

    The socket stays the one client.py already has; only ciphertext touches it.
    State the methods keep:

    * ``_incoming`` -- ciphertext read from the socket, not yet consumed by OpenSSL;
      bytes past the handshake (a CONNECT sent right behind the client's Finished)
      stay here and come out of the first ``recv_into``.
    * ``_wbuf`` -- ciphertext the socket did not take, always written before more.
    * ``_recs`` -- ``(end, n)`` per encrypted record not yet reported by ``send``:
      its ciphertext ends at byte ``end`` of everything queued (``_ct_queued``) and it
      holds ``n`` plaintext bytes.  Once ``_ct_sent`` (bytes the socket took) passes
      ``end``, the next ``send`` reports the ``n`` bytes.  ``_owed`` = sum of the ns.
    * ``_need_socket`` -- the last ``recv_into`` ran dry on the socket, so
      ``wait_readable`` must really wait; otherwise plaintext may already be buffered
      (``SSLObject.pending()`` or undecrypted records in ``_incoming``) and it returns
      at once.
    """

    is_tls = True

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool = True,
                 server_hostname: str | None = None):
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        # server_side=False is a route's dialler (natsjs/route.py): same transport.
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        self._peer = "client" if server_side else "peer"
        self._rbuf = bytearray(READ_CHUNK)
        self._rview = memoryview(self._rbuf)
        self._wbuf = bytearray()
        self._ct_queued = 0
        self._ct_sent = 0
        self._recs: deque[tuple[int, int]] = deque()
        self._owed = 0
        self._established = False
        self._need_socket = False
        self._eof = False
        self._shutdown_sent = False
        self._closed = False
        self._write_wants_read = False
        self._fed = trio.lowlevel.ParkingLot()
        self.tls_first = False

    # ---- handshake -------------------------------------------------------------

    async def handshake(self, timeout: float = TLS_TIMEOUT, preamble: bytes = b"") -> None:
        """Run the server handshake within ``timeout`` seconds.

        ``preamble`` (the INFO line) is written in the clear first, within the same
        deadline.  Raises :class:`TLSHandshakeError`; the caller closes the socket.
        """
        if self._established:
            return
        with trio.move_on_after(timeout) as cs:
            if preamble:
                await self._send_all_raw(bytes(preamble))
            await self._handshake()
        if cs.cancelled_caught:
            raise TLSHandshakeError("TLS handshake timeout (%gs)" % timeout, probe=True)

    async def _send_all_raw(self, data: bytes) -> None:
        sock = self.sock
        view = memoryview(data)
        while view:
            try:
                n = sock.send(view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            except OSError as exc:
                raise TLSHandshakeError("TLS handshake error: sending INFO: %s" % exc) from None
            view = view[n:]

    async def _handshake(self) -> None:
        sslobj = self._ssl
        sock = self.sock
        while True:
            try:
                sslobj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            except ssl.SSLError as exc:
                # Let the alert out (best effort) so the client sees why.
                self._pull()
                try:
                    self._flush()
                except OSError:
                    pass
                raise _handshake_error(exc, self._peer) from None
            self._pull()
            while self._wbuf:
                try:
                    self._flush()
                except OSError as exc:
                    raise TLSHandshakeError("TLS handshake error: %s" % exc) from None
                if self._wbuf:
                    await trio.lowlevel.wait_writable(sock)
            if done:
                break
            while True:
                try:
                    n = sock.recv_into(self._rbuf)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                    continue
                except OSError as exc:
                    raise TLSHandshakeError("TLS handshake error: %s" % exc) from None
                break
            if n == 0:
                raise TLSHandshakeError("TLS handshake error: connection closed by %s"
                                        % self._peer,
                                        probe=True)
            self._incoming.write(self._rview[:n])
        self._established = True

    # ---- reading -----------------------------------------------------------------

    def recv_into(self, buf, nbytes: int = 0) -> int:
        """Decrypted bytes into ``buf``; ``BlockingIOError`` if none yet; 0 at EOF."""
        if self._eof:
            return 0
        if not self._established:
            raise BlockingIOError(errno.EAGAIN, "TLS handshake not complete")
        size = nbytes or len(buf)
        if size <= 0:
            return 0
        sslobj = self._ssl
        while True:
            try:
                n = sslobj.read(size, buf)
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                # close_notify, or the socket closed without one: end of stream
                # either way (Go's crypto/tls reports io.EOF for both at a record
                # boundary).
                self._eof = True
                return 0
            except ssl.SSLError as exc:
                self._pull_and_flush()  # an alert of ours, if any
                raise TLSError("TLS read error: %s" % _ssl_reason(exc)) from None
            else:
                if self._outgoing.pending:
                    self._pull_and_flush()
                if n == 0:
                    self._eof = True
                return n
            if self._outgoing.pending:  # e.g. a TLS 1.3 KeyUpdate answer
                self._pull_and_flush()
            try:
                m = self.sock.recv_into(self._rbuf)
            except BlockingIOError:
                self._need_socket = True
                raise
            self._need_socket = False
            if m == 0:
                self._incoming.write_eof()
            else:
                self._incoming.write(self._rview[:m])
                if self._write_wants_read:
                    self._write_wants_read = False
                    self._fed.unpark_all()

    async def wait_readable(self) -> None:
        """Wait until ``recv_into`` may have something (returns at once if buffered)."""
        if self._need_socket and not self._eof:
            await trio.lowlevel.wait_readable(self.sock)
        else:
            await trio.lowlevel.checkpoint()

    # ---- writing -----------------------------------------------------------------

    def send(self, data) -> int:
        """Encrypt and write a prefix of ``data``; its length, once on the wire.

        Non-blocking; ``BlockingIOError`` when nothing could be consumed.  After a
        partial send the next call must pass the rest of the same stream (see the
        module docstring).
        """
        if not self._established:
            raise BlockingIOError(errno.EAGAIN, "TLS handshake not complete")
        if self._shutdown_sent:
            raise TLSError(errno.EPIPE, "TLS write after shutdown")
        self._pull()
        if self._wbuf:
            self._flush()
        total = len(data)
        if self._owed > total:
            # A caller bug; an OSError so that only this connection is closed (send
            # also runs from other connections' tasks), raised before any change.
            raise TLSError(errno.EINVAL, "TLS send: data does not continue the previous "
                           "send (%d bytes were already encrypted)" % self._owed)
        ready = self._acked()
        if self._wbuf:  # the socket is full; report the records that did get out
            if ready:
                return ready
            raise BlockingIOError(errno.EAGAIN, "TLS output pending")
        # Everything encrypted so far is on the wire: encrypt a batch more.
        self._write_wants_read = False
        pos = ready
        end = min(total, pos + SEND_BATCH)
        if pos < end:
            sslobj = self._ssl
            outgoing = self._outgoing
            recs = self._recs
            base = self._ct_queued
            with memoryview(data) as view:
                while pos < end:
                    k = min(RECORD_SIZE, end - pos)
                    try:
                        sslobj.write(view[pos:pos + k])
                    except ssl.SSLWantReadError:
                        # Only mid-renegotiation (refused) or similar: wait_writable()
                        # then waits for the read side to feed the engine.
                        self._write_wants_read = True
                        break
                    except ssl.SSLError as exc:
                        raise TLSError("TLS write error: %s" % _ssl_reason(exc)) from None
                    recs.append((base + outgoing.pending, k))
                    self._owed += k
                    pos += k
            ct = outgoing.read()
            if ct:
                self._ct_queued += len(ct)
                try:
                    n = self.sock.send(ct)
                except BlockingIOError:
                    n = 0
                self._ct_sent += n
                if n < len(ct):
                    self._wbuf += memoryview(ct)[n:]
                ready += self._acked()
        if ready == 0 and total:
            raise BlockingIOError(errno.EAGAIN, "TLS output pending")
        return ready

    def _acked(self) -> int:
        """Plaintext of the records whose ciphertext the socket has fully taken."""
        recs = self._recs
        sent = self._ct_sent
        n = 0
        while recs and recs[0][0] <= sent:
            n += recs.popleft()[1]
        self._owed -= n
        return n

    async def wait_writable(self) -> None:
        """Wait until ``send`` can make progress; writes pending ciphertext first."""
        if self._write_wants_read and not self._eof:
            await self._fed.park()
            return
        await trio.lowlevel.wait_writable(self.sock)
        if self._wbuf:
            self._flush()

    async def send_all(self, data) -> None:
        """Send everything (for the INFO after a TLS-first handshake, tests, ...)."""
        view = memoryview(bytes(data))
        while view:
            try:
                n = self.send(view)
            except BlockingIOError:
                await self.wait_writable()
                continue
            view = view[n:]
        while self._wbuf:
            await self.wait_writable()

    @property
    def pending_output(self) -> int:
        """Ciphertext bytes waiting for the socket."""
        return len(self._wbuf)

    def _pull(self) -> None:
        """Queue whatever the SSL engine produced (alerts, tickets, close_notify)."""
        if self._outgoing.pending:
            ct = self._outgoing.read()
            self._wbuf += ct
            self._ct_queued += len(ct)

    def _flush(self) -> None:
        """One non-blocking write of pending ciphertext (socket errors propagate)."""
        if not self._wbuf:
            return
        try:
            n = self.sock.send(self._wbuf)
        except BlockingIOError:
            return
        del self._wbuf[:n]
        self._ct_sent += n

    def _pull_and_flush(self) -> None:
        self._pull()
        try:
            self._flush()
        except OSError:
            pass  # the next send reports it

    # ---- closing -----------------------------------------------------------------

    def _close_notify(self) -> None:
        if self._shutdown_sent or not self._established:
            return
        self._shutdown_sent = True
        try:
            self._ssl.unwrap()
        except (ssl.SSLError, ValueError):
            pass  # SSLWantReadError: ours is sent, the peer's not yet received
        self._pull()

    def shutdown_write(self) -> None:
        """Send close_notify and half-close (when all output could be written)."""
        self._close_notify()
        self._flush()
        if not self._wbuf:
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close the socket; close_notify first if that cannot block."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._wbuf:
                self._flush()
            if not self._wbuf:
                self._close_notify()
                self._flush()
        except OSError:
            pass
        _close_socket(self.sock)

    # ---- information ---------------------------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    def getpeername(self):
        return self.sock.getpeername()

    @property
    def established(self) -> bool:
        return self._established

    def version(self) -> str:
        """"1.2" / "1.3", as nats-server's tlsVersion() (for /connz tls_version)."""
        v = self._ssl.version() or ""
        return v[4:] if v.startswith("TLSv") else v

    def cipher(self) -> str:
        c = self._ssl.cipher()
        return c[0] if c else ""

    def peer_cert(self) -> dict:
        """The verified peer certificate as ``SSLObject.getpeercert()`` ({} if none)."""
        return self._ssl.getpeercert() or {}

    def peer_cert_der(self) -> Optional[bytes]:
        return self._ssl.getpeercert(binary_form=True)

    def peer_cert_sha256(self) -> str:
        der = self.peer_cert_der()
        return hashlib.sha256(der).hexdigest() if der else ""


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        verify = getattr(exc, "verify_message", None)
        reason = exc.reason or exc.strerror or str(exc)
        if verify:
            return "%s (%s)" % (verify, reason)
        return str(reason)
    return str(exc)


def _handshake_error(exc: ssl.SSLError, peer: str = "client") -> TLSHandshakeError:
    reason = str(exc.reason or "")
    if isinstance(exc, ssl.SSLEOFError) or reason == "UNEXPECTED_EOF_WHILE_READING":
        return TLSHandshakeError("TLS handshake error: connection closed by %s" % peer,
                                 probe=True)
    if isinstance(exc, ssl.SSLCertVerificationError) or reason == "CERTIFICATE_VERIFY_FAILED":
        return TLSHandshakeError("TLS handshake error: %s certificate verification failed: %s"
                                 % (peer, getattr(exc, "verify_message", "") or reason))
    if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return TLSHandshakeError("TLS handshake error: client didn't provide a certificate")
    if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST",
                  "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"):
        return TLSHandshakeError("TLS handshake error: first record does not look like a "
                                 "TLS handshake (%s)" % reason, probe=True)
    if reason == "UNSUPPORTED_PROTOCOL":
        return TLSHandshakeError("TLS handshake error: client offered only unsupported "
                                 "versions (%s)" % reason)
    for prefix in ("SSLV3_ALERT_", "TLSV1_ALERT_", "TLSV13_ALERT_"):
        if reason.startswith(prefix):
            return TLSHandshakeError("TLS handshake error: remote error: tls: %s"
                                     % reason[len(prefix):].lower().replace("_", " "))
    return TLSHandshakeError("TLS handshake error: %s" % (reason or exc))


# ---------------------------------------------------------------------------------
# Accepting


async def peek_first_byte(sock: socket.socket, timeout: float) -> Optional[int]:
    """The client's first byte, without consuming it; None if nothing in ``timeout``.

    -1 when the client closed.  For ``handshake_first`` with a fallback delay (any
    byte -> TLS first) and for ``allow_non_tls`` (0x16 -> TLS).
    """
    with trio.move_on_after(timeout):
        while True:
            try:
                b = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            return b[0] if b else -1
    return None


async def accept_tls(sock: socket.socket, context: ssl.SSLContext, cfg: TLSConfig,
                     info: bytes) -> TLSTransport:
    """nats-server's client TLS sequence; the INFO line is sent as it prescribes.

    Returns the established transport (``transport.tls_first`` tells whether the
    handshake came first, for /connz ``tls_first``) or raises
    :class:`TLSHandshakeError`.
    """
    transport = TLSTransport(sock, context)
    first = cfg.handshake_first
    if first and cfg.handshake_first_fallback > 0:
        # server.go: wait for the client to speak; silence means it waits for INFO.
        if await peek_first_byte(sock, cfg.handshake_first_fallback) is None:
            first = False
    if first:
        await transport.handshake(cfg.timeout)
        transport.tls_first = True
        await transport.send_all(info)
    else:
        await transport.handshake(cfg.timeout, preamble=info)
    return transport


# ---------------------------------------------------------------------------------
# Client identity for verify_and_map (server/auth.go checkClientTLSCertSubject)

# Go's crypto/x509/pkix names for the attributes pkix.Name parses, keyed by the
# long names SSLObject.getpeercert() uses, in pkix ToRDNSequence() order.
_PKIX_ORDER = [("countryName", "C"), ("stateOrProvinceName", "ST"),
               ("localityName", "L"), ("streetAddress", "STREET"),
               ("postalCode", "POSTALCODE"), ("organizationName", "O"),
               ("organizationalUnitName", "OU")]
_PKIX_SINGLE = [("commonName", "CN"), ("serialNumber", "SERIALNUMBER")]
# internal/ldap/dn.go attributeTypeNames (FromRawCertSubject fails on anything else).
_LDAP_TYPES = dict(_PKIX_ORDER + _PKIX_SINGLE + [("domainComponent", "DC")])


def _go_escape(value: str) -> str:
    # pkix RDNSequence.String() escaping.
    out = []
    last = len(value) - 1
    for i, c in enumerate(value):
        if c in ',+"\\<>;' or (c == " " and (i == 0 or i == last)) or (c == "#" and i == 0):
            out.append("\\")
        out.append(c)
    return "".join(out)


def _go_rdn_string(subject) -> str:
    """``cert.Subject.ToRDNSequence().String()`` from getpeercert()'s subject."""
    multi: dict[str, list[str]] = {name: [] for name, _ in _PKIX_ORDER}
    single: dict[str, str] = {}
    for rdn in subject:
        for name, value in rdn:
            if name in multi:
                multi[name].append(value)
            elif name in ("commonName", "serialNumber"):
                single[name] = value  # pkix keeps the last one
    seq: list[str] = []
    for name, short in _PKIX_ORDER:
        if multi[name]:
            seq.append("+".join("%s=%s" % (short, _go_escape(v)) for v in multi[name]))
    for name, short in _PKIX_SINGLE:
        if single.get(name):
            seq.append("%s=%s" % (short, _go_escape(single[name])))
    return ",".join(reversed(seq))


DN = tuple  # tuple of RDNs, each a tuple of (TYPE, value)


def parse_dn(text: str) -> Optional[DN]:
    """internal/ldap/dn.go ParseDN (RFC 4514); None where it returns an error."""
    rdns: list[tuple] = []
    rdn: list[tuple[str, str]] = []
    buf = bytearray()
    atype = ""
    escaping = False
    trailing = 0
    data = text.encode()
    i = 0

    def take() -> str:
        nonlocal trailing
        s = bytes(buf[:len(buf) - trailing]).decode("utf-8", "replace")
        buf.clear()
        trailing = 0
        return s

    while i < len(data):
        c = data[i]
        ch = chr(c)
        if escaping:
            trailing = 0
            escaping = False
            if ch in ' "#+,;<=>\\':
                buf.append(c)
                i += 1
                continue
            if i + 1 >= len(data):
                return None
            try:
                buf.append(int(data[i:i + 2].decode(), 16))
            except ValueError:
                return None
            i += 2
            continue
        if ch == "\\":
            trailing = 0
            escaping = True
        elif ch == "=":
            atype = take()
            if i + 1 < len(data) and data[i + 1:i + 2] == b"#":
                return None
        elif ch in ",+":
            if not atype:
                return None
            rdn.append((atype, take()))
            atype = ""
            if ch == ",":
                rdns.append(tuple(rdn))
                rdn = []
        elif ch == " " and not buf:
            pass
        else:
            trailing = trailing + 1 if ch == " " else 0
            buf.append(c)
        i += 1
    if buf:
        if not atype:
            return None
        rdn.append((atype, take()))
        rdns.append(tuple(rdn))
    return tuple(rdns)


def _atv_eq(a: tuple[str, str], b: tuple[str, str]) -> bool:
    return a[0].lower() == b[0].lower() and a[1] == b[1]


def _rdn_eq(a: tuple, b: tuple) -> bool:
    return (len(a) == len(b) and all(any(_atv_eq(x, y) for y in b) for x in a)
            and all(any(_atv_eq(y, x) for x in a) for y in b))


def _dn_equal(a: DN, b: DN) -> bool:
    return len(a) == len(b) and all(_rdn_eq(x, y) for x, y in zip(a, b))


def _dn_rdns_match(a: DN, b: DN) -> bool:
    if len(a) != len(b):
        return False
    used = [False] * len(b)
    for x in a:
        for j, y in enumerate(b):
            if not used[j] and _rdn_eq(x, y):
                used[j] = True
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class ClientIdentity:
    """What ``verify_and_map`` may match a user name against, from a client cert.

    ``subject`` is Go's ``cert.Subject.ToRDNSequence().String()``, e.g.
    ``"CN=example.com,OU=nats.io,O=Synadia,L=Los Angeles,ST=CA,C=US"``: the
    attributes crypto/x509 parses (C, ST, L, STREET, POSTALCODE, O, OU, CN,
    SERIALNUMBER; others such as emailAddress or DC are dropped), most specific
    first, repeated types joined with ``+``, ``,+"\\<>;`` escaped.  ``dcs`` is
    ``"DC=a,DC=b"`` in certificate order (getTLSAuthDCs).  ``dn`` is the subject as
    internal/ldap reads it (None when it has an attribute ldap does not know).
    """

    subject: str
    dcs: str = ""
    emails: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    dn: Optional[DN] = None
    cert_sha256: str = ""
    raw_subject: tuple = field(default=(), repr=False)

    def match(self, users: Iterable[str]) -> Optional[str]:
        """The user name nats-server would map this certificate to, or None.

        The order of checkClientTLSCertSubject: SAN emails, SAN DNS names, SAN URIs
        (exact), then a user name that parses as a DN equal to the subject (in
        order, then in any RDN order), then ``subject + "," + dcs``, then
        ``subject``.  Pass only users allowed for this connection type.
        """
        users = list(users)
        names = set(users)
        for u in self.emails + self.dns_names + self.uris:
            if u in names:
                return u
        if self.dn is not None:
            parsed = []
            for u in users:
                d = parse_dn(u)
                if d is None:
                    continue
                if _dn_equal(d, self.dn):
                    return u
                parsed.append((u, d))
            for u, d in parsed:
                if _dn_rdns_match(d, self.dn):
                    return u
        if self.dcs:
            u = self.subject + "," + self.dcs
            if u in names:
                return u
        if self.subject in names:
            return self.subject
        return None


def client_identity(transport) -> Optional[ClientIdentity]:
    """The verified client certificate's identity, or None (no TLS, no cert)."""
    if not getattr(transport, "is_tls", False) or not transport.established:
        return None
    cert = transport.peer_cert()
    if not cert:
        return None
    subject = cert.get("subject", ())
    emails, dns, uris = [], [], []
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "email":
            emails.append(value)
        elif kind == "DNS":
            dns.append(value)
        elif kind == "URI":
            uris.append(value)
    dcs = ",".join("DC=" + v for rdn in subject for name, v in rdn
                   if name == "domainComponent")
    # FromRawCertSubject: RDNs and their attributes reversed; unknown types -> no DN.
    dn: Optional[DN] = []
    for rdn in reversed(subject):
        if not rdn:
            continue
        attrs = []
        for name, value in reversed(rdn):
            short = _LDAP_TYPES.get(name)
            if short is None:
                dn = None
                break
            attrs.append((short, value))
        if dn is None:
            break
        dn.append(tuple(attrs))
    return ClientIdentity(
        subject=_go_rdn_string(subject), dcs=dcs, emails=tuple(emails),
        dns_names=tuple(dns), uris=tuple(uris),
        dn=tuple(dn) if dn is not None else None,
        cert_sha256=transport.peer_cert_sha256(), raw_subject=tuple(subject))
