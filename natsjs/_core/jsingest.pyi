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
    def __init__(self, log: Any, fallback: Callable[..., Any], wake: Callable[[], Any],
                 file: bool) -> None: ...
