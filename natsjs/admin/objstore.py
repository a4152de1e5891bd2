"""``natsjs object ...``: Object Store buckets with nats.go's layout, so natscli and the
NATS clients read what natsjs writes.

A bucket is the stream ``OBJ_<bucket>`` on ``$O.<bucket>.C.>`` (chunks) and
``$O.<bucket>.M.>`` (one metadata message per object, rolled up, at
``$O.<bucket>.M.<base64url(name)>``).  An object's chunks go to
``$O.<bucket>.C.<nuid>``; its metadata names that nuid, the size, the chunk count and
``SHA-256=<base64url digest>``, which ``get`` checks.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time

from natsjs.admin import prompt
from natsjs.admin.args import duration_arg, json_flag, size_arg
from natsjs.admin.errors import APIError, CLIError, q
from natsjs.admin.jsapi import ordered_read
from natsjs.admin.kv import BUCKET_RE, list_buckets, publish, stream_of_bucket
from natsjs.admin.render import (Columns, Table, duration, emit, go_duration, ibytes,
                                 local_rfc3339, local_time, print_json, NS)
from natsjs.admin.stream import add_cluster_block

CHUNK = 128 * 1024


def register(top) -> None:
    g = top.group("object", "Interacts with a JetStream based Object store", aliases=["obj"])
    p = g.command("add", "Adds a new Object Store Bucket", add)
    p.add_argument("bucket", help="The bucket to act on")
    p.add_argument("--description", default="")
    p.add_argument("--storage", choices=["file", "f", "memory", "m"], default="file")
    p.add_argument("--ttl", default="", help="How long to keep objects for")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-bucket-size", default="", help="Maximum size for the bucket")
    p.add_argument("--compress", action="store_true", help="Compress the bucket data")
    json_flag(p)
    p = g.command("put", "Puts a file into the store", put)
    p.add_argument("bucket")
    p.add_argument("file", nargs="?", default="", help="The file to put (stdin without)")
    p.add_argument("--name", default="", help="Override the name supplied to the object store")
    p.add_argument("--description", default="")
    p.add_argument("--chunk-size", type=int, default=CHUNK)
    p.add_argument("-f", "--force", action="store_true", help="Act without confirmation")
    p = g.command("get", "Retrieves a file from the store", get)
    p.add_argument("bucket")
    p.add_argument("file", help="The file to retrieve")
    p.add_argument("-O", "--output", default="", help="Override the output file name")
    p.add_argument("-f", "--force", action="store_true", help="Overwrite without asking")
    p = g.command("del", "Deletes a file or bucket from the store", delete, aliases=["rm"])
    p.add_argument("bucket")
    p.add_argument("file", nargs="?", default="")
    p.add_argument("-f", "--force", action="store_true", help="Act without confirmation")
    p = g.command("info", "Get information about a bucket or object", info,
                  aliases=["show", "i"])
    p.add_argument("bucket")
    p.add_argument("file", nargs="?", default="")
    json_flag(p)
    p = g.command("ls", "List buckets or contents of a specific bucket", ls)
    p.add_argument("bucket", nargs="?", default="")
    p.add_argument("-n", "--names", action="store_true", help="Show just the names")
    json_flag(p)
    p = g.command("seal", "Seals a bucket preventing further updates", seal)
    p.add_argument("bucket")
    p.add_argument("-f", "--force", action="store_true")
    p = g.command("watch", "Watch a bucket for changes", watch)
    p.add_argument("bucket", help="The bucket to act on")
    p.add_argument("--count", type=int, default=0,
                   help="Stop after this many changes (natsjs: for scripts)")


def _stream(bucket: str) -> str:
    if not BUCKET_RE.match(bucket):
        raise CLIError("invalid bucket name %s" % q(bucket))
    return "OBJ_" + bucket


def _meta_subject(bucket: str, name: str) -> str:
    return "$O.%s.M.%s" % (bucket, base64.urlsafe_b64encode(name.encode()).decode())


def bucket_screen(bucket: str, info: dict) -> Columns:
    cfg, st = info.get("config") or {}, info.get("state") or {}
    c = Columns("Information for Object Store Bucket %s created %s"
                % (bucket, local_rfc3339(info.get("created"))))
    c.title("Configuration")
    c.row("Bucket Name", bucket)
    c.row_nonempty("Description", cfg.get("description"))
    c.row("Replicas", cfg.get("num_replicas", 1))
    age = cfg.get("max_age") or 0
    c.row("TTL", "unlimited" if age <= 0 else duration(age))
    c.row("Sealed", bool(cfg.get("sealed")))
    c.row("Size", ibytes(st.get("bytes", 0)))
    mb = cfg.get("max_bytes", -1)
    c.row("Maximum Bucket Size", "unlimited" if mb in (-1, 0) else ibytes(mb))
    c.row("Storage", (cfg.get("storage") or "file").capitalize())
    c.row("Backing Store Kind", "JetStream")
    c.row("JetStream Stream", cfg.get("name", ""))
    add_cluster_block(c, info.get("cluster"))
    return c


def object_screen(meta: dict) -> Columns:
    c = Columns("Object information for %s > %s" % (meta.get("bucket"), meta.get("name")))
    c.row_nonempty("Description", meta.get("description"))
    c.row("Size", ibytes(meta.get("size", 0)))
    c.row("Modification Time", local_time(meta.get("mtime")))
    c.row("Chunks", meta.get("chunks", 0))
    c.row("Digest", meta.get("digest", ""))
    return c


async def _bucket_info(rt, bucket: str) -> dict:
    return await stream_of_bucket(rt, _stream(bucket), "nats: object store not found")


async def add(rt) -> None:
    a = rt.args
    ttl = duration_arg(a.ttl, "ttl") if a.ttl else 0
    cfg = {"name": _stream(a.bucket),
           "subjects": ["$O.%s.C.>" % a.bucket, "$O.%s.M.>" % a.bucket],
           "description": a.description, "max_age": ttl,
           "max_bytes": size_arg(a.max_bucket_size, "bucket size") if a.max_bucket_size else -1,
           "storage": "memory" if a.storage in ("memory", "m") else "file",
           "num_replicas": a.replicas, "discard": "new", "allow_rollup_hdrs": True,
           "allow_direct": True, "max_msgs": -1, "max_consumers": -1, "retention": "limits",
           "max_msgs_per_subject": -1, "max_msg_size": -1}
    if a.compress:
        cfg["compression"] = "s2"
    js = await rt.js()
    info_ = await js.request("STREAM.CREATE." + cfg["name"], cfg,
                             doing="could not create bucket %s" % a.bucket)
    emit(info_, a.json, lambda i: bucket_screen(a.bucket, i))


async def _meta(rt, bucket: str, name: str) -> dict | None:
    js = await rt.js()
    try:
        msg = (await js.request("STREAM.MSG.GET." + _stream(bucket),
                                {"last_by_subj": _meta_subject(bucket, name)})).get("message")
    except APIError as e:
        if e.err_code == 10059:
            raise CLIError("nats: object store not found") from None
        if e.err_code == 10037 or e.code_http == 404:
            return None
        raise
    meta = json.loads(base64.b64decode(msg.get("data") or "") or b"{}")
    return None if meta.get("deleted") else meta


async def put(rt) -> None:
    from nats.nuid import NUID
    a = rt.args
    name = a.name or a.file
    if not name:
        raise CLIError("--name is required when reading from stdin")
    await _bucket_info(rt, a.bucket)
    existing = await _meta(rt, a.bucket, name)
    if existing is not None and not a.force:
        object_screen(existing).print()
        print()
        if not prompt.confirm("Replace existing file %s > %s" % (a.bucket, name), False):
            return
    src = open(a.file, "rb") if a.file else sys.stdin.buffer
    nuid = NUID().next().decode()
    chunk_subject = "$O.%s.C.%s" % (a.bucket, nuid)
    digest = hashlib.sha256()
    size = chunks = 0
    try:
        while True:
            data = src.read(max(1, a.chunk_size))
            if not data:
                break
            digest.update(data)
            size += len(data)
            chunks += 1
            await publish(rt, chunk_subject, data)
    finally:
        if a.file:
            src.close()
    meta = {"name": os.path.normpath(name), "description": a.description,
            "bucket": a.bucket, "nuid": nuid, "size": size, "chunks": chunks,
            "mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
            "digest": "SHA-256=" + base64.urlsafe_b64encode(digest.digest()).decode()}
    if a.chunk_size != CHUNK:
        meta["options"] = {"max_chunk_size": a.chunk_size}
    await publish(rt, _meta_subject(a.bucket, name), json.dumps(meta).encode(),
                   {"Nats-Rollup": "sub"})
    if existing is not None and existing.get("nuid") != nuid:
        js = await rt.js()
        await js.request("STREAM.PURGE." + _stream(a.bucket),
                         {"filter": "$O.%s.C.%s" % (a.bucket, existing["nuid"])})
    print()
    object_screen(meta).print()


async def get(rt) -> None:
    a = rt.args
    meta = await _meta(rt, a.bucket, a.file)
    if meta is None:
        raise CLIError("nats: object not found")
    out = a.output or os.path.basename(meta["name"])
    if os.path.exists(out) and not a.force and out != "-" and \
            not prompt.confirm("Replace existing target file %s" % out, False):
        return
    start = time.monotonic()
    js = await rt.js()
    digest = hashlib.sha256()
    written = 0
    sink = sys.stdout.buffer if out == "-" else open(out + ".tmp", "wb")
    try:
        if meta.get("chunks"):
            async def on_chunk(m):
                nonlocal written
                digest.update(m.data)
                sink.write(m.data)
                written += len(m.data)
            await ordered_read(js, _stream(a.bucket), ["$O.%s.C.%s" % (a.bucket, meta["nuid"])],
                               on_msg=on_chunk, follow=True, limit=meta["chunks"])
    finally:
        if out != "-":
            sink.close()
    want = meta.get("digest", "")
    got = "SHA-256=" + base64.urlsafe_b64encode(digest.digest()).decode()
    if written != meta.get("size", 0) or (want and want != got):
        if out != "-":
            os.unlink(out + ".tmp")
        raise CLIError("nats: received a corrupt object, digests do not match")
    if out != "-":
        os.replace(out + ".tmp", out)
        elapsed = time.monotonic() - start
        print("Wrote: %s to %s in %s" % (ibytes(written), out,
                                         go_duration(int(elapsed * NS) // 1000000 * 1000000)))


async def delete(rt) -> None:
    a = rt.args
    js = await rt.js()
    if not a.file:
        if not a.force and not prompt.confirm("Delete bucket %s?" % a.bucket, False):
            print("Skipping delete")
            return
        await js.request("STREAM.DELETE." + _stream(a.bucket), None,
                         doing="could not delete bucket %s" % a.bucket)
        return
    meta = await _meta(rt, a.bucket, a.file)
    if meta is None:
        raise CLIError("nats: object not found")
    if not a.force and not prompt.confirm("Delete %s > %s?" % (a.bucket, a.file), False):
        print("Skipping delete")
        return
    gone = dict(meta, deleted=True, size=0, chunks=0, digest="",
                mtime=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z")
    await publish(rt, _meta_subject(a.bucket, a.file), json.dumps(gone).encode(),
                   {"Nats-Rollup": "sub"})
    await js.request("STREAM.PURGE." + _stream(a.bucket),
                     {"filter": "$O.%s.C.%s" % (a.bucket, meta["nuid"])})
    print("Removed %s > %s" % (a.bucket, a.file))


async def info(rt) -> None:
    a = rt.args
    if a.file:
        meta = await _meta(rt, a.bucket, a.file)
        if meta is None:
            raise CLIError("nats: object not found")
        emit(meta, a.json, object_screen)
        return
    info_ = await _bucket_info(rt, a.bucket)
    emit(info_, a.json, lambda i: bucket_screen(a.bucket, i))


async def _objects(rt, bucket: str) -> list[dict]:
    js = await rt.js()
    msgs = await ordered_read(js, _stream(bucket), ["$O.%s.M.>" % bucket], "last_per_subject")
    out = []
    for m in msgs:
        try:
            meta = json.loads(m.data)
        except ValueError:
            continue
        if not meta.get("deleted"):
            out.append(meta)
    return out


async def ls(rt) -> None:
    a = rt.args
    if not a.bucket:
        await list_buckets(rt, "OBJ_", "Object Store Buckets", "No Object Store buckets found",
                           values=False)
        return
    await _bucket_info(rt, a.bucket)
    objs = await _objects(rt, a.bucket)
    if a.json:
        print_json(objs)
    elif a.names:
        for o in objs:
            print(o["name"])
    elif not objs:
        print("No entries found")
    else:
        t = Table("Bucket Contents", ["Name", "Size", "Time"])
        for o in sorted(objs, key=lambda o: o["name"]):
            t.add(o["name"], ibytes(o.get("size", 0)), local_time(o.get("mtime")))
        t.print()


async def seal(rt) -> None:
    a = rt.args
    if not a.force and not prompt.confirm("Really seal Bucket %s, sealed buckets can not be "
                                          "unsealed or modified" % a.bucket, False):
        return
    js = await rt.js()
    cfg = (await _bucket_info(rt, a.bucket))["config"]
    cfg["sealed"] = True
    await js.request("STREAM.UPDATE." + cfg["name"], cfg, doing="could not seal bucket")
    print("%s has been sealed" % a.bucket)


async def watch(rt) -> None:
    """natscli's object watch: every metadata message of the bucket, history first
    (nats.go's IncludeHistory), then what changes, until interrupted."""
    import datetime as dt
    a = rt.args
    await _bucket_info(rt, a.bucket)
    js = await rt.js()

    async def on_msg(m):
        try:
            meta = json.loads(m.data)
        except ValueError:
            return
        when = dt.datetime.fromtimestamp(m.time_ns / NS).strftime("%Y-%m-%d %H:%M:%S")
        name = meta.get("name", "")
        if meta.get("deleted"):
            print("[%s] DEL %s > %s" % (when, a.bucket, name), flush=True)
        else:
            print("[%s] PUT %s > %s: %s bytes in %s chunks" % (
                when, a.bucket, name, ibytes(meta.get("size", 0)),
                "{:,}".format(meta.get("chunks", 0))), flush=True)

    await ordered_read(js, _stream(a.bucket), ["$O.%s.M.>" % a.bucket], "all", follow=True,
                       on_msg=on_msg, limit=a.count)
