"""A pass-through file system that can lose every write not made durable by fsync.

Power loss is simulated at the file-system boundary, outside the server: a server's store
directory is a FUSE mount of this file system over a backing directory, every operation
goes straight through to the backing files, and for each file the file system keeps what
it would take to undo the writes made since that file's last ``fsync``/``fdatasync``:

* before a write overwrites bytes, their old content (a write past the end needs none);
* before a truncation shortens a file, the tail it cuts off;
* the file's size at its last fsync, and whether the file existed then.

A **power cut** (``cut`` on the control channel, sent after the server was SIGKILLed)
undoes all of that, newest first, and removes files never fsynced since their creation,
so every file holds exactly what it held at its last fsync; then the runner unmounts and
mounts again (the kernel's caches go with the mount, as they go with a machine).  This is
the lazyfs model of Jepsen's analysis: a server that acknowledged a write before its
fsync loses it here.  Namespace changes (create of an fsynced file, rename, unlink,
mkdir) are taken as durable at once, as a journaling file system's ordered metadata
nearly makes them; the fault is about data.

Run as ``python -m natsjs.testing.chaos.lossyfs BACKING MOUNTPOINT``; it prints
``mounted`` once the mount serves, then reads commands on stdin: ``cut`` answers
``cut <files> files <bytes> bytes`` (what was rolled back), ``stats`` the same figures
of what a cut would undo now.  ``Mount`` is the runner's handle.  Needs mfusepy (the
``chaos`` extra) and libfuse3 (Debian: libfuse3-3).
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time


class Journal:
    """What undoes one file's writes since its last fsync."""

    __slots__ = ("size", "existed", "undo")

    def __init__(self, size: int, existed: bool) -> None:
        self.size = size            # its size at the last fsync
        self.existed = existed      # it existed (had been fsynced or was there) then
        self.undo: list[tuple[int, bytes]] = []


class Undo:
    """The journals of a whole tree: the file-system independent part, testable alone."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, Journal] = {}
        self.lock = threading.Lock()

    def _journal(self, rel: str, fd: int | None = None) -> Journal:
        j = self.files.get(rel)
        if j is None:
            size = os.fstat(fd).st_size if fd is not None else os.stat(self.path(rel)).st_size
            j = self.files[rel] = Journal(size, True)
        return j

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def created(self, rel: str) -> None:
        with self.lock:
            self.files[rel] = Journal(0, False)

    def before_write(self, rel: str, fd: int, offset: int, length: int) -> None:
        with self.lock:
            j = self._journal(rel, fd)
            end = min(offset + length, os.fstat(fd).st_size)
            if end > offset:
                j.undo.append((offset, os.pread(fd, end - offset, offset)))

    def before_truncate(self, rel: str, length: int, fd: int | None = None) -> None:
        with self.lock:
            j = self._journal(rel, fd)
            size = os.fstat(fd).st_size if fd is not None else os.stat(self.path(rel)).st_size
            if length < size:
                if fd is not None:
                    tail = os.pread(fd, size - length, length)
                else:
                    with open(self.path(rel), "rb") as f:
                        f.seek(length)
                        tail = f.read()
                j.undo.append((length, tail))

    def synced(self, rel: str) -> None:
        with self.lock:
            self.files.pop(rel, None)

    def renamed(self, old: str, new: str) -> None:
        with self.lock:
            self.files.pop(new, None)
            j = self.files.pop(old, None)
            if j is not None:
                self.files[new] = j

    def removed(self, rel: str) -> None:
        with self.lock:
            self.files.pop(rel, None)

    def pending(self) -> tuple[int, int]:
        with self.lock:
            return len(self.files), sum(len(b) for j in self.files.values() for _, b in j.undo)

    def cut(self) -> tuple[int, int]:
        """Undo everything not fsynced; returns (files touched, bytes restored or cut)."""
        files = nbytes = 0
        with self.lock:
            for rel, j in self.files.items():
                p = self.path(rel)
                if not os.path.exists(p):
                    continue
                files += 1
                if not j.existed:
                    nbytes += os.path.getsize(p)
                    os.unlink(p)
                    continue
                fd = os.open(p, os.O_WRONLY)
                try:
                    nbytes += max(0, os.fstat(fd).st_size - j.size)
                    for offset, old in reversed(j.undo):
                        os.pwrite(fd, old, offset)
                        nbytes += len(old)
                    os.ftruncate(fd, j.size)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self.files.clear()
        return files, nbytes


def make_operations(backing: str, undo: Undo):
    """The pass-through FUSE operations (fusepy's path-based API, as mfusepy has it)."""
    import mfusepy as fuse

    def full(path: str) -> str:
        return os.path.join(backing, path.lstrip("/"))

    class LossyFS(fuse.Operations):
        use_ns = True

        def access(self, path, amode):
            if not os.access(full(path), amode):
                raise fuse.FuseOSError(errno.EACCES)

        def getattr(self, path, fh=None):
            st = os.fstat(fh) if fh is not None else os.lstat(full(path))
            return {k: getattr(st, k) for k in (
                "st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns",
                "st_mtime_ns", "st_ctime_ns", "st_ino", "st_blocks", "st_blksize")}

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(full(path))

        def mkdir(self, path, mode):
            os.mkdir(full(path), mode)

        def rmdir(self, path):
            os.rmdir(full(path))

        def unlink(self, path):
            os.unlink(full(path))
            undo.removed(path)

        def rename(self, old, new, flags=0):
            os.rename(full(old), full(new))
            undo.renamed(old, new)

        def chmod(self, path, mode):
            os.chmod(full(path), mode)

        def chown(self, path, uid, gid):
            os.chown(full(path), uid, gid)

        def utimens(self, path, times=None):
            os.utime(full(path), ns=times)

        def statfs(self, path):
            st = os.statvfs(full(path))
            return {k: getattr(st, k) for k in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                "f_files", "f_flag", "f_frsize", "f_namemax")}

        def open(self, path, flags):
            fd = os.open(full(path), flags & ~os.O_CREAT)
            if flags & os.O_TRUNC:
                undo.before_truncate(path, 0, fd)
            return fd

        def create(self, path, mode, fi=None):
            existed = os.path.exists(full(path))
            fd = os.open(full(path), os.O_RDWR | os.O_CREAT, mode)
            if not existed:
                undo.created(path)
            return fd

        def read(self, path, size, offset, fh):
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            undo.before_write(path, fh, offset, len(data))
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            undo.before_truncate(path, length, fh)
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(full(path), length)

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            os.close(fh)

        def fsync(self, path, datasync, fh):
            # The backing file need not reach the disk: durability is what this file
            # system decides, and the backing directory outlives only our own "power".
            undo.synced(path)

        def fsyncdir(self, path, datasync, fh):
            return 0

    return LossyFS()


