//! Connections: the single writer (behind the store's mutex) and the pool of read connections,
//! the per-connection settings, the transaction helpers (with namespace batching: one write
//! transaction kept open across many operations, each a SAVEPOINT), the durability barrier
//! and the durability window (committed work is made durable at most
//! `AGENTFS_DURABILITY_WINDOW_MS` after it committed, without a barrier).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::failure::Failure;
use crate::errno::Errno;

/// Most idle read connections kept; more are opened on demand and closed when returned.
const MAX_IDLE_READERS: usize = 16;
/// Prepared statements cached per connection.
const STATEMENT_CACHE: usize = 96;

/// Open a connection with the settings every connection shares (busy timeout, cache size,
/// statement cache) taken from the knobs.
pub fn open(path: &Path, readonly: bool) -> rusqlite::Result<Connection> {
    configure(Connection::open_with_flags(path, open_flags(readonly))?)
}

/// How every connection is opened: read-only or read-write, each used by one thread at a time.
fn open_flags(readonly: bool) -> OpenFlags {
    let rw = if readonly {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    };
    rw | OpenFlags::SQLITE_OPEN_NO_MUTEX
}

/// A connection of the server that writes (its writer, its checkpoint thread): [`open`]
/// read-write, its WAL writes and checkpoint copies gathered (`crate::sys::walvfs`) unless
/// `AGENTFS_WAL_GATHER` is off.
fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let gather = crate::knobs::get()
        .wal_gather
        .then(crate::sys::walvfs::register)
        .flatten();
    match gather {
        Some(vfs) => configure(Connection::open_with_flags_and_vfs(
            path,
            open_flags(false),
            vfs,
        )?),
        None => open(path, false),
    }
}

/// Busy timeout, memory limits and the statement cache of a new connection.
fn configure(conn: Connection) -> rusqlite::Result<Connection> {
    let k = crate::knobs::get();
    conn.busy_timeout(Duration::from_millis(k.sqlite_busy_timeout_ms))?;
    // The SQLite share of the memory budget holds all connections together: it is the
    // process-wide soft heap limit (past it the page caches recycle pages instead of growing)
    // and no connection's own cache exceeds it.
    let shares = crate::memory::Shares::from_knobs(k);
    let limit = i64::try_from(shares.sqlite).unwrap_or(i64::MAX);
    conn.pragma_update(None, "soft_heap_limit", limit)?;
    let kib = i64::try_from(shares.sqlite_cache_kib(k)).unwrap_or(i64::MAX);
    conn.pragma_update(None, "cache_size", -kib)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // One plan per statement, whatever is bound. Without this SQLite marks some parameters
    // (a LIMIT, an equality its planner weighs by value) as "re-plan when rebound", and the
    // statement cache clears every statement's bindings when it is returned, which counts as a
    // rebind: each use of such a statement was parsed and planned again (the directory
    // listing's, 5% of the server's time in an `rm -rf`).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

/// Namespace batching: how long one write transaction may stay open across operations and
/// how many operations it may hold (`AGENTFS_BATCH_NAMESPACE*`, `AGENTFS_BATCH_WINDOW_MS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceBatch {
    pub window: Duration,
    pub ops: u64,
    /// After a batch commits, operations commit one by one for this long before the next batch
    /// opens: the write lock is then free between them, so another process's writer (an
    /// offline `agentfs` command) gets it even under continuous load.
    pub gap: Duration,
}

impl NamespaceBatch {
    /// The policy from the knobs; `None` with the kill switch off.
    pub fn from_knobs(k: &crate::knobs::Knobs) -> Option<NamespaceBatch> {
        k.batch_namespace.then(|| NamespaceBatch {
            window: Duration::from_millis(k.batch_window_ms),
            ops: k.batch_namespace_ops.max(1),
            gap: Duration::from_millis(k.batch_namespace_gap_ms),
        })
    }
}

/// Called after a batch transaction was rolled back as a whole (a failed COMMIT): every
/// operation of its window is gone, so anything cached from them must be dropped.
pub type LostHook = Arc<dyn Fn() + Send + Sync>;

/// An identity of the -wal file (st_dev, st_ino).
type FileId = (u64, u64);

/// The open batch transaction.
struct OpenBatch {
    since: Instant,
    ops: u64,
}

