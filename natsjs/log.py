"""Logging in nats-server's line format.

``[pid] 2006/01/02 15:04:05.000000 [INF] message`` (server/log.go and the logger
package of nats-server): tools and test harnesses wait for lines such as
``Listening for client connections on HOST:PORT`` and ``Server is ready``.
"""
from __future__ import annotations

import os
import sys
import time


class Logger:
    def __init__(self, debug=False, trace=False, logtime=True, utc=False, path="", stream=None):
        self.debug_enabled = debug
        self.trace_enabled = trace
        self.logtime = logtime
        self.utc = utc
        self.path = path
        self._pid = "[%d] " % os.getpid()
        if path:
            self._out = open(path, "a", buffering=1, encoding="utf-8")
            self._owned = True
        else:
            self._out = stream if stream is not None else sys.stderr
            self._owned = False

    def _write(self, label: str, msg: str) -> None:
        if self.logtime:
            now = time.time()
            tm = time.gmtime(now) if self.utc else time.localtime(now)
            stamp = time.strftime("%Y/%m/%d %H:%M:%S", tm) + ".%06d " % int((now % 1) * 1e6)
        else:
            stamp = ""
        try:
            self._out.write("%s%s%s %s\n" % (self._pid, stamp, label, msg))
            self._out.flush()
        except (OSError, ValueError):
            pass  # a closed or full log target must not take the server down

    def info(self, msg: str, *args) -> None:
        self._write("[INF]", msg % args if args else msg)

    def warn(self, msg: str, *args) -> None:
        self._write("[WRN]", msg % args if args else msg)

    def error(self, msg: str, *args) -> None:
        self._write("[ERR]", msg % args if args else msg)

    def fatal(self, msg: str, *args) -> None:
        self._write("[FTL]", msg % args if args else msg)

    def debug(self, msg: str, *args) -> None:
        if self.debug_enabled:
            self._write("[DBG]", msg % args if args else msg)

    def trace(self, msg: str, *args) -> None:
        if self.trace_enabled:
            self._write("[TRC]", msg % args if args else msg)

    def reopen(self, path: str | None = None, logtime: bool | None = None) -> None:
        """Reopen the log file (SIGUSR1 / --signal reopen, or a reload that moved it)."""
        if logtime is not None:
            self.logtime = logtime
        if path is None:
            path = self.path
        if self._owned:
            try:
                self._out.close()
            except OSError:
                pass
        self.path = path
        if path:
            self._out = open(path, "a", buffering=1, encoding="utf-8")
            self._owned = True
        else:
            self._out = sys.stderr
            self._owned = False

    def close(self) -> None:
        if self._owned:
            self._out.close()
