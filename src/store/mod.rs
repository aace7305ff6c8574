//! The store: the SPEC v0.5 schema on SQLite, the one authority for all filesystem state.
//!
//! Connections: one writer connection behind a mutex (every mutation is one transaction on it)
//! and a pool of read connections (WAL lets readers proceed while the writer commits).
//! Durability: commits run with `synchronous=NORMAL`; [`Store::sync`] is the barrier that makes
//! every committed transaction durable (a real fdatasync of the WAL), see SPEC.md "Durability".
//!
//! Lookup-reference lifecycle: the store does not count kernel references. Operations that can
//! drop an inode's last name (unlink, rmdir, rename over a target) ask a [`Liveness`] whether the
//! inode is still referenced by the kernel; if so its rows stay with nlink = 0 (an orphan) until
//! [`Store::reap`] is called after the last FORGET. Orphans left by a crash are reaped by
//! [`Store::reap_orphans`] when a mount starts.

use std::path::Path;

use crate::errno::Errno;

/// An inode number; also the FUSE node id (the root is 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    pub const ROOT: Ino = Ino(1);
}

/// Seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
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
    /// 512-byte blocks allocated (whole stored chunks; inline bytes rounded up).
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
}

impl Default for InitOptions {
    fn default() -> Self {
        Self {
            chunk_size: 65536,
            inline_threshold: 4096,
        }
    }
}

/// Whether the kernel still references an inode that just lost its last name.
pub trait Liveness: Sync {
    /// Return true to keep the inode's rows as an orphan (the caller then owes a
    /// [`Store::reap`] after the last FORGET); false to delete them in the same transaction.
    fn retain_orphan(&self, ino: Ino) -> bool;
}

/// No kernel references (offline use): every inode that loses its last name is deleted.
pub struct NoReferences;

impl Liveness for NoReferences {
    fn retain_orphan(&self, _: Ino) -> bool {
        false
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

/// An open database.
pub struct Store {
    _private: (),
}

impl Store {
    /// Create a new database at `path` with the SPEC schema, config rows and root inode.
    /// Fails with `Exists` if the file exists.
    pub fn create(path: &Path, opts: &InitOptions) -> Result<(), StoreError> {
        let _ = (path, opts);
        todo!()
    }

    /// Open an existing v0.5 database. Refuses non-SQLite files and other schema versions.
    pub fn open(path: &Path, readonly: bool) -> Result<Store, StoreError> {
        let _ = (path, readonly);
        todo!()
    }

    pub fn config(&self) -> FsConfig {
        todo!()
    }
}
