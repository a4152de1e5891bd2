"""Message schedules: a stream with ``allow_msg_schedules`` publishes messages at set times.

A client stores a schedule as a message of its own subject:

    Nats-Schedule: @at 2026-01-01T00:00:00Z | @every 5m | <six-field cron> | @hourly ..
    Nats-Schedule-Target: <a subject of the same stream>
    Nats-Schedule-Time-Zone / -TTL / -Rollup / -Source   (optional)

Where it sits: ``check`` runs in the stream's state machine (``Stream._process``) before
a client's message is stored and refuses what nats-server refuses (a schedule also gets
``Nats-Rollup: sub``, so a newer schedule of the subject replaces it); ``MsgSchedules``
hears of every stored message (``stored``, on every replica, and again from the store
after a restart, ``rebuild``) and keeps each schedule's next time.  Its task fires on the
stream's leader only: the scheduled message (the schedule's payload and headers, or the
last message of ``Nats-Schedule-Source``) goes through the stream's inbox like a subject
delete marker, with ``Nats-Scheduler: <schedule subject>`` and ``Nats-Schedule-Next:
<next time>`` or ``purge`` (a one-off schedule is purged when its message is stored).
A replicated stream proposes it to its group, and every replica stores it alike.

This is server/scheduler.go and the scheduling parts of stream.go (processJetStreamMsg,
processJetStreamMsgWithRollup) and filestore.go (storeRawMsg, runMsgScheduling).
"""
from __future__ import annotations

import datetime as dt
import heapq
import re
import zoneinfo

import trio

from natsjs.jetstream import headers as H
from natsjs.jetstream.cron import CronError, next_time
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import now_ns, parse_go_duration, parse_rfc3339
from natsjs.jetstream.subjects import subjects_collide, valid_publish_subject

PATTERN = b"Nats-Schedule"
TIME_ZONE = b"Nats-Schedule-Time-Zone"
TTL = b"Nats-Schedule-TTL"
ROLLUP = b"Nats-Schedule-Rollup"
TARGET = b"Nats-Schedule-Target"
SOURCE = b"Nats-Schedule-Source"
SCHEDULER = b"Nats-Scheduler"
NEXT = b"Nats-Schedule-Next"
NEXT_PURGE = b"purge"

NS = 1_000_000_000
MIN_FIRE = 0.25          # server/scheduler.go: never checks more often than this
NOT_LEADING = 1.0        # how often a replica that does not lead looks again

_PREDEFINED = {"@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *",
               "@monthly": "0 0 0 1 * *", "@weekly": "0 0 0 * * 0",
               "@daily": "0 0 0 * * *", "@midnight": "0 0 0 * * *",
               "@hourly": "0 0 * * * *"}
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