/// The writer connection, the open batch transaction (if any) and what the durability
/// barrier remembers.
pub struct Writer {
    conn: Connection,
    /// The thread that checkpoints the WAL off the commit path (None: SQLite's automatic
    /// checkpoint, or none while Litestream replicates the database).
    checkpointer: Option<Checkpointer>,
    /// The database file.
    path: PathBuf,
    /// (st_dev, st_ino) of the -wal file last made durable: a different value means the file
    /// was (re)created since, so its directory entry must be synced too.
    synced_wal: Option<FileId>,
    /// Namespace batching policy (`None`: every transaction commits at once).
    policy: Option<NamespaceBatch>,
    batch: Option<OpenBatch>,
    /// Mirrors `batch.is_some()` for readers that do not hold the lock.
    open_flag: Arc<AtomicBool>,
    /// When the last batch committed (see [`NamespaceBatch::gap`]).
    last_commit: Option<Instant>,
    /// A transaction committed since the last successful barrier.
    dirty: bool,
    /// When the first transaction not yet made durable committed (the durability window
    /// runs from here; `None` when everything this connection committed is durable).
    dirty_since: Option<Instant>,
    /// The durability window (zero: only barriers make commits durable).
    sync_window: Duration,
    /// Test-only fault injection (`AGENTFS_FAULT_COMMIT`): while this file exists, every
    /// COMMIT fails with EIO.
    fault: Option<PathBuf>,
    /// `PRAGMA data_version` at the last successful barrier (moves when another process
    /// commits to the database).
    synced_version: Option<i64>,
    /// The change counter ([`super::schema::change_seq`]) as this connection's own commits
    /// left it: read when a transaction begins and again just before it commits.
    own_seq: Option<i64>,
    /// At the start of a transaction the counter was not where our last commit left it:
    /// another connection changed the filesystem's tables in between (see
    /// [`Writer::foreign_change`]).
    foreign_seq: bool,
    /// The sticky failure a lost batch or a failed fdatasync records.
    failure: Arc<Failure>,
    on_lost: Option<LostHook>,
    /// Set by the space guard while space is low: every operation commits on its own.
    space_low: Arc<AtomicBool>,
    shutdown: bool,
}

impl Writer {
    /// Open the writer: WAL journal, synchronous=NORMAL.
    pub fn open(
        path: &Path,
        policy: Option<NamespaceBatch>,
        failure: Arc<Failure>,
    ) -> rusqlite::Result<Writer> {
        let conn = open_writer(path)?;
        let k = crate::knobs::get();
        let _: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Each operation in a namespace batch is a savepoint, whose statement journal SQLite
        // spills to a temporary file past 64 KiB and then keeps writing there (a pwrite per
        // page an operation touches, for the life of the connection). In memory it is
        // emptied at every release, so it only ever holds one operation's pages.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        // A replicated database's WAL is Litestream's to checkpoint (src/replica.rs).
        let mut conn = conn;
        let space_low = Arc::new(AtomicBool::new(false));
        let checkpointer = if crate::replica::leaves_checkpoints(path) {
            conn.pragma_update(None, "wal_autocheckpoint", 0)?;
            None
        } else if k.wal_checkpoint_pages > 0 {
            // A WAL that grew past the threshold in a long write goes back to it at rest: SQLite
            // truncates the file to this limit at the first commit after the WAL starts over.
            let limit = k.wal_checkpoint_pages.saturating_mul(4096);
            conn.pragma_update(
                None,
                "journal_size_limit",
                i64::try_from(limit).unwrap_or(-1),
            )?;
            Checkpointer::start(&mut conn, path, k.wal_checkpoint_pages, space_low.clone())?
        } else {
            None
        };
        Ok(Writer {
            conn,
            checkpointer,
            path: path.to_path_buf(),
            synced_wal: None,
            policy,
            batch: None,
            open_flag: Arc::new(AtomicBool::new(false)),
            last_commit: None,
            dirty: true,
            dirty_since: None,
            sync_window: Duration::from_millis(k.durability_window_ms),
            fault: (!k.fault_commit.is_empty()).then(|| PathBuf::from(&k.fault_commit)),
            synced_version: None,
            own_seq: None,
            foreign_seq: false,
            failure,
            on_lost: None,
            space_low,
            shutdown: false,
        })
    }

    /// The connection, for statements outside [`Writer::transact`] (schema set-up, checkpoint).
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Fold the whole WAL into the database and truncate it; whether a reader kept it from
    /// finishing (SQLite's busy flag). A background checkpoint in progress is waited for: two
    /// checkpoints at once would make this one fail busy.
    pub fn checkpoint_truncate(&self) -> rusqlite::Result<bool> {
        let _quiet = self.checkpointer.as_ref().map(|c| c.shared.running.lock());
        let busy: i64 = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
        Ok(busy != 0)
    }

