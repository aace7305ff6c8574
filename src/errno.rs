//! The one mapping from internal failures to the errno a caller sees.

use std::fmt;

/// A filesystem answer: a positive errno value (`libc::ENOENT`, ...).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const EINTR: Errno = Errno(libc::EINTR);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);

    /// The errno of the last failed libc call.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({}: {})",
            self.0,
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// SQLite result codes are mapped deliberately, here only:
/// * SQLITE_FULL: ENOSPC (the database's filesystem is full).
/// * SQLITE_CORRUPT, SQLITE_NOTADB: EIO, logged as damage (`agentfs fsck` reports it).
/// * SQLITE_CONSTRAINT: EIO, logged. The one constraint an operation may legitimately hit, a
///   duplicate name, is turned into EEXIST where names are inserted; any other violation is
///   a broken invariant, not an answer for the caller.
/// * SQLITE_BUSY, SQLITE_LOCKED: EBUSY. The server's writer waits for the lock instead (see
///   `store::conn`), so this reaches only offline commands, after the busy timeout.
/// * SQLITE_READONLY: EROFS; SQLITE_TOOBIG: EFBIG; SQLITE_NOMEM: ENOMEM; SQLITE_INTERRUPT:
///   EINTR; anything else EIO, logged.
impl From<rusqlite::Error> for Errno {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ffi::ErrorCode as C;
        match &e {
            rusqlite::Error::QueryReturnedNoRows => Errno::ENOENT,
            rusqlite::Error::SqliteFailure(f, _) => match f.code {
                C::DiskFull => Errno::ENOSPC,
                C::DatabaseBusy | C::DatabaseLocked => Errno::EBUSY,
                C::ReadOnly => Errno::EROFS,
                C::TooBig => Errno::EFBIG,
                C::OutOfMemory => Errno::ENOMEM,
                C::OperationInterrupted => Errno::EINTR,
                C::DatabaseCorrupt | C::NotADatabase => {
                    tracing::error!("the database is damaged ({e}); run `agentfs fsck` on it");
                    Errno::EIO
                }
                C::ConstraintViolation => {
                    tracing::error!("a database constraint was violated, answered EIO: {e}");
                    Errno::EIO
                }
                _ => {
                    tracing::error!("sqlite failure mapped to EIO: {e}");
                    Errno::EIO
                }
            },
            _ => {
                tracing::error!("sqlite error mapped to EIO: {e}");
                Errno::EIO
            }
        }
    }
}

/// Whether `e` is SQLITE_BUSY or SQLITE_LOCKED (the busy timeout ran out).
pub fn is_busy(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi::ErrorCode as C;
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, C::DatabaseBusy | C::DatabaseLocked))
}

#[cfg(test)]
mod tests {
    use super::Errno;
    use rusqlite::ffi;

    fn sqlite(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), None)
    }

    #[test]
    fn sqlite_codes_map_deliberately() {
        let cases = [
            (ffi::SQLITE_FULL, Errno::ENOSPC),
            (ffi::SQLITE_CORRUPT, Errno::EIO),
            (ffi::SQLITE_NOTADB, Errno::EIO),
            (ffi::SQLITE_CONSTRAINT, Errno::EIO),
            (ffi::SQLITE_CONSTRAINT_UNIQUE, Errno::EIO),
            (ffi::SQLITE_CONSTRAINT_NOTNULL, Errno::EIO),
            (ffi::SQLITE_BUSY, Errno::EBUSY),
            (ffi::SQLITE_LOCKED, Errno::EBUSY),
            (ffi::SQLITE_READONLY, Errno::EROFS),
            (ffi::SQLITE_TOOBIG, Errno::EFBIG),
            (ffi::SQLITE_NOMEM, Errno::ENOMEM),
            (ffi::SQLITE_INTERRUPT, Errno::EINTR),
            (ffi::SQLITE_IOERR, Errno::EIO),
            (ffi::SQLITE_IOERR_WRITE, Errno::EIO),
        ];
        for (code, want) in cases {
            assert_eq!(Errno::from(sqlite(code)), want, "sqlite code {code}");
        }
        assert_eq!(
            Errno::from(rusqlite::Error::QueryReturnedNoRows),
            Errno::ENOENT
        );
        assert!(super::is_busy(&sqlite(ffi::SQLITE_BUSY)));
        assert!(super::is_busy(&sqlite(ffi::SQLITE_BUSY_SNAPSHOT)));
        assert!(!super::is_busy(&sqlite(ffi::SQLITE_FULL)));
    }
}
