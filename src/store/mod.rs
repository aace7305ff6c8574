//! The store: the SPEC v0.5 schema on SQLite, the one authority for all filesystem state.
//!
//! Connections: one writer connection behind a mutex (every mutation is one atomic unit on it)
//! and a pool of read connections (WAL lets readers proceed while the writer commits). With
//! namespace batching (`AGENTFS_BATCH_NAMESPACE`, the default) mutations are savepoints of one
//! write transaction kept open for a short window; while it is open, reads run on the writer
//! connection so they see every acknowledged operation.
//! Durability: commits run with `synchronous=NORMAL`; [`Store::sync`] is the barrier that makes
//! every committed transaction durable (a real fdatasync of the WAL), see SPEC.md "Durability".
//! With batching on (`AGENTFS_BATCH`, the default) a WRITE is acknowledged from memory and
//! committed by group commit ([`batch`]); [`Store::fsync`] and [`Store::sync`] commit first.
//!
//! Lookup-reference lifecycle: the store does not count kernel references. Operations that can
//! drop an inode's last name (unlink, rmdir, rename over a target) ask a [`Liveness`] whether the
//! inode is still referenced by the kernel; if so its rows stay with nlink = 0 (an orphan) until
//! [`Store::reap`] is called after the last FORGET. Orphans left by a crash are reaped by
//! [`Store::reap_orphans`] when a mount starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cache::{self, CacheConfig, Caches, Listing, ListingEdit};
use crate::errno::Errno;

pub mod backup;
pub mod batch;
mod check;
mod conn;
mod copy;
mod data;
mod dir;
pub mod failure;
mod inode;
pub mod kv;
pub mod migrate;
mod namespace;
pub mod overlay;
pub mod progress;
pub mod repair;
mod schema;
pub mod space;
mod stat;
#[cfg(test)]
mod tests;
pub mod tools;
pub mod upper;
mod xattr;

pub use check::{Finding, QuickCheck};
pub use conn::{data_version, NamespaceBatch};
pub use dir::{COOKIE_DOT, COOKIE_DOTDOT};
pub use failure::Failure;
pub use namespace::NewKind;
pub use overlay::Effects;
pub use schema::{
    change_seq, USER_VERSION_V00, USER_VERSION_V02, USER_VERSION_V03, USER_VERSION_V04,
    USER_VERSION_V05,
};

/// An inode number; also the FUSE node id (the root is 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    pub const ROOT: Ino = Ino(1);
}

/// Seconds and nanoseconds since the epoch (ordered by time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// Attributes of one inode as stat(2) reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    /// Type and permission bits (S_IFMT | 07777).
    pub mode: u32,
    /// POSIX link count: for directories 2 + number of subdirectories.
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks allocated: inline bytes rounded up; for a chunked file
    /// min(stored rows x chunk_size, size) rounded up, so holes do not count.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub rdev: u32,
}

/// Who asks for a new inode: its owner, and the group unless the parent is setgid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// A time to set: the current time or an explicit one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

/// A SETATTR: each field present is changed; ctime is set to now whenever anything changes
/// unless `ctime` is given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits only (07777); the type never changes.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timespec>,
}

/// Flags of RENAME2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// One directory entry. `offset` is the cookie that resumes the listing after this entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub name: Vec<u8>,
    /// S_IFMT bits of the entry's mode.
    pub kind: u32,
    pub offset: u64,
}

/// The listing change of a new entry `name` of inode `a` whose fs_dentry.id is `id`.
fn added(a: &Attr, name: &[u8], id: i64) -> ListingEdit {
    ListingEdit::Added(DirEntry {
        ino: a.ino,
        name: name.to_vec(),
        kind: a.mode & libc::S_IFMT,
        offset: dir::cookie(id),
    })
}

/// Filesystem-wide numbers for statfs(2), computed without scanning tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// The layout recorded in fs_config; any SPEC v0.5 database's values are honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsConfig {
    pub chunk_size: u64,
    pub inline_threshold: u64,
}

/// Options of `agentfs init`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitOptions {
    pub chunk_size: u64,
    pub inline_threshold: u64,
    /// Owner of the root directory: whoever creates the database, so an ordinary user can
    /// write into a filesystem they made.
    pub root_owner: Caller,
}

impl Default for InitOptions {
    fn default() -> Self {
        let (uid, gid) = crate::sys::ids::effective();
        Self {
            chunk_size: 65536,
            inline_threshold: 4096,
            root_owner: Caller { uid, gid },
        }
    }
}

/// Whether the kernel still references an inode that just lost its last name.
pub trait Liveness: Sync {
    /// Return true to keep the inode's rows as an orphan (the caller then owes a
    /// [`Store::reap`] after the last FORGET); false to delete them in the same transaction.
    fn retain_orphan(&self, ino: Ino) -> bool;

    /// The same references, owned, for an operation that runs after its reply (see
    /// [`Store::unlink`]); None where there is no such handle (the operation then runs first).
    fn shared(&self) -> Option<Arc<dyn Liveness + Send>> {
        None
    }
}

/// No kernel references (offline use): every inode that loses its last name is deleted.
pub struct NoReferences;

impl Liveness for NoReferences {
    fn retain_orphan(&self, _: Ino) -> bool {
        false
    }
}

/// A running server holds the database (offline use while mounted): the kernel may reference
/// any inode, so every inode that loses its last name stays as an orphan, and the server
/// reaps it when it notices the change (see [`Store::orphans`]) or at its last FORGET.
pub struct ServerReaps;

impl Liveness for ServerReaps {
    fn retain_orphan(&self, _: Ino) -> bool {
        true
    }
}

/// Failures of opening or creating a database (the CLI prints them as one line).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: not an AgentFS database (not a SQLite file)")]
    NotSqlite { path: String },
    #[error("{path}: schema version {found} is older than 0.5; run `agentfs migrate {path}`")]
    OldSchema { path: String, found: String },
    #[error("{path}: unknown schema version {found}; this agentfs understands 0.5")]
    UnknownSchema { path: String, found: String },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
    #[error("{path}: the database is damaged (db_corrupt: {detail}); run `agentfs fsck {path}`, or mount it with -o ro to copy files out")]
    Corrupt { path: String, detail: String },
    #[error("{path} already exists")]
    Exists { path: String },
    #[error("{path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// The error code (src/errors.rs).
    pub fn code(&self) -> crate::errors::Code {
        use crate::errors::Code;
        match self {
            StoreError::NotSqlite { .. } | StoreError::Invalid { .. } => Code::NotADatabase,
            StoreError::OldSchema { .. } => Code::DbOldSchema,
            StoreError::UnknownSchema { .. } => Code::DbUnknownSchema,
            StoreError::Corrupt { .. } => Code::DbCorrupt,
            StoreError::Exists { .. } => Code::Exists,
            StoreError::Sqlite { source, .. } => Code::of_sqlite(source),
            StoreError::Io { source, .. } => Code::of_io(source),
        }
    }

    /// The database it concerns.
    pub fn path(&self) -> &str {
        match self {
            StoreError::NotSqlite { path }
            | StoreError::OldSchema { path, .. }
            | StoreError::UnknownSchema { path, .. }
            | StoreError::Invalid { path, .. }
            | StoreError::Corrupt { path, .. }
            | StoreError::Exists { path }
            | StoreError::Sqlite { path, .. }
            | StoreError::Io { path, .. } => path,
        }
    }
}

/// The SQLite side of [`batch::Durability`]: a group commit is one transaction on the writer
/// connection; the barrier is [`conn::Writer::sync`] (a real fdatasync of the WAL).
pub struct SqliteDurability {
    config: FsConfig,
    writer: Arc<conn::WriterCell>,
    /// The store's caches: a commit changes the stored size, times and blocks of its inodes.
    caches: Arc<Caches>,
}

