"""``natsjs kv ...``: Key-Value buckets as natscli (and nats.go's KV) lay them out.

A bucket is the stream ``KV_<bucket>`` on ``$KV.<bucket>.>``, one subject per key,
``max_msgs_per_subject`` values of history, discard new, roll-ups allowed, deletes
and purges as messages with a ``KV-Operation`` header (``DEL``, ``PURGE``).  Reads use
direct MSG.GET (last per subject) and an ordered ephemeral consumer for listings,
history and watches; writes are publishes that wait for the stream's PubAck.
"""
from __future__ import annotations

import base64
import json
import re

from natsjs.admin import prompt
from natsjs.admin.args import duration_arg, json_flag, size_arg
from natsjs.admin.errors import APIError, CLIError, q
from natsjs.admin.jsapi import ordered_read
from natsjs.admin.render import (Columns, Table, comma, duration, emit, ibytes,
                                 local_rfc3339, local_time, print_json, since, NS)
from natsjs.admin.stream import add_cluster_block, decode_headers

KEY_RE = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
BUCKET_RE = re.compile(r"^[a-zA-Z0-9_-]+$")


def register(top) -> None:
    g = top.group("kv", "Interacts with a JetStream based Key-Value store")
    p = g.command("add", "Adds a new KV Store Bucket", add, aliases=["new"])
    p.add_argument("bucket", help="The bucket to act on")
    p.add_argument("--description", default="", help="A description for the bucket")
    p.add_argument("--history", type=int, default=1, help="Historic values to keep per key")
    p.add_argument("--storage", choices=["file", "f", "memory", "m"], default="file")
    p.add_argument("--ttl", default="", help="How long to keep values for")
    p.add_argument("--replicas", type=int, default=1, help="Replicas of the data to store")
    p.add_argument("--max-value-size", default="", help="Maximum size for any single value")
    p.add_argument("--max-bucket-size", default="", help="Maximum size for the bucket")
    p.add_argument("--cluster", default="", help="Place the bucket on a specific cluster")
    p.add_argument("--tags", action="append", help="Place the bucket on servers with tags")
    p.add_argument("--compress", action="store_true", help="Compress the bucket data")
    json_flag(p)
    for name, func, help_ in (("put", put, "Puts a value into a key"),
                              ("create", create, "Puts a value into a key only if the key "
                                                 "is new or its last operation was a delete")):
        p = g.command(name, help_, func)
        p.add_argument("bucket", help="The bucket to act on")
        p.add_argument("key", help="The key to act on")
        p.add_argument("value", nargs="?", default=None,
                       help="The value to store, when empty reads STDIN")
    p = g.command("update", "Updates a key with a new value if the previous value matches "
                  "the given revision", update)
    p.add_argument("bucket")
    p.add_argument("key")
    p.add_argument("value")
    p.add_argument("revision", type=int)
    p = g.command("get", "Gets a value for a key", get)
    p.add_argument("bucket", help="The bucket to act on")
    p.add_argument("key", help="The key to act on")
    p.add_argument("--revision", type=int, default=0, help="Gets a specific revision")
    p.add_argument("--raw", action="store_true", help="Show only the value string")
    json_flag(p)
    p = g.command("del", "Deletes a key or the entire bucket", delete, aliases=["rm"])
    p.add_argument("bucket", help="The bucket to act on")
    p.add_argument("key", nargs="?", default="", help="The key to act on")
    p.add_argument("-f", "--force", action="store_true", help="Act without confirmation")
    p = g.command("purge", "Deletes a key from the bucket, clearing history", purge)
    p.add_argument("bucket")
    p.add_argument("key")
    p.add_argument("-f", "--force", action="store_true", help="Act without confirmation")
    p = g.command("history", "Shows the full history for a key", history)
    p.add_argument("bucket")
    p.add_argument("key")
    json_flag(p)
    p = g.command("revert", "Reverts a value to a previous revision using put", revert)
    p.add_argument("bucket", help="The bucket to act on")
    p.add_argument("key", help="The key to act on")
    p.add_argument("revision", type=int, help="The revision to revert to")
    p.add_argument("--force", action="store_true", help="Force reverting without prompting")
    p = g.command("info", "View the status of a KV store", info, aliases=["view", "status"])
    p.add_argument("bucket", nargs="?", default="", help="The bucket to act on")
    json_flag(p)
    p = g.command("watch", "Watch the bucket or a specific key for updates", watch)
    p.add_argument("bucket")
    p.add_argument("key", nargs="?", default=">")
    p.add_argument("--history", action="store_true", help="Includes historic values")
    p.add_argument("--no-deletes", dest="deletes", action="store_false",
                   help="Leave deletes out of the watched values")
    p.add_argument("--updates", action="store_true", help="Only show new values written")
    p.add_argument("--count", type=int, default=0, help="Stop after this many updates")
    p = g.command("ls", "List available buckets or the keys in a bucket", ls, aliases=["list"])
    p.add_argument("bucket", nargs="?", default="", help="The bucket to list the keys")
    p.add_argument("-n", "--names", action="store_true", help="Show just the names")
    p.add_argument("-v", "--display-value", action="store_true", help="Display the values")
    json_flag(p)


