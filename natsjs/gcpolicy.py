"""How the server process uses Python's cyclic garbage collector.

Reference counting frees almost everything natsjs lets go of; the cyclic collector is
there for what forms cycles (a connection and its core point at each other).  Its full
collections walk every tracked object, and CPython starts one whenever the objects that
survived the young generations grew by a quarter since the last: a server taking on
connections by the thousand walks all of them again every few hundred new ones.

``tune()``, called once by ``natsjs-server`` after the server is built:

* freezes what exists then (modules, classes, configuration: objects that live as long
  as the process), so no collection walks them again (``gc.freeze``);
* paces full collections on the live set, as Go's collector does with GOGC=100: after
  each one, the next waits until about as many objects have been promoted as were
  found alive.  Garbage cycles are still collected, after at most a doubling.

Young collections are left as CPython runs them.  Subscriptions do not count at all:
the cores keep registered ones out of the collector's lists (natsjs/_core/sublist.pxd).
It is a process-wide setting, so it belongs to the command, not to ``Server`` objects
(tests run several in one process).
"""
from __future__ import annotations

import gc

# The oldest generation's threshold never goes below CPython's default.
MIN_THRESHOLD2 = 10


def tune() -> None:
    gc.collect()
    gc.freeze()
    if _pace not in gc.callbacks:
        gc.callbacks.append(_pace)


def _pace(phase: str, info: dict) -> None:
    if phase != "stop" or info.get("generation") != 2:
        return
    live = len(gc.get_objects(generation=2))
    t0, t1, _ = gc.get_threshold()
    # Each full-collection check comes after t1 young-generation-1 collections, each
    # after t0 net allocations: promote about ``live`` objects before the next one.
    gc.set_threshold(t0, t1, max(MIN_THRESHOLD2, live // max(t0 * t1, 1)))
