//! A SQLite VFS that gathers the write-ahead log's frames into large writes.
//!
//! SQLite writes each WAL frame as two `pwrite(2)` calls, its 24-byte header and then the page:
//! a 256 MiB file costs 131,072 system calls and as many 4 KiB page-cache folios. This VFS is
//! SQLite's default one except for the files it opens as a WAL: their contiguous writes collect
//! in a buffer that goes to the file as one write when
//! - the frame that commits a transaction (its header's database size is not zero) is complete,
//!   so every committed frame is in the file before SQLite publishes the commit in the
//!   wal-index, where other connections (readers, the checkpointer, Litestream) look;
//! - SQLite reads, syncs, truncates, sizes, controls or closes the file, or a write does not
//!   continue the buffer;
//! - the buffer holds [`CAP`] bytes.
//!
//! Frames of a transaction still open (spilled pages) may wait in the buffer: no one else may
//! read them, and a crash loses them as it loses the transaction. A failed write is reported
//! to SQLite by the call that triggered it, and the buffer is dropped with it.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name the VFS is registered under.
pub const NAME: &CStr = c"agentfs-walbuf";

/// Bytes a WAL buffer holds before it is written out: 30 frames of 4 KiB pages. The default
/// VFS writes at most 128 KiB - 1 in one call (its unix write masks the length with 0x1ffff,
/// so a larger write silently becomes a short one, which SQLite reports as a full disk).
pub const CAP: usize = 124 * 1024;

/// A WAL frame header's size; its bytes 4..8 hold the database size after a commit frame.
const FRAME_HEADER: c_int = 24;

/// The default VFS this one forwards to, once this one is registered.
struct Registered {
    real: *mut ffi::sqlite3_vfs,
}

// SAFETY: SQLite's VFS objects are immutable after registration and thread-safe by contract;
// the pointer is only read.
unsafe impl Send for Registered {}
// SAFETY: as above.
unsafe impl Sync for Registered {}

static VFS: OnceLock<Option<Registered>> = OnceLock::new();

/// Register the VFS (once per process); its name, or None if SQLite has no default VFS to
/// wrap or refused the registration.
pub fn register() -> Option<&'static CStr> {
    VFS.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find with NULL returns the default VFS or NULL; it is never freed.
        let real = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
        if real.is_null() {
            return None;
        }
        // SAFETY: `real` is a valid, registered VFS (above). The copy keeps its methods and
        // its pAppData, so every method but xOpen behaves exactly as the default VFS's.
        let mut vfs: ffi::sqlite3_vfs = unsafe { *real };
        let needed = c_int::try_from(std::mem::size_of::<WalFile>()).ok()?;
        vfs.szOsFile = vfs.szOsFile.max(needed);
        vfs.zName = NAME.as_ptr();
        vfs.pNext = std::ptr::null_mut();
        vfs.xOpen = Some(open);
        let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
        // SAFETY: `vfs` lives for the rest of the process (leaked) and is fully initialised.
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        (rc == ffi::SQLITE_OK).then_some(Registered { real })
    })
    .as_ref()
    .map(|_| NAME)
}

/// A WAL opened through this VFS: SQLite's handle, with the default VFS's handle behind it.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    buf: *mut Buffer,
}

/// Writes not yet passed on: `data` belongs at offset `start` of the file.
struct Buffer {
    data: Vec<u8>,
    start: i64,
    /// The last write was the header of a commit frame: its page completes the commit.
    commit_next: bool,
}

