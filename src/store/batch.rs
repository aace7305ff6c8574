//! The write batcher: acknowledged-but-uncommitted writes ("pending"), drained by group commit.
//!
//! A WRITE is acknowledged once its bytes are in the pending map (keyed by inode, so a rename
//! carries them). A background committer drains the map in SQLite transactions that span many
//! inodes, on whichever comes first:
//! - the timer window (`AGENTFS_BATCH_WINDOW_MS` after an inode's first pending byte),
//! - the per-inode trigger (`AGENTFS_BATCH_INODE_TRIGGER_KIB` pending on one inode),
//! - half the global cap (`AGENTFS_BATCH_MAX_PENDING_MIB`) or a writer blocked on the cap.
//!
//! Each transaction takes at most `AGENTFS_BATCH_TXN_INODES` inodes and (about)
//! `AGENTFS_BATCH_TXN_KIB` bytes; an inode with more is committed lowest offsets first, so a
//! sequential writer's file is always a prefix after a crash. When the cap is reached, writers
//! wait for the committer (back-pressure): memory never grows without bound.
//!
//! Pending state is never a second authority: every reader overlays it on the database (see
//! `Store::read`, `Store::getattr`), and every store operation that changes an inode's data or
//! times by other means first *claims* the inode ([`Batcher::claim`]): it waits for any commit of
//! that inode in flight, takes its pending bytes, and either commits them in its own
//! transaction (truncate, fallocate, copy_file_range, lseek) or puts them back (a SETATTR of
//! times only). Dead ranges are trimmed (truncate, punch hole) and a reaped inode's bytes are
//! discarded; the committer also re-checks in its transaction that each inode still exists.
//!
//! A truncate to zero of a regular file is pending too ([`Batcher::truncate_to_zero`], the
//! "cut"): it is committed in the same transaction as the bytes written after it, so a
//! rewrite in place (open with O_TRUNC, write, close) never commits an empty file ahead of
//! its new contents. Namespace operations commit the pending state of the inodes they name in
//! their own transaction (see `Store::rename_fx`).
//!
//! Durability sits behind [`Durability`] (the redb `StorageBackend` idea): the batcher only
//! calls `commit_batch` and `barrier`, so tests drive it with a fake backend that "crashes" at
//! the Nth barrier.
//!
//! Errors: a failed commit discards that inode's bytes (like a kernel writeback error) and
//! records the sticky [`Failure`]: every later fsync and sync reports it (the store also
//! refuses every later write with it).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::failure::Failure;
use super::{Ino, Timespec};
use crate::errno::Errno;

/// Adjacent writes are merged into one extent up to this length; larger runs stay separate
/// extents, so a transaction budget can split an inode's bytes without copying.
pub const MAX_EXTENT: usize = 1 << 20;

/// Non-overlapping byte ranges of one inode, keyed by offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extents {
    map: BTreeMap<u64, Vec<u8>>,
    bytes: u64,
}

impl Extents {
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// One past the last byte held (0 when empty).
    pub fn end(&self) -> u64 {
        self.map
            .last_key_value()
            .map_or(0, |(s, v)| s + v.len() as u64)
    }

