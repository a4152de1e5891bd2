"""The scenario catalogue of the end-to-end benchmarks.

Scenarios and server topologies are data, kept in ``bench/scenarios.toml`` (its header
documents the fields); this module parses them into frozen dataclasses and turns a scenario
into a natsbench command line for a given set of node URLs.  ``bench.run`` and
``bench.profile`` use it; adding a cluster or JetStream scenario needs no code here.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_FILE = Path(__file__).with_name("scenarios.toml")
TRACE_MODES = frozenset({"pubsub", "req"})  # the natsbench modes that honour -trace


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: int = 1
    cluster: bool = False
    jetstream: bool = False
    # The reference's JetStream sync_interval ("always" for its fsync-per-write mode);
    # empty: its default (lazy, 2 min).  natsjs always syncs before acknowledging.
    reference_sync: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    mode: str
    topology: Topology
    args: tuple[str, ...] = ()
    url: str = "{url0}"
    n: int = 1_000_000
    quick_n: int | None = None
    trace: bool = False
    default: bool = True
    timeout_s: float = 120.0
    rss: bool = False
    # The load generator: "natsbench", or "natsbatch" (bench/natsbatch: atomic batches
    # and counters); both take the same flags and print the same JSON line.
    tool: str = "natsbench"

    def messages(self, quick: bool = False, override: int | None = None) -> int:
        if override:
            return override
        if quick:
            return self.quick_n or max(1, self.n // 10)
        return self.n

    def natsbench_args(self, urls: list[str], n: int, trace_path: str | None = None) -> list[str]:
        """natsbench arguments (without the binary) against the nodes at ``urls``."""
        subst = {f"url{i}": u for i, u in enumerate(urls)}
        subst["urls"] = ",".join(urls)

        def expand(text: str) -> str:
            def one(m: re.Match) -> str:
                key = m.group(1)
                if key not in subst:
                    raise ValueError(
                        f"scenario {self.name}: {{{key}}} but topology "
                        f"{self.topology.name} has {len(urls)} node(s)")
                return subst[key]
            return re.sub(r"\{(\w+)\}", one, text)

        out = ["-mode", self.mode, "-url", expand(self.url), "-n", str(n)]
        out += [expand(a) for a in self.args]
        out += ["-timeout", f"{int(self.timeout_s)}s"]
        if trace_path and self.trace:
            out += ["-trace", trace_path]
        return out


@dataclass(frozen=True)
class Catalogue:
    scenarios: tuple[Scenario, ...]
    topologies: dict[str, Topology] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [s.name for s in self.scenarios]

    def select(self, names: list[str] | None = None) -> list[Scenario]:
        """The named scenarios in the order given, or the default set when ``names`` is empty."""
        if not names:
            return [s for s in self.scenarios if s.default]
        by_name = {s.name: s for s in self.scenarios}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise KeyError(f"unknown scenario(s) {unknown}; known: {self.names()}")
        return [by_name[n] for n in names]


def load(path: str | Path | None = None) -> Catalogue:
    """Parse a scenario file (default: ``bench/scenarios.toml``)."""
    with open(path or DEFAULT_FILE, "rb") as f:
        data = tomllib.load(f)
    topologies = {name: Topology(name=name, **spec) for name, spec in data.get("topology", {}).items()}
    topologies.setdefault("single", Topology(name="single"))
    scenarios = []
    seen = set()
    for raw in data.get("scenario", []):
        raw = dict(raw)
        topo_name = raw.pop("topology", "single")
        if topo_name not in topologies:
            raise ValueError(f"scenario {raw.get('name')}: unknown topology {topo_name!r}")
        raw["args"] = tuple(str(a) for a in raw.get("args", ()))
        raw.setdefault("title", raw["name"])
        sc = Scenario(topology=topologies[topo_name], **raw)
        if sc.trace and sc.mode not in TRACE_MODES:
            raise ValueError(f"scenario {sc.name}: natsbench -trace only works for {sorted(TRACE_MODES)}")
        if sc.name in seen:
            raise ValueError(f"duplicate scenario {sc.name}")
        seen.add(sc.name)
        scenarios.append(sc)
    return Catalogue(scenarios=tuple(scenarios), topologies=topologies)
