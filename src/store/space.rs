//! The space guard: a full disk fails the operation that fills it, and deletion always has room.
//!
//! The figures (see SPEC.md "Durability", "Full disk"): the free space of the filesystem that
//! holds the database (statvfs of its directory), minus the checkpoint's debt (pages the
//! database has grown by in the WAL that the next checkpoint must add to the main file), and
//! SQLite's free pages (which new data reuses without growing the database). They are sampled
//! at most every `AGENTFS_SPACE_SAMPLE_MS`; between samples the guard subtracts what it has
//! admitted since, so a sample never overstates the room left.
//!
//! A growing operation costs its bytes twice at most: once as WAL frames and once more as new
//! pages of the main file when no free page takes them. It is refused with ENOSPC when it
//! would leave less than the reserve (`AGENTFS_SPACE_RESERVE_MIB`); operations that free space
//! may use the reserve. Before refusing, the guard hands free pages back and folds the WAL
//! into the main file, then decides on fresh figures. Below the low-water mark
//! (`AGENTFS_SPACE_LOW_MIB` above the reserve, pending WRITE bytes counted twice) nothing is
//! acknowledged before it is committed: the writer's low-space flag, which the guard raises,
//! makes it commit every operation on its own, keeps its WAL short (checkpoints at SQLite's
//! 1,000 pages), and sends WRITEs through.
//!
//! Lock order: the guard's mutex may be held while [`Figures`] takes the writer or a reader;
//! nothing holding the writer may call into the guard.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rusqlite::Connection;

use crate::errno::Errno;

/// What one namespace operation may add besides its payload: the pages of the rows and index
/// entries it writes, each a WAL frame.
const OP_BYTES: u64 = 16 << 10;

/// What a mutation does to the size of the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// It may grow the database by about this many bytes of payload: refused when that would
    /// take the reserve.
    Grow(u64),
    /// It frees space or rewrites rows in place: it may use the reserve.
    Free,
}

impl Need {
    /// A namespace operation carrying `payload` bytes (a name, a symlink target, an xattr).
    pub fn op(payload: usize) -> Need {
        Need::Grow(OP_BYTES.saturating_add(payload as u64))
    }
}

/// SQLite's page figures of a database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DbPages {
    pub page_size: u64,
    /// Pages in the database (`PRAGMA page_count`).
    pub pages: u64,
    /// Pages on the free list (`PRAGMA freelist_count`).
    pub free: u64,
    /// `auto_vacuum=INCREMENTAL`: free pages can be handed back without a full VACUUM.
    pub incremental: bool,
}

impl DbPages {
    /// Read the figures on `c` (inside its transaction, if any).
    pub fn read(c: &Connection) -> Result<DbPages, Errno> {
        let get = |p: &str| -> Result<u64, Errno> {
            let v: i64 = c.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))?;
            Ok(u64::try_from(v).unwrap_or(0))
        };
        Ok(DbPages {
            page_size: get("page_size")?,
            pages: get("page_count")?,
            free: get("freelist_count")?,
            incremental: get("auto_vacuum")? == 2,
        })
    }

    /// The free pages' share of the database, in percent.
    pub fn free_percent(&self) -> u64 {
        (self.free * 100).checked_div(self.pages).unwrap_or(0)
    }
}

/// Where the guard gets SQLite's figures, and how it hands space back.
pub trait Figures {
    fn pages(&self) -> Result<DbPages, Errno>;
    /// Return free pages to the filesystem and fold the WAL into the main file (best effort).
    fn reclaim(&self);
}

/// One sample, and what was admitted since.
#[derive(Debug)]
struct Sample {
    at: Instant,
    /// Host free bytes minus the checkpoint's debt.
    room: i64,
    /// Bytes of free pages.
    free: u64,
    spent: u64,
    spent_free: u64,
}

impl Sample {
    /// Host bytes `n` more bytes of data cost, and the free-page bytes they take.
    fn cost(&self, n: u64) -> (u64, u64) {
        let reuse = n.min(self.free.saturating_sub(self.spent_free));
        (n + (n - reuse), reuse)
    }

    fn left(&self) -> i64 {
        self.room.saturating_sub(clamp(self.spent))
    }
}

#[derive(Debug, Default)]
struct State {
    sample: Option<Sample>,
    reclaimed: Option<Instant>,
}