    /// The extents in offset order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.map.iter().map(|(s, v)| (*s, v.as_slice()))
    }

    /// Store `data` at `off`, replacing what was there; merges with overlapping extents and
    /// with adjacent ones while the result stays within [`MAX_EXTENT`].
    pub fn insert(&mut self, off: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = off + data.len() as u64;
        let mut start = off;
        let mut new_end = end;
        let mut prev = None;
        if let Some((&s, v)) = self.map.range(..=off).next_back() {
            let e = s + v.len() as u64;
            if e > off || (e == off && v.len() + data.len() <= MAX_EXTENT) {
                prev = Some(s);
                start = s;
                new_end = new_end.max(e);
            }
        }
        let mut later = Vec::new();
        for (&s, v) in self.map.range((Excluded(off), Unbounded)) {
            if s > end {
                break;
            }
            let e = s + v.len() as u64;
            if s < end || (new_end - start) as usize + v.len() <= MAX_EXTENT {
                later.push(s);
                new_end = new_end.max(e);
            }
        }
        let total = (new_end - start) as usize;
        let mut buf = match prev.and_then(|s| self.map.remove(&s)) {
            Some(v) => {
                self.bytes -= v.len() as u64;
                v
            }
            None => crate::memory::pool::buffers().take(total),
        };
        // `buf` holds [start, off) at least; bytes written at its end need no zeroing first.
        let at = (off - start) as usize;
        if buf.len() == at {
            buf.extend_from_slice(data);
            buf.resize(total, 0);
        } else {
            buf.resize(total, 0);
            buf[at..at + data.len()].copy_from_slice(data);
        }
        for s in later {
            let Some(v) = self.map.remove(&s) else {
                continue;
            };
            self.bytes -= v.len() as u64;
            let e = s + v.len() as u64;
            if e > end {
                let from = end.max(s);
                let at = (from - start) as usize;
                let src = &v[(from - s) as usize..];
                buf[at..at + src.len()].copy_from_slice(src);
            }
        }
        self.bytes += buf.len() as u64;
        self.map.insert(start, buf);
    }

    /// Copy the held bytes that fall in [off, off + buf.len()) over `buf`.
    pub fn overlay(&self, off: u64, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        let end = off + buf.len() as u64;
        let first = self.map.range(..=off).next_back().map_or(off, |(&s, _)| s);
        for (&s, v) in self.map.range(first..end) {
            let e = s + v.len() as u64;
            let lo = s.max(off);
            let hi = e.min(end);
            if lo < hi {
                buf[(lo - off) as usize..(hi - off) as usize]
                    .copy_from_slice(&v[(lo - s) as usize..(hi - s) as usize]);
            }
        }
    }

    /// Drop every byte at or past `size`.
    pub fn trim(&mut self, size: u64) {
        let dead: Vec<u64> = self.map.range(size..).map(|(&s, _)| s).collect();
        for s in dead {
            if let Some(v) = self.map.remove(&s) {
                self.bytes -= v.len() as u64;
            }
        }
        if let Some((&s, v)) = self.map.range_mut(..size).next_back() {
            let keep = (size - s) as usize;
            if v.len() > keep {
                self.bytes -= (v.len() - keep) as u64;
                v.truncate(keep);
            }
        }
    }

    /// Drop the bytes in [lo, hi).
    pub fn punch(&mut self, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        let first = self.map.range(..=lo).next_back().map_or(lo, |(&s, _)| s);
        let hit: Vec<u64> = self.map.range(first..hi).map(|(&s, _)| s).collect();
        for s in hit {
            let Some(mut v) = self.map.remove(&s) else {
                continue;
            };
            self.bytes -= v.len() as u64;
            let e = s + v.len() as u64;
            if e > hi {
                let right = v[(hi - s) as usize..].to_vec();
                self.bytes += right.len() as u64;
                self.map.insert(hi, right);
            }
            if s < lo {
                v.truncate((lo - s) as usize);
                self.bytes += v.len() as u64;
                self.map.insert(s, v);
            }
        }
    }

    /// Remove and return the lowest extents holding about `budget` bytes (at least one).
    pub fn take_prefix(&mut self, budget: u64) -> Extents {
        let mut out = Extents::default();
        while let Some(entry) = self.map.first_entry() {
            let len = entry.get().len() as u64;
            if !out.is_empty() && out.bytes + len > budget {
                break;
            }
            let (k, v) = entry.remove_entry();
            self.bytes -= len;
            out.bytes += len;
            out.map.insert(k, v);
        }
        out
    }

    /// Put `older` underneath: where both hold bytes, ours win.
    pub fn put_under(&mut self, older: Extents) {
        let mut newer = std::mem::replace(self, older);
        for (s, v) in std::mem::take(&mut newer.map) {
            self.insert(s, &v);
            crate::memory::pool::buffers().give(v);
        }
    }
}

impl Drop for Extents {
    /// Committed or dropped bytes leave their large buffers to the next writes.
    fn drop(&mut self) {
        for (_, v) in std::mem::take(&mut self.map) {
            crate::memory::pool::buffers().give(v);
        }
    }
}

