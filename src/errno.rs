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

/// SQLite result codes are mapped deliberately: a full disk is ENOSPC, a busy database EBUSY
/// (after the busy timeout), corruption EIO, a constraint violation (a duplicate name) EEXIST.
impl From<rusqlite::Error> for Errno {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ffi::ErrorCode as C;
        match &e {
            rusqlite::Error::QueryReturnedNoRows => Errno::ENOENT,
            rusqlite::Error::SqliteFailure(f, _) => match f.code {
                C::DiskFull => Errno::ENOSPC,
                C::DatabaseBusy | C::DatabaseLocked => Errno::EBUSY,
                C::ConstraintViolation => Errno::EEXIST,
                C::ReadOnly => Errno::EROFS,
                C::TooBig => Errno::EFBIG,
                C::OutOfMemory => Errno::ENOMEM,
                C::OperationInterrupted => Errno::EINTR,
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