def serve(backing: str, mountpoint: str) -> None:
    import mfusepy as fuse
    undo = Undo(backing)
    ops = make_operations(backing, undo)

    def control():
        # The mount is up once the kernel answers for it.
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("mounted", flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "cut":
                files, nbytes = undo.cut()
                print("cut %d files %d bytes" % (files, nbytes), flush=True)
            elif cmd == "stats":
                files, nbytes = undo.pending()
                print("pending %d files %d bytes" % (files, nbytes), flush=True)
            else:
                print("error unknown command %r" % cmd, flush=True)

    threading.Thread(target=control, daemon=True).start()
    fuse.FUSE(ops, mountpoint, foreground=True, nothreads=False)


class Mount:
    """The runner's handle on one node's lossy mount."""

    def __init__(self, backing: str, mountpoint: str, log: str) -> None:
        self.backing = os.path.abspath(backing)
        self.mountpoint = os.path.abspath(mountpoint)
        self.log = log
        self.proc: subprocess.Popen | None = None

    @property
    def mounted(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def mount(self, timeout: float = 30.0) -> None:
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "natsjs.testing.chaos.lossyfs", self.backing, self.mountpoint],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, text=True, bufsize=1)
        line = self._readline(timeout)
        if line != "mounted":
            self.unmount()
            raise RuntimeError("lossyfs did not mount %s (%r); see %s" % (self.mountpoint, line, self.log))

    def _readline(self, timeout: float) -> str:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return out[0].strip() if out else ""

    def _say(self, cmd: str) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._readline(30.0)

    def power_cut(self) -> str:
        """Forget every write not fsynced (the server must be dead), then unmount and
        mount again.  Returns what was undone."""
        answer = self._say("cut") if self.mounted else "not mounted"
        self.unmount()
        self.mount()
        return answer

    def unmount(self) -> None:
        if self.proc is None:
            return
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", self.mountpoint], capture_output=True, timeout=30)
        if self.proc.poll() is None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", "-l", self.mountpoint], capture_output=True, timeout=30)
        self.proc = None


def available() -> str | None:
    """None when lossy mounts can work here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return "mfusepy/libfuse3 unavailable: %s" % e
    return None


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
