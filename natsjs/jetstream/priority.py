"""Priority groups of a pull consumer (ADR-42): which waiting pull request the next
message goes to when the consumer has a ``priority_policy``.

Where it sits in a message's path: the consumer (natsjs/jetstream/consumer.py) has
taken the next message from the store and asks its waiting pull requests, in order,
who may have it (server/consumer.go nextWaiting); before that, a pull request's
``group``, ``min_pending``, ``min_ack_pending``, ``id`` and ``priority`` were checked
as it arrived (processNextMsgRequest).  The policies:

* ``overflow``: a request with ``min_pending`` / ``min_ack_pending`` gets messages only
  while the consumer has at least that many pending (or unacknowledged) messages; it
  waits, passed over, otherwise.
* ``pinned_client``: the first request without an ``id`` pins the group: the server
  makes up an id, sends it on every delivered message (``Nats-Pin-Id``) and from then on
  serves only requests carrying it; others wait, or hear 423 when they carry another
  id.  The pin ends when the pinned client sends no request for ``priority_timeout``
  (or an administrator unpins it: ``$JS.API.CONSUMER.UNPIN``), with an advisory each
  way.
* ``prioritized``: requests are queued by ``priority`` (0 first, 9 last), each
  priority in arrival order.

The pin lives with the consumer's leader only: nats-server keeps it in memory
(``currentPinId``), replicates none of it, and a replica that stops leading forgets it
(setLeader), so a new leader starts unpinned and pins the next requester.
"""
from __future__ import annotations

import re
import secrets
import string

import trio

from natsjs.jetstream import headers as H
from natsjs.jetstream.apicore import T, check_api_level, err
from natsjs.jetstream.errors import ApiError
from natsjs.jetstream.jstime import ZERO_TIME, now_ns, rfc3339_nano
from natsjs.jetstream.schema import DecodeError, Struct, unmarshal

PIN_ID = b"Nats-Pin-Id"                       # server/consumer.go JSPullRequestNatsPinId
# server/consumer.go validGroupName (consumercfg.py checks configurations with it too).
GROUP_NAME = re.compile(r"^[a-zA-Z0-9/_=-]{1,16}$")
MAX_PRIORITY = 9
_NUID_CHARS = string.digits + string.ascii_letters

# What nextWaiting does with the request at the head of the queue.
SERVE = 0        # it may have the message
PASS = 1         # it waits: the next request is asked (the head goes to the back)
REFUSE = 2       # it is answered 423 and leaves the queue


def new_pin_id() -> str:
    """A pin id as nats-server makes it (a NUID: 22 characters of base 62)."""
    return "".join(secrets.choice(_NUID_CHARS) for _ in range(22))


class PriorityRequest:
    """server/consumer.go PriorityGroup: the group part of a JSON pull request."""
    __slots__ = ("group", "min_pending", "min_ack_pending", "id", "priority")

    def __init__(self, d: dict):
        self.group = d.get("group", "")
        self.min_pending = d.get("min_pending", 0)
        self.min_ack_pending = d.get("min_ack_pending", 0)
        self.id = d.get("id", "")
        self.priority = d.get("priority", 0)


def refusal(policy: str, groups, pin, pg: PriorityRequest | None) -> tuple[int, str] | None:
    """server/consumer.go processNextMsgRequest's checks of a request's priority group:
    (status, description) when it is refused.  A request carrying the current pin's id
    keeps the pin (its timer starts again)."""
    if pg is None:
        return None
    if (pg.min_pending or pg.min_ack_pending) and policy != "overflow":
        return 400, "Bad Request - Not a Overflow Priority consumer"
    if pg.id and policy != "pinned_client":
        return 400, "Bad Request - Not a Pinned Client Priority consumer"
    if pg.priority < 0 or pg.priority > MAX_PRIORITY:
        return 400, "Bad Request - Priority must be between 0 and 9"
    if policy == "none":
        return None
    if not pg.group:
        return 400, "Bad Request - Priority Group missing"
    if pg.group not in (groups or ()):
        return 400, "Bad Request - Invalid Priority Group"
    if pin.id:
        if pg.id == pin.id:
            pin.touch()
        elif pg.id:
            return 423, "Nats-Pin-Id mismatch"
    return None


def insert_prioritized(waiting, wr) -> None:
    """server/consumer.go insertAtPosition: behind every request of the same or a
    lower ``priority`` number (a request with no priority group goes last)."""
    p = _priority(wr)
    for i, other in enumerate(waiting):
        if _priority(other) > p:
            waiting.insert(i, wr)
            return
    waiting.append(wr)


def requeue_prioritized(waiting, wr) -> None:
    """server/consumer.go popAndRequeue: the head served one message and wants more; it
    goes behind the others of its priority, so that they take turns."""
    if len(waiting) > 1 and waiting[0] is wr:
        waiting.popleft()
        insert_prioritized(waiting, wr)


def _priority(wr) -> int:
    return wr.pg.priority if wr.pg is not None else 1 << 31