def _stream(bucket: str) -> str:
    if not BUCKET_RE.match(bucket):
        raise CLIError("invalid bucket name %s" % q(bucket))
    return "KV_" + bucket


def _subject(bucket: str, key: str) -> str:
    if not KEY_RE.match(key) or key.startswith(".") or key.endswith("."):
        raise CLIError("invalid key %s" % q(key))
    return "$KV.%s.%s" % (bucket, key)


def _op(headers: dict) -> str:
    return (headers.get("KV-Operation") or "PUT").upper()


async def stream_of_bucket(rt, stream: str, missing: str) -> dict:
    """The info of a bucket's stream; ``missing`` is the error when there is none."""
    js = await rt.js()
    try:
        return await js.request("STREAM.INFO." + stream, None)
    except APIError as e:
        if e.err_code == 10059:
            raise CLIError(missing) from None
        raise


async def _bucket_info(rt, bucket: str) -> dict:
    return await stream_of_bucket(rt, _stream(bucket), "nats: bucket not found")


def info_screen(bucket: str, info: dict) -> Columns:
    cfg, st = info.get("config") or {}, info.get("state") or {}
    c = Columns("Information for Key-Value Store Bucket %s created %s"
                % (bucket, local_rfc3339(info.get("created"))))
    c.title("Configuration")
    c.row("Bucket Name", bucket)
    c.row("History Kept", cfg.get("max_msgs_per_subject", 1))
    c.row("Values Stored", st.get("messages", 0))
    c.row("Compressed", cfg.get("compression", "none") == "s2")
    c.row("Backing Store Kind", "JetStream")
    c.row_nonempty("Description", cfg.get("description"))
    c.row("Bucket Size", ibytes(st.get("bytes", 0)))
    mb, mv = cfg.get("max_bytes", -1), cfg.get("max_msg_size", -1)
    c.row("Maximum Bucket Size", "unlimited" if mb in (-1, 0) else ibytes(mb))
    c.row("Maximum Value Size", "unlimited" if mv in (-1, 0) else ibytes(mv))
    age = cfg.get("max_age") or 0
    c.row("Maximum Age", "unlimited" if age <= 0 else duration(age))
    c.row("JetStream Stream", cfg.get("name", ""))
    c.row("Storage", (cfg.get("storage") or "file").capitalize())
    add_cluster_block(c, info.get("cluster"))
    return c