/// Decides, per mutation, whether there is room (see the module doc).
pub struct SpaceGuard {
    db: PathBuf,
    reserve: i64,
    low: i64,
    every: Duration,
    state: Mutex<State>,
    low_flag: Arc<AtomicBool>,
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SpaceGuard {
    /// The guard of the database at `db`, with the knobs `AGENTFS_SPACE_RESERVE_MIB`,
    /// `AGENTFS_SPACE_LOW_MIB` and `AGENTFS_SPACE_SAMPLE_MS`; it raises `low_flag` (the
    /// writer's) while space is low.
    pub fn new(db: &Path, k: &crate::knobs::Knobs, low_flag: Arc<AtomicBool>) -> SpaceGuard {
        SpaceGuard {
            db: db.to_path_buf(),
            reserve: clamp(k.space_reserve_mib << 20),
            low: clamp(k.space_low_mib << 20),
            every: Duration::from_millis(k.space_sample_ms),
            state: Mutex::new(State::default()),
            low_flag,
        }
    }

    /// Whether space is low (as of the last admitted operation).
    pub fn is_low(&self) -> bool {
        self.low_flag.load(Ordering::Relaxed)
    }

    /// Fresh figures; None when the host filesystem cannot tell (the guard then stands aside).
    fn take(&self, fig: &dyn Figures) -> Option<Sample> {
        let (host, _) = crate::sys::space::host_space(&self.db)?;
        let p = match fig.pages() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("space guard: reading the page counts failed: {e}");
                DbPages::default()
            }
        };
        let main = std::fs::metadata(&self.db).map_or(0, |m| m.len());
        let debt = (p.pages * p.page_size).saturating_sub(main);
        Some(Sample {
            at: Instant::now(),
            room: clamp(host).saturating_sub(clamp(debt)),
            free: p.free * p.page_size,
            spent: 0,
            spent_free: 0,
        })
    }

    /// Admit a mutation (ENOSPC when it would grow the database into the reserve) and update
    /// the low-space flag; `pending` is the bytes acknowledged but not yet committed.
    pub fn admit(&self, need: Need, pending: u64, fig: &dyn Figures) -> Result<(), Errno> {
        let mut st = self.state.lock();
        if st
            .sample
            .as_ref()
            .is_none_or(|s| s.at.elapsed() >= self.every)
        {
            st.sample = self.take(fig);
        }
        let n = match need {
            Need::Grow(n) => n,
            Need::Free => 0,
        };
        let fits = |s: &Sample| s.left().saturating_sub(clamp(s.cost(n).0)) >= self.reserve;
        if n > 0 && st.sample.as_ref().is_some_and(|s| !fits(s)) {
            // Fresh figures before refusing, after handing back what can be handed back.
            // At most once per sample interval, unless free pages wait to be handed back (a
            // deletion since the last reclaim left them).
            let due = st.reclaimed.is_none_or(|t| t.elapsed() >= self.every)
                || fig.pages().is_ok_and(|p| p.incremental && p.free > 0);
            if due {
                fig.reclaim();
                st.reclaimed = Some(Instant::now());
            }
            st.sample = self.take(fig);
            if st.sample.as_ref().is_some_and(|s| !fits(s)) {
                self.low_flag.store(true, Ordering::Relaxed);
                return Err(Errno::ENOSPC);
            }
        }
        let Some(s) = st.sample.as_mut() else {
            return Ok(());
        };
        let (host, reuse) = s.cost(n);
        s.spent += host;
        s.spent_free += reuse;
        let low =
            s.left().saturating_sub(clamp(pending.saturating_mul(2))) < self.reserve + self.low;
        self.low_flag.store(low, Ordering::Relaxed);
        Ok(())
    }
}

/// The mark a database gets beside it (`<db>-enospc`) the first time its server answers a
/// request with ENOSPC: it outlives the server, so `agentfs status` can say the delta ran out
/// of space (a write was refused) until a successful `agentfs apply` of the delta removes it.
/// It holds the Unix time of that first refusal; its mtime tells the same when the full disk
/// left no room for the digits.
pub fn full_mark(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-enospc");
    PathBuf::from(p)
}