impl batch::Durability for SqliteDurability {
    /// Its own transaction, after the open namespace batch commits (so transactions keep the
    /// order in which operations were answered). The attribute cache is told before the
    /// batcher drops the committed bytes from the pending map, so a reader merging pending
    /// state never pairs a stale cached size with a map that no longer holds the bytes: an
    /// inode whose attributes it held gets them as the transaction read them after writing
    /// (with the writer still held, so no later change is overwritten), the others' go.
    fn commit_batch(&self, batch: &[Arc<batch::InodeBatch>]) -> Result<(), Errno> {
        let tx = |c: &rusqlite::Connection| {
            let mut fresh = Vec::with_capacity(batch.len());
            for b in batch {
                apply(c, &self.config, b)?;
                let m = match self.caches.attr(b.ino) {
                    Some(_) => inode::meta_opt(c, b.ino)?,
                    None => None,
                };
                fresh.push(m.map(|m| inode::attr(c, &self.config, &m)).transpose()?);
            }
            Ok(fresh)
        };
        let learn = |out: &Result<Vec<Option<Attr>>, Errno>| {
            for b in batch {
                self.caches.inode_changed(b.ino);
            }
            for a in out.iter().flatten().flatten() {
                self.caches.put_committed(*a);
            }
        };
        self.writer.transact_alone_then(tx, learn).map(|_| ())
    }

    fn barrier(&self) -> Result<(), Errno> {
        self.writer.lock().sync()
    }
}

/// Write all of a batch's bytes (false: the inode is gone, nothing written).
fn apply(c: &rusqlite::Connection, cfg: &FsConfig, b: &batch::InodeBatch) -> Result<bool, Errno> {
    let pieces: Vec<(u64, &[u8])> = b.extents.iter().collect();
    put(c, cfg, b, &pieces)
}