async def add(rt) -> None:
    a = rt.args
    if not 1 <= a.history <= 64:
        raise CLIError("history must be between 1 and 64")
    ttl = duration_arg(a.ttl, "ttl") if a.ttl else 0
    cfg = {"name": _stream(a.bucket), "subjects": ["$KV.%s.>" % a.bucket],
           "description": a.description, "max_msgs_per_subject": a.history,
           "max_bytes": size_arg(a.max_bucket_size, "bucket size") if a.max_bucket_size else -1,
           "max_msg_size": size_arg(a.max_value_size, "value size") if a.max_value_size else -1,
           "max_age": ttl, "storage": "memory" if a.storage in ("memory", "m") else "file",
           "num_replicas": a.replicas, "allow_rollup_hdrs": True, "deny_delete": True,
           "allow_direct": True, "discard": "new", "max_msgs": -1, "max_consumers": -1,
           "retention": "limits",
           "duplicate_window": min(ttl, 120 * NS) if ttl else 120 * NS}
    if a.compress:
        cfg["compression"] = "s2"
    if a.cluster or a.tags:
        cfg["placement"] = {k: v for k, v in (("cluster", a.cluster), ("tags", a.tags)) if v}
    js = await rt.js()
    info_ = await js.request("STREAM.CREATE." + cfg["name"], cfg,
                             doing="could not create bucket %s" % a.bucket)
    emit(info_, a.json, lambda i: info_screen(a.bucket, i))


def _value(a) -> bytes:
    if a.value is not None:
        return a.value.encode()
    import sys
    return sys.stdin.buffer.read()


async def publish(rt, subject: str, data: bytes, headers: dict | None = None) -> dict:
    """Publish to a bucket's stream and return the stream's ack; no responders means
    the bucket does not exist, an error ack raises ``APIError``."""
    import nats.errors
    nc = await rt.conn()
    try:
        msg = await nc.request(subject, data, timeout=rt.timeout, headers=headers or None)
    except nats.errors.NoRespondersError:
        raise CLIError("nats: bucket not found") from None
    ack = json.loads(msg.data)
    if ack.get("error"):
        raise APIError(ack["error"])
    return ack


async def put(rt) -> None:
    a = rt.args
    data = _value(a)
    await publish(rt, _subject(a.bucket, a.key), data)
    print(data.decode(errors="replace"))


async def create(rt) -> None:
    a = rt.args
    data = _value(a)
    subject = _subject(a.bucket, a.key)
    try:
        await publish(rt, subject, data, {"Nats-Expected-Last-Subject-Sequence": "0"})
    except APIError as e:
        if e.err_code != 10071:                    # wrong last sequence: the key exists
            raise
        last = await _last(rt, a.bucket, a.key)
        if last is None or _op(last["headers"]) == "PUT":
            raise CLIError("nats: key exists") from None
        await publish(rt, subject, data,
                       {"Nats-Expected-Last-Subject-Sequence": str(last["seq"])})
    print(data.decode(errors="replace"))


async def update(rt) -> None:
    a = rt.args
    try:
        await publish(rt, _subject(a.bucket, a.key), a.value.encode(),
                       {"Nats-Expected-Last-Subject-Sequence": str(a.revision)})
    except APIError as e:
        if e.err_code == 10071:
            raise CLIError("nats: wrong last sequence: revision %d is not the latest of %s"
                           % (a.revision, a.key)) from None
        raise
    print(a.value)


async def _last(rt, bucket: str, key: str, revision: int = 0) -> dict | None:
    js = await rt.js()
    body = {"seq": revision} if revision else {"last_by_subj": _subject(bucket, key)}
    try:
        msg = (await js.request("STREAM.MSG.GET." + _stream(bucket), body)).get("message")
    except APIError as e:
        if e.err_code in (10037, 10059) or e.code_http == 404:
            if e.err_code == 10059:
                raise CLIError("nats: bucket not found") from None
            return None
        raise
    if not msg:
        return None
    hdrs = dict(decode_headers(base64.b64decode(msg["hdrs"]))) if msg.get("hdrs") else {}
    return {"seq": msg.get("seq", 0), "subject": msg.get("subject", ""), "headers": hdrs,
            "data": base64.b64decode(msg.get("data") or ""), "time": msg.get("time")}


