"""The ``natsjs`` command tree and how one command runs.

natscli's commands (``stream add``, ``server report jetstream``...) become argparse
subcommands with natscli's names and aliases; every command also takes the connection
flags, before or after its name.  A command is an ``async def run(rt)`` that gets a
``Runtime``: the parsed arguments, the resolved connection settings, and a lazily made
nats-py connection.  Whatever goes wrong ends as one ``natsjs: error: ...`` line on
stderr and a non-zero exit; set ``NATSJS_DEBUG=1`` for the traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import traceback

from natsjs import __version__
from natsjs.admin import (account, backup, bench, context, core, consumer, kv, localcluster,
                          objstore, server, stream, streamquery)
from natsjs.admin.connect import Settings, add_connection_flags, connect, resolve
from natsjs.admin.errors import CLIError
from natsjs.admin.jsapi import JSApi

PROG = "natsjs"


class Parser(argparse.ArgumentParser):
    """Errors as one line; a command's own arguments parsed intermixed, so that
    ``pub x.y -H a:b body`` finds its body after a flag as natscli does."""

    _intermixing = False

    def error(self, message):
        sys.stderr.write("%s: error: %s, try --help\n" % (PROG, message))
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        positionals = self._get_positional_actions()
        if self._intermixing or not positionals or \
                any(a.nargs == argparse.PARSER for a in positionals):
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


class Group:
    """A command that has subcommands (``stream``, ``stream cluster``...)."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.sub = parser.add_subparsers(metavar="<command>", parser_class=Parser)
        parser.set_defaults(func=None, group_parser=parser)

    def group(self, name: str, help: str, aliases=()) -> "Group":
        p = self.sub.add_parser(name, help=help, description=help, aliases=list(aliases))
        return Group(p)

    def command(self, name: str, help: str, func, aliases=()) -> argparse.ArgumentParser:
        p = self.sub.add_parser(name, help=help, description=help, aliases=list(aliases))
        add_connection_flags(p, suppress=True)
        p.set_defaults(func=func, group_parser=p)
        return p


class Runtime:
    """What a running command has to hand."""

    def __init__(self, args):
        self.args = args
        self._settings: Settings | None = None
        self.nc = None
        self.extra: list = []       # further connections a command made

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = resolve(self.args)
        return self._settings

    @property
    def timeout(self) -> float:
        return self.settings.timeout_s

    async def conn(self):
        if self.nc is None:
            self.nc = await connect(self.settings)
        return self.nc

    async def new_conn(self, name: str | None = None, reconnect: bool = False):
        nc = await connect(self.settings, name=name, reconnect=reconnect)
        self.extra.append(nc)
        return nc

    async def js(self) -> JSApi:
        nc = await self.conn()
        return JSApi(nc, self.settings.api_prefix, self.timeout, self.settings.trace)

    async def close(self) -> None:
        for nc in [self.nc] + self.extra:
            if nc is not None and not nc.is_closed:
                try:
                    await asyncio.wait_for(nc.close(), 2)
                except Exception:
                    pass


def build_parser() -> Parser:
    root = Parser(prog=PROG, description="natsjs: the NATS command line, for natsjs and "
                                         "nats-server (natscli's commands and flags)")
    root.add_argument("--version", action="version", version="natsjs " + __version__)
    add_connection_flags(root, suppress=True)
    top = Group(root)
    for module in (account, bench, context, consumer, core, kv, localcluster, objstore,
                   server):
        module.register(top)
    streams = stream.register(top)
    backup.register_stream(streams)
    streamquery.register(streams)
    stream.register_cluster(streams)
    return root


def _translate(exc: BaseException) -> str | None:
    """One line for the failures nats-py and the OS raise."""
    try:
        import nats.errors as ne
    except ImportError:       # pragma: no cover
        return None
    if isinstance(exc, ne.NoRespondersError):
        return "no responders available for request"
    if isinstance(exc, (ne.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        return "timeout waiting for a response"
    if isinstance(exc, ne.ConnectionClosedError):
        return "connection closed"
    if isinstance(exc, ne.NoServersError):
        return "no servers available for connection"
    if isinstance(exc, ne.Error):
        return str(exc) or type(exc).__name__
    if isinstance(exc, OSError):
        return str(exc)
    return None


async def _run(rt: Runtime, func):
    try:
        return await func(rt)
    finally:
        await rt.close()


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.func is None:
        args.group_parser.print_help()
        return 0
    rt = Runtime(args)
    debug = bool(os.environ.get("NATSJS_DEBUG"))
    try:
        rc = asyncio.run(_run(rt, args.func))
        return int(rc or 0)
    except CLIError as e:
        if debug:
            traceback.print_exc()
        sys.stderr.write("%s: error: %s\n" % (PROG, e))
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (| head); nothing more to say
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as e:
        if debug:
            traceback.print_exc()
        line = _translate(e) or "%s: %s" % (type(e).__name__, e)
        sys.stderr.write("%s: error: %s\n" % (PROG, line))
        return 1