/// Write `pieces` (all or part of `b`'s bytes) after `b`'s truncate to zero, if it carries
/// one, in the caller's transaction (false: the inode is gone, nothing written).
fn put(
    c: &rusqlite::Connection,
    cfg: &FsConfig,
    b: &batch::InodeBatch,
    pieces: &[(u64, &[u8])],
) -> Result<bool, Errno> {
    if let Some(t) = b.cut {
        match data::truncate(c, cfg, b.ino, 0, t) {
            Ok(()) => {}
            Err(e) if e == Errno::ENOENT || e == Errno::EISDIR || e == Errno::EINVAL => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
    }
    data::write_extents(c, cfg, b.ino, pieces, b.mtime, b.ctime)
}

/// The pieces of `b` below `size` (truncate trims the dead range instead of writing it).
fn pieces_below(b: &batch::InodeBatch, size: u64) -> Vec<(u64, &[u8])> {
    b.extents
        .iter()
        .filter(|(o, _)| *o < size)
        .map(|(o, d)| (o, &d[..d.len().min((size - o) as usize)]))
        .collect()
}

/// The pieces of `b` outside [lo, hi) (a punched hole drops the pending bytes it covers).
fn pieces_outside(b: &batch::InodeBatch, lo: u64, hi: u64) -> Vec<(u64, &[u8])> {
    let mut out = Vec::new();
    for (o, d) in b.extents.iter() {
        let e = o + d.len() as u64;
        if e <= lo || o >= hi {
            out.push((o, d));
            continue;
        }
        if o < lo {
            out.push((o, &d[..(lo - o) as usize]));
        }
        if e > hi {
            out.push((hi, &d[(hi - o) as usize..]));
        }
    }
    out
}

/// Fold pending writes into attributes read from the database: the size grows to the last
/// pending byte, mtime is the last write's, ctime at least the last write's.
fn merge_attr(a: &mut Attr, v: Option<batch::AttrView>) {
    let Some(v) = v else {
        return;
    };
    if a.mode & libc::S_IFMT != libc::S_IFREG {
        return;
    }
    if v.cut {
        // Truncated to zero since: nothing stored counts.
        a.size = 0;
        a.blocks = 0;
    }
    a.size = a.size.max(v.end);
    if let Some(m) = v.mtime {
        a.mtime = m;
    }
    a.ctime = a.ctime.max(v.ctime);
    let stored = a.blocks.saturating_mul(512);
    a.blocks = a
        .blocks
        .max(stored.saturating_add(v.bytes).min(a.size).div_ceil(512));
}

/// A name (parent directory, name) that resolves differently after an external change.
pub type ChangedName = (Ino, Vec<u8>);

/// Optimistic attempts of a reader before it reads with the pending map locked.
const OPTIMISTIC_TRIES: usize = 3;

/// An open database. `Send + Sync`: share it through an `Arc`.
///
/// Lock order: a batch claim ([`batch::Batcher::claim`], taken in ascending inode order)
/// before the writer mutex; the writer mutex, then (briefly, never while waiting on SQLite)
/// the pool's idle list. The batcher's state lock may be held while waiting for the writer (a
/// reader's locked fallback reads through the writer while a namespace batch is open), so
/// nothing holding the writer mutex may take the batcher's state lock. No store lock is held while a [`Liveness`] is consulted except the writer mutex, so a
/// `Liveness` must not call back into the store.
pub struct Store {
    path: PathBuf,
    config: FsConfig,
    /// The one writer connection (`None` for a read-only open). Holding its mutex is the right
    /// to write: every mutation is one atomic unit under it (its own transaction, or a
    /// savepoint of the open namespace batch), and [`Store::sync`] holds it so no commit races
    /// the barrier. Shared with the batcher's [`SqliteDurability`].
    writer: Option<Arc<conn::WriterCell>>,
    /// The write batcher (`None`: read-only, or `AGENTFS_BATCH=0`: one transaction per WRITE).
    batch: Option<Arc<batch::Batcher<SqliteDurability>>>,
    /// Read-only connections for lookups, attribute and data reads.
    readers: conn::Pool,
    /// Whether fs_xattr exists (a read-only open of a foreign database may lack it).
    xattrs: bool,
    /// Refuses growth into the space reserved for deletions (`None` on a read-only open).
    space: Option<space::SpaceGuard>,
    /// Whether WRITE stamps mtime/ctime. False while the kernel's writeback cache keeps them:
    /// it then sends its own times with SETATTR, and a WRITE arriving after that must not
    /// move them (a cache drop would otherwise show a different mtime).
    write_times: std::sync::atomic::AtomicBool,
    /// Attribute, lookup and listing caches (see [`crate::cache`]). Every mutation method
    /// invalidates what it changed after its transaction and before it returns.
    caches: Arc<Caches>,
    /// What [`Store::external_change`] saw last.
    watch: Mutex<Watch>,
    /// The sticky failure: once a commit lost acknowledged work, every mutation is refused
    /// with its errno and every barrier reports it (see [`Failure`]).
    failure: Arc<Failure>,
}

/// What the external-change watcher saw last: `PRAGMA data_version` (on the writer's
/// connection, whose own commits never change it; on a read-only open on `conn`), and on a
/// read-only open the change counter.
#[derive(Default)]
struct Watch {
    version: Option<i64>,
    conn: Option<rusqlite::Connection>,
    seq: Option<i64>,
}

impl Store {
    /// Create a new database at `path` with the SPEC schema, config rows and root inode.
    /// Fails with `Exists` if the file exists, `Invalid` for a chunk_size that is not a power
    /// of two in 512..=1 MiB or an inline_threshold above chunk_size.
    pub fn create(path: &Path, opts: &InitOptions) -> Result<(), StoreError> {
        schema::create(path, opts)
    }

    /// SQLite's quick check of the file at `path` within `budget` (see [`QuickCheck`]);
    /// [`StoreError::Corrupt`] when it finds damage.
    pub fn quick_check(path: &Path, budget: std::time::Duration) -> Result<QuickCheck, StoreError> {
        let out = check::quick_check(path, budget).map_err(|source| StoreError::Sqlite {
            path: path.display().to_string(),
            source,
        })?;
        match out {
            QuickCheck::Damaged(detail) => Err(StoreError::Corrupt {
                path: path.display().to_string(),
                detail,
            }),
            other => Ok(other),
        }
    }

    /// Open an existing v0.5 database. Refuses non-SQLite files (`NotSqlite`), older schemas
    /// (`OldSchema`, naming `agentfs migrate`) and unknown versions (`UnknownSchema`) without
    /// modifying them. Honours the chunk_size and inline_threshold recorded in fs_config.
    /// A writable open switches the file to WAL and adds missing extension objects.
    pub fn open(path: &Path, readonly: bool) -> Result<Store, StoreError> {
        let k = crate::knobs::get();
        let batching = k.batch.then(|| batch::BatchConfig::from_knobs(k));
        let namespace = conn::NamespaceBatch::from_knobs(k);
        Self::open_with(
            path,
            readonly,
            batching,
            namespace,
            CacheConfig::from_knobs(k),
        )
    }

    /// [`Store::open`] with explicit batching policies and cache capacities: `batching` for
    /// WRITE data (`None`: one transaction per write), `namespace` for every mutation (`None`:
    /// each commits at once).
    pub fn open_with(
        path: &Path,
        readonly: bool,
        batching: Option<batch::BatchConfig>,
        namespace: Option<NamespaceBatch>,
        caching: CacheConfig,
    ) -> Result<Store, StoreError> {
        let caches = Arc::new(Caches::new(caching));
        let failure = Arc::new(Failure::default());
        caches.set_journal(failure.clone());
        let config = schema::inspect(path)?;
        let sqlite = |source| StoreError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        let writer = if readonly {
            None
        } else {
            let w = conn::Writer::open(path, namespace, failure.clone()).map_err(sqlite)?;
            // SQLite opens a file it may not write read-only without a word; every write would
            // then fail after the mount (or the sandbox's command) had started.
            if w.conn().is_readonly(rusqlite::MAIN_DB).map_err(sqlite)? {
                return Err(StoreError::Io {
                    path: path.display().to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        "not writable by this process (SQLite could only open it read-only); \
                         give it write permission, or mount it with -o ro",
                    ),
                });
            }
            schema::ensure_extensions(w.conn()).map_err(sqlite)?;
            let w = conn::WriterCell::new(w).map_err(|source| StoreError::Io {
                path: path.display().to_string(),
                source,
            })?;
            // A lost namespace batch undoes operations whose effects the caches may hold.
            let c = caches.clone();
            w.set_lost_hook(Arc::new(move || c.clear()));
            Some(w)
        };
        let space = writer
            .as_ref()
            .map(|w| space::SpaceGuard::new(path, crate::knobs::get(), w.space_low()));
        let batch = match (&writer, batching) {
            (Some(w), Some(cfg)) => {
                let b = batch::Batcher::new(
                    SqliteDurability {
                        config,
                        writer: w.clone(),
                        caches: caches.clone(),
                    },
                    cfg,
                    failure.clone(),
                );
                b.start().map_err(|source| StoreError::Io {
                    path: path.display().to_string(),
                    source,
                })?;
                Some(b)
            }
            _ => None,
        };
        let readers = conn::Pool::new(path);
        let xattrs = readers
            .read(|c| Ok(schema::has_xattr_table(c)?))
            .map_err(|e| StoreError::Io {
                path: path.display().to_string(),
                source: std::io::Error::from_raw_os_error(e.0),
            })?;
        Ok(Store {
            path: path.to_path_buf(),
            config,
            writer,
            batch,
            readers,
            xattrs,
            space,
            write_times: std::sync::atomic::AtomicBool::new(true),
            caches,
            failure,
            watch: Mutex::new(Watch::default()),
        })
    }

    /// Let the kernel own mtime/ctime of written files (the FUSE writeback cache is on).
    pub fn set_kernel_owns_write_times(&self, kernel: bool) {
        self.write_times
            .store(!kernel, std::sync::atomic::Ordering::Relaxed);
    }

    /// The time a WRITE stamps, or None when the kernel keeps the times.
    fn write_stamp(&self) -> Option<Timespec> {
        self.write_times
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(inode::now)
    }

    /// Whether writes are batched.
    pub fn batching(&self) -> bool {
        self.batch.is_some()
    }

    /// Acknowledged bytes not yet committed.
    pub fn pending_bytes(&self) -> u64 {
        self.batch.as_ref().map_or(0, |b| b.pending_bytes())
    }

    /// The layout recorded in fs_config.
    pub fn config(&self) -> FsConfig {
        self.config
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sticky failure of this store (what a failed commit lost).
    pub fn failure(&self) -> &Arc<Failure> {
        &self.failure
    }

    /// One write transaction (EROFS on a read-only open; the sticky errno after a failed
    /// commit lost acknowledged work). The space guard sees every one (an operation that grows
    /// the database has been admitted as such before).
    fn write_tx<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.write_tx_then(f, |_| ())
    }

    /// [`Store::write_tx`], then `after` with its outcome while the writer is still held
    /// ([`conn::WriterCell::transact_then`]).
    fn write_tx_then<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, Errno>,
        after: impl FnOnce(&Result<T, Errno>),
    ) -> Result<T, Errno> {
        let w = self.writer.as_ref().ok_or(Errno::EROFS)?;
        self.admit(space::Need::Free)?;
        w.transact_then(f, after)
    }

    /// Ask the space guard for room (ENOSPC when `need` would take the reserve); it also
    /// decides whether operations may be acknowledged before they commit.
    fn admit(&self, need: space::Need) -> Result<(), Errno> {
        match &self.space {
            Some(g) => g.admit(need, self.pending_bytes(), self),
            None => Ok(()),
        }
    }

    /// Whether space is low: nothing may be acknowledged before it is committed.
    fn space_low(&self) -> bool {
        self.space.as_ref().is_some_and(|g| g.is_low())
    }

    /// SQLite's page figures of the committed database.
    pub fn pages(&self) -> Result<space::DbPages, Errno> {
        self.readers.read(space::DbPages::read)
    }

    /// Hand free pages back to the filesystem when they are at least `min_percent` of the
    /// database (`PRAGMA incremental_vacuum`, up to `max` pages, all with None;
    /// `auto_vacuum=INCREMENTAL` databases only), then fold the WAL into the main file and
    /// truncate it, so the file shrinks. Returns how many pages were handed back.
    pub fn give_back(&self, max: Option<u64>, min_percent: u64) -> Result<u64, Errno> {
        let before = self.pages()?;
        let pct = min_percent;
        if self.writer.is_none()
            || !before.incremental
            || before.free == 0
            || before.free_percent() < pct
        {
            return Ok(0);
        }
        if let Some(w) = &self.writer {
            let mut w = w.lock();
            w.commit()?;
            let sql = match max {
                Some(n) => format!("PRAGMA incremental_vacuum({n})"),
                None => "PRAGMA incremental_vacuum".to_string(),
            };
            let mut st = w.conn().prepare(&sql)?;
            let mut rows = st.query([])?;
            while rows.next()?.is_some() {}
        }
        self.checkpoint()?;
        let after = self.pages()?;
        let handed = before.free.saturating_sub(after.free);
        tracing::info!(
            "handed {handed} free pages back to the filesystem ({} left)",
            after.free
        );
        Ok(handed)
    }

    /// An idle server's give-back: the caches shrink to an eighth of their capacity, idle
    /// read connections close (with their page caches) and the writer frees the pages its
    /// cache holds; the next requests fill them again.
    pub fn release_memory(&self) -> Result<(), Errno> {
        self.caches.shrink(8);
        self.readers.close_idle();
        if let Some(w) = &self.writer {
            w.lock().conn().execute_batch("PRAGMA shrink_memory")?;
        }
        Ok(())
    }

    /// Bytes the attribute, lookup and listing caches hold.
    pub fn cache_bytes(&self) -> u64 {
        let (a, l, d) = self.caches.weights();
        (a + l + d) as u64
    }

    /// One read transaction on a pooled read connection; while a namespace batch is open, on
    /// the writer connection instead, so every acknowledged operation is visible.
    fn read_tx<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let f = match &self.writer {
            Some(w) => match w.read_if_open(f) {
                Ok(out) => return out,
                Err(f) => f,
            },
            None => f,
        };
        self.readers.read(f)
    }

    /// Commit the open namespace batch now (no barrier).
    #[cfg(test)]
    pub fn commit_namespace_batch(&self) -> Result<(), Errno> {
        match &self.writer {
            Some(w) => w.lock().commit(),
            None => Ok(()),
        }
    }

    /// Set a pragma on the writer connection (fault injection).
    #[cfg(test)]
    pub fn writer_pragma(&self, name: &str, value: &str) -> Result<(), Errno> {
        if let Some(w) = &self.writer {
            w.lock().conn().pragma_update(None, name, value)?;
        }
        Ok(())
    }

    /// Read attributes from the database and fold pending writes into them, consistently:
    /// if bytes left the pending map during the database read, try again, and in the end read
    /// with the map locked.
    fn with_pending_attrs<T>(
        &self,
        read: impl Fn() -> Result<T, Errno>,
        attrs: impl Fn(&mut T) -> Vec<&mut Attr>,
    ) -> Result<T, Errno> {
        let Some(b) = &self.batch else {
            return read();
        };
        for _ in 0..OPTIMISTIC_TRIES {
            let v0 = b.version();
            let mut out = read()?;
            let (v1, ok) = b.view(|view| {
                for a in attrs(&mut out) {
                    merge_attr(a, view.attr(a.ino));
                }
            });
            let () = ok;
            if v0 == v1 {
                return Ok(out);
            }
        }
        b.locked(|view| {
            let mut out = read()?;
            for a in attrs(&mut out) {
                merge_attr(a, view.attr(a.ino));
            }
            Ok(out)
        })
    }

    /// The entry `name` in directory `parent`: ENOENT, ENOTDIR (parent), ENAMETOOLONG.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        self.with_pending_attrs(|| self.stored_lookup(parent, name), |a| vec![a])
    }

    /// [`Store::lookup`] before pending writes are merged: from the caches when they know the
    /// name (and, for a positive entry, the child's attributes), else from the database.
    fn stored_lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        if name == b"." || name == b".." {
            return self.read_tx(|c| dir::lookup(c, &self.config, parent, name));
        }
        match self.caches.lookup(parent, name) {
            Some(None) => return Err(Errno::ENOENT),
            Some(Some(child)) => {
                if let Ok(a) = self.stored_attr(child) {
                    return Ok(a);
                }
            }
            None => {}
        }
        let t = self.caches.ticket();
        let found = self.read_tx(|c| match dir::child(c, parent, name)? {
            Some(child) => Ok(Some(inode::attr_of(c, &self.config, child)?)),
            None => Ok(None),
        })?;
        self.caches
            .put_lookup(&t, parent, name, found.map(|a| a.ino));
        let a = found.ok_or(Errno::ENOENT)?;
        self.caches.put_attr(&t, a);
        Ok(a)
    }

    /// An inode's attributes (orphans included); ENOENT if it does not exist. Pending writes
    /// count (size, times).
    pub fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        self.with_pending_attrs(|| self.stored_attr(ino), |a| vec![a])
    }

    /// Attributes as stored (pending writes not merged), from the cache or the database.
    fn stored_attr(&self, ino: Ino) -> Result<Attr, Errno> {
        if let Some(a) = self.caches.attr(ino) {
            return Ok(a);
        }
        let t = self.caches.ticket();
        let a = self.read_tx(|c| inode::attr_of(c, &self.config, ino))?;
        self.caches.put_attr(&t, a);
        Ok(a)
    }

    /// The cached listing of `dir`, loaded whole on a miss (names, inode numbers and types
    /// only). None when listings are not cached or the directory has more entries than the
    /// cache may hold.
    fn cached_listing(&self, dir: Ino) -> Result<Option<Arc<Listing>>, Errno> {
        let Some(limit) = self.caches.listing_limit() else {
            return Ok(None);
        };
        if let Some(l) = self.caches.listing(dir) {
            return Ok(Some(l));
        }
        let t = self.caches.ticket();
        let mut entries = self.read_tx(|c| dir::names(c, dir, 0, limit.saturating_add(1)))?;
        if entries.len() > limit {
            self.caches.put_listing(&t, dir, Arc::new(Listing::TooBig));
            return Ok(None);
        }
        entries.shrink_to_fit();
        let l = Arc::new(Listing::Entries(entries));
        self.caches.put_listing(&t, dir, l.clone());
        Ok(Some(l))
    }

    /// Up to `max` entries of `dir`'s cached listing after cookie `offset`; None when the
    /// listing is not cached (see [`Store::cached_listing`]).
    fn cached_page(
        &self,
        dir: Ino,
        offset: u64,
        max: usize,
    ) -> Result<Option<Vec<DirEntry>>, Errno> {
        Ok(self.cached_listing(dir)?.and_then(|l| match &*l {
            Listing::Entries(entries) => Some(cache::page(entries, offset, max)),
            Listing::TooBig => None,
        }))
    }

    /// A page of `dir`'s listing with stored attributes: from the caches when the listing and
    /// every attribute on the page are there, else the page read whole from the database in
    /// one snapshot (its attributes then cached). A directory's first READDIRPLUS so costs
    /// the attributes of one page, not of every entry (the kernel lists the rest with READDIR
    /// when nothing looks the entries up).
    fn page_plus(&self, dir: Ino, offset: u64, max: usize) -> Result<Vec<(DirEntry, Attr)>, Errno> {
        if let Some(page) = self.cached_page(dir, offset, max)? {
            let cached: Option<Vec<_>> = page
                .into_iter()
                .map(|e| self.caches.attr(e.ino).map(|a| (e, a)))
                .collect();
            if let Some(out) = cached {
                return Ok(out);
            }
        }
        let t = self.caches.ticket();
        let out = self.read_tx(|c| dir::list_plus(c, &self.config, dir, offset, max))?;
        for (_, a) in &out {
            self.caches.put_attr(&t, *a);
        }
        Ok(out)
    }

    /// Drop every cached value (another process changed the database, or a transaction whose
    /// effects the caches may have seen was rolled back). Never needed for correctness after
    /// the store's own mutations: each invalidates what it changed.
    pub fn invalidate_all(&self) {
        self.caches.clear();
    }

    /// Whether another connection (another process: `agentfs fs`, `kv`, a foreign tool)
    /// committed to the database since the last call, by `PRAGMA data_version` on a
    /// connection whose own commits do not count. On a change every cache is dropped and the
    /// names the caches held that now resolve differently are returned (parent, name), so the
    /// kernel can be told; names the caches did not hold are not found. The first call only
    /// records the version.
    pub fn external_change(&self) -> Result<Option<Vec<ChangedName>>, Errno> {
        let mut watch = self.watch.lock();
        let watch = &mut *watch;
        let first = watch.version.is_none();
        let changed = match &self.writer {
            Some(w) => {
                let mut w = w.lock();
                let version = conn::data_version(w.conn())?;
                // Asked at the baseline too: its first call sets the counter's reference.
                watch.version.replace(version) != Some(version) && w.foreign_change()
            }
            None => {
                let c = match &mut watch.conn {
                    Some(c) => c,
                    None => watch.conn.insert(conn::open(&self.path, true)?),
                };
                let version = conn::data_version(c)?;
                // Every commit is another process's here; only those that moved the counter
                // changed the filesystem (no counter: all of them may have).
                watch.version.replace(version) != Some(version) && {
                    let seq = schema::change_seq(c)?;
                    let before = std::mem::replace(&mut watch.seq, seq);
                    seq.is_none() || seq != before
                }
            }
        };
        if first || !changed {
            return Ok(None);
        }
        let names = self.caches.cached_names();
        self.caches.clear();
        let changed = self.read_tx(|c| {
            let mut out = Vec::new();
            for (parent, name, was) in names {
                let now = match inode::dentry(c, parent, &name) {
                    Ok(d) => d.map(|d| d.1),
                    Err(_) => None,
                };
                if now != was {
                    out.push((parent, name));
                }
            }
            Ok(out)
        })?;
        Ok(Some(changed))
    }

    /// Claim the pending bytes of `inos` (ascending, each once), run `f` with them in one
    /// write transaction, then finish the claims: committed if `f` succeeded and wrote them
    /// (`commits` says which it writes), put back otherwise. The attributes of `inos` are
    /// invalidated.
    fn with_claims<T>(
        &self,
        inos: &[Ino],
        commits: impl Fn(&batch::InodeBatch) -> bool,
        clear_mtime: bool,
        f: impl FnOnce(&rusqlite::Connection, &[Arc<batch::InodeBatch>]) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.with_claims_keeping(inos, commits, clear_mtime, f, |_| None)
    }

    /// [`Store::with_claims`] whose transaction may answer the attributes of one of `inos` as
    /// it left them (`keep`): the caches take those instead of dropping them, with the writer
    /// still held, so no later change is overwritten.
    fn with_claims_keeping<T>(
        &self,
        inos: &[Ino],
        commits: impl Fn(&batch::InodeBatch) -> bool,
        clear_mtime: bool,
        f: impl FnOnce(&rusqlite::Connection, &[Arc<batch::InodeBatch>]) -> Result<T, Errno>,
        keep: impl FnOnce(&T) -> Option<Attr>,
    ) -> Result<T, Errno> {
        // Before the claimed bytes leave the pending map (see SqliteDurability::commit_batch).
        let changed = |out: &Result<T, Errno>| {
            for ino in inos {
                self.caches.inode_changed(*ino);
            }
            if let Some(a) = out.as_ref().ok().and_then(keep) {
                self.caches.put_committed(a);
            }
        };
        let Some(b) = &self.batch else {
            return self.write_tx_then(|c| f(c, &[]), changed);
        };
        let mut sorted = inos.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let claims: Vec<_> = sorted.iter().filter_map(|i| b.claim(*i)).collect();
        let out = self.write_tx_then(|c| f(c, &claims), changed);
        for cl in &claims {
            let how = if out.is_ok() && commits(cl) {
                batch::Finish::Committed
            } else {
                batch::Finish::Restore {
                    clear_mtime: out.is_ok() && clear_mtime,
                }
            };
            b.finish(cl, how);
        }
        out
    }

    /// Change the fields present in `set` in one transaction. A size change truncates or
    /// extends (EISDIR on directories, EINVAL on other non-regular files) and sets mtime;
    /// ctime becomes `set.ctime` or now whenever anything is set. Pending writes of the inode
    /// are committed in the same transaction when the size changes (trimmed to the new size),
    /// and kept pending otherwise (an explicit mtime then wins over theirs).
    /// A truncate to zero of a regular file (size and times only) is pending instead, and
    /// commits with the bytes written after it (see [`batch::Batcher::truncate_to_zero`]).
    /// Pending bytes carrying such a truncate are always committed.
    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr, Errno> {
        if let Some(a) = self.truncate_to_zero(ino, set)? {
            return Ok(a);
        }
        self.setattr_now(ino, set)
    }

    /// [`Store::setattr`] in the operation's own atomic unit, a truncate to zero included (an
    /// overlay's partial-origin file, whose chunk ownership was just committed for the new
    /// size).
    pub fn setattr_now(&self, ino: Ino, set: &SetAttr) -> Result<Attr, Errno> {
        let cfg = &self.config;
        let sized = set.size.is_some();
        let commits = |b: &batch::InodeBatch| sized || b.cut.is_some();
        let v0 = self.pending_version();
        let tx = |c: &rusqlite::Connection, claims: &[Arc<batch::InodeBatch>]| {
            for b in claims {
                match set.size {
                    Some(size) => put(c, cfg, b, &pieces_below(b, size))?,
                    None if b.cut.is_some() => apply(c, cfg, b)?,
                    None => false,
                };
            }
            stat::setattr(c, cfg, ino, set, inode::now())
        };
        // The stored attributes as the transaction left them (a chmod, chown or utimes of a
        // file just written keeps them cached for the listings that follow); a size change
        // drops them, since bytes it committed leave the pending map only afterwards.
        let keep = |a: &Attr| (!sized).then_some(*a);
        let a = self.with_claims_keeping(&[ino], commits, set.mtime.is_some(), tx, keep)?;
        self.answer(ino, v0, a)
    }

    /// The version of the pending map (0 without batching), taken before a transaction whose
    /// attributes [`Store::answer`] will answer.
    fn pending_version(&self) -> u64 {
        self.batch.as_ref().map_or(0, |b| b.version())
    }

    /// The attributes an operation on `ino` answers, given those its transaction returned (`a`)
    /// and the pending map's version before it began (`v0`): the pending writes folded in, as
    /// every reader does after its database read. If bytes left the map since `v0` (committed,
    /// by this operation's claim or by the committer), `a` may miss them and answer a stale
    /// size, which the kernel may keep: then the answer is read again.
    fn answer(&self, ino: Ino, v0: u64, mut a: Attr) -> Result<Attr, Errno> {
        let Some(b) = &self.batch else {
            return Ok(a);
        };
        let (v1, ()) = b.view(|view| merge_attr(&mut a, view.attr(ino)));
        if v1 == v0 {
            return Ok(a);
        }
        self.getattr(ino)
    }

    /// [`Store::setattr`] of size 0 (and times) on a regular file with batching on: the
    /// truncate joins the pending state. `None` when `set` is not such a truncate.
    fn truncate_to_zero(&self, ino: Ino, set: &SetAttr) -> Result<Option<Attr>, Errno> {
        let Some(b) = self.batch.as_ref() else {
            return Ok(None);
        };
        let only_size =
            set.mode.is_none() && set.uid.is_none() && set.gid.is_none() && set.atime.is_none();
        if set.size != Some(0) || !only_size || self.writer.is_none() {
            return Ok(None);
        }
        if self.stored_attr(ino)?.mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(None);
        }
        self.failure.check()?;
        let now = inode::now();
        let mtime = stat::resolve_time(set.mtime.unwrap_or(TimeSet::Now), now)?;
        let ctime = set.ctime.unwrap_or(now);
        b.truncate_to_zero(ino, mtime, ctime);
        // Read the answer after the cut is registered, the way every reader does: the
        // committer (or an fsync) may commit the cut at once, and attributes read before it
        // would then answer the old size, which the kernel keeps as the file's.
        self.getattr(ino).map(Some)
    }

    /// A symlink's target; EINVAL if `ino` is not a symlink.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        self.read_tx(|c| namespace::readlink(c, ino))
    }

    /// Create a regular or special file (`mode` carries S_IFMT; 0 means regular). EEXIST if
    /// the name exists, EINVAL for directories/symlinks (use mkdir/symlink).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Attr, Errno> {
        let kind = namespace::NewKind::Node { mode, rdev };
        self.create_fx(parent, name, kind, caller, &Effects::NONE)
    }

    /// Create an inode of any kind, with whiteout changes in the same transaction.
    pub fn create_fx(
        &self,
        parent: Ino,
        name: &[u8],
        kind: NewKind<'_>,
        caller: Caller,
        fx: &Effects<'_>,
    ) -> Result<Attr, Errno> {
        let payload = match kind {
            NewKind::Symlink { target } => target.len(),
            _ => 0,
        };
        self.admit(space::Need::op(name.len() + payload))?;
        // A new subdirectory moves the parent's link count; a file, node or symlink only its
        // times (an unnamed file not even those).
        let links = match kind {
            NewKind::Node { .. } | NewKind::Symlink { .. } => Some(0),
            NewKind::Dir { .. } => Some(1),
            NewKind::Tmpfile { .. } => None,
        };
        let clears = self.caches.clears();
        let out = self.write_tx(|c| {
            let now = inode::now();
            let made = namespace::create(c, &self.config, parent, name, kind, caller, now)?;
            overlay::apply_effects(c, fx, now)?;
            Ok((made, now))
        });
        let (a, id, now, links) = match (out, links) {
            (Ok(((a, Some(id)), now)), Some(links)) => (a, id, now, links),
            (out, _) => {
                self.names_changed(&[(parent, name)], None);
                return out.map(|((a, _), _)| a);
            }
        };
        self.caches
            .entry_changed_at(parent, name, now, links, added(&a, name, id));
        if links == 0 {
            self.caches.put_bare(a.ino, clears);
        }
        if !name.is_empty() {
            self.caches.put_created(parent, name, &a);
        }
        Ok(a)
    }

    /// Tell the caches that `names` (directory, name) came, went or changed: `times` when
    /// each directory's only change is its mtime and ctime, set to that time (a name of a
    /// non-directory), None when more may have changed (a subdirectory's, a failed operation).
    fn names_changed(&self, names: &[(Ino, &[u8])], times: Option<Timespec>) {
        for &(parent, name) in names {
            match times {
                Some(t) => self
                    .caches
                    .entry_changed_at(parent, name, t, 0, ListingEdit::Unknown),
                None => self.caches.entry_changed(parent, name),
            }
        }
    }

    /// Create an unnamed regular file (O_TMPFILE) with permission bits `perm`: nlink 0, so it
    /// is an orphan from birth; the group follows `parent` as for a named file.
    pub fn tmpfile(&self, parent: Ino, perm: u32, caller: Caller) -> Result<Attr, Errno> {
        let kind = namespace::NewKind::Tmpfile { perm };
        self.write_tx(|c| {
            namespace::create(c, &self.config, parent, b"", kind, caller, inode::now())
                .map(|(a, _)| a)
        })
    }

    /// Create a directory (inherits S_ISGID and the group from a setgid parent).
    pub fn mkdir(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        caller: Caller,
    ) -> Result<Attr, Errno> {
        let kind = namespace::NewKind::Dir { perm: mode };
        self.create_fx(parent, name, kind, caller, &Effects::NONE)
    }

    /// Create a symlink to `target` (stored verbatim, never followed here).
    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Attr, Errno> {
        let kind = namespace::NewKind::Symlink { target };
        self.create_fx(parent, name, kind, caller, &Effects::NONE)
    }

    /// A new name for `ino`; EPERM on directories, ENOENT for an unlinked inode other than a
    /// regular file (the kernel sends LINK of one only for an O_TMPFILE file).
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr, Errno> {
        self.link_fx(ino, newparent, newname, &Effects::NONE)
    }

    /// [`Store::link`] with whiteout changes in the same transaction.
    pub fn link_fx(
        &self,
        ino: Ino,
        newparent: Ino,
        newname: &[u8],
        fx: &Effects<'_>,
    ) -> Result<Attr, Errno> {
        self.admit(space::Need::op(newname.len()))?;
        let cfg = &self.config;
        let v0 = self.pending_version();
        let out = self.with_claims(
            &[ino],
            |_| true,
            false,
            |c, claims| {
                // First, so the attributes the link answers include the committed bytes.
                commit_claims(c, cfg, claims)?;
                let now = inode::now();
                let a = namespace::link(c, cfg, ino, newparent, newname, now)?;
                overlay::apply_effects(c, fx, now)?;
                Ok((a, now))
            },
        );
        let ((a, id), now) = match out {
            Ok(out) => out,
            Err(e) => {
                self.names_changed(&[(newparent, newname)], None);
                self.caches.inode_changed(ino);
                return Err(e);
            }
        };
        let edit = added(&a, newname, id);
        self.caches
            .entry_changed_at(newparent, newname, now, 0, edit);
        self.caches.inode_changed(ino);
        self.answer(ino, v0, a)
    }

    /// The inodes `names` (parent, name) resolve to now, for an operation on those names to
    /// claim their pending state (see [`commit_claims`]). Names that do not resolve are left
    /// out; with nothing pending nothing is looked up.
    fn named(&self, names: &[(Ino, &[u8])]) -> Vec<Ino> {
        if self.batch.as_ref().is_none_or(|b| b.is_idle()) {
            return Vec::new();
        }
        names
            .iter()
            .filter_map(|&(parent, name)| match self.caches.lookup(parent, name) {
                Some(found) => found,
                None => self.read_tx(|c| dir::child(c, parent, name)).ok().flatten(),
            })
            .collect()
    }

    /// Drop the pending bytes of an inode a transaction just deleted.
    fn discard_dead(&self, dead: impl IntoIterator<Item = Ino>) {
        if let Some(b) = &self.batch {
            for ino in dead {
                b.discard(ino);
            }
        }
    }

    /// Remove a non-directory name (EISDIR on directories). If it was the last name, `live`
    /// decides inside the transaction whether the rows stay as an orphan. Returns the inode
    /// when it keeps other names (a hard link lost one).
    pub fn unlink(
        &self,
        parent: Ino,
        name: &[u8],
        live: &dyn Liveness,
    ) -> Result<Option<Ino>, Errno> {
        if let Some(kept) = self.remove_later(parent, name, None, live) {
            return Ok(kept);
        }
        self.remove_fx(parent, name, false, live, &Effects::NONE)
    }

    /// Acknowledge an unlink or rmdir before it runs, when the caches know everything its
    /// answer depends on: the name's inode, its type, for a non-directory its link count and
    /// that it has no pending bytes, for a directory that its listing holds nothing but "."
    /// and "..". The caches take the change at once; the statements run later as one
    /// operation of the namespace batch, in order, on the flusher (the other CPU) or before
    /// whatever touches the database next ([`conn::WriterCell::defer`]), so the unlinks of a
    /// directory's files queued before its rmdir run first. Whether the rows of a last name
    /// go or stay as an orphan is decided when they run, by the references the kernel holds
    /// then. Another process may have changed the name meanwhile, or put an entry into the
    /// directory: then the name no longer leads to that inode, or the directory is not empty,
    /// and nothing is removed. Returns the answer (the inode when it keeps other names), None
    /// when the operation must run now.
    ///
    /// `rmdir`: None for an unlink, Some for an rmdir with the path whose children's
    /// whiteouts go too ([`Store::rmdir_clearing`]).
    fn remove_later(
        &self,
        parent: Ino,
        name: &[u8],
        rmdir: Option<Option<&[u8]>>,
        live: &dyn Liveness,
    ) -> Option<Option<Ino>> {
        let dir = rmdir.is_some();
        let cap = crate::knobs::get().batch_unlink_queue;
        let w = self.writer.as_ref()?;
        if cap == 0 || self.failure.check().is_err() {
            return None;
        }
        let ino = self.caches.lookup(parent, name)??;
        let a = self.caches.attr(ino)?;
        let known = match dir {
            false => a.nlink >= 1 && a.mode & libc::S_IFMT != libc::S_IFDIR,
            true => a.mode & libc::S_IFMT == libc::S_IFDIR && self.caches.empty_dir(ino),
        };
        let pending = self
            .batch
            .as_ref()
            .is_some_and(|b| b.view(|v| v.attr(ino).is_some()).1);
        if !known || pending {
            return None;
        }
        let live = live.shared()?;
        let now = inode::now();
        let batch = self.batch.clone();
        let owned = name.to_vec();
        let clear = rmdir.flatten().map(<[u8]>::to_vec);
        let op: conn::Deferred = Box::new(move |c| {
            let Some(found) = inode::dentry(c, parent, &owned)?.filter(|&(_, i)| i == ino) else {
                return Ok(());
            };
            let removed = match namespace::remove_found(c, parent, found, dir, &*live, now) {
                Err(Errno::ENOTEMPTY) => return Ok(()),
                removed => removed?,
            };
            let fx = Effects {
                clear_children: clear.as_deref(),
                ..Effects::NONE
            };
            overlay::apply_effects(c, &fx, now)?;
            if let (true, Some(b)) = (removed.deleted, &batch) {
                b.discard(ino);
            }
            Ok(())
        });
        if w.defer(op, usize::try_from(cap).unwrap_or(usize::MAX))
            .is_err()
        {
            return None;
        }
        self.name_removed(parent, name, ino, dir, now);
        Some((!dir && a.nlink > 1).then_some(ino))
    }

    /// Tell the caches that `name` of `parent`, which led to `ino`, went at `now`: the
    /// directory's times and listing follow, and its link count for a subdirectory; what the
    /// caches held of `ino` goes.
    fn name_removed(&self, parent: Ino, name: &[u8], ino: Ino, dir: bool, now: Timespec) {
        let links = if dir { -1 } else { 0 };
        let edit = ListingEdit::Removed(ino);
        self.caches.entry_changed_at(parent, name, now, links, edit);
        self.forget_inodes([ino]);
    }

    /// Invalidate the cached attributes, marks and listings of inodes a mutation changed or
    /// deleted.
    fn forget_inodes(&self, inos: impl IntoIterator<Item = Ino>) {
        for ino in inos {
            self.caches.xattrs_changed(ino);
            self.caches.dir_changed(ino);
        }
    }

    /// Remove an empty directory: ENOTEMPTY, ENOTDIR, EINVAL for ".".
    pub fn rmdir(&self, parent: Ino, name: &[u8], live: &dyn Liveness) -> Result<(), Errno> {
        self.rmdir_clearing(parent, name, None, live)
    }

    /// [`Store::rmdir`] of an overlay directory the base does not have: the whiteouts stored
    /// for names below its path `clear` (if any) go with it.
    pub fn rmdir_clearing(
        &self,
        parent: Ino,
        name: &[u8],
        clear: Option<&[u8]>,
        live: &dyn Liveness,
    ) -> Result<(), Errno> {
        if self.remove_later(parent, name, Some(clear), live).is_some() {
            return Ok(());
        }
        let fx = Effects {
            clear_children: clear,
            ..Effects::NONE
        };
        self.remove_fx(parent, name, true, live, &fx).map(|_| ())
    }

    /// unlink (`dir` false) or rmdir, with whiteout changes in the same transaction. Returns
    /// the inode when it is a non-directory that keeps other names.
    pub fn remove_fx(
        &self,
        parent: Ino,
        name: &[u8],
        dir: bool,
        live: &dyn Liveness,
        fx: &Effects<'_>,
    ) -> Result<Option<Ino>, Errno> {
        let involved = self.named(&[(parent, name)]);
        let cfg = &self.config;
        let out = self.with_claims(
            &involved,
            |_| true,
            false,
            |c, claims| {
                let now = inode::now();
                let removed = namespace::remove(c, parent, name, dir, live, now)?;
                overlay::apply_effects(c, fx, now)?;
                commit_claims(c, cfg, claims)?;
                Ok((removed, now))
            },
        );
        let removed = match out {
            Ok((removed, now)) => {
                self.name_removed(parent, name, removed.ino, dir, now);
                removed
            }
            Err(e) => {
                self.names_changed(&[(parent, name)], None);
                return Err(e);
            }
        };
        self.discard_dead(removed.deleted.then_some(removed.ino));
        Ok(removed.keeps_names.then_some(removed.ino))
    }

    /// rename/RENAME2 with the POSIX rules: same inode is a no-op; ENOTEMPTY, ENOTDIR, EISDIR
    /// for incompatible targets; EINVAL for moving a directory below itself or both flags;
    /// `noreplace` EEXIST; `exchange` swaps two existing entries atomically (ENOENT).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        live: &dyn Liveness,
    ) -> Result<(), Errno> {
        let none = &Effects::NONE;
        self.rename_fx(parent, name, newparent, newname, flags, live, none)
    }

    /// [`Store::rename`] with whiteout changes in the same transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn rename_fx(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        live: &dyn Liveness,
        fx: &Effects<'_>,
    ) -> Result<(), Errno> {
        let involved = self.named(&[(parent, name), (newparent, newname)]);
        let cfg = &self.config;
        let out = self.with_claims(
            &involved,
            |_| true,
            false,
            |c, claims| {
                let now = inode::now();
                let moved = inode::dentry(c, parent, name).ok().flatten().map(|d| d.1);
                let victim = inode::dentry(c, newparent, newname)
                    .ok()
                    .flatten()
                    .map(|d| d.1);
                let times_only =
                    namespace::rename(c, parent, name, newparent, newname, flags, live, now)?;
                overlay::apply_effects(c, fx, now)?;
                commit_claims(c, cfg, claims)?;
                Ok((moved, victim, gone(c, victim)?, times_only.then_some(now)))
            },
        );
        let times = out.as_ref().ok().and_then(|(.., times)| *times);
        self.names_changed(&[(parent, name), (newparent, newname)], times);
        // A moved directory's ".." changed; both inodes' ctime (and the victim's nlink).
        let (moved, victim, dead, _) = out?;
        self.forget_inodes([moved, victim].into_iter().flatten());
        self.discard_dead(dead);
        Ok(())
    }

    /// Delete the rows of each of `inos` whose nlink is 0 (the others are left alone), all in
    /// one transaction; call after the last FORGET.
    pub fn reap(&self, inos: &[Ino]) -> Result<(), Errno> {
        if inos.is_empty() {
            return Ok(());
        }
        let tx = |c: &rusqlite::Connection| {
            let mut dead = Vec::with_capacity(inos.len());
            for &ino in inos {
                if namespace::reap(c, ino)? {
                    dead.push(ino);
                }
            }
            Ok(dead)
        };
        // It finishes an unlink the database already holds, so it runs also after a failed
        // commit (the orphan would otherwise outlive the mount).
        let out = match (&self.writer, self.failure.check()) {
            (Some(w), Err(_)) => w.transact_alone(tx),
            _ => self.write_tx(tx),
        };
        self.forget_inodes(inos.iter().copied());
        self.discard_dead(out?);
        Ok(())
    }

    /// Every orphan (nlink 0, never the root) as committed: a running server reaps those the
    /// kernel does not reference after another process removed names (`agentfs fs rm`).
    pub fn orphans(&self) -> Result<Vec<Ino>, Errno> {
        self.read_tx(namespace::orphans)
    }

    /// Delete every inode with nlink 0 (never the root); for mount start. Returns the count.
    pub fn reap_orphans(&self) -> Result<u64, Errno> {
        let out = self.write_tx(namespace::reap_orphans);
        self.invalidate_all();
        out
    }

    /// Up to `size` bytes at `offset`: short at EOF, holes read as zeros; EISDIR on
    /// directories, EINVAL on other non-regular files. atime is not updated.
    /// Pending writes (of this and every other writer) are visible at once.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let len = u64::from(size);
        let cfg = &self.config;
        let Some(b) = &self.batch else {
            return self.read_tx(|c| data::read(c, cfg, ino, offset, len));
        };
        let merged = |view: Option<batch::ReadView>| -> Result<Vec<u8>, Errno> {
            let Some(view) = view else {
                return self.read_tx(|c| data::read(c, cfg, ino, offset, len));
            };
            let mut buf = if view.cut {
                // Truncated to zero since the stored contents: only pending bytes count.
                let end = offset.saturating_add(len).min(view.end);
                let len = usize::try_from(end.saturating_sub(offset)).map_err(|_| Errno::EFBIG)?;
                crate::memory::pool::buffers().zeroed(len)
            } else {
                self.read_tx(|c| data::read_sized(c, cfg, ino, offset, len, view.end))?
            };
            for layer in &view.layers {
                layer.overlay(offset, &mut buf);
            }
            Ok(buf)
        };
        for _ in 0..OPTIMISTIC_TRIES {
            let (v0, view) = b.view(|v| v.read(ino, offset, len));
            let none = view.is_none();
            let buf = merged(view)?;
            // With nothing pending there is nothing the database read could contradict.
            if none || b.version() == v0 {
                return Ok(buf);
            }
        }
        b.locked(|v| merged(v.read(ino, offset, len)))
    }

    /// Write `data` at `offset`; extends the size, sets mtime and ctime. Batched: acknowledged
    /// once in the pending map (it may wait for the committer when the cap is reached).
    /// Unbatched: one transaction. Refused with the sticky errno after a failed commit.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let n = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let cfg = &self.config;
        self.admit(space::Need::Grow(u64::from(n)))?;
        match &self.batch {
            Some(b) if !self.space_low() => {
                offset
                    .checked_add(data.len() as u64)
                    .filter(|e| *e <= inode::MAX_FILE_SIZE)
                    .ok_or(Errno::EFBIG)?;
                self.failure.check()?;
                b.write(ino, offset, data, self.write_stamp());
                Ok(n)
            }
            // Little space left: the WRITE commits before its reply (with the inode's pending
            // bytes first), so ENOSPC reaches it.
            Some(_) => self.with_claims(
                &[ino],
                |_| true,
                false,
                |c, claims| {
                    commit_claims(c, cfg, claims)?;
                    data::write(c, cfg, ino, offset, data, self.write_stamp())
                },
            ),
            None => {
                let out =
                    self.write_tx(|c| data::write(c, cfg, ino, offset, data, self.write_stamp()));
                self.caches.inode_changed(ino);
                out
            }
        }
    }

    /// fallocate: mode 0 (extend size), KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE; else EOPNOTSUPP.
    /// Pending writes are committed in the same transaction (minus a punched range).
    pub fn fallocate(&self, ino: Ino, offset: u64, length: u64, mode: u32) -> Result<(), Errno> {
        let cfg = &self.config;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE as u32 != 0;
        if !punch {
            self.admit(space::Need::op(0))?;
        }
        // The reservation itself checks the bytes it stores against the free space, less the
        // reserve kept for deletions (a partial-origin or inline file reserves nothing).
        let reserve = crate::knobs::get().space_reserve_mib << 20;
        let free = crate::sys::space::host_space(self.path())
            .map(|(free, _)| free.saturating_sub(reserve));
        self.with_claims(
            &[ino],
            |_| true,
            false,
            |c, claims| {
                for b in claims {
                    let pieces = if punch {
                        pieces_outside(b, offset, offset.saturating_add(length))
                    } else {
                        b.extents.iter().collect()
                    };
                    put(c, cfg, b, &pieces)?;
                    // Punched-out pending bytes still extended the file: the size keeps their end.
                    let end = b.extents.iter().map(|(o, d)| o + d.len() as u64).max();
                    if let Some(end) = end {
                        data::extend_to(c, cfg, b.ino, end, inode::now())?;
                    }
                }
                data::fallocate(c, cfg, ino, offset, length, mode, free)
            },
        )
    }

    /// Commit `ino`'s pending writes now (no barrier).
    fn commit_inode(&self, ino: Ino) -> Result<(), Errno> {
        if self.batch.is_none() {
            return Ok(());
        }
        let cfg = &self.config;
        self.with_claims(
            &[ino],
            |_| true,
            false,
            |c, claims| commit_claims(c, cfg, claims),
        )
    }

    /// SEEK_DATA / SEEK_HOLE; ENXIO at or past EOF (or no data after `offset`). Pending writes
    /// of the inode are committed first, so the chunk map is exact.
    pub fn lseek(&self, ino: Ino, offset: u64, whence: u32) -> Result<u64, Errno> {
        self.commit_inode(ino)?;
        self.read_tx(|c| data::lseek(c, &self.config, ino, offset, whence))
    }

    /// Copy bytes between regular files in one transaction; short at the input's EOF.
    /// EINVAL for overlapping ranges within one file.
    pub fn copy_file_range(
        &self,
        ino_in: Ino,
        off_in: u64,
        ino_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let cfg = &self.config;
        self.admit(space::Need::Grow(len))?;
        self.with_claims(
            &[ino_in, ino_out],
            |_| true,
            false,
            |c, claims| {
                commit_claims(c, cfg, claims)?;
                data::copy_range(
                    c,
                    &self.config,
                    ino_in,
                    off_in,
                    ino_out,
                    off_out,
                    len,
                    inode::now(),
                )
            },
        )
    }

    /// The durability barrier for everything: commits every pending write, then returns after
    /// everything committed is on stable storage (an fdatasync of the -wal file, or of the main
    /// file when there is no WAL). syncfs and unmount call this. Reports a failed background
    /// commit not reported by an earlier `sync`. A no-op on a read-only open.
    pub fn sync(&self) -> Result<(), Errno> {
        if let Some(b) = &self.batch {
            return b.sync_all();
        }
        match &self.writer {
            Some(w) => w.lock().sync(),
            None => Ok(()),
        }
    }

    /// fsync/fdatasync of one inode: commits its pending writes, then the same barrier as
    /// [`Store::sync`] (which also makes every other committed transaction durable). Reports a
    /// failed background commit of this inode not reported by an earlier fsync.
    pub fn fsync(&self, ino: Ino) -> Result<(), Errno> {
        if let Some(b) = &self.batch {
            return b.fsync(ino);
        }
        self.sync()
    }

    /// Up to `max_entries` entries after cookie `offset` ("." and ".." first).
    pub fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        max_entries: usize,
    ) -> Result<Vec<DirEntry>, Errno> {
        match self.cached_page(ino, offset, max_entries)? {
            Some(page) => Ok(page),
            None => self.read_tx(|c| dir::names(c, ino, offset, max_entries)),
        }
    }

    /// readdir plus each entry's attributes.
    pub fn readdirplus(
        &self,
        ino: Ino,
        offset: u64,
        max_entries: usize,
    ) -> Result<Vec<(DirEntry, Attr)>, Errno> {
        self.with_pending_attrs(
            || self.page_plus(ino, offset, max_entries),
            |v| v.iter_mut().map(|(_, a)| a).collect(),
        )
    }

    /// Filesystem numbers from SQLite page counts, the inode sequence and the host filesystem;
    /// never scans a table.
    pub fn statfs(&self) -> Result<StatFs, Errno> {
        self.read_tx(|c| stat::statfs(c, &self.path))
    }

    /// Set an attribute: XATTR_CREATE → EEXIST, XATTR_REPLACE → ENODATA, names over 255
    /// bytes → ERANGE, values over 64 KiB → E2BIG.
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno> {
        self.admit(space::Need::op(name.len() + value.len()))?;
        let out = self.write_tx(|c| xattr::set(c, ino, name, value, flags, inode::now()));
        self.caches.xattrs_changed(ino);
        out
    }

    /// An attribute's value; ENODATA if absent.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if !self.xattrs {
            self.getattr(ino)?;
            return Err(Errno::ENODATA);
        }
        if self.caches.bare(ino) {
            // A mark goes with its inode (forget_inodes), so the inode exists.
            xattr::check_name(name)?;
            return Err(Errno::ENODATA);
        }
        self.read_tx(|c| xattr::get(c, ino, name))
    }

    /// Every attribute name, each NUL-terminated.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        if !self.xattrs || self.caches.bare(ino) {
            self.getattr(ino)?;
            return Ok(Vec::new());
        }
        self.read_tx(|c| xattr::list(c, ino))
    }

    /// Remove an attribute; ENODATA if absent.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<(), Errno> {
        let out = self.write_tx(|c| xattr::remove(c, ino, name, inode::now()));
        self.caches.xattrs_changed(ino);
        out
    }

    /// Resolve an absolute path without following symlinks (for `agentfs fs`).
    pub fn resolve(&self, path: &[u8]) -> Result<Ino, Errno> {
        self.read_tx(|c| dir::resolve(c, path))
    }

    /// Fold the WAL into the main file and truncate it (clean unmount); so a copy of the main
    /// file alone is complete. A no-op on a read-only open; while the database is replicated
    /// it only commits, and the checkpoint is left to Litestream (AGENTFS_REPLICA_LEAVE_CHECKPOINTS).
    pub fn checkpoint(&self) -> Result<(), Errno> {
        let Some(w) = &self.writer else {
            return Ok(());
        };
        let mut w = w.lock();
        w.commit()?;
        if crate::replica::leaves_checkpoints(&self.path) {
            return Ok(());
        }
        if w.checkpoint_truncate()? {
            return Err(Errno::EBUSY);
        }
        Ok(())
    }

    /// Run the consistency checker (after committing pending writes); each [`Finding`] names its rule (the rule names are
    /// listed in SPEC.md "Consistency rules").
    pub fn check(&self) -> Result<Vec<Finding>, Errno> {
        if let Some(b) = &self.batch {
            b.flush_all()?;
        }
        self.read_tx(|c| check::check(c, &self.config))
    }
}