/// The bytes of one inode handed to one commit, and the times that commit sets.
#[derive(Debug, Clone)]
pub struct InodeBatch {
    pub ino: Ino,
    pub extents: Extents,
    /// The mtime to store (the last write's time); `None` when a SETATTR set mtime explicitly
    /// after the last write, so the stored mtime must stay.
    pub mtime: Option<Timespec>,
    /// ctime becomes at least this.
    pub ctime: Timespec,
    /// A truncate to zero to apply before the bytes, with its time (see [`Pending::cut`]).
    pub cut: Option<Timespec>,
    /// When the bytes became pending: put back, they keep their deadline.
    since: Instant,
}

/// Where committed batches go. The SQLite implementation lives in the store; tests use a fake.
pub trait Durability: Send + Sync + 'static {
    /// Commit every inode's bytes in ONE transaction (all or nothing). An inode that no longer
    /// exists is skipped, not an error.
    fn commit_batch(&self, batch: &[Arc<InodeBatch>]) -> Result<(), Errno>;
    /// Return only when everything committed before the call is on stable storage.
    fn barrier(&self) -> Result<(), Errno>;
}

/// The batching policy (all from the AGENTFS_BATCH_* knobs).
#[derive(Clone, Copy, Debug)]
pub struct BatchConfig {
    pub window: Duration,
    pub inode_trigger: u64,
    pub max_pending: u64,
    pub txn_inodes: usize,
    pub txn_bytes: u64,
}

impl BatchConfig {
    pub fn from_knobs(k: &crate::knobs::Knobs) -> BatchConfig {
        BatchConfig {
            window: Duration::from_millis(k.batch_window_ms),
            inode_trigger: k.batch_inode_trigger_kib.saturating_mul(1024),
            max_pending: k
                .batch_max_pending_mib
                .saturating_mul(1024 * 1024)
                .min(crate::memory::Shares::from_knobs(k).batch),
            txn_inodes: usize::try_from(k.batch_txn_inodes).unwrap_or(usize::MAX),
            txn_bytes: k.batch_txn_kib.saturating_mul(1024),
        }
    }
}

/// One inode's pending state.
#[derive(Debug)]
struct Pending {
    /// Acknowledged bytes nobody is committing yet (newest layer).
    open: Extents,
    /// Bytes a commit (the committer's, an fsync's or a claim's) is writing now; readers still
    /// see them under `open`. At most one commit per inode at a time.
    inflight: Option<Arc<InodeBatch>>,
    /// Time of the last write (None after an explicit mtime SETATTR, see [`InodeBatch::mtime`]).
    mtime: Option<Timespec>,
    ctime: Timespec,
    /// When `open` (or `cut`) last became non-empty (the timer window runs from here).
    since: Instant,
    /// A truncate to zero acknowledged but not committed, with its time: it goes before the
    /// bytes of `open` (and after those in flight, which it makes dead to readers).
    cut: Option<Timespec>,
}

impl Pending {
    /// The layers readers see, older first: the bytes in flight are dead below a cut.
    fn layers(&self) -> impl Iterator<Item = &Extents> + '_ {
        let inflight = self.inflight.as_ref().filter(|_| self.cut.is_none());
        inflight
            .map(|b| &b.extents)
            .into_iter()
            .chain(std::iter::once(&self.open))
    }

    /// Whether the stored contents are dead: a cut is pending or in flight.
    fn cut_any(&self) -> bool {
        self.cut.is_some() || self.inflight.as_ref().is_some_and(|b| b.cut.is_some())
    }

    fn end(&self) -> u64 {
        self.layers().map(Extents::end).max().unwrap_or(0)
    }

    fn bytes(&self) -> u64 {
        self.layers().map(Extents::bytes).sum()
    }

    /// Nothing in the open layer waits for a commit.
    fn open_idle(&self) -> bool {
        self.open.is_empty() && self.cut.is_none()
    }
}