async def get(rt) -> None:
    a = rt.args
    entry = await _last(rt, a.bucket, a.key, a.revision)
    if entry is None or _op(entry["headers"]) != "PUT" or \
            entry["subject"] != _subject(a.bucket, a.key):
        raise CLIError("nats: key not found")
    if a.json:
        print_json({"bucket": a.bucket, "key": a.key, "revision": entry["seq"],
                    "created": entry["time"], "operation": "PUT",
                    "value": entry["data"].decode(errors="replace")})
        return
    if a.raw:
        print(entry["data"].decode(errors="replace"))
        return
    print("%s > %s revision: %d created @ %s\n" % (a.bucket, a.key, entry["seq"],
                                                   local_time(entry["time"])))
    text = entry["data"].decode(errors="replace")
    if len(text) > 120:
        print("Showing first 120 bytes of %s, use --raw for full data\n" % comma(len(text)))
        text = text[:120]
    print(text)
    print()


async def delete(rt) -> None:
    a = rt.args
    if not a.key:
        if not a.force and not prompt.confirm("Delete bucket %s?" % a.bucket, False):
            print("Skipping delete")
            return
        js = await rt.js()
        await js.request("STREAM.DELETE." + _stream(a.bucket), None,
                         doing="could not delete bucket %s" % a.bucket)
        return
    if not a.force and not prompt.confirm("Delete key %s > %s?" % (a.bucket, a.key), False):
        print("Skipping delete")
        return
    await publish(rt, _subject(a.bucket, a.key), b"", {"KV-Operation": "DEL"})


async def purge(rt) -> None:
    a = rt.args
    if not a.force and not prompt.confirm("Purge key %s > %s?" % (a.bucket, a.key), False):
        print("Skipping purge")
        return
    await publish(rt, _subject(a.bucket, a.key), b"",
                   {"KV-Operation": "PURGE", "Nats-Rollup": "sub"})


def _created(m) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(m.time_ns / NS).strftime("%Y-%m-%d %H:%M:%S")


async def _history(rt, bucket: str, key: str) -> list:
    await _bucket_info(rt, bucket)
    js = await rt.js()
    msgs = await ordered_read(js, _stream(bucket), [_subject(bucket, key)])
    if not msgs:
        raise CLIError("nats: key not found")
    return msgs


def _short(data: bytes) -> str:
    """natscli's value cell: long values as their first and last 15 characters."""
    value = data.decode(errors="replace")
    return value[:15] + "..." + value[-15:] if len(value) > 40 else value


async def history(rt) -> None:
    a = rt.args
    msgs = await _history(rt, a.bucket, a.key)
    if getattr(a, "json", False):
        print_json([{"bucket": a.bucket, "key": a.key, "revision": m.seq,
                     "operation": _op(m.headers), "value": m.data.decode(errors="replace")}
                    for m in msgs])
        return
    t = Table("History for %s > %s" % (a.bucket, a.key),
              ["Key", "Revision", "Op", "Created", "Length", "Value"])
    for m in msgs:
        t.add(a.key, m.seq, _op(m.headers), _created(m), len(m.data), _short(m.data))
    t.print()


async def revert(rt) -> None:
    """natscli revertAction: the value of an earlier revision put back with an update
    on the latest revision (so a concurrent write makes it fail), then the history."""
    a = rt.args
    msgs = await _history(rt, a.bucket, a.key)
    if len(msgs) <= 1:
        raise CLIError("cannot revert key in a bucket where history=1")
    old = await _last(rt, a.bucket, a.key, a.revision)
    if old is None or old["subject"] != _subject(a.bucket, a.key):
        raise CLIError("nats: key not found")
    if not a.force:
        print("Revision: %d\n\n%s\n" % (old["seq"], _short(old["data"])))
        if not prompt.confirm("Really revert to revision %d" % a.revision, False):
            return
    try:
        await publish(rt, _subject(a.bucket, a.key), old["data"],
                       {"Nats-Expected-Last-Subject-Sequence": str(msgs[-1].seq)})
    except APIError as e:
        if e.err_code == 10071:
            raise CLIError("nats: wrong last sequence: %s changed while reverting" % a.key) \
                from None
        raise
    await history(rt)