fn real_vfs() -> *mut ffi::sqlite3_vfs {
    VFS.get()
        .and_then(|r| r.as_ref())
        .map_or(std::ptr::null_mut(), |r| r.real)
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real = real_vfs();
    // SAFETY: `real` was found registered at start-up; open is only reachable through the VFS
    // registered then.
    let Some(real_open) = (unsafe { real.as_ref() }).and_then(|v| v.xOpen) else {
        return ffi::SQLITE_ERROR;
    };
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // SAFETY: `file` has szOsFile bytes, at least the default VFS's (see register).
        return unsafe { real_open(real, name, file, flags, out_flags) };
    }
    // SAFETY: `real` is valid (above).
    let size = unsafe { (*real).szOsFile };
    let Ok(bytes) = u64::try_from(size) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: sqlite3_malloc64 returns NULL or `bytes` of memory; it is zeroed before use.
    let inner = unsafe { ffi::sqlite3_malloc64(bytes) }.cast::<ffi::sqlite3_file>();
    if inner.is_null() {
        // SAFETY: `file` is SQLite's handle memory; a NULL pMethods tells it nothing is open.
        unsafe { (*file).pMethods = std::ptr::null() };
        return ffi::SQLITE_NOMEM;
    }
    // SAFETY: `inner` has `size` bytes (above).
    unsafe { std::ptr::write_bytes(inner.cast::<u8>(), 0, bytes as usize) };
    // SAFETY: `inner` is a zeroed handle of the default VFS's size.
    let rc = unsafe { real_open(real, name, inner, flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        // SAFETY: a failed open that left methods set still wants its close (SQLite's xOpen
        // contract); `inner` is ours to free after it, and a NULL pMethods on `file` tells
        // SQLite that nothing is open.
        unsafe {
            if let Some(close) = (*inner).pMethods.as_ref().and_then(|m| m.xClose) {
                close(inner);
            }
            ffi::sqlite3_free(inner.cast());
            (*file).pMethods = std::ptr::null();
        }
        return rc;
    }
    let buf = Box::into_raw(Box::new(Buffer {
        data: Vec::with_capacity(CAP),
        start: 0,
        commit_next: false,
    }));
    // SAFETY: `file` has at least size_of::<WalFile>() bytes (register), suitably aligned by
    // SQLite's allocator; it is written whole before SQLite uses it.
    unsafe {
        file.cast::<WalFile>().write(WalFile {
            base: ffi::sqlite3_file {
                pMethods: &WAL_METHODS,
            },
            real: inner,
            buf,
        })
    };
    ffi::SQLITE_OK
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The WAL handle behind SQLite's `file` and its default-VFS handle's methods.
///
/// # Safety
/// `file` must be a handle `open` initialised as a WAL and not yet closed.
unsafe fn parts<'a>(
    file: *mut ffi::sqlite3_file,
) -> (
    &'a mut Buffer,
    *mut ffi::sqlite3_file,
    &'a ffi::sqlite3_io_methods,
) {
    // SAFETY: per the contract, `file` is a live WalFile whose `real` handle was opened by the
    // default VFS (so its pMethods is set) and whose `buf` is a live Box.
    unsafe {
        let w = &*file.cast::<WalFile>();
        (&mut *w.buf, w.real, &*(*w.real).pMethods)
    }
}

/// Pass the buffer on to the file behind it. The buffer is empty afterwards, whatever the
/// outcome.
///
/// # Safety
/// `real` must be the open default-VFS handle the buffer belongs to, `m` its methods.
unsafe fn flush_to(
    buf: &mut Buffer,
    real: *mut ffi::sqlite3_file,
    m: &ffi::sqlite3_io_methods,
) -> c_int {
    if buf.data.is_empty() {
        return ffi::SQLITE_OK;
    }
    let rc = match (c_int::try_from(buf.data.len()), m.xWrite) {
        // SAFETY: `real` is open (contract); the bytes are valid for `len` during the call.
        (Ok(len), Some(w)) => unsafe { w(real, buf.data.as_ptr().cast(), len, buf.start) },
        _ => ffi::SQLITE_IOERR_WRITE,
    };
    buf.data.clear();
    rc
}