    /// Run `f` as one atomic operation: everything it did stays if it returns Ok, nothing if it
    /// fails. Without namespace batching that is one immediate transaction, committed before
    /// returning. With it, `f` runs as a SAVEPOINT inside the open batch transaction (opened
    /// here when none is); the batch commits when the window elapses ([`Writer::flusher`]),
    /// when the op budget is reached (here) or at a barrier. Returns whether a batch was
    /// opened (the flusher must be woken). Refused with the sticky errno after a failed
    /// commit lost acknowledged work.
    fn transact<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
    ) -> (Result<T, Errno>, bool) {
        if let Err(e) = self.failure.check() {
            return (Err(e), false);
        }
        if self.space_low.load(Ordering::Relaxed) {
            // Little space left: nothing is acknowledged before it is committed.
            if let Err(e) = self.commit() {
                return (Err(e), false);
            }
            return (self.transact_alone(f), false);
        }
        let Some(policy) = self.policy else {
            return (self.transact_alone(f), false);
        };
        let opened = self.batch.is_none();
        if opened && self.last_commit.is_some_and(|t| t.elapsed() < policy.gap) {
            return (self.transact_alone(f), false);
        }
        if opened {
            if let Err(e) = self.begin() {
                return (Err(e), false);
            }
            self.batch = Some(OpenBatch {
                since: Instant::now(),
                ops: 0,
            });
            self.open_flag.store(true, Ordering::Release);
        }
        let out = self.savepoint(f);
        if self.conn.is_autocommit() {
            // SQLite rolled the whole transaction back (SQLITE_FULL, IOERR, ...): the window
            // is lost, and this operation with it.
            let e = out.as_ref().err().copied().unwrap_or(Errno::EIO);
            self.lose_batch(e);
            return (Err(e), opened);
        }
        let full = self.batch.as_mut().is_some_and(|b| {
            b.ops += 1;
            b.ops >= policy.ops
        });
        if full {
            if let Err(e) = self.commit() {
                // This operation was in the lost batch: it fails too (the barrier still
                // reports the loss of the others).
                return (Err(e), opened);
            }
        }
        (out, opened)
    }

    /// `f` inside SAVEPOINT op: released on success, rolled back to on failure.
    fn savepoint<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.conn.prepare_cached("SAVEPOINT op")?.execute([])?;
        let out = f(&self.conn);
        if self.conn.is_autocommit() {
            return out;
        }
        let end = if out.is_ok() {
            self.conn
                .prepare_cached("RELEASE op")
                .and_then(|mut s| s.execute([]))
        } else {
            self.conn
                .prepare_cached("ROLLBACK TO op")
                .and_then(|mut s| s.execute([]))
                .and_then(|_| self.conn.prepare_cached("RELEASE op")?.execute([]))
        };
        match end {
            Ok(_) => out,
            // The savepoint could not be ended: nothing of the batch can be trusted.
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(out.err().unwrap_or(e.into()))
            }
        }
    }

    /// One immediate transaction committed at once (namespace batching off, the gap after a
    /// batch, a group commit).
    fn transact_alone<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.begin()?;
        let out = f(&self.conn).and_then(|v| {
            self.commit_now()?;
            Ok(v)
        });
        if out.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        let out = out?;
        self.committed();
        Ok(out)
    }

    /// BEGIN IMMEDIATE, and note where the change counter stands: if another connection
    /// moved it since our last commit, that is a foreign change.
    fn begin(&mut self) -> Result<(), Errno> {
        begin_immediate(&self.conn)?;
        self.foreign_seq |= self.counter_moved();
        Ok(())
    }

    /// Whether the committed change counter is not where our own commits left it (or cannot
    /// be read); it becomes the new reference. Outside a transaction of ours, or at its start.
    fn counter_moved(&mut self) -> bool {
        match super::schema::change_seq(&self.conn) {
            Ok(Some(seq)) => {
                let moved = self.own_seq.is_some_and(|own| own != seq);
                self.own_seq = Some(seq);
                moved
            }
            Ok(None) | Err(_) => true,
        }
    }

    /// COMMIT the open transaction (failing with the injected fault, if any), remembering the
    /// change counter it leaves behind. On failure the caller rolls back.
    fn commit_now(&mut self) -> Result<(), Errno> {
        // A rollback follows a failure, as a failing disk would leave it.
        fault(&self.fault)?;
        let seq = super::schema::change_seq(&self.conn);
        self.conn.execute_batch("COMMIT")?;
        match seq {
            Ok(seq) => self.own_seq = seq,
            Err(_) => self.foreign_seq = true,
        }
        Ok(())
    }

    /// Whether another connection changed the filesystem's tables since the last call: a
    /// commit of its own that moved the change counter. Commits that leave the counter alone
    /// (Litestream's bookkeeping, `agentfs kv`) are not changes. Without a counter every
    /// call answers yes. The first call sets the baseline.
    pub fn foreign_change(&mut self) -> bool {
        let foreign = std::mem::take(&mut self.foreign_seq);
        // With a transaction of ours open nobody else can have committed since it began, and
        // `begin` compared the counter then.
        let moved = self.conn.is_autocommit() && self.counter_moved();
        foreign || moved
    }

    /// A transaction committed: it is not durable until a barrier or the durability window.
    fn committed(&mut self) {
        self.dirty = true;
        self.dirty_since.get_or_insert_with(Instant::now);
        self.failure.committed();
    }

    /// COMMIT the open batch (a no-op when none is open). On failure the batch is rolled back
    /// and remembered as lost (see [`Writer::lose_batch`]).
    pub fn commit(&mut self) -> Result<(), Errno> {
        if self.batch.is_none() {
            return Ok(());
        }
        match self.commit_now() {
            Ok(()) => {
                self.batch = None;
                self.open_flag.store(false, Ordering::Release);
                self.last_commit = Some(Instant::now());
                self.committed();
                Ok(())
            }
            Err(e) => {
                self.lose_batch(e);
                Err(e)
            }
        }
    }

    /// The open batch is gone: roll back what is left of it, record the sticky failure, tell
    /// the caches.
    fn lose_batch(&mut self, e: Errno) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        let ops = self.batch.take().map_or(0, |b| b.ops);
        self.open_flag.store(false, Ordering::Release);
        if let Some(hook) = &self.on_lost {
            hook();
        }
        self.failure.lost_ops(e, ops);
        // Again once the loss is recorded: an operation of the batch that finished after the
        // first clear may have updated a cached value in place, and it checks for a loss only
        // after doing so (Caches::entry_changed_at).
        if let Some(hook) = &self.on_lost {
            hook();
        }
    }

    /// A deferred operation failed after it was acknowledged: record it as lost work and
    /// drop what the caches may have learned from it (an operation that was refused because
    /// of an earlier loss is part of that loss).
    fn lose_deferred(&mut self, e: Errno) {
        self.failure.lost_ops(e, 1);
        if let Some(hook) = &self.on_lost {
            hook();
        }
    }

    /// The durability barrier: commit the open batch, then make every committed transaction
    /// durable with an fdatasync of the -wal file (or of the main file when there is no WAL).
    /// The caller holds the writer lock, so no commit races it. Skipped when provably nothing
    /// was committed since the last successful barrier (by this connection or another).
    /// Reports the sticky failure (a lost batch or group commit, a failed fdatasync), every
    /// time.
    pub fn sync(&mut self) -> Result<(), Errno> {
        let committed = self.commit();
        let version = data_version(&self.conn)?;
        if self.dirty || self.synced_version != Some(version) {
            self.sync_committed()?;
            self.synced_version = Some(version);
        }
        committed?;
        self.failure.check()
    }

    /// Make every committed transaction durable (the barrier's fdatasync; also run by the
    /// flusher when the durability window elapses). A failure is sticky: the kernel may have
    /// dropped the dirty pages it could not write, so a later fdatasync that succeeds proves
    /// nothing about them.
    fn sync_committed(&mut self) -> Result<(), Errno> {
        match fdatasync(&self.path, self.synced_wal) {
            Ok(id) => {
                if id.is_some() {
                    self.synced_wal = id;
                }
                self.dirty = false;
                self.dirty_since = None;
                Ok(())
            }
            Err(e) => {
                self.dirty_since = None;
                self.failure.lost_sync(e);
                Err(e)
            }
        }
    }
}