class Pin:
    """The pinned client of a ``pinned_client`` consumer (server/consumer.go
    currentPinId, pinnedTS, pinnedTtl)."""
    __slots__ = ("consumer", "id", "ts", "group", "deadline")

    def __init__(self, consumer):
        self.consumer = consumer
        self.id = ""
        self.ts = 0            # when it was pinned (ns), 0: not pinned
        self.group = ""
        self.deadline = 0.0    # trio time the pin expires without a request

    def assign(self, wr) -> None:
        """server/consumer.go assignNewPinId: ``wr`` (without an id) takes a new pin."""
        if wr.pg is None or not wr.pg.group:
            return
        self.id = new_pin_id()
        self.ts = now_ns()
        self.group = wr.pg.group
        wr.pg.id = self.id
        self.touch()
        c = self.consumer
        _advisory(c, "PINNED", "consumer_group_pinned",
                  {"group": self.group, "pinned_id": self.id})

    def touch(self) -> None:
        """server/consumer.go setPinnedTimer: ``priority_timeout`` from now."""
        self.deadline = trio.current_time() + self.consumer.cfg["priority_timeout"] / 1e9

    def clear(self) -> None:
        """server/consumer.go unassignPinId (no advisory: callers send it)."""
        self.id = ""
        self.ts = 0
        self.deadline = 0.0

    def unpin(self, group: str, reason: str) -> None:
        """The pin ends, for ``reason`` (``timeout`` or ``admin``), with the unpinned
        advisory; the next request without an id is pinned."""
        self.clear()
        _advisory(self.consumer, "UNPINNED", "consumer_group_unpinned",
                  {"group": group, "reason": reason})

    def expire(self, now: float) -> float | None:
        """The pin timer (seconds left, None: no pin); an expired pin ends here."""
        if not self.id:
            return None
        left = self.deadline - now
        if left > 0:
            return left
        self.unpin(self.group, "timeout")
        return None

    def check(self, wr) -> int:
        """server/consumer.go nextWaiting's pin checks for the request at the head:
        SERVE, PASS or REFUSE (423).  A request without an id takes a free pin."""
        pg = wr.pg
        if not self.id:
            if pg is None or not pg.id:
                self.assign(wr)
                return SERVE
            return REFUSE         # the id of a pin that ended
        if pg is not None and pg.id == self.id:
            return SERVE
        if pg is None or not pg.id:
            return PASS
        return REFUSE

    def state(self, group: str) -> dict:
        """server/consumer.go PriorityGroupState for consumer info."""
        out = {"group": group}
        if self.id:
            out["pinned_client_id"] = self.id
        out["pinned_ts"] = rfc3339_nano(self.ts) if self.ts else ZERO_TIME
        return out


def overflow_waits(pg, pending: int, ack_pending: int) -> bool:
    """server/consumer.go nextWaiting for ``overflow``: a request with minimums waits
    unless one of them is reached (``pending`` counts the message being handed out)."""
    if pg is None or not (pg.min_pending > 0 or pg.min_ack_pending > 0):
        return False
    return not ((pg.min_pending > 0 and pg.min_pending <= pending) or
                (pg.min_ack_pending > 0 and pg.min_ack_pending <= ack_pending))


def wrong_pin(wr) -> bytes:
    """The 423 a request with a pin id that is not (or no longer) the pin hears."""
    return H.make(423, "Nats-Wrong-Pin-Id", [(H.PENDING_MESSAGES, b"%d" % wr.n),
                                             (H.PENDING_BYTES, b"%d" % wr.b)])


def pause_advisory(c, cfg: dict, until: int) -> None:
    """server/consumer.go sendPauseAdvisoryLocked: the consumer paused or resumed."""
    body = {"stream": c.stream.name, "consumer": c.name, "paused": bool(until and now_ns() < until),
            "pause_until": cfg.get("pause_until") or ZERO_TIME}
    c.js.advisory("$JS.EVENT.ADVISORY.CONSUMER.PAUSE.%s.%s" % (c.stream.name, c.name),
                  "io.nats.jetstream.advisory.v1.consumer_pause", body, c.stream.jsa.account)


def announce_paused(c) -> None:
    """A paused consumer says so when its create is answered
    (server/jetstream_api.go jsConsumerCreateRequest, jetstream_cluster.go
    processConsumerLeaderChange), and an R1 consumer of a cluster again on each update
    of its assignment, which nats-server answers as a create."""
    if c.paused_until and now_ns() < c.paused_until:
        pause_advisory(c, c.cfg, c.paused_until)


def _advisory(c, kind: str, type_: str, body: dict) -> None:
    """server/jetstream_events.go JSConsumerGroupPinnedAdvisory / ...Unpinned."""
    ev = {"account": c.stream.jsa.name, "stream": c.stream.name, "consumer": c.name, **body}
    c.js.advisory("$JS.EVENT.ADVISORY.CONSUMER.%s.%s.%s" % (kind, c.stream.name, c.name),
                  "io.nats.jetstream.advisory.v1." + type_, ev, c.stream.jsa.account)


# ---- $JS.API.CONSUMER.UNPIN.<stream>.<consumer> (server/jetstream_api.go) ----------------

UNPIN_REQUEST = Struct("JSApiConsumerUnpinRequest", {"group": "string"})


def read_unpin_request(hdr: bytes | None, body: bytes) -> dict:
    """jsConsumerUnpinRequest's checks of the request alone, in its order: the API
    level, the JSON (read as json.Unmarshal reads it: an empty body is not JSON), a
    group, a valid group name."""
    check_api_level(hdr)
    try:
        req = unmarshal(body, UNPIN_REQUEST)
    except DecodeError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from None
    group = req.get("group", "")
    if not group:
        raise ApiError.of("JSInvalidJSONErr", err="consumer group not specified")
    if not GROUP_NAME.match(group):
        raise ApiError.of("JSConsumerInvalidGroupNameErr")
    return req


def unpin(c, req: dict) -> dict:
    """The consumer's leader (or single server) unpins ``req``'s group: the pinned
    client, if any, is let go with an ``admin`` unpinned advisory (sent even when
    nothing was pinned, as nats-server sends it), and the next request without an id
    takes a new pin."""
    rtype = "consumer_unpin_response"
    group = req["group"]
    if group not in (c.cfg["priority_groups"] or ()):
        return err(rtype, ApiError.of("JSConsumerInvalidPriorityGroupErr"))
    c.pin.unpin(group, "admin")
    c.signal()          # the waiting requests are asked again (signalNewMessages)
    return {"type": T + rtype}
