# cython: language_level=3
"""A thread of its own for fsync: group commit without the GIL in the way.

Where it sits: a stream's commit task (natsjs/jetstream/stream.py) asks its FileLog
for a ``Sync`` (the descriptors the last batch wrote) and hands it here; this module's
thread fdatasync's them and then writes to an eventfd, which the trio layer waits on
with ``wait_readable``; the trio side then collects what finished, marks the log
synced and sends the acknowledgements.

Why not ``trio.to_thread.run_sync(sync.run)``: a Python worker thread needs the GIL
before and after the fsync, and while the event loop is busy (it is: it keeps
processing the next batch) it gets it only at the interpreter's switch interval, 5 ms
by default; two such waits per fsync cap a publisher with 500 messages in flight at
about 50k messages/s whatever the disk does.  This thread never touches Python
objects, so an fsync costs the disk's time and an eventfd write.

No trio here and no sockets (STYLE.md habit 1): descriptors in, completions out.
"""
from libc.errno cimport errno
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from posix.unistd cimport close, fdatasync, fsync, read, write

from natsjs._core.filelog cimport Sync

import os


cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t* thread, void* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
    int pthread_join(pthread_t thread, void** retval)
    int pthread_mutex_init(pthread_mutex_t* m, void* attr)
    int pthread_mutex_destroy(pthread_mutex_t* m)
    int pthread_mutex_lock(pthread_mutex_t* m)
    int pthread_mutex_unlock(pthread_mutex_t* m)
    int pthread_cond_init(pthread_cond_t* c, void* attr)
    int pthread_cond_destroy(pthread_cond_t* c)
    int pthread_cond_wait(pthread_cond_t* c, pthread_mutex_t* m)
    int pthread_cond_signal(pthread_cond_t* c)

# Sync states of filelog.pyx, and the one this module adds while a Sync is in flight.
DEF SYNC_OK = 1
DEF SYNC_FAILED = 2
DEF SYNC_RUNNING = 3


cdef struct Job:
    int* fds
    int nfds
    int dir_slot
    int err
    uint64_t id
    Job* next


cdef struct Shared:
    pthread_mutex_t mu
    pthread_cond_t cv
    Job* todo_head
    Job* todo_tail
    Job* done_head
    Job* done_tail
    int efd
    bint stop


cdef void* _work(void* arg) noexcept nogil:
    cdef Shared* sh = <Shared*>arg
    cdef Job* job
    cdef int i, rc
    cdef uint64_t one = 1
    while True:
        pthread_mutex_lock(&sh.mu)
        while sh.todo_head == NULL and not sh.stop:
            pthread_cond_wait(&sh.cv, &sh.mu)
        if sh.todo_head == NULL:
            pthread_mutex_unlock(&sh.mu)
            return NULL
        job = sh.todo_head
        sh.todo_head = job.next
        if sh.todo_head == NULL:
            sh.todo_tail = NULL
        pthread_mutex_unlock(&sh.mu)
        job.err = 0
        for i in range(job.nfds):
            if i == job.dir_slot:
                rc = fsync(job.fds[i])
            else:
                rc = fdatasync(job.fds[i])
            if rc != 0 and job.err == 0:
                job.err = errno
            close(job.fds[i])
        job.next = NULL
        pthread_mutex_lock(&sh.mu)
        if sh.done_tail == NULL:
            sh.done_head = job
        else:
            sh.done_tail.next = job
        sh.done_tail = job
        pthread_mutex_unlock(&sh.mu)
        write(sh.efd, &one, 8)


cdef class Syncer:
    """One fsync thread; ``fd`` becomes readable when submitted Syncs have finished."""

    cdef Shared* sh
    cdef pthread_t thread
    cdef bint started
    cdef dict inflight          # job id -> Sync (kept alive while its fds are in use)
    cdef uint64_t next_id

    def __cinit__(self):
        self.sh = <Shared*>malloc(sizeof(Shared))
        if self.sh == NULL:
            raise MemoryError()
        self.sh.todo_head = self.sh.todo_tail = NULL
        self.sh.done_head = self.sh.done_tail = NULL
        self.sh.stop = False
        self.sh.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.sh.efd < 0:
            free(self.sh)
            self.sh = NULL
            raise OSError(errno, os.strerror(errno))
        pthread_mutex_init(&self.sh.mu, NULL)
        pthread_cond_init(&self.sh.cv, NULL)
        if pthread_create(&self.thread, NULL, _work, self.sh) != 0:
            raise OSError("could not start the fsync thread")
        self.started = True
        self.inflight = {}
        self.next_id = 1

    @property
    def fd(self):
        """The eventfd to wait on (readable when something finished)."""
        return self.sh.efd

    def submit(self, Sync s):
        """Hand ``s`` to the thread (its descriptors are closed there)."""
        cdef Job* job
        if s.state == SYNC_OK or s.state == SYNC_FAILED or s.state == SYNC_RUNNING:
            raise ValueError("Sync already run")
        if self.sh.stop:
            raise ValueError("Syncer closed")
        job = <Job*>malloc(sizeof(Job))
        if job == NULL:
            raise MemoryError()
        job.fds = s.fds
        job.nfds = s.nfds
        job.dir_slot = s.dir_slot
        job.err = 0
        job.id = self.next_id
        job.next = NULL
        self.next_id += 1
        s.state = SYNC_RUNNING
        self.inflight[job.id] = s
        pthread_mutex_lock(&self.sh.mu)
        if self.sh.todo_tail == NULL:
            self.sh.todo_head = job
        else:
            self.sh.todo_tail.next = job
        self.sh.todo_tail = job
        pthread_cond_signal(&self.sh.cv)
        pthread_mutex_unlock(&self.sh.mu)

    def collect(self):
        """The Syncs that finished since the last call: a list of (sync, errno)."""
        cdef uint64_t n
        cdef Job* job
        cdef Job* nxt
        cdef Sync s
        cdef list out = []
        read(self.sh.efd, &n, 8)
        pthread_mutex_lock(&self.sh.mu)
        job = self.sh.done_head
        self.sh.done_head = self.sh.done_tail = NULL
        pthread_mutex_unlock(&self.sh.mu)
        while job != NULL:
            nxt = job.next
            s = self.inflight.pop(job.id)
            s.err = job.err
            s.state = SYNC_FAILED if job.err else SYNC_OK
            out.append((s, job.err))
            free(job)
            job = nxt
        return out

    @property
    def pending(self):
        return len(self.inflight)

    def close(self):
        """Finish what was submitted, then stop the thread."""
        if not self.started:
            return
        pthread_mutex_lock(&self.sh.mu)
        self.sh.stop = True
        pthread_cond_signal(&self.sh.cv)
        pthread_mutex_unlock(&self.sh.mu)
        with nogil:
            pthread_join(self.thread, NULL)
        self.started = False

    def __dealloc__(self):
        cdef Job* job
        if self.sh == NULL:
            return
        if self.started:
            self.close()
        job = self.sh.done_head
        while job != NULL:
            self.sh.done_head = job.next
            free(job)
            job = self.sh.done_head
        close(self.sh.efd)
        pthread_mutex_destroy(&self.sh.mu)
        pthread_cond_destroy(&self.sh.cv)
        free(self.sh)
        self.sh = NULL