/// The test-only fault hook, the one place a COMMIT is made to fail: EIO while the file
/// `AGENTFS_FAULT_COMMIT` names (`trigger`) exists.
fn fault(trigger: &Option<PathBuf>) -> Result<(), Errno> {
    match trigger {
        Some(p) if p.exists() => Err(Errno::EIO),
        _ => Ok(()),
    }
}

/// fdatasync of the -wal file (plus an fsync of its directory when it is not `known`, the
/// file last synced), or of the main file when there is no -wal. Returns the -wal's identity.
fn fdatasync(db: &Path, known: Option<FileId>) -> Result<Option<FileId>, Errno> {
    let wal = wal_path(db);
    match File::open(&wal) {
        Ok(f) => {
            let md = f.metadata()?;
            f.sync_data()?;
            let id = (md.dev(), md.ino());
            if known != Some(id) {
                sync_parent_dir(db)?;
            }
            Ok(Some(id))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            File::open(db)?.sync_data()?;
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// WAL checkpoints off the commit path (`AGENTFS_WAL_CHECKPOINT_PAGES`). SQLite's automatic
/// checkpoint runs inside the COMMIT that crosses its threshold, on the committing thread: it
/// syncs the WAL, copies its pages into the database file and syncs that, while every other
/// writer waits for the lock. Here the writer's WAL hook only wakes a thread that runs a
/// PASSIVE checkpoint on a connection of its own (opened at its first wake) beside the next
/// commits; a PASSIVE checkpoint blocks neither writers nor readers. The WAL file starts over
/// only at a write that begins after a checkpoint copied all of it, which a thread racing a
/// busy writer rarely manages: at 4 times the threshold the committing writer checkpoints
/// itself (as SQLite would, but over the little the thread left), so the WAL stays bounded.
/// Durability is unchanged: a commit is durable by the WAL's sync at a barrier, whoever
/// copies it into the database later.
///
/// The same thread starts the disk writes of the WAL's new frames every
/// `AGENTFS_WAL_WRITEBACK_KIB` of them (sync_file_range, without waiting), so a long write's
/// frames reach the disk while the writer goes on and the barrier's sync, or the checkpoint's,
/// finds little left to write.
struct Checkpointer {
    shared: Arc<CkptShared>,
    thread: Option<JoinHandle<()>>,
}

/// The checkpoint threshold while space is low: SQLite's own.
const LOW_SPACE_PAGES: u64 = 1000;

/// What the writer's hook asks of the checkpoint thread.
#[derive(Default)]
struct CkptState {
    /// A PASSIVE checkpoint.
    checkpoint: bool,
    /// Start the writeback of the WAL's dirty pages.
    writeback: bool,
    /// End the thread.
    stop: bool,
}

struct CkptShared {
    state: Mutex<CkptState>,
    wake: Condvar,
    /// Held while the thread checkpoints.
    running: Mutex<()>,
    /// Whether Litestream has the checkpoints now.
    left: crate::replica::CheckpointsLeft,
    /// The writer's low-space flag (the space guard's).
    space_low: Arc<AtomicBool>,
}

impl Checkpointer {
    /// Start the thread and hook it to `conn`'s commits (which replaces SQLite's automatic
    /// checkpoint). None when the thread cannot start: SQLite's own checkpoint stays.
    fn start(
        conn: &mut Connection,
        db: &Path,
        pages: u64,
        space_low: Arc<AtomicBool>,
    ) -> rusqlite::Result<Option<Checkpointer>> {
        let shared = Arc::new(CkptShared {
            state: Mutex::new(CkptState::default()),
            wake: Condvar::new(),
            running: Mutex::new(()),
            left: crate::replica::CheckpointsLeft::new(db),
            space_low: space_low.clone(),
        });
        let (sh, path) = (shared.clone(), db.to_path_buf());
        let thread = match std::thread::Builder::new()
            .name("agentfs-wal".into())
            .spawn(move || {
                // Started before the server blocks them: a shutdown signal must never end
                // the process here.
                crate::sys::signals::block_shutdown_signals();
                checkpoint_loop(&path, &sh)
            }) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(
                    "no WAL checkpoint thread ({e}): checkpoints stay on the commit path"
                );
                return Ok(None);
            }
        };
        // Dropped (the thread stopped and joined) if the hook cannot be set.
        let started = Checkpointer {
            shared: shared.clone(),
            thread: Some(thread),
        };
        let sh = shared;
        // Frames of a 4 KiB page (and their 24-byte headers) between two writeback starts.
        let every = crate::knobs::get().wal_writeback_kib / 4;
        // The WAL's length (frames) at the last writeback start.
        let mut last_start = 0u64;
        conn.wal_hook(Some(
            move |wal: &mut rusqlite::hooks::Wal, n: std::ffi::c_int| {
                let n = u64::try_from(n).unwrap_or(0);
                if n < last_start {
                    // The WAL started over.
                    last_start = 0;
                }
                if every > 0 && n >= last_start + every {
                    last_start = n;
                    let mut st = sh.state.lock();
                    st.writeback = true;
                    sh.wake.notify_one();
                }
                // With little space left the WAL stays short, as SQLite's own threshold
                // would keep it: it holds the checkpoint's debt.
                let pages = if space_low.load(Ordering::Relaxed) {
                    pages.min(LOW_SPACE_PAGES)
                } else {
                    pages
                };
                let cap = pages.saturating_mul(4);
                if n >= cap {
                    // Not while the thread checkpoints (this one would only fail busy), nor
                    // once Litestream replicates the database (its WAL is Litestream's).
                    // Errors are not the commit's (it is done): the next commit tries again.
                    let running = sh.running.try_lock();
                    if let Some(_running) = running.filter(|_| !sh.left.get()) {
                        let done = checkpoint_gathered(&space_low, || {
                            wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE)
                        });
                        if let Err(e) = done {
                            tracing::warn!("WAL checkpoint at {n} pages failed: {e}");
                        }
                    }
                } else if n >= pages {
                    let mut st = sh.state.lock();
                    if !st.checkpoint {
                        st.checkpoint = true;
                        sh.wake.notify_one();
                    }
                }
                Ok(())
            },
        ))?;
        Ok(Some(started))
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run `checkpoint`, its copies gathered (`crate::sys::walvfs`) only while the space guard
/// (`space_low`, the writer's flag) sees room for what they add to the file.
fn checkpoint_gathered<T>(space_low: &AtomicBool, checkpoint: impl FnOnce() -> T) -> T {
    if space_low.load(Ordering::Relaxed) {
        checkpoint()
    } else {
        crate::sys::walvfs::gathered_checkpoint(checkpoint)
    }
}

/// The checkpoint thread: a writeback start or a PASSIVE checkpoint each time the writer's
/// hook asks, until told to stop. A database Litestream started replicating meanwhile is left
/// to it.
fn checkpoint_loop(db: &Path, sh: &CkptShared) {
    let mut conn = None;
    // The -wal file, opened at the first writeback (SQLite keeps the same file while the
    // database is open: it starts over by overwriting, not by a new file).
    let mut wal: Option<File> = None;
    loop {
        let (checkpoint, writeback) = {
            let mut st = sh.state.lock();
            while !st.checkpoint && !st.writeback && !st.stop {
                sh.wake.wait(&mut st);
            }
            if st.stop {
                return;
            }
            (
                std::mem::take(&mut st.checkpoint),
                std::mem::take(&mut st.writeback),
            )
        };
        if writeback {
            if wal.is_none() {
                wal = File::open(wal_path(db)).ok();
            }
            // Only a head start for the disk: the barrier's fdatasync stays the proof.
            if let Some(Err(e)) = wal.as_ref().map(crate::sys::writeback::start_writeback) {
                tracing::debug!("WAL writeback of {} not started: {e}", db.display());
            }
        }
        if !checkpoint || sh.left.get() {
            continue;
        }
        if conn.is_none() {
            match open_writer(db) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::warn!("WAL checkpoint thread: {}: {e}", db.display());
                    continue;
                }
            }
        }
        let Some(c) = &conn else { continue };
        let _running = sh.running.lock();
        let done = checkpoint_gathered(&sh.space_low, || {
            c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        });
        if let Err(e) = done {
            tracing::warn!("WAL checkpoint of {} failed: {e}", db.display());
        }
    }
}

