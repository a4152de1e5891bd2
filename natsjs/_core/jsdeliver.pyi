"""Type stub for natsjs._core.jsdeliver (see jsdeliver.pyx)."""
from typing import Optional

from natsjs._core.fanout import ClientCore


def deliver_run(log: object, pub: ClientCore, route_subject: bytes, ack_prefix: bytes,
                start: int, limit: int, filter: Optional[bytes], dseq: int, pending: int,
                max_msgs: int, max_bytes: int,
                out: list[tuple[int, int, int]]) -> tuple[int, int, int, bool]: ...
