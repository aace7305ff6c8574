//! The process's memory as the system sees it, and handing freed memory back.

/// Resident set of process `pid` (`None`: this process) in bytes, from /proc/PID/statm.
pub fn rss(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/statm"),
        None => "/proc/self/statm".to_string(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).unwrap_or(4096)
}

/// Return the allocator's free memory to the system (glibc keeps freed heap pages otherwise);
/// true when some was returned.
pub fn trim() -> bool {
    // SAFETY: malloc_trim only walks glibc's own arenas; 0 keeps no padding.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Hand the pages wholly inside `buf` back to the system; reading them afterwards gives
/// zeros. For a buffer whose contents are no longer needed (a request buffer between
/// requests), so that one large request does not keep it resident for good.
pub fn discard(buf: &mut [u8]) {
    let page = page_size() as usize;
    let start = buf.as_mut_ptr() as usize;
    let first = start.div_ceil(page) * page;
    let end = (start + buf.len()) / page * page;
    if end <= first {
        return;
    }
    // SAFETY: [first, end) lies inside `buf`, which we borrow mutably, so no other reference
    // reads it meanwhile; MADV_DONTNEED on private anonymous memory only replaces its pages
    // with zero-filled ones on the next access.
    let rc = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
    if rc != 0 {
        tracing::debug!(
            "madvise(DONTNEED) of a buffer failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Bytes SQLite holds now, every connection of the process together.
pub fn sqlite_used() -> u64 {
    // SAFETY: sqlite3_memory_used only reads SQLite's global counter.
    let n = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    u64::try_from(n).unwrap_or(0)
}

/// Keep glibc from holding large freed buffers: allocations of 256 KiB and more (request
/// copies, pending WRITE data, replies) are mapped on their own and unmapped when freed, and
/// a heap's free top beyond 1 MiB is returned at once. Without this glibc raises both
/// thresholds after the first large free, and a write burst leaves its buffers resident.
pub fn return_large_frees() {
    // SAFETY: mallopt only sets glibc's tuning parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1024 * 1024);
    }
}
