//! Free space of the filesystem that holds the database.

use std::path::Path;

/// The host filesystem's free bytes (for the caller) and total bytes, if statvfs works.
pub fn host_space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call and `st` points to writable
    // memory of the right type; statvfs initialises it fully when it returns 0.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: rc == 0, so statvfs filled the struct.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    Some((
        st.f_bavail.saturating_mul(frsize),
        st.f_blocks.saturating_mul(frsize),
    ))
}