/// An operation acknowledged before it ran (see [`WriterCell::defer`]).
pub type Deferred = Box<dyn FnOnce(&Connection) -> Result<(), Errno> + Send>;

/// The deferred operations, and whether the cell still takes any (not after shutdown began:
/// nothing would run them).
#[derive(Default)]
struct Queue {
    ops: VecDeque<Deferred>,
    closed: bool,
}

/// The writer behind its mutex, with the flusher that commits a batch when its window ends.
pub struct WriterCell {
    writer: Mutex<Writer>,
    /// Wakes the flusher: a batch was opened, an operation was deferred, or shutdown.
    wake: Condvar,
    /// Whether a batch transaction is open (readers then read through the writer).
    open: Arc<AtomicBool>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// Operations acknowledged before they ran, oldest first. Only a holder of the writer
    /// lock takes them out, and it runs every one before its own work ([`WriterCell::settle`]),
    /// so the database sees them in the order they were acknowledged, before anything after.
    deferred: Mutex<Queue>,
    /// Deferred operations not yet run: those in `deferred` and the one a settler has taken
    /// out and is running. Read without a lock by readers, which must not read the committed
    /// state around the writer while it is above zero.
    queued: AtomicUsize,
    /// Whether operations may be acknowledged before they commit at all (namespace batching).
    acks_early: bool,
    /// The space guard's low-space flag (nothing is acknowledged early while it is up).
    space_low: Arc<AtomicBool>,
}

