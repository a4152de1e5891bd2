"""``natsjs stream backup|restore``: a stream out of the server into a folder and back,
over NATS, in jsm.go's folder layout (``backup.json``: the snapshot answer's
configuration and state; ``stream.tar.s2``: the archive as the server sent it).

Backup asks ``$JS.API.STREAM.SNAPSHOT.<stream>`` to send the archive to an inbox and
answers every chunk that carries a reply (the server's flow control); an empty message
ends it (status 204, or another status as the error).  Restore asks
``$JS.API.STREAM.RESTORE.<stream>`` for a subject, sends the archive there in 64 KiB
requests, then an empty request whose answer is the created stream.
"""
from __future__ import annotations

import asyncio
import json
import os
import time

from natsjs.admin.args import json_flag, load_config_file, read_json_file, size_arg
from natsjs.admin.errors import APIError, CLIError, q
from natsjs.admin.render import comma, go_duration, ibytes, print_json, NS
from natsjs.admin.stream import show_stream

DATA_FILE = "stream.tar.s2"
META_FILE = "backup.json"
RESTORE_CHUNK = 64 * 1024


def register_stream(g) -> None:
    p = g.command("backup", "Creates a backup of a stream over the NATS network", backup,
                  aliases=["snapshot"])
    p.add_argument("stream", help="Stream to backup")
    p.add_argument("target", help="Directory to create the backup in")
    p.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction,
                   default=False, help="Report each chunk as it arrives")
    p.add_argument("--check", action="store_true", help="Checks the stream before backup")
    p.add_argument("--consumers", action=__import__("argparse").BooleanOptionalAction,
                   default=True, help="Enable or disable consumer backups")
    p.add_argument("--chunk-size", default="", help="Chunk size the server will send")
    p.add_argument("--window-size", default="", help="Window size the server will use")
    p = g.command("restore", "Restore a stream over the NATS network", restore)
    p.add_argument("file", help="The directory holding the backup to restore")
    p.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction,
                   default=False, help="Report each chunk as it is sent")
    p.add_argument("--config", default="", help="Load a different configuration")
    p.add_argument("--cluster", default="", help="Place the stream in a specific cluster")
    p.add_argument("--tag", action="append", help="Place the stream on servers with a tag")
    p.add_argument("--replicas", type=int, default=0, help="Override how many replicas")
    json_flag(p)


async def backup(rt) -> None:
    a = rt.args
    js = await rt.js()
    nc = await rt.conn()
    os.makedirs(a.target, exist_ok=True)
    inbox = nc.new_inbox()
    req = {"deliver_subject": inbox, "no_consumers": not a.consumers, "jsck": a.check,
           "chunk_size": size_arg(a.chunk_size, "chunk size") if a.chunk_size else 128 * 1024}
    if a.window_size:
        req["window_size"] = size_arg(a.window_size, "window size")
    done = asyncio.Event()
    state = {"bytes": 0, "chunks": 0, "error": None, "last": time.monotonic()}
    out = open(os.path.join(a.target, DATA_FILE), "wb")

    async def on_chunk(msg):
        state["last"] = time.monotonic()
        if not msg.data:
            status = (msg.headers or {}).get("Status", "") if msg.headers else ""
            if status and "204" not in status:
                state["error"] = "%s %s" % (status, (msg.headers or {}).get("Description", ""))
            done.set()
            return
        if msg.reply:
            await nc.publish(msg.reply, b"")
        out.write(msg.data)
        state["bytes"] += len(msg.data)
        state["chunks"] += 1
        if a.progress:
            print("Received %s chunk %s" % (ibytes(len(msg.data)), comma(state["chunks"])))

    sub = await nc.subscribe(inbox, cb=on_chunk)
    start = time.monotonic()
    try:
        await nc.flush()
        resp = await js.request("STREAM.SNAPSHOT." + a.stream, req,
                                doing="could not backup stream %s" % a.stream)
        print("Starting backup of Stream %s with %s" % (q(a.stream), ibytes(
            (resp.get("state") or {}).get("bytes", 0))))
        if a.check:
            print("Health Check was requested, this can take a long time without progress "
                  "reports\n")
        idle = max(rt.timeout, 30.0)
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                if time.monotonic() - state["last"] > idle:
                    raise CLIError("backup timed out after receiving no data for a long "
                                   "period") from None
    finally:
        await sub.unsubscribe()
        out.close()
    if state["error"]:
        raise CLIError("backup failed: %s" % state["error"].strip())
    with open(os.path.join(a.target, META_FILE), "w") as f:
        json.dump({"config": resp.get("config"), "state": resp.get("state")}, f, indent=2)
    took = go_duration(int((time.monotonic() - start) * 1000) * 1000000)
    print()
    print("Received %s compressed data in %s chunks for stream %s in %s" % (
        ibytes(state["bytes"]), comma(state["chunks"]), q(a.stream), took))


async def restore(rt) -> None:
    import nats.errors

    a = rt.args
    meta_path, data_path = os.path.join(a.file, META_FILE), os.path.join(a.file, DATA_FILE)
    req = read_json_file(meta_path, "invalid %s: %s")
    cfg = req.get("config") or {}
    name = cfg.get("name", "")
    if a.config:
        new = load_config_file(a.config)
        if new.get("name", name) != name:
            raise CLIError("stream names may not be changed during restore")
        cfg = new
    if a.replicas:
        cfg["num_replicas"] = a.replicas
    if a.cluster or a.tag:
        placement = dict(cfg.get("placement") or {})
        if a.cluster:
            placement["cluster"] = a.cluster
        if a.tag:
            placement["tags"] = a.tag
        cfg["placement"] = placement
    if cfg.get("storage") == "memory":
        raise CLIError("memory streams do not support snapshots")
    req["config"] = cfg
    if not os.path.exists(data_path):
        raise CLIError("%s does not exist" % data_path)
    js = await rt.js()
    nc = await rt.conn()
    if not a.json:
        print("Starting restore of Stream %s from file %s\n" % (q(name), q(a.file)))
    start = time.monotonic()
    resp = await js.request("STREAM.RESTORE." + name, req,
                            doing="could not restore stream %s" % name)
    target = resp.get("deliver_subject")
    if not target:
        raise CLIError("the server gave no subject to restore to")
    sent = 0
    with open(data_path, "rb") as f:
        while True:
            chunk = f.read(RESTORE_CHUNK)
            if not chunk:
                break
            try:
                ack = await nc.request(target, chunk, timeout=rt.timeout)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                raise CLIError("restore failed: no answer to chunk %d" % (sent + 1)) from None
            if ack.data:
                raise CLIError("restore failed: %s" % ack.data.decode(errors="replace"))
            sent += 1
            if a.progress:
                print("Sent %s chunk %d" % (ibytes(len(chunk)), sent))
    final = await nc.request(target, b"", timeout=3600)
    try:
        done = json.loads(final.data)
    except ValueError:
        raise CLIError("invalid final restore answer") from None
    if done.get("error"):
        raise APIError(done["error"], "restore failed")
    if a.json:
        print_json(done)
        return
    print("Restored stream %s in %s\n" % (q(name), go_duration(
        int(round(time.monotonic() - start)) * NS)))
    show_stream(await js.stream_info(name))
