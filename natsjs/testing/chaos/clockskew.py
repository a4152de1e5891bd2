"""Clock skew for one server process: an LD_PRELOAD shim that shifts the wall clock.

The shim replaces libc's ``clock_gettime`` (for the realtime clocks only), ``gettimeofday``
and ``time`` with versions that add ``CHAOS_SKEW_NS`` nanoseconds; monotonic clocks stay
true, as they do when an operator or NTP steps a machine's clock.  It is compiled once
with the system C compiler into a cache folder.  It reaches programs that read the clock
through libc (natsjs: CPython's ``time.time()``); a Go binary such as nats-server reads
the clock through the vDSO itself, so for it the fault is a no-op, which the nemesis
reports after checking the server's ``/varz`` ``now``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zlib

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <sys/time.h>

static long long skew_ns(void) {
    static long long v = 0;
    static int read = 0;
    if (!read) {
        const char *s = getenv("CHAOS_SKEW_NS");
        v = s ? atoll(s) : 0;
        read = 1;
    }
    return v;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_nsec + skew_ns() % 1000000000LL;
    ts->tv_sec += skew_ns() / 1000000000LL + ns / 1000000000LL;
    ns %= 1000000000LL;
    if (ns < 0) { ns += 1000000000LL; ts->tv_sec -= 1; }
    ts->tv_nsec = ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = 0;
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


def shim_path() -> str | None:
    """The compiled shim (built on first use), or None without a C compiler."""
    cache = os.path.join(tempfile.gettempdir(), "natsjs-chaos-clockskew-%d" % os.getuid())
    so = os.path.join(cache, "clockskew-%08x.so" % zlib.crc32(SOURCE.encode()))
    if os.path.exists(so):
        return so
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    os.makedirs(cache, exist_ok=True)
    src = os.path.join(cache, "clockskew.c")
    with open(src, "w") as f:
        f.write(SOURCE)
    tmp = so + ".tmp"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", tmp, src, "-ldl"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None
    os.replace(tmp, so)
    return so


def skew_env(offset_s: float) -> dict | None:
    """Environment for a process whose wall clock is ``offset_s`` seconds off."""
    so = shim_path()
    if so is None:
        return None
    pre = os.environ.get("LD_PRELOAD")
    return {"LD_PRELOAD": so + (" " + pre if pre else ""),
            "CHAOS_SKEW_NS": str(int(offset_s * 1e9))}
