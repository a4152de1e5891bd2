"""An in-process network between RaftServices, for tests and benchmarks.

Beside the simulator (natsjs/testing/raftsim.py), which runs RaftNodes without trio;
this one runs the real driver (natsjs/jetstream/raft_driver.RaftService) on trio.
"""
from __future__ import annotations

import trio

from natsjs.jetstream.raft_driver import hand_to


class LocalNetwork:
    """An in-process transport between RaftServices (tests, benchmarks).

    Later the transport is internal subscriptions in the system account over routes; it
    has the same shape: ``send(peer, data)`` never blocks and may drop (a full inbox is a
    slow consumer), and what arrives is fed to the node.
    """

    def __init__(self, capacity: int = 65536, inline: bool = False):
        """``inline``: a message is stepped in the sending task when the receiving
        service is free (``RaftService.receive``), as the server's transport does."""
        self._capacity = capacity
        self._inline = inline
        self._services: dict = {}
        self._inboxes: dict[str, trio.MemorySendChannel] = {}
        self.blocked: set[tuple[str, str]] = set()   # (from, to) pairs cut off
        self.dropped = 0

    def attach(self, node_id: str):
        """A transport for ``node_id`` and the channel its received messages arrive on."""
        send, recv = trio.open_memory_channel(self._capacity)
        self._inboxes[node_id] = send
        return LocalTransport(self, node_id), recv

    def detach(self, node_id: str) -> None:
        self._services.pop(node_id, None)
        ch = self._inboxes.pop(node_id, None)
        if ch is not None:
            ch.close()

    def _deliver(self, src: str, dst: str, data: bytes) -> None:
        ch = self._inboxes.get(dst)
        if ch is None or (src, dst) in self.blocked:
            self.dropped += 1
            return
        if not hand_to(self._services.get(dst), ch, data):
            self.dropped += 1


class LocalTransport:
    __slots__ = ("_net", "id")

    def __init__(self, net: LocalNetwork, node_id: str):
        self._net = net
        self.id = node_id

    def send(self, peer: str, data: bytes) -> None:
        self._net._deliver(self.id, peer, data)

    def bind(self, service) -> None:
        if self._net._inline:
            self._net._services[self.id] = service


__all__ = ["LocalNetwork", "LocalTransport"]