async def info(rt) -> None:
    a = rt.args
    bucket = a.bucket
    if not bucket:
        names = await _bucket_names(rt)
        if not names:
            raise CLIError("no Key-Value buckets found")
        bucket = names[0] if len(names) == 1 else prompt.select("Select a Bucket", names)
    info_ = await _bucket_info(rt, bucket)
    emit(info_, a.json, lambda i: info_screen(bucket, i))


async def _bucket_names(rt) -> list[str]:
    js = await rt.js()
    return [n[3:] for n in await js.stream_names() if n.startswith("KV_")]


async def watch(rt) -> None:
    a = rt.args
    await _bucket_info(rt, a.bucket)
    js = await rt.js()
    deliver = "new" if a.updates else "all" if a.history else "last_per_subject"

    async def on_msg(m):
        op = _op(m.headers)
        key = m.subject.split(".", 2)[2] if m.subject.count(".") >= 2 else m.subject
        if op != "PUT":
            if a.deletes:
                print("[%s] %s %s > %s" % (_created(m), op, a.bucket, key), flush=True)
            return
        print("[%s] %s %s > %s: %s" % (_created(m), op, a.bucket, key,
                                       m.data.decode(errors="replace")), flush=True)

    await ordered_read(js, _stream(a.bucket), ["$KV.%s.%s" % (a.bucket, a.key)], deliver,
                       follow=True, on_msg=on_msg, limit=a.count)


async def list_buckets(rt, prefix: str, title: str, empty: str, values: bool) -> None:
    """The buckets (streams named ``prefix``...) as natscli lists them, or their names
    with --names / --json."""
    a = rt.args
    js = await rt.js()
    infos, _ = await js.paged("STREAM.LIST", "streams")
    infos = sorted((i for i in infos if i["config"]["name"].startswith(prefix)),
                   key=lambda i: i["config"]["name"])
    names = [i["config"]["name"][len(prefix):] for i in infos]
    if a.json:
        print_json(names)
    elif a.names:
        for n in names:
            print(n)
    elif not infos:
        print(empty)
    else:
        t = Table(title, ["Bucket", "Description", "Created", "Size"] +
                  (["Values"] if values else []) + ["Last Update"])
        for n, i in zip(names, infos):
            st = i.get("state") or {}
            last = st.get("last_ts")
            row = [n, i["config"].get("description", ""), local_time(i.get("created")),
                   ibytes(st.get("bytes", 0))] + ([st.get("messages", 0)] if values else [])
            t.add(*row, duration(since(last)) if local_time(last) else "never")
        t.print()


async def ls(rt) -> None:
    a = rt.args
    js = await rt.js()
    if not a.bucket:
        await list_buckets(rt, "KV_", "Key-Value Buckets", "No Key-Value buckets found",
                           values=True)
        return
    await _bucket_info(rt, a.bucket)
    msgs = await ordered_read(js, _stream(a.bucket), ["$KV.%s.>" % a.bucket],
                              "last_per_subject")
    live = [m for m in msgs if _op(m.headers) == "PUT"]
    keys = [m.subject.split(".", 2)[2] for m in live]
    if a.json:
        print_json(keys)
        return
    if a.names:
        for k in keys:
            print(k)
        return
    if not live:
        print("No keys found in bucket")
        return
    headers = ["Key", "Created", "Delta", "Revision"] + (["Value"] if a.display_value else [])
    t = Table("Contents for bucket '%s'" % a.bucket, headers)
    for m, k in zip(live, keys):
        row = [k, _created(m), m.pending, m.seq]
        if a.display_value:
            row.append(m.data.decode(errors="replace"))
        t.add(*row)
    t.print()