/// [`flush_to`] for SQLite's handle.
///
/// # Safety
/// As for [`parts`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: per the contract.
    let (buf, real, m) = unsafe { parts(file) };
    // SAFETY: `real` and `m` belong to `buf`'s handle.
    unsafe { flush_to(buf, real, m) }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a handle `open` initialised, once.
    let rc = unsafe { flush(file) };
    // SAFETY: as above; after this the handle is not used again.
    unsafe {
        let w = &mut *file.cast::<WalFile>();
        let m = &*(*w.real).pMethods;
        let closed = m.xClose.map_or(ffi::SQLITE_OK, |c| c(w.real));
        ffi::sqlite3_free(w.real.cast());
        drop(Box::from_raw(w.buf));
        w.base.pMethods = std::ptr::null();
        if rc != ffi::SQLITE_OK {
            rc
        } else {
            closed
        }
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amt: c_int,
    offset: i64,
) -> c_int {
    let Ok(n) = usize::try_from(amt) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    if n >= CAP {
        // Larger than any frame: written as it comes, after what is gathered.
        // SAFETY: SQLite calls this on an open handle with its own arguments.
        return unsafe {
            flushed(file, ffi::SQLITE_IOERR_WRITE, |real, m| {
                m.xWrite.map(|w| w(real, data, amt, offset))
            })
        };
    }
    // SAFETY: SQLite calls this on an open handle.
    let (buf, real, m) = unsafe { parts(file) };
    let end = buf.start + buf.data.len() as i64;
    if !buf.data.is_empty() && (offset != end || buf.data.len() + n > CAP) {
        // SAFETY: `real` and `m` belong to `buf`'s handle.
        let rc = unsafe { flush_to(buf, real, m) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    if buf.data.is_empty() {
        buf.start = offset;
    }
    // SAFETY: SQLite passes `amt` readable bytes at `data`, valid during the call.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), n) };
    buf.data.extend_from_slice(bytes);
    if buf.commit_next {
        // This write is the page of a commit frame: the transaction's frames go out now.
        buf.commit_next = false;
        // SAFETY: as above.
        return unsafe { flush_to(buf, real, m) };
    }
    buf.commit_next = amt == FRAME_HEADER && bytes[4..8] != [0; 4];
    ffi::SQLITE_OK
}

/// Make the call `call` describes on the default VFS's handle; `missing` when the method is
/// absent.
///
/// # Safety
/// As for [`parts`]; `call` gets the open default-VFS handle and its methods.
unsafe fn forward(
    file: *mut ffi::sqlite3_file,
    missing: c_int,
    call: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> Option<c_int>,
) -> c_int {
    // SAFETY: per the contract.
    let (_, real, m) = unsafe { parts(file) };
    call(real, m).unwrap_or(missing)
}

/// [`forward`] after flushing the buffer; a flush failure is the call's result.
///
/// # Safety
/// As for [`forward`].
unsafe fn flushed(
    file: *mut ffi::sqlite3_file,
    missing: c_int,
    call: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> Option<c_int>,
) -> c_int {
    // SAFETY: per the contract.
    let rc = unsafe { flush(file) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: per the contract.
    unsafe { forward(file, missing, call) }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amt: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: SQLite calls this on an open handle with its own arguments, passed on as they are.
    unsafe {
        flushed(file, ffi::SQLITE_IOERR_READ, |real, m| {
            m.xRead.map(|f| f(real, data, amt, offset))
        })
    }
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: as in `read`.
    unsafe {
        flushed(file, ffi::SQLITE_IOERR_TRUNCATE, |real, m| {
            m.xTruncate.map(|f| f(real, size))
        })
    }
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: as in `read`.
    unsafe {
        flushed(file, ffi::SQLITE_IOERR_FSYNC, |real, m| {
            m.xSync.map(|f| f(real, flags))
        })
    }
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    // SAFETY: as in `read`; `size` is SQLite's out pointer.
    unsafe {
        flushed(file, ffi::SQLITE_IOERR_FSTAT, |real, m| {
            m.xFileSize.map(|f| f(real, size))
        })
    }
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: SQLite calls this on an open handle with its own arguments.
    unsafe {
        forward(file, ffi::SQLITE_OK, |real, m| {
            m.xLock.map(|f| f(real, level))
        })
    }
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: as in `lock`.
    unsafe {
        forward(file, ffi::SQLITE_OK, |real, m| {
            m.xUnlock.map(|f| f(real, level))
        })
    }
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: as in `lock`; `out` is SQLite's out pointer.
    unsafe {
        forward(file, ffi::SQLITE_OK, |real, m| {
            m.xCheckReservedLock.map(|f| f(real, out))
        })
    }
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as in `read`; `arg` is whatever SQLite passes for `op`.
    unsafe {
        flushed(file, ffi::SQLITE_NOTFOUND, |real, m| {
            m.xFileControl.map(|f| f(real, op, arg))
        })
    }
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as in `lock`.
    unsafe { forward(file, 4096, |real, m| m.xSectorSize.map(|f| f(real))) }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as in `lock`.
    unsafe { forward(file, 0, |real, m| m.xDeviceCharacteristics.map(|f| f(real))) }
}

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, OpenFlags};

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// Every committed transaction is visible to a connection of the default VFS as soon as
    /// the commit returns, also one whose pages spilled to the WAL before it committed.
    #[test]
    fn committed_frames_are_in_the_file_when_the_commit_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let vfs = super::register().expect("the VFS registers");
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let w = Connection::open_with_flags_and_vfs(&path, flags, vfs).unwrap();
        let _: String = w
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        // As the server's writer: no sync at commit, so only the gathering's own flush puts a
        // commit's frames in the file.
        w.execute_batch("PRAGMA synchronous = NORMAL; CREATE TABLE t (x BLOB)")
            .unwrap();
        let r = Connection::open(&path).unwrap();
        let blob = vec![7u8; 20 * 1024];
        for i in 1..=40 {
            w.execute("INSERT INTO t VALUES (?1)", [&blob]).unwrap();
            assert_eq!(count(&r), i, "commit {i} not visible to another connection");
        }
        // A transaction larger than the writer's cache spills frames before its commit.
        w.execute_batch("PRAGMA cache_size = 16").unwrap();
        w.execute_batch("BEGIN").unwrap();
        for _ in 0..100 {
            w.execute("INSERT INTO t VALUES (?1)", [&blob]).unwrap();
        }
        assert_eq!(count(&r), 40, "an open transaction is not visible");
        w.execute_batch("COMMIT").unwrap();
        assert_eq!(count(&r), 140);
        drop(r);
        drop(w);
        let again = Connection::open(&path).unwrap();
        assert_eq!(count(&again), 140);
        let ok: String = again
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }
}