#[derive(Debug, Default)]
struct State {
    inodes: HashMap<Ino, Pending>,
    /// Bytes in every `open` and `inflight` layer; never above the cap except for one write
    /// larger than the cap on an otherwise empty map.
    bytes: u64,
    /// Writers blocked on the cap.
    waiting: usize,
    shutdown: bool,
    /// How the committer waits for `wake`, so a write that only adds a later deadline need
    /// not wake it.
    asleep: Asleep,
    /// Times the committer came back from waiting on `wake`.
    wakeups: u64,
}

/// The committer's wait on `wake`.
#[derive(Clone, Copy, Debug, Default)]
enum Asleep {
    /// Not waiting on `wake`: it looks at the pending map again before it next sleeps.
    #[default]
    No,
    /// Until this instant.
    Until(Instant),
    /// Until woken.
    Forever,
}

impl Asleep {
    /// Whether the committer would sleep past `due` unless woken.
    fn past(self, due: Instant) -> bool {
        match self {
            Asleep::No => false,
            Asleep::Until(t) => t > due,
            Asleep::Forever => true,
        }
    }
}

/// What a caller learns about pending bytes overlapping a read.
pub struct ReadView {
    /// One past the last pending byte of the inode.
    pub end: u64,
    /// Older layer first: overlay in this order.
    pub layers: Vec<Extents>,
    /// The file was truncated to zero after its stored contents: they read as zeros.
    pub cut: bool,
}

/// What pending writes add to an inode's attributes.
#[derive(Clone, Copy, Debug)]
pub struct AttrView {
    /// One past the last pending byte.
    pub end: u64,
    pub mtime: Option<Timespec>,
    pub ctime: Timespec,
    /// Pending bytes (for st_blocks).
    pub bytes: u64,
    /// A truncate to zero is pending: the stored size and blocks no longer count.
    pub cut: bool,
}

/// The pending map, locked, for readers.
pub struct View<'a>(&'a State);

impl View<'_> {
    /// Pending bytes overlapping [off, off + len) of `ino`; None when it has none.
    pub fn read(&self, ino: Ino, off: u64, len: u64) -> Option<ReadView> {
        let p = self.0.inodes.get(&ino)?;
        let mut layers = Vec::with_capacity(2);
        let end = off.saturating_add(len);
        for ext in p.layers() {
            let mut part = Extents::default();
            let first = ext.map.range(..=off).next_back().map_or(off, |(&s, _)| s);
            for (&s, v) in ext.map.range(first..end.max(first)) {
                let e = s + v.len() as u64;
                let lo = s.max(off);
                let hi = e.min(end);
                if lo < hi {
                    part.insert(lo, &v[(lo - s) as usize..(hi - s) as usize]);
                }
            }
            layers.push(part);
        }
        Some(ReadView {
            end: p.end(),
            layers,
            cut: p.cut_any(),
        })
    }

    /// What pending writes add to `ino`'s attributes; None when it has none.
    pub fn attr(&self, ino: Ino) -> Option<AttrView> {
        self.0.inodes.get(&ino).map(|p| AttrView {
            end: p.end(),
            mtime: p.mtime,
            ctime: p.ctime,
            bytes: p.bytes(),
            cut: p.cut_any(),
        })
    }
}

/// The pending map and the committer. `D` is the durable backend.
///
/// Lock order: the batcher never holds `state` while calling `commit_batch`/`barrier`; the
/// backend must not take `state` while it holds the SQLite writer lock. Readers may hold `state`
/// across a read (pool idle list, or the writer lock while a namespace batch is open, after
/// `state`).
pub struct Batcher<D: Durability> {
    backend: D,
    cfg: BatchConfig,
    /// Where a failed commit is recorded (sticky).
    failure: Arc<Failure>,
    /// Guards the pending map, byte count, error slots and flags.
    state: Mutex<State>,
    /// Wakes the committer (new work, urgency, shutdown).
    wake: Condvar,
    /// Signalled after every commit/claim finishes or bytes are dropped: blocked writers,
    /// claimers waiting for an inode's in-flight commit, and flushers wait on it.
    done: Condvar,
    /// Bumped (under `state`) whenever bytes leave the pending map, so an optimistic reader
    /// can tell whether its database read and its pending snapshot may disagree.
    version: AtomicU64,
    /// The committer thread, joined at shutdown.
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How a claim ends.
pub enum Finish {
    /// The claimed bytes were committed.
    Committed,
    /// Put them back (the claimer's transaction did not write them); optionally forget the
    /// last write's mtime because the claimer stored an explicit one.
    Restore { clear_mtime: bool },
}

impl<D: Durability> Batcher<D> {
    pub fn new(backend: D, cfg: BatchConfig, failure: Arc<Failure>) -> Arc<Self> {
        Arc::new(Batcher {
            backend,
            cfg,
            failure,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            done: Condvar::new(),
            version: AtomicU64::new(0),
            thread: Mutex::new(None),
        })
    }

