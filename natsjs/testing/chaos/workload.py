"""The clients of a chaos run and what they saw: the history.

Two workloads run side by side, each client on its own connection (nats-py):

* **publishers** ``p0..pK`` send unique values (``p3-17``: publisher 3, its 17th attempt)
  to the replicated stream ``CHAOS`` at a steady pace, each with ``Nats-Msg-Id`` set to
  the value.  Attempts are not serialised behind each other: a new one starts every
  ``1/rate`` seconds, up to a bound of attempts in flight, so an outage shows as a run of
  unacknowledged attempts rather than as fewer attempts.  Each attempt ends **ok** (a
  PubAck with its stream sequence), **failed** (an error that proves nothing was stored:
  no responders, a JetStream error reply, a connection that refused the publish) or
  **unknown** (no answer within ``ack_timeout``: it may or may not be stored);
* a **queue**: one producer feeds the work-queue stream ``CHAOSQ`` the same way (values
  ``q-17``), and one worker pulls from its durable consumer with explicit acks, recording
  each delivery and each acknowledgement it had confirmed (``ack_sync``).  After the
  faults the worker drains whatever is left.

Every operation becomes one ``Op`` of the history; the checker (``checker.py``) reads
nothing else from the clients.  Timestamps are nanoseconds since the run's start
(monotonic) plus the wall clock at the start, for the trace files.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import nats
import nats.errors
import nats.js.errors

STREAM = "CHAOS"
QSTREAM = "CHAOSQ"
QCONSUMER = "worker"

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


@dataclass
class Op:
    """One client operation: ``kind`` is publish, enqueue, deliver or ack."""

    process: str
    kind: str
    value: str
    start_ns: int
    end_ns: int = -1
    outcome: str = UNKNOWN
    seq: int = -1               # the stream sequence a PubAck or a delivery named
    node: int = -1              # the node the client was connected to when it started
    error: str = ""
    redelivered: int = 0        # deliveries: the delivery count minus one


@dataclass
class History:
    start_mono_ns: int = field(default_factory=time.monotonic_ns)
    start_unix_ns: int = field(default_factory=time.time_ns)
    ops: list[Op] = field(default_factory=list)

    def now(self) -> int:
        return time.monotonic_ns() - self.start_mono_ns


def classify(exc: BaseException) -> tuple[str, str]:
    """An exception of a publish: failed (nothing can have been stored) or unknown."""
    name = type(exc).__name__
    if isinstance(exc, (nats.errors.TimeoutError, asyncio.TimeoutError)):
        return UNKNOWN, "timeout"
    if isinstance(exc, nats.errors.NoRespondersError):
        return FAILED, "no responders"
    if isinstance(exc, nats.js.errors.APIError):
        # A JetStream error reply comes from the stream leader after it decided not to
        # store the message (or from a server that knows no leader).
        return FAILED, "%s: %s" % (name, getattr(exc, "description", "") or exc)
    if isinstance(exc, (nats.errors.ConnectionClosedError, nats.errors.OutboundBufferLimitError,
                        nats.errors.ConnectionReconnectingError)):
        return FAILED, name
    # Anything else: we cannot prove the request never left.
    return UNKNOWN, "%s: %s" % (name, exc)


async def connect(urls: list[str], first: int, name: str):
    """A connection that prefers node ``first`` and reconnects to any node, forever."""
    order = urls[first:] + urls[:first]
    return await nats.connect(servers=order, name=name, dont_randomize=True,
                              reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                              connect_timeout=2, allow_reconnect=True,
                              ping_interval=2, max_outstanding_pings=2,
                              error_cb=_quiet, disconnected_cb=_quiet_cb,
                              reconnected_cb=_quiet_cb, closed_cb=_quiet_cb)


async def _quiet(e):  # nats-py prints errors by default; the history records them
    return None


async def _quiet_cb():
    return None


@dataclass
class WorkloadConfig:
    clients: int = 5
    rate: float = 100.0            # attempts per second per publisher
    ack_timeout: float = 2.0
    queue: bool = True
    queue_rate: float = 50.0
    replicas: int = 3


class Workload:
    def __init__(self, urls: list[str], cfg: WorkloadConfig, history: History,
                 sabotage: str = ""):
        self.urls = urls
        self.cfg = cfg
        self.h = history
        self.sabotage = sabotage
        self.stop = asyncio.Event()
        self.conns: list = []

    # ---- setup --------------------------------------------------------------------------

    async def create_streams(self, timeout: float = 60.0) -> None:
        """Create both streams; retried until a meta leader answers (bounded)."""
        nc = await connect(self.urls, 0, "chaos-setup")
        try:
            js = nc.jetstream(timeout=5)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    await js.add_stream(name=STREAM, subjects=["chaos.>"],
                                        num_replicas=self.cfg.replicas, allow_direct=True,
                                        duplicate_window=120.0)
                    if self.cfg.queue:
                        await js.add_stream(name=QSTREAM, subjects=["chaosq.>"],
                                            num_replicas=self.cfg.replicas,
                                            retention="workqueue", duplicate_window=120.0)
                        await js.add_consumer(QSTREAM, durable_name=QCONSUMER,
                                              ack_policy="explicit", ack_wait=5.0,
                                              max_ack_pending=1000)
                    # A publish that comes back proves the stream has a leader.
                    for _ in range(100):
                        try:
                            await js.publish("chaos.warmup", b"warmup", timeout=2)
                            break
                        except Exception:  # noqa: BLE001 - no leader yet
                            await asyncio.sleep(0.1)
                    return
                except Exception:  # noqa: BLE001 - no meta leader yet, or placement failed
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await nc.close()

    # ---- publishers ---------------------------------------------------------------------

    async def _attempt(self, js, process: str, value: str, subject: str, kind: str,
                       node: int) -> None:
        op = Op(process, kind, value, self.h.now(), node=node)
        self.h.ops.append(op)
        if self.sabotage == "phantom-ack" and kind == "publish" and value.endswith("-7"):
            # Sabotage: acknowledge an attempt that is never sent (an ack before the
            # write).  The checker must report it as lost.
            op.outcome, op.seq, op.end_ns = OK, 0, self.h.now()
            return
        try:
            ack = await js.publish(subject, value.encode(), timeout=self.cfg.ack_timeout,
                                   headers={"Nats-Msg-Id": value})
            op.outcome, op.seq = OK, ack.seq
            if ack.duplicate:
                op.error = "duplicate"
        except Exception as e:  # noqa: BLE001 - every failure is recorded, none stops the run
            op.outcome, op.error = classify(e)
        op.end_ns = self.h.now()

    async def _producer(self, k: int, process: str, subject: str, kind: str, rate: float) -> None:
        node = k % len(self.urls)
        nc = await connect(self.urls, node, "chaos-%s" % process)
        self.conns.append(nc)
        js = nc.jetstream(timeout=self.cfg.ack_timeout)
        limit = asyncio.Semaphore(max(4, int(rate * self.cfg.ack_timeout * 2)))
        tasks: set[asyncio.Task] = set()
        interval = 1.0 / rate
        n = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            await limit.acquire()
            value = "%s-%d" % (process, n)
            n += 1

            async def one(value=value):
                try:
                    await self._attempt(js, process, value, subject, kind, node)
                finally:
                    limit.release()
            t = asyncio.create_task(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            else:
                next_at = time.monotonic()   # behind (a pause of this process): no burst
        if tasks:
            await asyncio.wait(tasks)

    # ---- the queue worker ---------------------------------------------------------------

    async def _worker(self, until: asyncio.Event, drain_quiet: float,
                      drain_timeout: float) -> None:
        nc = await connect(self.urls, (self.cfg.clients + 1) % len(self.urls), "chaos-worker")
        self.conns.append(nc)
        js = nc.jetstream(timeout=5)
        sub = None
        quiet_since = None
        drain_deadline = None
        while True:
            if until.is_set():
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + drain_timeout
                if quiet_since is not None and time.monotonic() - quiet_since > drain_quiet:
                    break
                if time.monotonic() > drain_deadline:
                    break
                if self._queue_done():
                    break
            try:
                if sub is None:
                    sub = await js.pull_subscribe_bind(QCONSUMER, QSTREAM)
                msgs = await sub.fetch(20, timeout=1.0)
            except nats.errors.TimeoutError:
                if quiet_since is None:
                    quiet_since = time.monotonic()
                continue
            except Exception:  # noqa: BLE001 - no leader, reconnecting: try again
                sub = None
                await asyncio.sleep(0.2)
                continue
            quiet_since = None
            for m in msgs:
                md = m.metadata
                value = m.data.decode(errors="replace")
                t = self.h.now()
                self.h.ops.append(Op("worker", "deliver", value, t, t, OK,
                                     seq=md.sequence.stream, node=-1,
                                     redelivered=md.num_delivered - 1))
                op = Op("worker", "ack", value, self.h.now(), seq=md.sequence.stream)
                self.h.ops.append(op)
                try:
                    await m.ack_sync(timeout=self.cfg.ack_timeout)
                    op.outcome = OK
                except Exception as e:  # noqa: BLE001
                    op.outcome, op.error = UNKNOWN, "%s" % type(e).__name__
                op.end_ns = self.h.now()

    def _queue_done(self) -> bool:
        """Every acknowledged enqueue has been delivered."""
        enq = {o.value for o in self.h.ops if o.kind == "enqueue" and o.outcome == OK}
        done = {o.value for o in self.h.ops if o.kind == "deliver"}
        return enq <= done

    # ---- the whole thing ----------------------------------------------------------------

    async def run(self, duration_stop: asyncio.Event, drain_done: asyncio.Event,
                  drain_quiet: float = 10.0, drain_timeout: float = 30.0) -> None:
        """Publish until ``duration_stop`` is set; the worker then drains until quiet for
        ``drain_quiet`` seconds (at most ``drain_timeout``) after ``drain_done`` is set
        (the faults healed)."""
        producers = [asyncio.create_task(self._producer(k, "p%d" % k, "chaos.p%d" % k, "publish",
                                                        self.cfg.rate))
                     for k in range(self.cfg.clients)]
        if self.cfg.queue:
            producers.append(asyncio.create_task(
                self._producer(self.cfg.clients, "q", "chaosq.jobs", "enqueue",
                               self.cfg.queue_rate)))
            worker = asyncio.create_task(self._worker(drain_done, drain_quiet, drain_timeout))
        await duration_stop.wait()
        self.stop.set()
        await asyncio.gather(*producers)
        if self.cfg.queue:
            await worker
        for nc in self.conns:
            try:
                await asyncio.wait_for(nc.close(), 5)
            except Exception:  # noqa: BLE001
                pass