impl WriterCell {
    /// Wrap `w`; with namespace batching or a durability window, start the flusher thread.
    pub fn new(w: Writer) -> std::io::Result<Arc<WriterCell>> {
        let batching = w.policy.is_some() || !w.sync_window.is_zero();
        let cell = Arc::new(WriterCell {
            open: w.open_flag.clone(),
            acks_early: w.policy.is_some(),
            space_low: w.space_low.clone(),
            writer: Mutex::new(w),
            wake: Condvar::new(),
            flusher: Mutex::new(None),
            deferred: Mutex::new(Queue::default()),
            queued: AtomicUsize::new(0),
        });
        if batching {
            let me = cell.clone();
            let h = std::thread::Builder::new()
                .name("ns-flusher".into())
                .spawn(move || {
                    crate::sys::signals::block_shutdown_signals();
                    me.flusher()
                })?;
            *cell.flusher.lock() = Some(h);
        }
        Ok(cell)
    }

    /// The writer, locked (for the barrier, the checkpoint, schema statements), with every
    /// deferred operation run.
    pub fn lock(&self) -> MutexGuard<'_, Writer> {
        let mut w = self.writer.lock();
        self.settle(&mut w);
        w
    }

    /// Run `f` as one atomic operation (see [`Writer::transact`]), after the deferred ones;
    /// then `after` with its outcome while the writer is still held, so no other change
    /// reaches the database in between (for caches that take what the transaction read after
    /// its changes).
    pub fn transact_then<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
        after: impl FnOnce(&Result<T, Errno>),
    ) -> Result<T, Errno> {
        let mut w = self.lock();
        let (out, opened) = w.transact(f);
        after(&out);
        drop(w);
        if opened {
            self.wake.notify_one();
        }
        out
    }

    /// Queue `op` to run as one atomic operation of the namespace batch later, on the flusher
    /// or before whatever uses the writer next; its caller acknowledges it now. Handed back
    /// when operations may not be acknowledged before they commit (no namespace batching, low
    /// space), `cap` operations are queued already or shutdown began: the caller then runs it
    /// itself.
    pub fn defer(&self, op: Deferred, cap: usize) -> Result<(), Deferred> {
        if !self.acks_early || self.space_low.load(Ordering::Relaxed) {
            return Err(op);
        }
        {
            let mut q = self.deferred.lock();
            if q.closed || q.ops.len() >= cap {
                return Err(op);
            }
            q.ops.push_back(op);
            self.queued.fetch_add(1, Ordering::AcqRel);
        }
        self.wake.notify_one();
        Ok(())
    }

    /// Run every deferred operation, oldest first, each as one atomic operation (see
    /// [`Writer::transact`]). One that fails was acknowledged already: it is counted as lost
    /// work (the sticky failure) and the caches are told, as for a lost batch. A batch
    /// transaction they open wakes the flusher, which commits it when its window ends.
    fn settle(&self, w: &mut Writer) {
        let mut opened = false;
        while self.queued.load(Ordering::Acquire) > 0 {
            let Some(op) = self.deferred.lock().ops.pop_front() else {
                break;
            };
            let (out, o) = w.transact(op);
            opened |= o;
            if let Err(e) = out {
                w.lose_deferred(e);
            }
            // Only now: a reader that finds nothing queued reads around the writer.
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        if opened {
            self.wake.notify_one();
        }
    }

    /// Run `f` as its own transaction after committing the open batch (a failed batch COMMIT is
    /// recorded as the sticky failure). For large units such as a group commit of WRITE data:
    /// as a savepoint of the batch, every page they change would be copied to the statement
    /// journal first.
    pub fn transact_alone<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.transact_alone_then(f, |_| ())
    }

    /// [`WriterCell::transact_alone`], then `after` with its outcome while the writer is still
    /// held (see [`WriterCell::transact_then`]).
    pub fn transact_alone_then<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
        after: impl FnOnce(&Result<T, Errno>),
    ) -> Result<T, Errno> {
        let mut w = self.lock();
        let _ = w.commit();
        let out = w.transact_alone(f);
        after(&out);
        out
    }

    /// While a batch transaction is open its operations are visible only to the writer
    /// connection: run the read `f` there. Hands `f` back when no batch is open (everything
    /// acknowledged is then committed, and a pooled reader sees it).
    pub fn read_if_open<T, F>(&self, f: F) -> Result<Result<T, Errno>, F>
    where
        F: FnOnce(&Connection) -> Result<T, Errno>,
    {
        // The queue first: a deferred operation opens the batch before it stops counting as
        // queued, so a reader that sees the count at zero sees the batch open (or committed).
        if self.queued.load(Ordering::Acquire) == 0 && !self.open.load(Ordering::Acquire) {
            return Err(f);
        }
        let mut w = self.lock();
        if w.batch.is_none() {
            return Err(f);
        }
        let out = f(&w.conn);
        if w.conn.is_autocommit() {
            let e = out.as_ref().err().copied().unwrap_or(Errno::EIO);
            w.lose_batch(e);
        }
        Ok(out)
    }

    /// The low-space flag the space guard raises (see [`crate::store::space`]).
    pub fn space_low(&self) -> Arc<AtomicBool> {
        self.writer.lock().space_low.clone()
    }

    /// Install the hook told when a batch is lost.
    pub fn set_lost_hook(&self, hook: LostHook) {
        self.writer.lock().on_lost = Some(hook);
    }

    /// Commit the open batch when its window has elapsed, and make committed work durable
    /// when the durability window has elapsed; sleep otherwise.
    fn flusher(&self) {
        let mut w = self.writer.lock();
        loop {
            if w.shutdown {
                return;
            }
            self.settle(&mut w);
            let now = Instant::now();
            let commit_due = match (&w.batch, w.policy) {
                (Some(b), Some(p)) => Some(b.since + p.window),
                _ => None,
            };
            let window = w.sync_window;
            let sync_due = w
                .dirty_since
                .filter(|_| !window.is_zero())
                .map(|t| t + window);
            match commit_due.into_iter().chain(sync_due).min() {
                // Nothing due: look again after a window (a commit may start one meanwhile).
                None if window.is_zero() => self.wake.wait(&mut w),
                None => {
                    self.wake.wait_for(&mut w, window);
                }
                Some(d) if d > now => {
                    self.wake.wait_until(&mut w, d);
                }
                Some(_) => {
                    if commit_due.is_some_and(|d| d <= now) {
                        // A failure is recorded as the sticky failure.
                        let _ = w.commit();
                    }
                    if sync_due.is_some_and(|d| d <= now) {
                        // A failure is recorded as the sticky failure.
                        let _ = w.sync_committed();
                    }
                }
            }
        }
    }

    /// Stop the flusher and commit the open batch (no barrier). Idempotent.
    pub fn shutdown(&self) -> Result<(), Errno> {
        // Closed first, so every operation deferred before is run below.
        self.deferred.lock().closed = true;
        let out = {
            let mut w = self.lock();
            w.shutdown = true;
            w.commit()
        };
        self.wake.notify_all();
        let h = self.flusher.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
        out
    }
}

