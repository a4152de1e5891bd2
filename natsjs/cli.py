"""``natsjs-server``: the command line, with nats-server's flags.

Flags and the optional configuration file become one frozen ``ServerOptions``
(flags win over the file, as in nats-server); then a ``Server`` runs under trio
until SIGINT/SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

import trio

from natsjs import NATS_VERSION, __version__
from natsjs.log import Logger
from natsjs.options import ServerOptions

USAGE = """\
Usage: natsjs-server [options]

Server Options:
    -a, --addr, --net <host>         Bind to host address (default: 0.0.0.0)
    -p, --port <port>                Use port for clients (default: 4222; -1 picks a free port)
    -n, --name
        --server_name <server_name>  Server name (default: auto)
    -P, --pid <file>                 File to store PID
    -m, --http_port <port>           Use port for http monitoring
    -c, --config <file>              Configuration file
    -t                               Test configuration and exit
    -sl,--signal <signal>[=<pid>]    Send signal to natsjs-server process (ldm, stop, quit, term, reopen, reload)
                                     <pid> can be either a PID (e.g. 1) or the path to a PID file
        --max_payload <size>         Maximum message payload in bytes (default: 1MB)

Authorization Options:
        --user <user>                User required for connections
        --pass <password>            Password required for connections
        --auth <token>               Authorization token required for connections

JetStream Options:
    -js, --jetstream                 Enable JetStream functionality
    -sd, --store_dir <dir>           Set the storage directory

Cluster Options:
        --routes <rurl-1, rurl-2>    Routes to solicit and connect
        --cluster <cluster-url>      Cluster URL for solicited routes
        --cluster_name <string>      Cluster Name, if not set one will be dynamically generated
        --no_advertise <bool>        Do not advertise known cluster information to clients
        --cluster_advertise <string> Cluster URL to advertise to other servers
        --connect_retries <number>   For implicit routes, number of connect retries
        --cluster_listen <url>       Cluster url from which members can solicit routes
        --cluster_max_subs <number>  Most subscriptions one cluster peer may hold here
                                     (natsjs only; default 1048576; beyond it they are
                                     ignored and logged)

TLS Options:
        --tls                        Enable TLS, do not verify clients (default: false)
        --tlscert <file>             Server certificate file
        --tlskey <file>              Private key for server certificate
        --tlsverify                  Enable TLS, verify client certificates
        --tlscacert <file>           Client certificate CA for verification

Logging Options:
    -l, --log <file>                 File to redirect log output
    -T, --logtime                    Timestamp log entries (default: true)
        --logtime_utc                Timestamps in UTC instead of local timezone
    -D, --debug                      Enable debugging output
    -V, --trace                      Trace the raw protocol
    -DV                              Debug and trace

Common Options:
    -h, --help                       Show this message
    -v, --version                    Show version
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # nats-server prints the usage and exits 1
        sys.stderr.write("natsjs-server: %s\n%s" % (message, USAGE))
        raise SystemExit(1)


