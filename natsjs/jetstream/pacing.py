"""Pacing a consumer's deliveries: ``replay_policy: original`` and ``rate_limit_bps``.

Where it sits: inside a consumer's delivery task (natsjs/jetstream/consumer.py), between
taking the next message from the store and sending it.  ``Pacer.wait`` says how long
that message has to wait; the consumer holds it and sleeps that long (new messages
arriving do not cut the wait short), then delivers it.

The rules are server/consumer.go loopAndGatherMsgs':

* original replay: while the consumer has not caught up with the stream as it was when
  the consumer started, each message waits for the time that separated it from the
  previous one when they were stored (gaps of a millisecond or less are not waited
  for); once caught up, messages go out as they come.
* rate limit: a token bucket in bytes, filled at ``rate_limit_bps / 8`` per second and
  holding at most the stream's maximum message size (or the server's max payload);
  a message takes its size from the bucket and waits until the debt is paid.  (The
  reference's limiter never delivers a message larger than the bucket; here it waits
  for it like for any other.)
"""
from __future__ import annotations

import trio


class Pacer:
    __slots__ = ("replay", "replay_until", "lts", "rate", "burst", "tokens", "tlast", "memo")

    def __init__(self, replay_original: bool, replay_until: int, rate_bps: int, burst: int):
        self.replay = replay_original
        self.replay_until = replay_until   # the stream's last sequence when we started
        self.lts = 0                       # stored time of the last message let through
        self.rate = rate_bps / 8.0         # bytes per second; 0: no limit
        self.burst = max(burst, 1)
        self.tokens = float(self.burst)
        self.tlast = None
        self.memo = None                   # (seq, ready time) of the message held

    @classmethod
    def for_consumer(cls, consumer):
        """A pacer if the consumer's configuration asks for one, else None."""
        cfg = consumer.cfg
        replay = cfg["replay_policy"] == "original"
        bps = cfg["rate_limit_bps"] if consumer.push else 0
        if not replay and not bps:
            return None
        stream = consumer.stream
        burst = stream.cfg["max_msg_size"]
        if burst <= 0:
            burst = stream.server.opts.max_payload
        return cls(replay, stream.store.last_seq, bps, burst)

    def caught_up(self, next_seq: int) -> None:
        """Nothing more to deliver right now: original timing ends once past the stream's
        end at the start."""
        if self.replay and next_seq > self.replay_until:
            self.replay = False

    def wait(self, seq: int, ts: int, size: int) -> float:
        """Seconds the message must wait; it is let through (accounted) once this
        answers 0 -- asking again for a held message does not charge it twice."""
        now = trio.current_time()
        memo = self.memo
        if memo is not None and memo[0] == seq:
            left = memo[1] - now
            if left > 0:
                return left
            self.memo = None
            return 0.0
        delay = 0.0
        if self.replay and self.lts:
            gap = (ts - self.lts) / 1e9
            if gap > 0.001:
                delay = gap
        self.lts = ts
        if self.rate > 0:
            at = now + delay
            if self.tlast is not None and at > self.tlast:
                self.tokens = min(self.burst, self.tokens + (at - self.tlast) * self.rate)
            if self.tlast is None or at > self.tlast:
                self.tlast = at
            self.tokens -= size
            if self.tokens < 0:
                delay += -self.tokens / self.rate
        if delay <= 0:
            return 0.0
        self.memo = (seq, now + delay)
        return delay


__all__ = ["Pacer"]