/// Leave the mark (kept as it is when there is one already).
pub fn mark_full(db: &Path) {
    use std::io::Write as _;
    let path = full_mark(db);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let _ = writeln!(f, "{now}");
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => tracing::warn!("cannot mark {} as full: {e}", path.display()),
    }
}

/// When the database was first refused space, if its mark is there.
pub fn full_since(db: &Path) -> Option<u64> {
    let path = full_mark(db);
    let text = std::fs::read_to_string(&path).ok()?;
    text.trim().parse().ok().or_else(|| {
        let m = std::fs::metadata(&path).ok()?.modified().ok()?;
        m.duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs())
    })
}

/// Remove the mark; whether there was one.
pub fn clear_full(db: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(full_mark(db)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// An empty database that counts the times it was asked to hand space back.
    struct Empty(Cell<u32>);

    impl Figures for Empty {
        fn pages(&self) -> Result<DbPages, Errno> {
            Ok(DbPages::default())
        }
        fn reclaim(&self) {
            self.0.set(self.0.get() + 1);
        }
    }

    /// A database whose free list stays non-empty (a deletion left pages to hand back).
    struct Freed(Cell<u32>);

    impl Figures for Freed {
        fn pages(&self) -> Result<DbPages, Errno> {
            Ok(DbPages {
                page_size: 4096,
                pages: 10,
                free: 5,
                incremental: true,
            })
        }
        fn reclaim(&self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn free_pages_waiting_are_handed_back_before_every_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let (free, _) = crate::sys::space::host_space(&dir.path().join("db.sqlite")).unwrap();
        let g = guard(dir.path(), clamp(free) + (1 << 30), 0);
        let fig = Freed(Cell::new(0));
        assert_eq!(g.admit(Need::op(10), 0, &fig), Err(Errno::ENOSPC));
        assert_eq!(g.admit(Need::op(10), 0, &fig), Err(Errno::ENOSPC));
        assert_eq!(fig.0.get(), 2, "free pages were left waiting at a refusal");
    }

    fn guard(dir: &Path, reserve: i64, low: i64) -> SpaceGuard {
        SpaceGuard {
            db: dir.join("db.sqlite"),
            reserve,
            low,
            every: Duration::from_secs(3600),
            state: Mutex::new(State::default()),
            low_flag: Arc::new(AtomicBool::new(false)),
        }
    }

    #[test]
    fn growth_into_the_reserve_is_refused_after_one_reclaim_and_frees_pass() {
        let dir = tempfile::tempdir().unwrap();
        let (free, _) = crate::sys::space::host_space(&dir.path().join("db.sqlite")).unwrap();
        let g = guard(dir.path(), clamp(free) + (1 << 30), 0);
        let fig = Empty(Cell::new(0));
        assert_eq!(g.admit(Need::op(10), 0, &fig), Err(Errno::ENOSPC));
        assert_eq!(fig.0.get(), 1, "space is handed back once before refusing");
        assert!(g.is_low());
        assert_eq!(g.admit(Need::Free, 0, &fig), Ok(()));
        assert_eq!(g.admit(Need::op(10), 0, &fig), Err(Errno::ENOSPC));
        assert_eq!(fig.0.get(), 1, "at most one reclaim per sample interval");
    }

    #[test]
    fn room_admits_and_the_low_mark_counts_pending_bytes_twice() {
        let dir = tempfile::tempdir().unwrap();
        let (free, _) = crate::sys::space::host_space(&dir.path().join("db.sqlite")).unwrap();
        let fig = Empty(Cell::new(0));
        let g = guard(dir.path(), 0, 0);
        assert_eq!(g.admit(Need::Grow(4096), 0, &fig), Ok(()));
        assert!(!g.is_low());
        // Pending bytes that would not fit twice make the guard low, not the admission fail.
        assert_eq!(g.admit(Need::Grow(4096), free, &fig), Ok(()));
        assert!(g.is_low());
        assert_eq!(fig.0.get(), 0);
    }

    #[test]
    fn new_data_reuses_free_pages_before_growing() {
        let s = Sample {
            at: Instant::now(),
            room: 1 << 30,
            free: 8192,
            spent: 0,
            spent_free: 0,
        };
        assert_eq!(s.cost(4096), (4096, 4096));
        assert_eq!(s.cost(12288), (12288 + 4096, 8192));
    }
}
