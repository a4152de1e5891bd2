"""Bringing streams and consumers back from disk when JetStream starts.

Files read at start are input like any request (DESIGN.md: validation happens where
data enters), and damage is expected.  For each stream directory:

* the metadata is decoded with the API's schema and goes through the checks a
  create request meets (natsjs/jetstream/streamcfg.py check_stream_config); a stream
  whose metadata is missing, unreadable or refused is reported and left on disk
  untouched, as nats-server does, and the other streams are served;
* the message log recovers itself (torn tails truncated, bad records reported, never
  served: natsjs/_core/filelog.pyx) and what it found is logged;
* each consumer's metadata is checked like a create request
  (natsjs/jetstream/consumercfg.py check_config) and its state (snapshot + acknowledgement
  log, natsjs/jetstream/store.py) is loaded, with any damage reported;
* the stream's sequence is kept: the last sequence recorded in ``msgs/state.json`` and
  every consumer's position are floors below which no new message may be stored.  A log
  that ends below them lost messages (a block deleted or cut short): the loss is
  reported with its sequences and the log skips to the floor, so new messages never
  reuse a sequence a consumer has passed (nats-server: "Stream state detected prior
  state, could not locate msg block").
"""
from __future__ import annotations

import os

import trio

from natsjs.jetstream import batching
from natsjs.jetstream import consumercfg as CC
from natsjs.jetstream import streamcfg as SC
from natsjs.jetstream.consumer import Consumer
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.names import safe_name
from natsjs.jetstream.schema import DecodeError, decode_struct, is_empty
from natsjs.jetstream.store import (META, MSGS, OBS, FileConsumerStore, meta_sum,
                                    open_message_log, read_json, read_store_state,
                                    write_store_state)
from natsjs.jetstream.stream import Stream

# What a damaged or hostile file can raise while it is read and checked.
_BAD = (OSError, ValueError, KeyError, TypeError, ApiError)


async def recover_streams(js, jsa, sdir: str) -> None:
    for name in sorted(os.listdir(sdir)):
        try:
            await _recover_stream(js, jsa, os.path.join(sdir, name), name)
        except Exception as exc:
            # Whatever one stream's files do is reported; the other streams are served.
            js.server.log.error("  Error recovering stream '%s > %s': %s", jsa.name, name,
                                _describe(exc))


async def _recover_stream(js, jsa, path: str, dirname: str) -> None:
    log = js.server.log
    got = _read_meta(log, path, dirname, _stream_config, "  ", "stream ")
    if got is None:
        return
    cfg, created = got
    if cfg["storage"] != "file":
        log.warn("  Stream '%s > %s' has memory storage on disk, skipped", jsa.name, dirname)
        return
    log.info("  Starting restore for stream '%s > %s'", jsa.name, cfg["name"])
    try:
        store = await trio.to_thread.run_sync(open_message_log, os.path.join(path, MSGS), cfg)
    except (OSError, ValueError) as exc:
        log.error("  Error recreating stream %r: %s", cfg["name"], exc)
        return
    report = getattr(store, "recovery", None) or {}
    log_recovery(log, jsa.name, cfg["name"], report)
    _drop_partial_batch(log, jsa.name, cfg["name"], store)
    consumers = _read_consumers(js, jsa, cfg, os.path.join(path, OBS))
    _keep_sequence(log, jsa.name, cfg["name"], path, store, consumers)
    try:
        write_store_state(path, store)
    except OSError as exc:
        log.warn("  Stream '%s > %s': could not record its state: %s", jsa.name,
                 cfg["name"], exc)
    stream = Stream(jsa, cfg, created, store, path)
    jsa.streams[cfg["name"]] = stream
    for name, ccfg, ccreated, cstore, state in consumers:
        stream.consumers[name] = Consumer(stream, ccfg, name, ccreated, cstore, state)
    js.start_stream(stream)
    st = store.state()
    log.info("  Restored %s messages for stream '%s > %s' in %s",
             _commas(st["messages"]), jsa.name, cfg["name"],
             "%.3fms" % (float(report.get("seconds", 0.0)) * 1000))


def _drop_partial_batch(log, acc: str, name: str, store) -> None:
    """An atomic batch whose writing the process did not finish is not kept (none of it
    was acknowledged): natsjs/jetstream/batching.py."""
    n = batching.drop_partial_tail(store)
    if n:
        s = store.begin_sync()
        s.run()
        store.mark_synced(s)
        log.warn("  Stream '%s > %s': %d messages of an uncommitted atomic batch dropped",
                 acc, name, n)


