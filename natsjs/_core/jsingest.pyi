"""Type stub for natsjs._core.jsingest (see jsingest.pyx)."""
from typing import Any, Callable


class StreamSink:
    plain: bool
    no_ack: bool
    file: bool
    budget: int
    replies: list[tuple[bytes, int]]
    inbox: list[Any]
    fallback: Callable[..., Any]
    wake: Callable[[], Any]
    dirty: bool
    captured: int
    batching: bool
    max_batch: int
    breplies: list[bytes | None]
    @property
    def batch_bytes(self) -> int: ...
    def take(self, max_bytes: int) -> tuple[bytes | None, list[bytes | None]]: ...
    def clear_batch(self) -> None: ...
    def __init__(self, log: Any, fallback: Callable[..., Any], wake: Callable[[], Any],
                 file: bool) -> None: ...


def apply_plain(log: Any, data: bytes, off: int) -> tuple[int, int, int]: ...
def decode_record(data: bytes, off: int) -> tuple[int, int, bytes, bytes | None, bytes]: ...
def count_records(data: bytes, off: int) -> int: ...
