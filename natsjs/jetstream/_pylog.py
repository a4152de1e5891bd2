"""A pure-Python log with the filelog interface (stand-in while the Cython one lands)."""
from __future__ import annotations

from natsjs._core.sublist import subject_matches


def _size(subject, hdr, msg):
    return len(subject) + len(hdr or b"") + len(msg) + 16


class _Sync:
    def __init__(self, seq):
        self.seq = seq

    def run(self):
        pass


class PyLog:
    def __init__(self, first_seq: int = 1):
        self.recs: dict[int, tuple] = {}
        self.first_seq = first_seq
        self.last_seq = first_seq - 1
        self.bytes = 0
        self.synced_seq = 0
        self.last_ts = 0
        self.recovery = {}

    @property
    def msgs(self):
        return len(self.recs)

    def append(self, subject, hdr, msg, ts, seq=0):
        if seq == 0:
            seq = self.last_seq + 1
        if seq <= self.last_seq:
            raise ValueError("sequence %d not above last %d" % (seq, self.last_seq))
        if not self.recs:
            self.first_seq = seq
        self.recs[seq] = (subject, hdr, msg, ts)
        self.last_seq = seq
        self.last_ts = ts
        self.bytes += _size(subject, hdr, msg)
        return seq

    def begin_sync(self):
        return _Sync(self.last_seq)

    def mark_synced(self, s):
        self.synced_seq = max(self.synced_seq, s.seq)

    def load(self, seq):
        return self.recs.get(seq)

    def _match(self, filt, subject):
        return not filt or filt == b">" or subject_matches(filt, subject)

    def load_next(self, start, filt=None):
        for seq in range(max(start, self.first_seq), self.last_seq + 1):
            r = self.recs.get(seq)
            if r is not None and self._match(filt, r[0]):
                return (seq,) + r
        return None

    def load_last(self, filt=None):
        return self.load_prev(self.last_seq, filt)

    def load_prev(self, start, filt=None):
        for seq in range(min(start, self.last_seq), self.first_seq - 1, -1):
            r = self.recs.get(seq)
            if r is not None and self._match(filt, r[0]):
                return (seq,) + r
        return None

    def _fix_first(self):
        if self.recs:
            self.first_seq = min(self.recs)
        else:
            self.first_seq = self.last_seq + 1

    def remove(self, seq, secure=False):
        r = self.recs.pop(seq, None)
        if r is None:
            return False
        self.bytes -= _size(r[0], r[1], r[2])
        if seq == self.first_seq:
            self._fix_first()
        return True

    def purge(self, subject=None, seq=0, keep=0):
        cands = [s for s, r in sorted(self.recs.items()) if self._match(subject, r[0])
                 and (not seq or s < seq)]
        if keep:
            if subject:
                cands = cands[:max(len(cands) - keep, 0)] if not seq else cands
            else:
                cands = cands[:max(len(cands) - keep, 0)]
        for s in cands:
            r = self.recs.pop(s)
            self.bytes -= _size(r[0], r[1], r[2])
        if not subject and not seq and not keep:
            self.first_seq = self.last_seq + 1
        elif not subject and seq:
            self.first_seq = max(self.first_seq, seq) if not self.recs else min(self.recs)
        else:
            self._fix_first()
        return len(cands)

    def compact(self, seq):
        n = 0
        for s in [s for s in self.recs if s < seq]:
            self.remove(s)
            n += 1
        if seq > self.last_seq:
            self.last_seq = seq - 1
        self.first_seq = min(self.recs) if self.recs else seq
        return n

    def truncate(self, seq):
        for s in [s for s in self.recs if s > seq]:
            self.remove(s)
        self.last_seq = seq

    def expire(self, before_ts):
        n = 0
        for s in sorted(self.recs):
            if self.recs[s][3] >= before_ts:
                break
            self.remove(s)
            n += 1
        return n

    def state(self):
        fs = self.first_seq
        first = self.recs.get(fs)
        last = self.recs.get(self.last_seq)
        subs = {r[0] for r in self.recs.values()}
        span = self.last_seq - fs + 1 if self.recs else 0
        return {"messages": len(self.recs), "bytes": self.bytes, "first_seq": fs,
                "first_ts": first[3] if first else 0, "last_seq": self.last_seq,
                "last_ts": last[3] if last else self.last_ts,
                "num_deleted": span - len(self.recs) if self.recs else 0,
                "num_subjects": len(subs)}

    def deleted(self, limit=0):
        if not self.recs:
            return []
        out = [s for s in range(self.first_seq, self.last_seq + 1) if s not in self.recs]
        return out[:limit] if limit else out

    def subject_state(self, subject):
        seqs = [s for s, r in self.recs.items() if r[0] == subject]
        return (len(seqs), min(seqs), max(seqs)) if seqs else (0, 0, 0)

    def subjects(self, filt=None):
        out = {}
        for s in sorted(self.recs):
            subj = self.recs[s][0]
            if self._match(filt, subj):
                out[subj] = out.get(subj, 0) + 1
        return out

    def num_pending(self, start, filt=None, last_per_subject=False):
        if last_per_subject:
            last = {}
            for s, r in self.recs.items():
                if self._match(filt, r[0]):
                    last[r[0]] = max(last.get(r[0], 0), s)
            return sum(1 for s in last.values() if s >= start)
        return sum(1 for s, r in self.recs.items() if s >= start and self._match(filt, r[0]))

    def compact_blocks(self, threshold=0.5):
        return 0

    def close(self):
        pass