def _keep_sequence(log, acc: str, name: str, path: str, store, consumers: list) -> None:
    """A log that ends below what the stream had reached (its recorded state, or a
    consumer's position) lost its last messages: report them and skip to that point."""
    floor, why = 0, ""
    try:
        prior = read_store_state(path)
    except _BAD as exc:
        log.warn("  Stream '%s > %s': state file unreadable (%s), ignored", acc, name,
                 _describe(exc))
        prior = None
    if prior is not None and prior["last_seq"] > floor:
        floor, why = prior["last_seq"], "prior state"
    for cname, _, _, _, state in consumers:
        # Only one that delivered something: a start sequence ahead of the stream
        # (by_start_sequence) is a position nothing has reached yet.
        if state is not None and state.dseq > 1 and state.sseq - 1 > floor:
            floor, why = state.sseq - 1, "consumer '%s'" % cname
    last = store.last_seq
    if floor <= last:
        return
    lo = max(last + 1, store.first_seq if store.msgs else last + 1)
    lost = floor - lo + 1
    if prior is not None and prior["last_seq"] >= floor:
        # Of the sequences gone, only those that held messages when the state was written.
        lost = min(lost, prior["msgs"])
    log.warn("  Filestore [%s] Stream state detected %s at sequence %d, but the log ends "
             "at %d: could not locate %d messages (sequences %d-%d), lost; the stream "
             "keeps its sequence", name, why, floor, last, lost, lo, floor)
    store.skip(last + 1, floor - last)
    s = store.begin_sync()
    s.run()
    store.mark_synced(s)


def _read_consumers(js, jsa, scfg: dict, odir: str) -> list:
    """(name, config, created, store, state) of each consumer that reads and checks."""
    log = js.server.log
    if not os.path.isdir(odir):
        return []
    names = sorted(os.listdir(odir))
    if names:
        log.info("  Recovering %d consumers for stream - '%s > %s'", len(names), jsa.name,
                 scfg["name"])
    out = []
    for name in names:
        d = os.path.join(odir, name)

        def check(raw, name=name):
            return _consumer_config(js, jsa, scfg, raw, name)
        got = _read_meta(log, d, name, check, "    ", "consumer ")
        if got is None:
            continue
        cfg, created = got
        cstore = None
        try:
            cstore = FileConsumerStore(d, js.fsync)
            state = cstore.load()
        except _BAD as exc:
            log.warn("    Error recovering consumer state '%s > %s > %s': %s",
                     jsa.name, scfg["name"], name, _describe(exc))
            if cstore is not None:
                cstore.close()
            continue
        for what in cstore.damage:
            log.warn("    Consumer '%s > %s > %s': %s", jsa.name, scfg["name"], name, what)
        out.append((name, cfg, created, cstore, state))
    return out


def _decoded(blank: dict, raw, schema) -> dict:
    """A stored configuration over ``blank``, every field a request could set decoded
    (types checked) by the API's schema.  Go's zero values ("" for an enum left unset)
    are stored as they were and are not decoded: a request would have omitted them."""
    cfg = blank
    cfg.update(_object(raw))
    cfg.update(decode_struct({k: v for k, v in raw.items() if not is_empty(v)}, schema,
                             strict=False))
    return cfg


def _stream_config(raw, dirname: str) -> dict:
    cfg = _decoded(SC.blank_config(), raw, SC.STREAM_CONFIG)
    if cfg["name"] != dirname:
        raise ValueError("stream name %r does not match its directory" % cfg["name"])
    SC.check_stream_config(cfg, SC.CheckContext())
    return cfg


def _consumer_config(js, jsa, scfg: dict, raw, dirname: str) -> dict:
    cfg = _decoded(CC.blank_config(), raw, CC.CONSUMER_CONFIG)
    if any(cfg[k] and cfg[k] != dirname for k in ("name", "durable_name")):
        raise ValueError("consumer configuration names another consumer")
    CC.check_config(dict(cfg, name=dirname), scfg, js.opts.limits, jsa.limits,
                    recovering=True)
    return cfg


def _object(raw) -> dict:
    if not isinstance(raw, dict):
        raise ValueError("config is not an object")
    return raw


def _read_meta(log, path: str, dirname: str, check, indent: str, what: str):
    """A stream's or consumer's (config, created) from its meta file, checked; None,
    reported, when it is missing, unreadable or refused (the directory is left as it
    is)."""
    if not safe_name(dirname):
        log.warn("%sSkipping %sdirectory %r: not a valid name", indent, what, dirname)
        return None
    meta = os.path.join(path, META)
    if not os.path.isfile(meta):
        log.warn("%sMissing %smetafile %r", indent, what, meta)
        return None
    try:
        d = read_json(meta)
        if not isinstance(d, dict):
            raise ValueError("not an object")
        if "sum" in d and d["sum"] != meta_sum(d):
            raise ValueError("checksum mismatch")
        created = d.get("created")
        if not isinstance(created, int) or isinstance(created, bool) or created < 0:
            raise ValueError("bad creation time %r" % (created,))
        return check(d.get("config"), dirname), created
    except (DecodeError, *_BAD) as exc:
        log.warn("%sError reading %smetafile %r: %s", indent, what, meta, _describe(exc))
        return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return exc.to_dict().get("description", str(exc))
    return str(exc) or exc.__class__.__name__


def log_recovery(log, acc: str, name: str, report: dict) -> None:
    """Say in the log what a stream store's recovery ``report`` (FileLog.recovery)
    found: torn tails cut, damaged records, messages lost."""
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