/// BEGIN IMMEDIATE, waiting as long as another process holds the write lock: a busy
/// database is never an answer to a request. Each busy timeout that runs out is logged.
fn begin_immediate(conn: &Connection) -> rusqlite::Result<()> {
    loop {
        match conn.execute_batch("BEGIN IMMEDIATE") {
            Err(e) if crate::errno::is_busy(&e) => {
                tracing::warn!("another process holds the database's write lock; still waiting");
            }
            r => return r,
        }
    }
}

/// `PRAGMA data_version` of `c`: it moves with every commit another connection makes.
pub fn data_version(c: &Connection) -> rusqlite::Result<i64> {
    c.query_row("PRAGMA data_version", [], |r| r.get(0))
}

/// `<db>-wal`, the name SQLite gives the write-ahead log.
pub fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_os_string();
    s.push("-wal");
    PathBuf::from(s)
}

fn sync_parent_dir(db: &Path) -> Result<(), Errno> {
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Read-only connections checked out per call. The mutex guards only the idle list; a
/// checked-out connection is owned by one caller until its guard drops.
pub struct Pool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    pub fn new(path: &Path) -> Pool {
        Pool {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn checkout(&self) -> Result<Connection, Errno> {
        if let Some(c) = self.idle.lock().pop() {
            return Ok(c);
        }
        Ok(open(&self.path, true)?)
    }

    /// Close every idle connection (at shutdown, before the writer closes; and when the
    /// server is idle, to hand their page caches back: the next read opens one again).
    pub fn close_idle(&self) {
        let idle = std::mem::take(&mut *self.idle.lock());
        drop(idle);
    }

    fn checkin(&self, conn: Connection) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }

    /// Run `f` inside one read transaction (a consistent snapshot across its statements).
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T, Errno>) -> Result<T, Errno> {
        let mut conn = self.checkout()?;
        let out = (|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })();
        if conn.is_autocommit() {
            self.checkin(conn);
        }
        out
    }
}