    /// Start the background committer.
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("committer".into())
            .spawn(move || {
                // Shutdown signals belong to the session's signal thread, even when the store
                // is opened before the session blocks them.
                crate::sys::signals::block_shutdown_signals();
                me.committer()
            })?;
        *self.thread.lock() = Some(h);
        Ok(())
    }

    pub fn backend(&self) -> &D {
        &self.backend
    }

    /// Stop the committer after it has drained everything, then commit what is left.
    pub fn shutdown(&self) -> Result<(), Errno> {
        self.state.lock().shutdown = true;
        self.wake.notify_all();
        let h = self.thread.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
        self.flush_all()
    }

    /// Acknowledge a write: its bytes join the pending map. Blocks while the global cap is
    /// reached (back-pressure). The caller has checked the range (EFBIG).
    /// `now`: the write's time for mtime/ctime, or None when the kernel keeps those itself
    /// (writeback cache) and the write must not move them.
    pub fn write(&self, ino: Ino, off: u64, data: &[u8], now: Option<Timespec>) {
        let len = data.len() as u64;
        if len == 0 {
            return;
        }
        let mut st = self.state.lock();
        while st.bytes > 0 && st.bytes + len > self.cfg.max_pending && !st.shutdown {
            st.waiting += 1;
            self.wake.notify_one();
            self.done.wait(&mut st);
            st.waiting -= 1;
        }
        let asleep = st.asleep;
        let p = st.inodes.entry(ino).or_insert_with(|| Pending {
            open: Extents::default(),
            inflight: None,
            mtime: None,
            ctime: now.unwrap_or_default(),
            since: Instant::now(),
            cut: None,
        });
        // A new deadline: the committer must hear of it if it sleeps past it (without one, when
        // every other pending inode is in flight elsewhere). A committer that sleeps until an
        // older deadline, or that is awake, finds it itself: waking it for every new file
        // cost two context switches per small file.
        let new_deadline = p.open_idle();
        if new_deadline {
            p.since = Instant::now();
        }
        let before = p.open.bytes();
        p.open.insert(off, data);
        let missed = new_deadline && self.sleeps_past(asleep, p);
        let after = p.open.bytes();
        if let Some(t) = now {
            p.mtime = Some(t);
            p.ctime = t;
        }
        let hot = after >= self.cfg.inode_trigger;
        st.bytes = st.bytes + after - before;
        let urgent = hot || st.bytes >= self.cfg.max_pending / 2;
        drop(st);
        if urgent || missed {
            self.wake.notify_one();
        }
    }

    /// Acknowledge a truncate to zero of a regular file: its pending bytes are dropped and the
    /// cut waits, like a write, for the commit that also carries the bytes written after it.
    /// `mtime` and `ctime` are the truncate's times.
    pub fn truncate_to_zero(&self, ino: Ino, mtime: Timespec, ctime: Timespec) {
        let mut st = self.state.lock();
        let asleep = st.asleep;
        let p = st.inodes.entry(ino).or_insert_with(|| Pending {
            open: Extents::default(),
            inflight: None,
            mtime: None,
            ctime,
            since: Instant::now(),
            cut: None,
        });
        // As for a write: only a deadline the committer would sleep past is news to it.
        let new_deadline = p.open_idle();
        if new_deadline {
            p.since = Instant::now();
        }
        let dropped = p.open.bytes();
        p.open = Extents::default();
        p.cut = Some(ctime);
        let missed = new_deadline && self.sleeps_past(asleep, p);
        p.mtime = Some(mtime);
        p.ctime = p.ctime.max(ctime);
        st.bytes -= dropped;
        self.version.fetch_add(1, Ordering::Release);
        drop(st);
        if missed {
            self.wake.notify_one();
        }
    }

