"""A replicated consumer answers an acknowledgement once the consumer's Raft group has
committed it (natsjs/jetstream/replicated.py ReplicaStateStore).  The group may commit
and apply the entry before the consumer's state loop gets round to waiting for it: on a
loaded machine it did, the wait then ran out after 5 s and the client's AckSync heard
503 ("no responders" to nats-py) although its ack was stored (CI at cbe4103)."""
from __future__ import annotations

import trio

from natsjs.jetstream.replicated import (E_STATE, _STATE, ReplicaStateStore,
                                         ReplicatedConsumer)


class _Raft:
    def __init__(self):
        self.term = 3
        self.log: list = []

    def propose(self, data: bytes) -> int:
        self.log.append(data)
        return len(self.log)


class _State:
    asflr = adflr = 0


class _Consumer:
    st = _State()


def _replica() -> ReplicatedConsumer:
    """A ReplicatedConsumer leading, with only what proposing and applying touch."""
    rep = ReplicatedConsumer.__new__(ReplicatedConsumer)
    rep.raft = _Raft()
    rep.consumer = _Consumer()
    rep._waiters = {}
    rep._active = True
    rep._since_snapshot = 0
    rep._snapshotting = False
    return rep


def _entry(rep, index: int, term: int) -> tuple:
    return (index, term, E_STATE + _STATE.pack(1, index, 0, 0, 0))


def test_an_ack_applied_before_the_wait_is_still_confirmed():
    async def main():
        rep = _replica()
        store = ReplicaStateStore(rep)
        store.record(1, 5, 0)
        rep.apply([_entry(rep, 1, 3)])        # committed and applied at once
        with trio.fail_after(1):              # no 5 s wait, no error
            await store.sync()
    trio.run(main)


def test_an_ack_whose_index_another_leader_took_is_not_confirmed():
    """The entry at our index came from a later term: our ack was never committed, and
    the client must not hear that it was."""
    async def main():
        rep = _replica()
        store = ReplicaStateStore(rep)
        store.record(1, 5, 0)
        rep.apply([_entry(rep, 1, 4)])
        try:
            await store.sync()
        except OSError as exc:
            assert "not committed" in str(exc)
        else:
            raise AssertionError("an ack another leader overwrote was confirmed")
    trio.run(main)