def _bool(v: str) -> bool:
    return v.lower() in ("1", "true", "yes", "on", "t", "y")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="natsjs-server", add_help=False, usage=argparse.SUPPRESS)
    p.add_argument("-a", "--addr", "--net", "-addr", "-net", dest="host")
    p.add_argument("-p", "--port", "-port", dest="port", type=int)
    p.add_argument("-n", "--name", "--server_name", "-name", "-server_name", dest="server_name")
    p.add_argument("-P", "--pid", "-pid", dest="pid_file")
    p.add_argument("-m", "--http_port", "-http_port", dest="http_port", type=int)
    p.add_argument("-c", "--config", "-config", dest="config_file")
    p.add_argument("-t", dest="test_config", action="store_true")
    p.add_argument("-sl", "--signal", "-signal", dest="signal")
    p.add_argument("--max_payload", "-max_payload", dest="max_payload")
    p.add_argument("--user", "-user", dest="auth_user")
    p.add_argument("--pass", "-pass", dest="auth_pass")
    p.add_argument("--auth", "-auth", dest="auth_token")
    p.add_argument("--cluster", "-cluster", "--cluster_listen", "-cluster_listen",
                   dest="cluster_url")
    p.add_argument("--routes", "-routes", dest="routes")
    p.add_argument("--cluster_name", "-cluster_name", dest="cluster_name")
    p.add_argument("--cluster_advertise", "-cluster_advertise", dest="cluster_advertise")
    p.add_argument("--no_advertise", "-no_advertise", dest="no_advertise", nargs="?",
                   const="true")
    p.add_argument("--connect_retries", "-connect_retries", dest="connect_retries", type=int)
    p.add_argument("--cluster_max_subs", "-cluster_max_subs", dest="cluster_max_subs", type=int)
    p.add_argument("-js", "--jetstream", "-jetstream", dest="jetstream", action="store_true")
    p.add_argument("-sd", "--store_dir", "-store_dir", dest="store_dir")
    p.add_argument("--tls", "-tls", dest="tls", action="store_true")
    p.add_argument("--tlscert", "-tlscert", dest="tlscert")
    p.add_argument("--tlskey", "-tlskey", dest="tlskey")
    p.add_argument("--tlscacert", "-tlscacert", dest="tlscacert")
    p.add_argument("--tlsverify", "-tlsverify", dest="tlsverify", action="store_true")
    p.add_argument("-l", "--log", "-log", dest="log_file")
    p.add_argument("-T", "--logtime", "-logtime", dest="logtime", nargs="?", const="true")
    p.add_argument("--logtime_utc", "-logtime_utc", dest="logtime_utc", action="store_true",
                   default=None)
    p.add_argument("-D", "--debug", "-debug", dest="debug", action="store_true", default=None)
    p.add_argument("-V", "--trace", "-trace", dest="trace", action="store_true", default=None)
    p.add_argument("-DV", dest="debug_trace", action="store_true")
    p.add_argument("-h", "--help", "-help", dest="help", action="store_true")
    p.add_argument("-v", "--version", "-version", dest="version", action="store_true")
    return p


def options_from_args(argv: list[str], warn=None) -> tuple[ServerOptions, argparse.Namespace]:
    """Parse flags (and the config file they name) into options; flags win over the file."""
    ns = build_parser().parse_args(argv)
    opts = ServerOptions()
    if ns.config_file:
        from natsjs.config import load_config
        opts = load_config(ns.config_file, opts, warn=warn)
    changes = {}
    for key in ("host", "port", "server_name", "pid_file", "http_port", "log_file",
                "logtime_utc", "debug", "trace"):
        value = getattr(ns, key)
        if value is not None:
            changes[key] = value
    if ns.debug_trace:
        changes["debug"] = True
        changes["trace"] = True
    if ns.logtime is not None:
        changes["logtime"] = _bool(ns.logtime)
    if ns.max_payload is not None:
        from natsjs.config import parse_size
        changes["max_payload"] = parse_size(ns.max_payload)
    if ns.auth_user or ns.auth_pass or ns.auth_token:
        import dataclasses
        auth = opts.auth
        if ns.auth_user:
            auth = dataclasses.replace(auth, username=ns.auth_user)
        if ns.auth_pass:
            auth = dataclasses.replace(auth, password=ns.auth_pass)
        if ns.auth_token:
            auth = dataclasses.replace(auth, token=ns.auth_token)
        changes["auth"] = auth
    if ns.jetstream or ns.store_dir:
        # -sd alone does not turn JetStream on, but it sets where it stores (opts.go).
        import dataclasses
        from natsjs.jetstream.config import JetStreamOptions
        js = opts.jetstream
        if ns.jetstream and js is None:
            js = JetStreamOptions()
        if js is not None and ns.store_dir:
            js = dataclasses.replace(js, store_dir=ns.store_dir)
        changes["jetstream"] = js
        if ns.store_dir:
            changes["store_dir"] = ns.store_dir
    cluster = _cluster_from_flags(ns, opts.cluster)
    if cluster is not None:
        changes["cluster"] = cluster
    if ns.tls or ns.tlsverify or ns.tlscert or ns.tlskey or ns.tlscacert:
        import dataclasses
        from natsjs.tls import TLSConfig
        tls = opts.tls or TLSConfig()
        tls = dataclasses.replace(
            tls, cert_file=ns.tlscert or tls.cert_file, key_file=ns.tlskey or tls.key_file,
            ca_file=ns.tlscacert or tls.ca_file, verify=tls.verify or ns.tlsverify)
        changes["tls"] = tls
    opts = opts.replace(**changes)
    opts.validate()
    return opts, ns


