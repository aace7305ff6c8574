//! One server per database: an exclusive flock(2) on the database file, held for the life of
//! the mount. flock locks are independent of the fcntl locks SQLite uses, so offline readers and
//! writers (`agentfs fs`, `agentfs kv`) keep working while the database is mounted.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The held lock; released when dropped or when the process dies.
pub struct DbLock {
    _file: File,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path} is already mounted by agentfs server pid {pid}")]
    HeldBy { path: String, pid: u32 },
    #[error("{path} is already mounted by another agentfs server")]
    Held { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Take the server lock on `db`, or say who holds it.
pub fn lock_db(db: &Path) -> Result<DbLock, LockError> {
    let path = db.display().to_string();
    let file = File::open(db).map_err(|source| LockError::Io {
        path: path.clone(),
        source,
    })?;
    // SAFETY: flock on a valid fd owned by `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(DbLock { _file: file });
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(LockError::Io { path, source: err });
    }
    match holder_pid(db) {
        Some(pid) => Err(LockError::HeldBy { path, pid }),
        None => Err(LockError::Held { path }),
    }
}

/// The pid holding a FLOCK on `db`, from /proc/locks.
pub fn holder_pid(db: &Path) -> Option<u32> {
    let meta = std::fs::metadata(db).ok()?;
    // The device as /proc/locks prints it (major:minor in hex) with the inode: inode numbers
    // alone repeat across filesystems (every fresh tmpfs numbers its first file 2).
    let dev = meta.dev();
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    for line in locks.lines() {
        // "1: FLOCK  ADVISORY  WRITE 1234 00:2e:5678 0 EOF"
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        if f[5] == want {
            return f[4].parse().ok();
        }
    }
    None
}
