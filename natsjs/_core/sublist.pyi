"""Type stub for natsjs._core.sublist (see sublist.pyx)."""
from typing import Any, Callable, Optional


class Subscription:
    subject: bytes
    queue: Optional[bytes]
    sid: bytes
    client: Any
    callback: Optional[Callable[..., Any]]
    owner: Any
    max_msgs: int
    nmsgs: int
    qweight: int
    closed: bool
    def __init__(self, subject: bytes, queue: Optional[bytes] = ..., sid: bytes = ...,
                 client: Any = ..., callback: Optional[Callable[..., Any]] = ...,
                 max_msgs: int = ..., qweight: int = ..., owner: Any = ...) -> None: ...


class SublistResult:
    psubs: list[Subscription]
    qsubs: list[list[Subscription]]
    def __len__(self) -> int: ...


class Sublist:
    genid: int
    count: int
    cache_max: int
    matches: int
    cache_hits: int
    inserts: int
    removes: int
    def __init__(self, cache_max: int = ...) -> None: ...
    def insert(self, sub: Subscription) -> None: ...
    def remove(self, sub: Subscription) -> bool: ...
    def match(self, subject: bytes) -> SublistResult: ...
    def subscriptions(self) -> list[Subscription]: ...
    def cache_size(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def clear(self) -> None: ...


def valid_subject(subject: bytes) -> bool: ...
def valid_literal_subject(subject: bytes) -> bool: ...
def subject_is_literal(subject: bytes) -> bool: ...
def subject_matches(pattern: bytes, subject: bytes) -> bool: ...