class ScheduleError(ValueError):
    """A schedule nats-server refuses: ``code`` names its ApiError."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


def _location(hdr: bytes):
    """server/stream.go loadMessageScheduleLocation: None without the header."""
    tz = H.get(hdr, TIME_ZONE)
    if tz is None:
        return None
    try:
        if not tz:
            raise ValueError
        name = tz.decode()
        return dt.timezone.utc if name == "UTC" else zoneinfo.ZoneInfo(name)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise ScheduleError("JSMessageSchedulesTimeZoneInvalidErr") from None


def _go_round_seconds(ns: int) -> int:
    """Go's Time.Round(time.Second): halves away from zero."""
    return (ns + NS // 2) // NS * NS


def parse_schedule(pattern: str, tz, ts: int):
    """server/scheduler.go parseMsgSchedule: (next time as an aware datetime, or None for
    no schedule; repeats).  ScheduleError for a pattern it refuses."""
    if not pattern:
        return None, False
    if pattern.startswith("@at "):
        text = pattern[4:]
        if tz is not None or not _RFC3339.match(text):
            raise ScheduleError("JSMessageSchedulesPatternInvalidErr")
        try:
            ns = parse_rfc3339(text)
        except ValueError:
            raise ScheduleError("JSMessageSchedulesPatternInvalidErr") from None
        return _utc(ns), False
    if pattern.startswith("@every "):
        try:
            every = parse_go_duration(pattern[7:])
        except ValueError:
            every = 0
        if tz is not None or every < NS:
            raise ScheduleError("JSMessageSchedulesPatternInvalidErr")
        # A schedule that would fire many times (after a restart) fires once.
        nxt = _go_round_seconds(ts) + every
        now = now_ns()
        if nxt < now:
            nxt = _go_round_seconds(now) + every
        return _utc(nxt), True
    pattern = _PREDEFINED.get(pattern, pattern)
    try:
        nxt = next_time(pattern, tz, ts)
        now = now_ns()
        if _ns(nxt) < now:
            nxt = next_time(pattern, tz, _go_round_seconds(now))
    except (CronError, OverflowError, ValueError):
        raise ScheduleError("JSMessageSchedulesPatternInvalidErr") from None
    return nxt, True


def _utc(ns: int) -> "_NsTime":
    return _NsTime(ns)


class _NsTime:
    """A UTC time with nanoseconds (what @at and @every give), like the datetimes cron
    gives: ``_ns`` and ``go_format`` take both."""

    __slots__ = ("ns",)

    def __init__(self, ns: int):
        self.ns = ns


def _ns(t) -> int:
    if t.__class__ is _NsTime:
        return t.ns
    return int(t.timestamp()) * NS


def go_format(t) -> str:
    """Go's Time.Format(time.RFC3339Nano): Z for a zero offset, fraction trimmed."""
    if t.__class__ is _NsTime:
        secs, frac = divmod(t.ns, NS)
        base = dt.datetime.fromtimestamp(secs, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        return base + (".%09d" % frac).rstrip("0") + "Z" if frac else base + "Z"
    off = t.utcoffset()
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    if not off:
        return base + "Z"
    mins = int(off.total_seconds()) // 60
    sign = "-" if mins < 0 else "+"
    return base + "%s%02d:%02d" % (sign, abs(mins) // 60, abs(mins) % 60)


def next_schedule(hdr: bytes | None, ts: int):
    """server/stream.go nextMessageSchedule: the schedule's next time, None if the
    message is no schedule; ScheduleError if its headers are refused."""
    if not hdr:
        return None
    tz = _location(hdr)
    raw = H.get(hdr, PATTERN)
    return parse_schedule(raw.decode("utf-8", "replace") if raw else "", tz, ts)[0]


def _in_stream(cfg: dict, subject: str) -> bool:
    return any(subjects_collide(s, subject) for s in cfg["subjects"] or ())


def check(cfg: dict, store, subject: bytes, hdr: bytes) -> bytes | ApiError:
    """A client's message with scheduling headers (server/stream.go
    processJetStreamMsg): the header block to store, or the ApiError it is refused with."""
    allow = cfg["allow_msg_schedules"]
    try:
        when = next_schedule(hdr, now_ns())
    except ScheduleError as exc:
        return ApiError.of(exc.code if allow else "JSMessageSchedulesDisabledErr")
    if when is not None:
        if not allow:
            return ApiError.of("JSMessageSchedulesDisabledErr")
        ttl = H.get(hdr, TTL)
        if ttl and H.parse_ttl(ttl) is None:
            return ApiError.of("JSMessageSchedulesTTLInvalidErr")
        rollup = H.get(hdr, ROLLUP)
        if rollup and rollup != b"sub":
            return ApiError.of("JSMessageSchedulesRollupInvalidErr")
        if ttl and not cfg["allow_msg_ttl"]:
            return ApiError.of("JSMessageTTLDisabledErr")
        target = H.get(hdr, TARGET)
        if not target or target == subject or not valid_publish_subject(target.decode()):
            return ApiError.of("JSMessageSchedulesTargetInvalidErr")
        source = H.get(hdr, SOURCE)
        if source and (source in (target, subject) or
                       not valid_publish_subject(source.decode())):
            return ApiError.of("JSMessageSchedulesSourceInvalidErr")
        if not _in_stream(cfg, target.decode()):
            return ApiError.of("JSMessageSchedulesTargetInvalidErr")
        if source and not _in_stream(cfg, source.decode()):
            return ApiError.of("JSMessageSchedulesSourceInvalidErr")
        # The schedule rolls up its subject: a newer schedule replaces it.
        r = H.get(hdr, H.ROLLUP)
        if not r:
            hdr = H.add(hdr, H.ROLLUP, b"sub")
        elif r.lower() != b"sub":
            return ApiError.of("JSMessageSchedulesRollupInvalidErr")
    nxt = H.get(hdr, NEXT)
    if nxt:
        # Clients may use Nats-Schedule-Next only to purge a schedule, named by
        # Nats-Scheduler (which must hold a schedule, or nothing).
        scheduler = H.get(hdr, SCHEDULER)
        if nxt != NEXT_PURGE or not scheduler or scheduler == subject or \
                not valid_publish_subject(scheduler.decode()):
            return ApiError.of("JSMessageSchedulesSchedulerInvalidErr")
        if not allow:
            return ApiError.of("JSMessageSchedulesDisabledErr")
        last = store.load_last(scheduler)
        if last is not None and not H.get(last[2], PATTERN):
            return ApiError.of("JSMessageSchedulesSchedulerInvalidErr")
    elif H.get(hdr, SCHEDULER):
        return ApiError.of("JSMessageSchedulesSchedulerInvalidErr")
    return hdr


def has_headers(hdr: bytes | None) -> bool:
    """Whether ``check`` has anything to look at (Nats-Schedule*, Nats-Scheduler); a
    header block may be gone by then (a replicated counter stream's refusal)."""
    return bool(hdr) and b"Nats-Schedule" in hdr


class MsgSchedules:
    """A stream's schedules (server/scheduler.go MsgScheduling): subject -> (sequence,
    next time), a heap of due times, and the subjects whose message is on its way."""

    def __init__(self, stream):
        self.stream = stream
        self.schedules: dict[bytes, tuple[int, int]] = {}
        self._due: list = []                    # (ns, seq, subject), stale ones skipped
        self.inflight: set[bytes] = set()
        self._wake = trio.lowlevel.ParkingLot()

    @classmethod
    def for_stream(cls, stream, current=None):
        """The stream's schedules when its configuration allows them (kept across an
        update), else None."""
        if not stream.cfg["allow_msg_schedules"]:
            return None
        return current if current is not None else cls(stream)

    # ---- what the store holds (every replica) -------------------------------------------

    def _add(self, seq: int, subject: bytes, ns: int) -> None:
        self.schedules[subject] = (seq, ns)
        heapq.heappush(self._due, (ns, seq, subject))
        self.inflight.discard(subject)
        self._wake.unpark()

    def _remove(self, subject: bytes) -> None:
        self.schedules.pop(subject, None)
        self.inflight.discard(subject)

    def stored(self, seq: int, subject: bytes, hdr: bytes | None, ts: int) -> bool:
        """A message was stored (server/filestore.go storeRawMsg): a schedule is added or
        replaced, another message of a schedule's subject ends it, a scheduled message
        moves its repeating schedule on.  True when it asks for its schedule's purge."""
        try:
            when = next_schedule(hdr, ts)
        except ScheduleError:
            when = None
        if when is not None:
            self._add(seq, subject, _ns(when))
        elif not H.get(hdr, SCHEDULER):
            if subject in self.schedules:
                self._remove(subject)
        nxt = H.get(hdr, NEXT) if hdr else None
        if not nxt:
            return False
        if nxt == NEXT_PURGE:
            return bool(H.get(hdr, SCHEDULER))
        scheduler = H.get(hdr, SCHEDULER)
        cur = self.schedules.get(scheduler) if scheduler else None
        if cur is not None:
            try:
                self._add(cur[0], scheduler, parse_rfc3339(nxt.decode()))
            except ValueError:
                pass
        return False

    def rebuild(self) -> None:
        """After a restart or a catch-up: every stored message again, in order."""
        self.schedules.clear()
        self._due = []
        self.inflight.clear()
        store = self.stream.store
        seq = store.first_seq
        while store.msgs:
            rec = store.load_next(seq)
            if rec is None:
                break
            seq, subject, hdr, _, ts = rec
            if hdr and b"Nats-Sched" in hdr:
                self.stored(seq, subject, hdr, ts)
            seq += 1

    # ---- firing (the leader) ----------------------------------------------------------------

    async def run(self) -> None:
        while True:
            delay = self.fire_due()
            with trio.move_on_after(delay):
                await self._wake.park()
            # However often schedules arrive, look no more often than nats-server does.
            await trio.sleep(MIN_FIRE)

    def _leading(self) -> bool:
        replica = self.stream.replica
        return replica is None or replica.is_leader()

    def fire_due(self) -> float:
        """Send what is due; seconds until the next one."""
        due = self._due
        now = now_ns()
        if due and due[0][0] <= now and not self._leading():
            return NOT_LEADING
        keep = []
        fired = []
        while due and due[0][0] <= now:
            item = heapq.heappop(due)
            ns, seq, subject = item
            if self.schedules.get(subject) != (seq, ns):
                continue                        # replaced, moved on or ended
            rec = self.stream.store.load_last(subject)
            if rec is None or rec[0] != seq:
                self._remove(subject)           # its message is gone or was replaced
                continue
            keep.append(item)
            if subject in self.inflight:
                continue
            out = self._scheduled(subject, rec[2], rec[3], ns)
            if out is None:
                self._remove(subject)
                keep.pop()
                continue
            fired.append((seq, out))
            self.inflight.add(subject)
        for item in keep:
            heapq.heappush(due, item)
        for _, (target, hdr, msg) in sorted(fired, key=lambda f: f[0]):
            self.stream.enqueue(target, self._store, hdr, msg)
        if not due:
            return 3600.0
        # What is in flight is looked at again after a while (a lost proposal).
        return max((due[0][0] - now) / NS, MIN_FIRE)

    def _scheduled(self, subject: bytes, hdr: bytes, msg: bytes, ns: int):
        """server/scheduler.go getScheduledMessages: (target, headers, payload) of the
        message a schedule sends now, or None when its headers no longer make one."""
        try:
            tz = _location(hdr)
            raw = H.get(hdr, PATTERN)
            if not raw:
                return None
            nxt, repeat = parse_schedule(raw.decode("utf-8", "replace"), tz, ns)
        except ScheduleError:
            return None
        ttl = H.get(hdr, TTL)
        if ttl and H.parse_ttl(ttl) is None:
            return None
        target = H.get(hdr, TARGET)
        if not target:
            return None
        rollup = H.get(hdr, ROLLUP)
        source = H.get(hdr, SOURCE)
        if source:
            last = self.stream.store.load_last(source)
            if last is not None:
                hdr, msg = last[2], last[3]
        out = H.remove_prefixed(hdr, b"Nats-Schedule")
        out = H.remove_prefixed(out, b"Nats-Expected-")
        for key in (H.MSG_ID, H.MSG_TTL, H.ROLLUP):
            out = H.remove(out, key)
        out = H.add(out, SCHEDULER, subject)
        out = H.add(out, NEXT, go_format(nxt).encode() if repeat else NEXT_PURGE)
        if ttl:
            out = H.add(out, H.MSG_TTL, ttl)
        if rollup:
            out = H.add(out, H.ROLLUP, rollup)
        return bytes(target), out, bytes(msg)

    def _store(self, subject: bytes, hdr: bytes | None, msg: bytes) -> None:
        """Called by the stream's ingest task, in order with everything else."""
        self.stream.write_sourced(subject, hdr, msg)


__all__ = ["MsgSchedules", "check", "has_headers", "next_schedule", "parse_schedule"]
