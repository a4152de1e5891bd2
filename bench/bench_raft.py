"""Micro-benchmarks of Raft (natsjs/_core/raftlog.pyx, natsjs/jetstream/raft*.py), run by
``make micro`` (never by the test suite: pytest collects only tests/).

Run:  .venv/bin/python -m pytest bench/bench_raft.py -o 'python_files=bench_*.py' -q

Cases: encoding 128-byte entries; encoding and decoding one append-entries batch of 256
of them (what a follower parses per message under load); the leader's per-proposal path
(propose + ready, no I/O); and three RaftServices on FileLogs over the in-process
transport, one 128-byte proposal per entry, fsync group commit, counted until every node
applied them (entries/s in ``extra_info``).
"""
import random
import tempfile

import pytest
import trio

from natsjs._core import raftlog as rl
from natsjs._core.filelog import FileLog
from natsjs.jetstream.raft import RaftNode
from natsjs.jetstream.raft_driver import RaftService, StateMachine
from natsjs.jetstream.raft_storage import DirFiles, RaftStorage
from natsjs.testing.raftnet import LocalNetwork

PAYLOAD = bytes(random.Random(1).randbytes(128))
N = 10_000


def _per_second(benchmark, n: int, key: str = "entries/s"):
    benchmark.extra_info[key] = round(n / benchmark.stats.stats.mean)


def test_encode_entry_128b(benchmark):
    benchmark.group = "raftlog"

    def run():
        enc = rl.encode_entry
        for i in range(N):
            enc(0, 3, i + 1, PAYLOAD)

    benchmark(run)
    _per_second(benchmark, N)


def test_append_batch_encode_decode(benchmark):
    benchmark.group = "raftlog"
    entries = [rl.encode_entry(0, 3, i + 1, PAYLOAD) for i in range(256)]

    def run():
        rl.decode_message(rl.encode_append(3, b"leader", 0, 0, 0, entries))

    benchmark(run)
    _per_second(benchmark, 256)


class _EmptyView:
    last_index = 0

    def entry(self, index):
        return None


def test_leader_propose_and_ready(benchmark):
    """One single-voter leader: propose, then collect the effects (no I/O)."""
    benchmark.group = "raft node"

    def setup():
        node = RaftNode("a", ("a",), view=_EmptyView())
        node.tick(10.0)
        node.ready()
        return (node,), {}

    def run(node):
        propose, ready, persisted = node.propose, node.ready, node.persisted
        for i in range(N // 100):
            for _ in range(100):
                last = propose(PAYLOAD)
            ready()
            persisted(last)
            ready()

    benchmark.pedantic(run, setup=setup, rounds=10)
    _per_second(benchmark, N)


class _Count(StateMachine):
    def __init__(self):
        self.n = 0

    def apply(self, entries):
        self.n += len(entries)


def test_three_services_on_filelog(benchmark):
    benchmark.group = "raft service"

    async def main():
        with tempfile.TemporaryDirectory() as root:
            net = LocalNetwork()
            svcs = []
            async with trio.open_nursery() as nursery:
                for p in ("a", "b", "c"):
                    log = FileLog("%s/%s/log" % (root, p))
                    transport, inbox = net.attach(p)
                    svc = RaftService(p, RaftStorage(log, DirFiles("%s/%s" % (root, p))),
                                      transport, _Count(), peers=("a", "b", "c"), seed=p)
                    await nursery.start(svc.run, inbox)
                    svcs.append(svc)
                while not any(s.is_leader() for s in svcs):
                    await trio.sleep(0.01)
                lead = [s for s in svcs if s.is_leader()][0]
                start = trio.current_time()
                last = 0
                for i in range(N):
                    last = lead.propose(PAYLOAD)
                    if i % 200 == 199:
                        await lead.wait_applied(last - 2000)
                for s in svcs:
                    await s.wait_applied(last)
                elapsed = trio.current_time() - start
                nursery.cancel_scope.cancel()
            for s in svcs:
                s.storage.close()
            return elapsed

    times = []
    benchmark.pedantic(lambda: times.append(trio.run(main)), rounds=3)
    benchmark.extra_info["entries/s"] = round(N / (sum(times) / len(times)))


def test_failover_under_load(benchmark):
    """Kill the leader of three RaftServices while it takes proposals; time until the
    first proposal on the new leader is applied there (issue 10: within 1.5 s)."""
    benchmark.group = "raft service"

    async def main():
        with tempfile.TemporaryDirectory() as root:
            net = LocalNetwork()
            svcs, scopes = {}, {}
            async with trio.open_nursery() as nursery:
                for p in ("a", "b", "c"):
                    log = FileLog("%s/%s/log" % (root, p))
                    transport, inbox = net.attach(p)
                    svc = RaftService(p, RaftStorage(log, DirFiles("%s/%s" % (root, p))),
                                      transport, _Count(), peers=("a", "b", "c"), seed=p)
                    scopes[p] = trio.CancelScope()

                    async def run(svc=svc, inbox=inbox, scope=scopes[p], task_status=None):
                        with scope:
                            await svc.run(inbox, task_status=task_status)

                    await nursery.start(run)
                    svcs[p] = svc
                while not any(s.is_leader() for s in svcs.values()):
                    await trio.sleep(0.01)
                lead = [s for s in svcs.values() if s.is_leader()][0]
                last = 0
                for i in range(5000):                  # load, then kill mid-stream
                    last = lead.propose(PAYLOAD)
                    if i % 200 == 199:
                        await lead.wait_applied(last - 2000)
                net.detach(lead.id)
                scopes[lead.id].cancel()
                killed = trio.current_time()
                while True:
                    new = [s for s in svcs.values() if s is not lead and s.is_leader()]
                    if new:
                        try:
                            await new[0].wait_applied(new[0].propose(PAYLOAD))
                            break
                        except Exception:
                            pass
                    await trio.sleep(0.002)
                took = trio.current_time() - killed
                nursery.cancel_scope.cancel()
            for s in svcs.values():
                s.storage.close()
            return took

    times = []
    benchmark.pedantic(lambda: times.append(trio.run(main)), rounds=5)
    benchmark.extra_info["failover_s_max"] = round(max(times), 3)
    benchmark.extra_info["failover_s_mean"] = round(sum(times) / len(times), 3)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-o", "python_files=bench_*.py", "-q"])
