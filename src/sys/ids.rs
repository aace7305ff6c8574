//! The identity of this process.

/// Effective user and group ids: the owner of what this process creates.
pub fn effective() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail and have no preconditions.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    effective().0 == 0
}