def _cluster_from_flags(ns, cluster):
    """--cluster, --routes and friends on top of the config file's cluster block."""
    import dataclasses
    from urllib.parse import urlsplit
    from natsjs.options import ClusterOptions
    if not any(v is not None for v in (ns.cluster_url, ns.routes, ns.cluster_name,
                                        ns.cluster_advertise, ns.no_advertise,
                                        ns.connect_retries, ns.cluster_max_subs)):
        return None
    changes = {}
    if ns.cluster_url:
        u = urlsplit(ns.cluster_url if "://" in ns.cluster_url else "nats://" + ns.cluster_url)
        creds, _, hostport = u.netloc.rpartition("@")
        host, _, port = hostport.rpartition(":")
        changes["host"] = host.strip("[]") or "0.0.0.0"
        changes["port"] = int(port) if port else 0
        if creds:
            user, _, password = creds.partition(":")
            changes["username"] = user
            changes["password"] = password
    if ns.routes:
        changes["routes"] = tuple(r.strip() for r in ns.routes.split(",") if r.strip())
    if ns.cluster_name:
        changes["name"] = ns.cluster_name
    if ns.cluster_advertise:
        changes["advertise"] = ns.cluster_advertise
    if ns.no_advertise is not None:
        changes["no_advertise"] = _bool(ns.no_advertise)
    if ns.connect_retries is not None:
        changes["connect_retries"] = ns.connect_retries
    if ns.cluster_max_subs is not None:
        changes["max_remote_subs"] = ns.cluster_max_subs
    return dataclasses.replace(cluster or ClusterOptions(), **changes)


# How long a graceful shutdown may take before the process exits regardless.
SHUTDOWN_TIMEOUT = 10.0

# --signal names -> the signal the running server acts on (server/signal.go).
SIGNALS = {
    "stop": signal.SIGKILL,
    "quit": signal.SIGINT,
    "term": signal.SIGTERM,
    "reopen": signal.SIGUSR1,
    "reload": signal.SIGHUP,
    "ldm": signal.SIGUSR2,
}


def _find_server_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        names = [os.path.basename(a) for a in argv[:3]]
        if b"natsjs-server" in names or (b"-m" in argv[:3] and b"natsjs" in argv[:4]):
            if not any(a in (b"--signal", b"-sl", b"-signal") for a in argv):
                pids.append(int(entry))
    return pids


