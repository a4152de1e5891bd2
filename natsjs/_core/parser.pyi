"""Type stub for natsjs._core.parser (see parser.pyx)."""
from typing import Any, Callable, Optional

KIND_CLIENT: int
KIND_ROUTER: int
CONNECT: int
INFO: int
SUB: int
UNSUB: int
PING: int
PONG: int
OK: int
ERR: int
RS_PLUS: int
RS_MINUS: int
LS_PLUS: int
LS_MINUS: int
MSG: int
ERR_UNKNOWN_OP: str
ERR_MAX_PAYLOAD: str
ERR_MAX_CONTROL_LINE: str
ERR_AUTH_VIOLATION: str


class ProtocolError(Exception):
    client_error: Optional[str]
    def __init__(self, message: str, client_error: Optional[str] = ...) -> None: ...


class ProtoParser:
    kind: int
    max_control_line: int
    max_payload: int
    on_trace: Optional[Callable[[bytes], Any]]
    on_trace_payload: Optional[Callable[[bytes], Any]]
    connect_required: bool
    closed: bool
    no_account: bool
    pause: bool
    def __init__(self, on_op: Callable[[int, Any], Any], kind: int = ...,
                 max_control_line: int = ..., max_payload: int = ...) -> None: ...
    def feed(self, data: bytes | bytearray | memoryview, length: int = ...) -> int: ...
    def release(self) -> None: ...
    @property
    def pending_bytes(self) -> int: ...