impl Drop for Store {
    /// Stop the committer and commit what is pending (without a barrier: unmount has already
    /// called [`Store::sync`]; an offline tool calls it itself).
    fn drop(&mut self) {
        if let Some(b) = &self.batch {
            if let Err(e) = b.shutdown() {
                tracing::error!("committing pending writes at close failed: {e}");
            }
        }
        if let Some(w) = &self.writer {
            if let Err(e) = w.shutdown() {
                tracing::error!("committing batched operations at close failed: {e}");
            }
        }
        // The read-only connections close first: SQLite folds the WAL into the main file and
        // deletes the -wal and -shm files only when the last connection to close can write,
        // so the writer (dropped with the fields below) must be that one.
        self.readers.close_idle();
        self.watch.lock().conn = None;
    }
}

/// Commit claimed pending state in the caller's transaction. In a namespace operation the
/// operation then never commits ahead of the data acknowledged before it for the inodes it
/// names: a file renamed or linked into place holds its contents in the same commit (SPEC.md
/// "Durability", "Order"). After a rename or unlink, an inode the operation deleted is skipped.
fn commit_claims(
    c: &rusqlite::Connection,
    cfg: &FsConfig,
    claims: &[Arc<batch::InodeBatch>],
) -> Result<(), Errno> {
    for b in claims {
        apply(c, cfg, b)?;
    }
    Ok(())
}

/// `victim` if the transaction deleted it (so its pending bytes must go).
fn gone(c: &rusqlite::Connection, victim: Option<Ino>) -> Result<Option<Ino>, Errno> {
    match victim {
        Some(i) if inode::meta_opt(c, i)?.is_none() => Ok(Some(i)),
        _ => Ok(None),
    }
}

impl space::Figures for Store {
    fn pages(&self) -> Result<space::DbPages, Errno> {
        Store::pages(self)
    }

    fn reclaim(&self) {
        if let Err(e) = self.give_back(None, 0).and_then(|_| self.checkpoint()) {
            tracing::debug!("handing space back before refusing a write: {e}");
        }
    }
}