def send_signal(command: str) -> int:
    name, _, target = command.partition("=")
    sig = SIGNALS.get(name.lower())
    if sig is None:
        sys.stderr.write("natsjs-server: unknown signal %r\n" % name)
        return 1
    if target:
        if target.isdigit():
            pid = int(target)
        else:
            try:
                with open(target) as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError) as exc:
                sys.stderr.write("natsjs-server: could not read pid from %s: %s\n" % (target, exc))
                return 1
    else:
        pids = _find_server_pids()
        if len(pids) != 1:
            sys.stderr.write("natsjs-server: %s\n" % (
                "no natsjs-server process running" if not pids else
                "multiple natsjs-server processes running:\n" + "\n".join(map(str, pids))))
            return 1
        pid = pids[0]
    try:
        os.kill(pid, sig)
    except OSError as exc:
        sys.stderr.write("natsjs-server: %s\n" % exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warnings: list[str] = []
    try:
        opts, ns = options_from_args(argv, warn=warnings.append)
    except SystemExit:
        raise
    except Exception as exc:
        sys.stderr.write("natsjs-server: %s\n" % exc)
        return 1
    if ns.signal:
        return send_signal(ns.signal)
    if ns.help:
        sys.stdout.write(USAGE)
        return 0
    if ns.version:
        sys.stdout.write("natsjs-server: v%s (NATS %s)\n" % (__version__, NATS_VERSION))
        return 0
    if ns.test_config:
        sys.stderr.write("natsjs-server: configuration file %s is valid\n" % (ns.config_file or ""))
        return 0
    log = Logger(debug=opts.debug, trace=opts.trace, logtime=opts.logtime,
                 utc=opts.logtime_utc, path=opts.log_file)
    for w in warnings:
        log.warn("%s", w)
    try:
        rc = trio.run(_run, opts, log, argv)
    except KeyboardInterrupt:
        rc = 0
    finally:
        log.close()
    # The server is done and every store is flushed and closed; what is left are its
    # clients' sockets (Server.exits_with_process). Exit now, without the
    # interpreter's teardown (10 ms and more here): the kernel closes those sockets as
    # the last step of the exit, after it has released the process's memory, so a
    # client sees its connection close when the process is gone, as with nats-server.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


async def _run(opts: ServerOptions, log: Logger, argv: list[str]) -> int:
    from natsjs import gcpolicy
    from natsjs.server import Server
    server = Server(opts, log)
    server.exits_with_process = True
    if opts.pid_file:
        try:
            with open(opts.pid_file, "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            log.fatal("Could not write pidfile: %s", exc)
            return 1
    try:
        async with trio.open_nursery() as nursery:
            # Signal handlers first: a SIGTERM that arrives as soon as the server
            # listens must already mean a graceful shutdown.
            await nursery.start(_signals, server, argv)
            from natsjs.jetstream.engine import JetStreamError
            try:
                await nursery.start(server.run)
            except JetStreamError:
                nursery.cancel_scope.cancel()
                return 1
            except OSError as exc:
                log.fatal("Error listening on port: %s:%d, %r", opts.host, opts.port,
                          exc.strerror or str(exc))
                nursery.cancel_scope.cancel()
                return 1
            except BaseExceptionGroup as group:
                from natsjs.monitor import MonitorListenError
                found = group.subgroup(lambda e: isinstance(e, MonitorListenError))
                if found is None:
                    raise
                while isinstance(found, BaseExceptionGroup):
                    found = found.exceptions[0]
                log.fatal("%s", found)
                nursery.cancel_scope.cancel()
                return 1
            # What the server built to start lives as long as it does (gcpolicy.py).
            gcpolicy.tune()
            await server.stopped.wait()
            nursery.cancel_scope.cancel()
    finally:
        if opts.pid_file:
            try:
                os.unlink(opts.pid_file)
            except OSError:
                pass
    return 0


async def _signals(server, argv: list[str], task_status=trio.TASK_STATUS_IGNORED) -> None:
    """SIGINT/SIGTERM: shut down; SIGHUP: reload; SIGUSR1: reopen the log; SIGUSR2: ldm."""
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                       signal.SIGUSR1, signal.SIGUSR2) as signals:
            task_status.started()
            async for signum in signals:
                server.log.debug("Trapped %r signal", signal.Signals(signum).name)
                if signum in (signal.SIGINT, signal.SIGTERM):
                    await server.graceful_shutdown()
                    # A task that ignores cancellation must not keep the process
                    # alive after a stop was asked for: give up after a while.
                    with trio.move_on_after(SHUTDOWN_TIMEOUT) as cs:
                        await server.stopped.wait()
                    if cs.cancelled_caught:
                        server.log.error("Shutdown did not complete in %gs, exiting",
                                         SHUTDOWN_TIMEOUT)
                        os._exit(1)
                    nursery.cancel_scope.cancel()
                    return
                if signum == signal.SIGHUP:
                    _reload(server, argv)
                elif signum == signal.SIGUSR1:
                    server.log.reopen()
                    server.log.info("File log re-opened")
                elif signum == signal.SIGUSR2:
                    nursery.start_soon(server.enter_lame_duck_mode)


def _reload(server, argv: list[str]) -> None:
    warnings: list[str] = []
    try:
        opts, _ = options_from_args(argv, warn=warnings.append)
        for w in warnings:
            server.log.warn("%s", w)
        server.reload(opts)
    except Exception as exc:  # a bad file must leave the running server as it was
        server.log.error("Failed to reload server configuration: %s", exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