    /// A consistent view of the pending map for one lookup: `(version, f(view))`. Compare the
    /// version with [`Batcher::version`] after reading the database; if it moved, bytes left
    /// the map meanwhile and the two may disagree.
    pub fn view<T>(&self, f: impl FnOnce(&View<'_>) -> T) -> (u64, T) {
        let st = self.state.lock();
        let v = self.version.load(Ordering::Acquire);
        (v, f(&View(&st)))
    }

    /// Run `f` with the pending map locked throughout, so no bytes can leave it meanwhile (the
    /// readers' fallback after optimistic attempts saw the version move).
    pub fn locked<T>(&self, f: impl FnOnce(&View<'_>) -> T) -> T {
        let st = self.state.lock();
        f(&View(&st))
    }

    /// The current version (see the field).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Take `ino`'s pending bytes for the caller's own transaction. Waits for a commit of the
    /// inode already in flight. `None` when nothing is pending. The caller must [`finish`].
    /// Claim several inodes in ascending order only (two claimers never wait on each other).
    ///
    /// [`finish`]: Batcher::finish
    pub fn claim(&self, ino: Ino) -> Option<Arc<InodeBatch>> {
        let mut st = self.state.lock();
        loop {
            let p = st.inodes.get_mut(&ino)?;
            if p.inflight.is_some() {
                self.done.wait(&mut st);
                continue;
            }
            let b = Arc::new(InodeBatch {
                ino,
                extents: std::mem::take(&mut p.open),
                mtime: p.mtime,
                ctime: p.ctime,
                cut: p.cut.take(),
                since: p.since,
            });
            p.inflight = Some(b.clone());
            return Some(b);
        }
    }

    /// End a claim (or a background commit) of `b`.
    pub fn finish(&self, b: &Arc<InodeBatch>, how: Finish) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        // Whether the committer must look again: it skips inodes in flight, so bytes left on
        // this one (restored, or written meanwhile) may have a deadline it would sleep past.
        let mut missed = false;
        if let Some(p) = st.inodes.get_mut(&b.ino) {
            if p.inflight.as_ref().is_some_and(|x| Arc::ptr_eq(x, b)) {
                p.inflight = None;
                match how {
                    Finish::Committed => {
                        st.bytes -= b.extents.bytes();
                        self.version.fetch_add(1, Ordering::Release);
                    }
                    Finish::Restore { clear_mtime } => {
                        let before = p.open.bytes();
                        // Below a newer cut the claimed bytes are dead; otherwise they (and
                        // their cut) go back underneath the newer bytes.
                        if p.cut.is_none() {
                            p.open.put_under(b.extents.clone());
                            p.cut = b.cut;
                        }
                        st.bytes = st.bytes + p.open.bytes() - before - b.extents.bytes();
                        p.mtime = if clear_mtime {
                            None
                        } else {
                            p.mtime.or(b.mtime)
                        };
                        if !b.extents.is_empty() || b.cut.is_some() {
                            p.since = p.since.min(b.since);
                        }
                    }
                }
                missed = self.sleeps_past(st.asleep, p);
                if p.open_idle() {
                    st.inodes.remove(&b.ino);
                }
            }
        }
        missed |= st.waiting > 0 || st.bytes >= self.cfg.max_pending / 2;
        // Claimers and flushers wait for the inode to leave flight; writers for room.
        self.done.notify_all();
        drop(guard);
        // A claim that committed everything leaves the committer nothing to do: waking it
        // anyway cost a futex wake and two context switches per claimed file (git writing an
        // object, then linking it).
        if missed {
            self.wake.notify_one();
        }
    }

    /// Whether the committer, asleep as `asleep`, would sleep past the deadline of `p`'s open
    /// bytes (or its pending cut): news to it when they open a new deadline, or when a commit
    /// of the inode ends (it skips an inode while one is in flight).
    fn sleeps_past(&self, asleep: Asleep, p: &Pending) -> bool {
        if p.open_idle() {
            return false;
        }
        let due = if p.open.bytes() >= self.cfg.inode_trigger {
            Instant::now()
        } else {
            p.since + self.cfg.window
        };
        asleep.past(due)
    }

    /// A commit of `b` failed: its bytes are dropped and the sticky failure recorded.
    fn failed(&self, b: &Arc<InodeBatch>, e: Errno) {
        tracing::error!(
            "committing {} pending bytes of inode {} failed: {e}",
            b.extents.bytes(),
            b.ino.0
        );
        self.failure.lost_bytes(e, b.extents.bytes());
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut missed = false;
        if let Some(p) = st.inodes.get_mut(&b.ino) {
            if p.inflight.as_ref().is_some_and(|x| Arc::ptr_eq(x, b)) {
                p.inflight = None;
                st.bytes -= b.extents.bytes();
                self.version.fetch_add(1, Ordering::Release);
                missed = self.sleeps_past(st.asleep, p);
                if p.open_idle() {
                    st.inodes.remove(&b.ino);
                }
            }
        }
        self.done.notify_all();
        drop(guard);
        if missed {
            self.wake.notify_one();
        }
    }

    /// The inode is gone (reaped): drop its pending bytes. Bytes of an in-flight commit are
    /// dropped when it finishes (its transaction skips a missing inode).
    pub fn discard(&self, ino: Ino) {
        let mut st = self.state.lock();
        let st = &mut *st;
        if let Some(p) = st.inodes.get_mut(&ino) {
            st.bytes -= p.open.bytes();
            p.open = Extents::default();
            p.cut = None;
            self.version.fetch_add(1, Ordering::Release);
            if p.inflight.is_none() {
                st.inodes.remove(&ino);
            }
        }
        self.done.notify_all();
    }

    /// Commit batches, falling back to one inode per transaction when a multi-inode
    /// transaction fails, so one bad inode cannot sink the others.
    fn commit(&self, batch: Vec<Arc<InodeBatch>>) -> Result<(), Errno> {
        if batch.is_empty() {
            return Ok(());
        }
        match self.backend.commit_batch(&batch) {
            Ok(()) => {
                for b in &batch {
                    self.finish(b, Finish::Committed);
                }
                Ok(())
            }
            Err(e) if batch.len() == 1 => {
                self.failed(&batch[0], e);
                Err(e)
            }
            Err(_) => {
                let mut first = Ok(());
                for b in batch {
                    if let Err(e) = self.commit(vec![b]) {
                        first = first.and(Err(e));
                    }
                }
                first
            }
        }
    }

    /// Take up to one transaction's worth of inodes that have open bytes and nothing in
    /// flight: hot inodes first, then the oldest.
    fn take_batch(&self, st: &mut State) -> Vec<Arc<InodeBatch>> {
        let trigger = self.cfg.inode_trigger;
        let mut cands: Vec<(bool, Instant, Ino)> = st
            .inodes
            .iter()
            .filter(|(_, p)| p.inflight.is_none() && !p.open_idle())
            .map(|(i, p)| (p.open.bytes() < trigger, p.since, *i))
            .collect();
        cands.sort_unstable();
        let mut out = Vec::new();
        let mut budget = self.cfg.txn_bytes;
        for (_, _, ino) in cands {
            if out.len() >= self.cfg.txn_inodes.max(1) || (budget == 0 && !out.is_empty()) {
                break;
            }
            let Some(p) = st.inodes.get_mut(&ino) else {
                continue;
            };
            let ext = if p.open.bytes() <= budget {
                std::mem::take(&mut p.open)
            } else {
                p.open.take_prefix(budget.max(1))
            };
            budget = budget.saturating_sub(ext.bytes());
            if !p.open.is_empty() {
                p.since = Instant::now().min(p.since);
            }
            let b = Arc::new(InodeBatch {
                ino,
                extents: ext,
                mtime: p.mtime,
                ctime: p.ctime,
                cut: p.cut.take(),
                since: p.since,
            });
            p.inflight = Some(b.clone());
            out.push(b);
        }
        out
    }

    /// When the committer must act: now (Some(zero)), at a deadline, or never (None: idle).
    fn next_due(&self, st: &State, now: Instant) -> Option<Duration> {
        if st.waiting > 0 || st.shutdown || st.bytes >= self.cfg.max_pending / 2 {
            return Some(Duration::ZERO);
        }
        let mut due: Option<Duration> = None;
        for p in st.inodes.values() {
            if p.inflight.is_some() || p.open_idle() {
                continue;
            }
            if p.open.bytes() >= self.cfg.inode_trigger {
                return Some(Duration::ZERO);
            }
            let left = (p.since + self.cfg.window).saturating_duration_since(now);
            due = Some(due.map_or(left, |d| d.min(left)));
        }
        due
    }

    fn committer(&self) {
        loop {
            let batch = {
                let mut st = self.state.lock();
                loop {
                    match self.next_due(&st, Instant::now()) {
                        Some(d) if d.is_zero() => {
                            let b = self.take_batch(&mut st);
                            if !b.is_empty() {
                                break b;
                            }
                            if st.shutdown {
                                return;
                            }
                            // Everything due is in flight elsewhere: wait for it.
                            self.done.wait_for(&mut st, Duration::from_millis(1));
                        }
                        Some(d) => {
                            st.asleep = Asleep::Until(Instant::now() + d);
                            self.wake.wait_for(&mut st, d);
                            st.asleep = Asleep::No;
                            st.wakeups += 1;
                        }
                        None if st.shutdown => return,
                        None => {
                            st.asleep = Asleep::Forever;
                            self.wake.wait(&mut st);
                            st.asleep = Asleep::No;
                            st.wakeups += 1;
                        }
                    }
                }
            };
            // Errors are recorded per inode by `commit`.
            let _ = self.commit(batch);
        }
    }

    /// Commit every pending byte (ignoring the window) and wait for commits in flight.
    /// Returns the first error of these commits.
    pub fn flush_all(&self) -> Result<(), Errno> {
        let mut result = Ok(());
        loop {
            let batch = {
                let mut st = self.state.lock();
                loop {
                    let b = self.take_batch(&mut st);
                    if !b.is_empty() {
                        break b;
                    }
                    if !st.inodes.values().any(|p| p.inflight.is_some()) {
                        // Nothing open and nothing in flight: only empty entries remain.
                        st.inodes.retain(|_, p| !p.open_idle());
                        return result;
                    }
                    self.done.wait(&mut st);
                }
            };
            if let Err(e) = self.commit(batch) {
                result = result.and(Err(e));
            }
        }
    }

    /// fsync/fdatasync: commit `ino`'s pending bytes, then a barrier. Reports the sticky
    /// failure, every time.
    pub fn fsync(&self, ino: Ino) -> Result<(), Errno> {
        let result = match self.claim(ino) {
            Some(b) => self.commit(vec![b]),
            None => Ok(()),
        };
        let barrier = self.backend.barrier();
        result.and(self.failure.check()).and(barrier)
    }

    /// syncfs/unmount: commit everything, then a barrier. Reports the sticky failure, every
    /// time.
    pub fn sync_all(&self) -> Result<(), Errno> {
        let result = self.flush_all();
        let barrier = self.backend.barrier();
        result.and(self.failure.check()).and(barrier)
    }

    /// Whether nothing at all is pending (no bytes, no truncate, nothing in flight).
    pub fn is_idle(&self) -> bool {
        self.state.lock().inodes.is_empty()
    }

    /// Bytes pending (acknowledged, not yet committed).
    pub fn pending_bytes(&self) -> u64 {
        self.state.lock().bytes
    }
}

#[cfg(test)]
mod tests;
