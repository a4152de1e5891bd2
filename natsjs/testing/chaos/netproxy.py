"""Network partitions between servers on one machine: a relay per ordered pair of nodes.

Every server reaches every other one through a relay of this process: node i's route to
node j is ``nats-route://<j's address>:<port of relay i->j>``, and each server advertises a
route address where nothing listens, so gossip never hands a peer a way around the relays
(an implicit route to it fails, the explicit ones keep retrying).  Since the relay of a
connection knows both ends, cutting the link between i and j needs no privileges, no
iptables and no namespaces, and behaves for the servers like packets being dropped:

* a cut link stops reading both sockets of every connection across it, so bytes stay in
  the kernel buffers and the senders' windows fill, as with a filter that drops packets;
  a new connection across a cut link is accepted and then left silent (the dialler times
  out waiting for INFO, as it would waiting for a SYN-ACK);
* healing resumes the relays, so connections that neither end gave up on carry on, as
  TCP retransmission would make them.

Client connections (the workload) go straight to the servers and are never cut: the
faults are between servers, as in Jepsen's partitions.

Run as ``python -m natsjs.testing.chaos.netproxy SPEC`` where SPEC is a JSON list of
``[src, dst, listen_host, target_host, target_port]``; it binds every relay on a free port,
prints ``{"ports": {"src-dst": port, ...}}`` and then reads commands on stdin, one a line,
answering each with ``ok`` (or ``error ...``): ``cut I J`` (both directions),
``heal I J``, ``heal`` (everything), ``quit``.  ``ChaosNet`` is the runner's handle on it.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterable

CHUNK = 65536


class Link:
    """The state of one unordered pair of nodes: open or cut."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()


class Relays:
    def __init__(self) -> None:
        self.links: dict[frozenset, Link] = {}
        self.servers: list[asyncio.base_events.Server] = []
        # asyncio keeps only weak references to tasks: a relay nobody else holds could be
        # collected mid-connection and silently stop forwarding.
        self.tasks: set[asyncio.Task] = set()

    def link(self, a: int, b: int) -> Link:
        key = frozenset((a, b))
        if key not in self.links:
            self.links[key] = Link()
        return self.links[key]

    async def start(self, spec: list) -> dict[str, int]:
        ports = {}
        for src, dst, listen_host, target_host, target_port in spec:
            link = self.link(src, dst)

            async def handler(reader, writer, link=link, target=(target_host, target_port)):
                task = asyncio.current_task()
                self.tasks.add(task)
                try:
                    await self._relay(reader, writer, link, target)
                finally:
                    self.tasks.discard(task)

            srv = await asyncio.start_server(handler, listen_host, 0)
            self.servers.append(srv)
            ports["%d-%d" % (src, dst)] = srv.sockets[0].getsockname()[1]
        return ports

    async def _relay(self, creader, cwriter, link: Link, target) -> None:
        try:
            await link.open.wait()
            try:
                ureader, uwriter = await asyncio.open_connection(*target)
            except OSError:
                return
            pumps = [asyncio.ensure_future(self._pump(creader, uwriter, link)),
                     asyncio.ensure_future(self._pump(ureader, cwriter, link))]
            self.tasks.update(pumps)
            try:
                await asyncio.gather(*pumps)
            finally:
                self.tasks.difference_update(pumps)
                uwriter.close()
        finally:
            cwriter.close()

    @staticmethod
    async def _pump(reader, writer, link: Link) -> None:
        try:
            while True:
                await link.open.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                # Bytes read just before a cut are "in flight": they arrive after the heal.
                await link.open.wait()
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if writer.can_write_eof():
                try:
                    writer.write_eof()
                except OSError:
                    pass

    def command(self, line: str) -> str:
        words = line.split()
        if not words:
            return "error empty"
        if words[0] == "cut" and len(words) == 3:
            self.link(int(words[1]), int(words[2])).open.clear()
        elif words[0] == "heal" and len(words) == 3:
            self.link(int(words[1]), int(words[2])).open.set()
        elif words[0] == "heal" and len(words) == 1:
            for link in self.links.values():
                link.open.set()
        else:
            return "error unknown command %r" % line
        return "ok"


async def _main(spec: list) -> None:
    relays = Relays()
    ports = await relays.start(spec)
    sys.stdout.write(json.dumps({"ports": ports}) + "\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        sys.stdout.write(relays.command(line) + "\n")
        sys.stdout.flush()
    # Every relayed connection ends with the process, as if the network went away.
    os._exit(0)


class ChaosNet:
    """The runner's handle on a relay process: start it, cut and heal links, stop it."""

    def __init__(self, spec: Iterable[tuple[int, int, str, str, int]]) -> None:
        self.spec = [list(s) for s in spec]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "natsjs.testing.chaos.netproxy", json.dumps(self.spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError("netproxy exited before binding its relays")
        self.ports: dict[tuple[int, int], int] = {
            tuple(int(x) for x in k.split("-")): v for k, v in json.loads(first)["ports"].items()}
        self.cut_links: set[frozenset] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _say(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError("netproxy: %s -> %r" % (line, answer))

    def cut(self, a: int, b: int) -> None:
        self._say("cut %d %d" % (a, b))
        self.cut_links.add(frozenset((a, b)))

    def heal(self, a: int | None = None, b: int | None = None) -> None:
        if a is None:
            self._say("heal")
            self.cut_links.clear()
        else:
            self._say("heal %d %d" % (a, b))
            self.cut_links.discard(frozenset((a, b)))

    def partition(self, groups: list[list[int]]) -> None:
        """Cut every link between nodes of different groups (a node in no group keeps
        its links: the bridge of a bridge partition)."""
        where = {n: g for g, members in enumerate(groups) for n in members}
        nodes = sorted(where)
        for x in nodes:
            for y in nodes:
                if x < y and where[x] != where[y]:
                    self.cut(x, y)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1])))
