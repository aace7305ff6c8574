//! Starting the disk writes of a file's dirty pages without waiting for them.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Start writeback of every dirty page of `f` (sync_file_range with SYNC_FILE_RANGE_WRITE over
/// the whole file): the kernel queues the writes and returns; a later fdatasync then waits only
/// for what is still in flight or was dirtied since. Nothing is made durable by this alone.
pub fn start_writeback(f: &File) -> std::io::Result<()> {
    // SAFETY: the descriptor is open for the life of `f`; sync_file_range reads no memory of
    // ours (offset 0 and length 0 mean the whole file).
    let rc = unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
