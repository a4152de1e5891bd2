"""Bringing streams and consumers back from disk when JetStream starts.

For each stream directory: the metadata (configuration and creation time) is read
and checked like a new configuration; the message log recovers itself (torn tails
truncated, bad records reported, never served: natsjs/_core/filelog.pyx) and what it
found is logged; then each consumer's metadata and state (snapshot + acknowledgement
log, natsjs/jetstream/store.py).  A stream whose metadata cannot be read is reported
and left on disk untouched, as nats-server does.
"""
from __future__ import annotations

import os

import trio

from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.consumer import Consumer
from natsjs.jetstream.store import (META, MSGS, OBS, FileConsumerStore, open_message_log,
                                    read_json)
from natsjs.jetstream.stream import Stream


async def recover_streams(js, jsa, sdir: str) -> None:
    log = js.server.log
    for name in sorted(os.listdir(sdir)):
        path = os.path.join(sdir, name)
        got = _read_meta(log, path, SC.blank_config, "  ", "stream ")
        if got is None:
            continue
        cfg, created = got
        log.info("  Starting restore for stream '%s > %s'", jsa.name, cfg["name"])
        try:
            store = await trio.to_thread.run_sync(open_message_log, os.path.join(path, MSGS), cfg)
        except (OSError, ValueError) as exc:
            log.error("  Error recreating stream %r: %s", cfg["name"], exc)
            continue
        report = getattr(store, "recovery", None) or {}
        _log_recovery(log, jsa.name, cfg["name"], report)
        stream = Stream(jsa, cfg, created, store, path)
        jsa.streams[cfg["name"]] = stream
        _recover_consumers(js, jsa, stream, os.path.join(path, OBS))
        js.start_stream(stream)
        st = store.state()
        log.info("  Restored %s messages for stream '%s > %s' in %s",
                 _commas(st["messages"]), jsa.name, cfg["name"],
                 "%.3fms" % (float(report.get("seconds", 0.0)) * 1000))


def _recover_consumers(js, jsa, stream, odir: str) -> None:
    log = js.server.log
    if not os.path.isdir(odir):
        return
    names = sorted(os.listdir(odir))
    if names:
        log.info("  Recovering %d consumers for stream - '%s > %s'", len(names), jsa.name,
                 stream.name)
    for name in names:
        d = os.path.join(odir, name)
        got = _read_meta(log, d, CC.blank_config, "    ", "consumer ")
        if got is None:
            continue
        cfg, created = got
        try:
            cstore = FileConsumerStore(d, js.fsync)
            state = cstore.load()
        except (OSError, ValueError) as exc:
            log.warn("    Error recovering consumer state '%s > %s > %s': %s",
                     jsa.name, stream.name, name, exc)
            continue
        c = Consumer(stream, cfg, name, created, cstore, state)
        stream.consumers[name] = c


def _read_meta(log, path: str, blank, indent: str, what: str):
    """A stream's or consumer's (config, created) from its meta file; None, reported,
    when it is missing or unreadable (the directory is left as it is)."""
    meta = os.path.join(path, META)
    if not os.path.isfile(meta):
        log.warn("%sMissing %smetafile %r", indent, what, meta)
        return None
    try:
        d = read_json(meta)
        cfg = blank()
        cfg.update(d["config"])
        return cfg, int(d["created"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warn("%sError reading %smetafile %r: %s", indent, what, meta, exc)
        return None


def _log_recovery(log, acc: str, name: str, report: dict) -> None:
    if report.get("truncated_bytes"):
        log.warn("  Stream '%s > %s': truncated a torn tail of %d bytes", acc, name,
                 report["truncated_bytes"])
    for bad in report.get("corrupt") or []:
        log.error("  Stream '%s > %s': corrupt record skipped (never served): %s", acc, name,
                  bad)
    if report.get("lost"):
        log.error("  Stream '%s > %s': messages lost to corruption: %s", acc, name,
                  report["lost"])


def _commas(n: int) -> str:
    return "{:,}".format(n)
