"""Type stub for natsjs._core.fanout (see fanout.pyx)."""
from typing import Any, Callable, Optional

from natsjs._core.parser import ProtoParser
from natsjs._core.sublist import Sublist, Subscription


UNDELIVERED: object


class UnsafeSubject(ValueError): ...


class WithProducer:
    fn: Callable[..., Any]
    def __init__(self, fn: Callable[..., Any]) -> None: ...
    def __call__(self, sub: Subscription, subject: bytes, reply: Optional[bytes], hdr: int,
                 msg: bytes) -> Any: ...


class Conn(ProtoParser):
    out: bytearray
    max_pending: int
    pending: bool
    headers: bool
    conn: Any
    in_msgs: int
    in_bytes: int
    out_msgs: int
    out_bytes: int
    pcd: list["Conn"]
    stalled: Optional["Conn"]
    is_route: bool
    echo: bool
    on_trace_out: Optional[Callable[[bytes, bytes], Any]]
    deliver_filter: Optional[Callable[[bytes], bool]]
    def send_msg(self, sub: Subscription, subject: bytes, reply: Optional[bytes], hdr: int,
                 msg: bytes) -> None: ...
    def take_pcd(self) -> list["Conn"]: ...
    def enqueue(self, data: bytes) -> None: ...


class ClientCore(Conn):
    sublist: Sublist
    account_name: bytes
    verbose: bool
    pedantic: bool
    no_responders: bool
    pub_check: Optional[Callable[[bytes], bool]]
    on_reply: Optional[Callable[[bytes], Any]]
    subs: dict[bytes, Subscription]
    fast_subs: bool
    on_interest: Optional[Callable[[list[Subscription], int], Any]]
    max_subs: int
    def __init__(self, on_op: Callable[[int, Any], Any], conn: Any = ...,
                 sublist: Optional[Sublist] = ..., max_control_line: int = ...,
                 max_payload: int = ..., max_pending: int = ...) -> None: ...
    def publish(self, subject: bytes, reply: Optional[bytes], hdr: int, msg: bytes) -> None: ...
    def publish_deliver(self, subject: bytes, shown: bytes, reply: Optional[bytes], hdr: int,
                        msg: bytes) -> None: ...
    def add_sub(self, subject: bytes, queue: Optional[bytes], sid: bytes) -> Subscription: ...
    def unsubscribe(self, sub: Subscription) -> bool: ...
    def drop_all(self, sublist: Sublist, keep: bool = ...) -> list[Subscription]: ...
    def flush_interest(self) -> None: ...


class PeerSubs:
    count: int
    limit: int
    def __init__(self, limit: int = ...) -> None: ...


class RouteCore(Conn):
    sublists: dict[bytes, Sublist]
    pinned_account: Optional[bytes]
    peer: Any
    remote_subs: dict[bytes, Subscription]
    interest_ok: bool
    peer_subs: Optional[PeerSubs]
    def __init__(self, on_op: Callable[[int, Any], Any], conn: Any = ...,
                 sublists: Optional[dict[bytes, Sublist]] = ..., max_control_line: int = ...,
                 max_payload: int = ..., max_pending: int = ...) -> None: ...
    def send_rmsg(self, account: bytes, subject: bytes, reply: Optional[bytes],
                  queues: bytes, hdr: int, msg: bytes) -> None: ...
    def add_remote(self, sl: Sublist, key: bytes, subject: bytes, queue: Optional[bytes],
                   weight: int) -> Subscription: ...
    def drop_remote(self, key: bytes) -> bool: ...
