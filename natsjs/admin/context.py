"""``natsjs context add|select|ls|info|rm|unselect|previous``: named connection settings
(natscli's context command; the files are described in ``connect``)."""
from __future__ import annotations

import os

from natsjs.admin import prompt
from natsjs.admin.args import json_flag
from natsjs.admin.connect import OVERRIDE_ENV, ContextStore, connect, explicit_values, resolve
from natsjs.admin.errors import CLIError, q
from natsjs.admin.render import Columns, Table, print_json


def register(top) -> None:
    g = top.group("context", "Manage nats configuration contexts", aliases=["ctx"])
    p = g.command("add", "Update or create a context", add, aliases=["create", "save"])
    p.add_argument("name", help="The context name to act on")
    p.add_argument("--description", default="", help="Set a friendly description")
    p.add_argument("--select", action="store_true", help="Select the saved context")
    p = g.command("ls", "List known contexts", ls, aliases=["list", "l"])
    json_flag(p)
    p.add_argument("--names", action="store_true", help="List just the names")
    p = g.command("select", "Select the default context", select, aliases=["switch", "set"])
    p.add_argument("name", nargs="?", help="The context name to select")
    p = g.command("info", "Display information on the current or named context", info,
                  aliases=["show", "v", "view"])
    p.add_argument("name", nargs="?", help="The context name to show")
    p.add_argument("--connect", action="store_true", help="Attempt to connect with it")
    json_flag(p)
    p = g.command("rm", "Remove a context", rm, aliases=["remove"])
    p.add_argument("name", help="The context name to remove")
    p.add_argument("-f", "--force", action="store_true", help="Force remove without prompting")
    g.command("unselect", "Ensures that no context is the default context", unselect)
    g.command("previous", "Switch to the previous context", previous, aliases=["-"])


async def add(rt) -> None:
    store = ContextStore()
    name = rt.args.name
    ctx = store.load(name) if store.known(name) else {}
    ctx.update(explicit_values(rt.args, os.environ))
    if rt.args.description:
        ctx["description"] = rt.args.description
    store.save(name, ctx)
    if rt.args.select:
        store.select(name)
    await _show(store, name, False, False)


async def ls(rt) -> None:
    store = ContextStore()
    names = store.names()
    current = store.selected()
    if rt.args.json:
        out = []
        for n in names:
            ctx = store.load(n)
            ctx["name"] = n
            out.append(ctx)
        print_json(out)
        return
    if rt.args.names:
        for n in names:
            print(n)
        return
    if not names:
        print("No known contexts")
        return
    t = Table("Known Contexts", ["Name", "Description"])
    for n in names:
        t.add(n + ("*" if n == current else ""), store.load(n).get("description", ""))
    t.print()


async def select(rt) -> None:
    store = ContextStore()
    names = store.names()
    if not names:
        raise CLIError("no context defined")
    name = rt.args.name or prompt.select("Select a Context", names)
    store.select(name)
    await _show(store, name, False, False)


async def info(rt) -> None:
    store = ContextStore()
    name = rt.args.name or store.selected()
    if not name:
        raise CLIError("no default context and no name supplied")
    await _show(store, name, rt.args.json, rt.args.connect)


async def _show(store: ContextStore, name: str, as_json: bool, check: bool) -> None:
    ctx = store.load(name)
    if as_json:
        print_json(ctx)
        return

    def file_state(path):
        return "%s (%s)" % (path, "OK" if os.path.exists(os.path.expanduser(path))
                            else "ERROR")

    c = Columns("NATS Configuration Context %s" % q(name))
    c.row_nonempty("Description", ctx.get("description"))
    c.row_nonempty("Server URLs", ctx.get("url"))
    c.row_nonempty("Username", ctx.get("user"))
    c.row_nonempty("Password", "*" * len(ctx.get("password") or ""))
    c.row_nonempty("Token", ctx.get("token"))
    for key, label in (("creds", "Credentials"), ("nkey", "NKey"), ("cert", "Certificate"),
                       ("key", "Key"), ("ca", "CA")):
        if ctx.get(key):
            c.row(label, file_state(ctx[key]))
    c.row_if("TLS First", True, ctx.get("tls_first"))
    c.row_nonempty("JS API Prefix", ctx.get("jetstream_api_prefix"))
    c.row_nonempty("JS Event Prefix", ctx.get("jetstream_event_prefix"))
    c.row_nonempty("JS Domain", ctx.get("jetstream_domain"))
    c.row_nonempty("Inbox Prefix", ctx.get("inbox_prefix"))
    c.row("Path", store.path(name))
    if check:
        import argparse
        try:
            nc = await connect(resolve(argparse.Namespace(context=name), env={}))
            await nc.close()
            c.row("Connection", "OK")
        except CLIError as e:
            c.row("Connection", str(e))
    c.print()
    print()
    overrides = [v for v in OVERRIDE_ENV if os.environ.get(v)]
    if overrides:
        print("WARNING: Shell environment overrides in place using %s" % ", ".join(overrides))


async def rm(rt) -> None:
    store = ContextStore()
    name = rt.args.name
    if not store.known(name):
        raise CLIError("unknown context %s" % q(name))
    if store.selected() == name:
        if not rt.args.force:
            raise CLIError("cannot remove the selected context, select another one or use "
                           "the unselect command")
        store.unselect()
    if not rt.args.force and not prompt.confirm("Really delete context %s" % q(name)):
        return
    store.delete(name)


async def unselect(rt) -> None:
    store = ContextStore()
    current = store.selected()
    if not current:
        print("No context currently selected")
        return
    store.unselect()
    print("Unselected the %s context" % q(current))


async def previous(rt) -> None:
    store = ContextStore()
    name = store.previous()
    if not name:
        raise CLIError("no previous context")
    store.select(name)
    await _show(store, name, False, False)
