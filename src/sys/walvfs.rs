//! A SQLite VFS that gathers the write-ahead log's frames into large writes.
//!
//! SQLite writes each WAL frame as two `pwrite(2)` calls, its 24-byte header and then the page:
//! a 256 MiB file costs 131,072 system calls and as many 4 KiB page-cache folios. This VFS is
//! SQLite's default one except for the files it opens as a WAL: their contiguous writes collect
//! in a buffer that goes to the file as one write when
//! - SQLite writes the header of the frame that commits a transaction (its database size is
//!   not zero), and then that frame's page, so every committed frame is in the file before
//!   SQLite publishes the commit in the wal-index, where other connections (readers, the
//!   checkpointer, Litestream) look;
//! - SQLite reads, syncs, truncates, sizes, controls or closes the file, or a write does not
//!   continue the buffer;
//! - the buffer holds [`CAP`] bytes.
//!
//! Frames of a transaction still open (spilled pages) may wait in the buffer: no one else may
//! read them, and a crash loses them as it loses the transaction. What a rolled-back one
//! spilled is written when its connection gives up the WAL's write lock (a shared-memory
//! unlock on the database file, linked to its WAL), before another writer may append frames
//! where those bytes would land. A commit frame's header goes
//! out with the frames before it as soon as it is written, and its page right after it: SQLite
//! may write nothing after such a header (when a transaction wrote again a page it had
//! spilled, the commit ends by rewriting its frames' headers with new checksums, the commit
//! frame's last). This holds for the server's writer, which never pads a commit to a sector
//! (WAL commits are not synced at `synchronous=NORMAL`; padding comes only with syncing). A
//! failed write is reported to SQLite by the call that triggered it, and the buffer is dropped
//! with it; when that call is not a write, as an I/O error, so that SQLite undoes the whole
//! transaction the dropped frames belonged to (a full disk would undo only the statement).
//!
//! A checkpoint (SQLite copying the WAL's pages into the database file, in page order) reads
//! one frame's page from the WAL and writes it to the database file per call: two system
//! calls and a 4 KiB page-cache folio per page. On a thread that asked for it
//! ([`gathered_checkpoint`]), between SQLite's `CKPT_START` and `CKPT_DONE` file controls on
//! the database file, the WAL's reads that follow each other in the file are served from a
//! read-ahead of [`CAP`] bytes, and the database file's contiguous writes gather as the WAL's
//! do. The gathered pages reach the file at `CKPT_DONE`, before SQLite publishes the backfill
//! in the wal-index (the only place where readers learn that a page may be read from the
//! database file). SQLite ignores that file control's result, so a failure there cannot fail
//! the checkpoint: the write is retried once and then the process aborts, which leaves the
//! files as a crash would (the WAL keeps every frame, and the next checkpoint copies them
//! again). So that this cannot come from a full disk, copies gather only on filesystems that
//! overwrite a file's blocks in place (ext2/3/4, XFS, tmpfs: an overwrite needs no new space),
//! and what they add to the file is reserved first (fallocate at SQLite's size hint, which
//! comes before the first copy; if it fails, SQLite writes each page itself and a failure is
//! the checkpoint's). The server also asks only while its space guard is not low. A failed
//! write before `CKPT_DONE` fails the checkpoint as without the buffer.

use std::cell::Cell;
use std::ffi::{c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
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
        let needed = c_int::try_from(std::mem::size_of::<Handle>()).ok()?;
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

thread_local! {
    /// Whether this thread's checkpoints gather their copies ([`gathered_checkpoint`]).
    static ASKED: Cell<bool> = const { Cell::new(false) };
    /// The gathered checkpoint this thread is copying (between `CKPT_START` and `CKPT_DONE`),
    /// 0 when none: the WAL's read-ahead belongs to one of them only.
    static COPYING: Cell<u64> = const { Cell::new(0) };
}

/// The last number given to a gathered checkpoint (of any thread: a connection may move
/// between threads, its WAL's read-ahead with it).
static COPIES: AtomicU64 = AtomicU64::new(0);

/// Database writes gathered and WAL reads served from the read-ahead, for the tests.
#[cfg(test)]
static GATHERED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Run `f`, a checkpoint on a connection of this VFS, with its copies gathered (see the module
/// documentation): only while the space guard sees room for the checkpoint's growth.
pub fn gathered_checkpoint<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ASKED.with(|a| a.set(self.0));
            COPYING.with(|c| c.set(0));
        }
    }
    let _restore = Restore(ASKED.with(|a| a.replace(true)));
    f()
}

/// Which file a handle of this VFS is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A write-ahead log.
    Wal,
    /// A main database file.
    Db,
}

/// A file opened through this VFS: SQLite's handle, with the default VFS's handle behind it.
#[repr(C)]
struct Handle {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    buf: *mut Buffer,
    kind: Kind,
    /// A database file's descriptor on which a checkpoint's copies may gather
    /// ([`copy_target`]), -1 when they may not, and the file's identity.
    copy_fd: c_int,
    copy_id: (u64, u64),
    /// A WAL's database file handle, or a database file's WAL handle, when both are this
    /// VFS's (NULL otherwise): the database file's shared-memory locks say when a write
    /// transaction ends.
    peer: *mut Handle,
}

/// Writes not yet passed on, and a checkpoint's read-ahead.
struct Buffer {
    /// Bytes that belong at offset `start` of the file.
    data: Vec<u8>,
    start: i64,
    /// The last write was the header of a commit frame: its page completes the commit (WAL).
    commit_next: bool,
    /// The WAL's bytes from `ahead_start`, `ahead_len` of them, read for checkpoint
    /// `ahead_of` (0: none). Allocated at the first read-ahead.
    ahead: Vec<u8>,
    ahead_start: i64,
    ahead_len: usize,
    ahead_of: u64,
    /// Where the checkpoint `next_of` would read next if it reads the WAL in order: the
    /// read-ahead is filled only for a read there.
    next_read: i64,
    next_of: u64,
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
    let kind = if flags & ffi::SQLITE_OPEN_WAL != 0 {
        Kind::Wal
    } else if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
        Kind::Db
    } else {
        // SAFETY: `file` has szOsFile bytes, at least the default VFS's (see register).
        return unsafe { real_open(real, name, file, flags, out_flags) };
    };
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
    // A database file stands in for the default one's only with its whole interface (shared
    // memory and memory mapping are version 3); otherwise it is opened as SQLite would.
    // SAFETY: after a successful open the default VFS's handle has its methods set.
    let unwrapped = rc == ffi::SQLITE_OK
        && kind == Kind::Db
        && unsafe { (*inner).pMethods.as_ref() }.is_none_or(|m| m.iVersion < 3);
    if rc != ffi::SQLITE_OK || unwrapped {
        // SAFETY: a failed open that left methods set still wants its close (SQLite's xOpen
        // contract), as does an unwrapped one; `inner` is ours to free after it, and a NULL
        // pMethods on `file` tells SQLite that nothing is open.
        unsafe {
            if let Some(close) = (*inner).pMethods.as_ref().and_then(|m| m.xClose) {
                close(inner);
            }
            ffi::sqlite3_free(inner.cast());
            (*file).pMethods = std::ptr::null();
        }
        if unwrapped {
            // SAFETY: as for any file this VFS does not wrap.
            return unsafe { real_open(real, name, file, flags, out_flags) };
        }
        return rc;
    }
    let buf = Box::into_raw(Box::new(Buffer {
        data: Vec::with_capacity(if kind == Kind::Wal { CAP } else { 0 }),
        start: 0,
        commit_next: false,
        ahead: Vec::new(),
        ahead_start: 0,
        ahead_len: 0,
        ahead_of: 0,
        next_read: 0,
        next_of: 0,
    }));
    let methods = match kind {
        Kind::Wal => &WAL_METHODS,
        Kind::Db => &DB_METHODS,
    };
    let (copy_fd, copy_id) = match kind {
        // SAFETY: `inner` is open, of the default VFS's size; `name` is SQLite's.
        Kind::Db => unsafe { copy_target(inner, size, name) }.unwrap_or((-1, (0, 0))),
        Kind::Wal => (-1, (0, 0)),
    };
    // SAFETY: `file` has at least size_of::<Handle>() bytes (register), suitably aligned by
    // SQLite's allocator; it is written whole before SQLite uses it.
    unsafe {
        file.cast::<Handle>().write(Handle {
            base: ffi::sqlite3_file { pMethods: methods },
            real: inner,
            buf,
            kind,
            copy_fd,
            copy_id,
            peer: std::ptr::null_mut(),
        })
    };
    if kind == Kind::Wal {
        // SAFETY: `name` is the WAL's name as SQLite passed it to xOpen, for which SQLite
        // returns its database file's open handle (or NULL).
        let db = unsafe { ffi::sqlite3_database_file_object(name) };
        // SAFETY: a handle whose methods are DB_METHODS is a Handle this VFS opened; both
        // belong to one connection, used by one thread at a time.
        unsafe {
            if !db.is_null() && std::ptr::eq((*db).pMethods, &DB_METHODS) {
                let db = db.cast::<Handle>();
                (*db).peer = file.cast::<Handle>();
                (*file.cast::<Handle>()).peer = db;
            }
        }
    }
    ffi::SQLITE_OK
}

/// The filesystems on which a checkpoint's copies gather: an overwrite of a file's blocks needs
/// no new space there, and fallocate reserves what the copies add (ext2/3/4, XFS, tmpfs).
const IN_PLACE: [libc::__fsword_t; 3] = [0xEF53, 0x5846_5342, 0x0102_1994];

/// The descriptor of the database file the default VFS opened as `inner`, and the file's
/// (device, inode), if a checkpoint's copies may gather on it. SQLite's unix VFS keeps the
/// descriptor after three pointers in its handle; the number found there is taken only if it
/// is a descriptor of the file `name` names, open for writing, on a filesystem of [`IN_PLACE`].
///
/// # Safety
/// `inner` must be an open handle of the default VFS, `size` bytes long; `name` SQLite's name
/// of the file (NULL or a C string).
unsafe fn copy_target(
    inner: *mut ffi::sqlite3_file,
    size: c_int,
    name: ffi::sqlite3_filename,
) -> Option<(c_int, (u64, u64))> {
    let at = 3 * std::mem::size_of::<*const c_void>();
    if name.is_null() || usize::try_from(size).ok()? < at + std::mem::size_of::<c_int>() {
        return None;
    }
    // SAFETY: the handle has `size` bytes (contract), more than `at` plus an int.
    let fd = unsafe { inner.cast::<u8>().add(at).cast::<c_int>().read_unaligned() };
    // SAFETY: `name` is a C string (contract).
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(
        unsafe { CStr::from_ptr(name) }.to_bytes(),
    ));
    let named = std::fs::metadata(path).ok()?;
    let id = identity(fd)?;
    // SAFETY: F_GETFL on any number only reads the descriptor's flags or fails.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: fstatfs writes a statfs into `fs` or fails.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let on = unsafe { libc::fstatfs(fd, &mut fs) } == 0;
    (id == (named.dev(), named.ino())
        && flags >= 0
        && flags & libc::O_ACCMODE == libc::O_RDWR
        && on
        && IN_PLACE.contains(&fs.f_type))
    .then_some((fd, id))
}

/// The status of the file open as `fd`.
fn fstat(fd: c_int) -> Option<libc::stat> {
    // SAFETY: fstat writes a stat into `st` or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// The (device, inode) of the file open as `fd`.
fn identity(fd: c_int) -> Option<(u64, u64)> {
    fstat(fd).map(|st| (st.st_dev, st.st_ino))
}

/// Reserve the space a checkpoint's copies add to the database file up to `want` bytes
/// (SQLite's size hint), without changing its size; false when it cannot be reserved.
fn reserve(h: &Handle, want: i64) -> bool {
    let Some(st) = (h.copy_fd >= 0).then(|| fstat(h.copy_fd)).flatten() else {
        return false;
    };
    if (st.st_dev, st.st_ino) != h.copy_id {
        return false;
    }
    if want <= st.st_size {
        return true;
    }
    // SAFETY: fallocate on a descriptor of the database file (checked above) reserves blocks
    // past its end; KEEP_SIZE leaves its size to SQLite.
    let rc = unsafe {
        libc::fallocate(
            h.copy_fd,
            libc::FALLOC_FL_KEEP_SIZE,
            st.st_size,
            want - st.st_size,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "no room reserved for a checkpoint's copies: {}",
            std::io::Error::last_os_error()
        );
    }
    rc == 0
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

static DB_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
    ..WAL_METHODS
};

/// The handle behind SQLite's `file`, its default-VFS handle's methods, and which file it is.
///
/// # Safety
/// `file` must be a handle `open` initialised and not yet closed.
unsafe fn parts<'a>(
    file: *mut ffi::sqlite3_file,
) -> (
    &'a mut Buffer,
    *mut ffi::sqlite3_file,
    &'a ffi::sqlite3_io_methods,
    Kind,
) {
    // SAFETY: per the contract, `file` is a live Handle whose `real` handle was opened by the
    // default VFS (so its pMethods is set) and whose `buf` is a live Box.
    unsafe {
        let w = &*file.cast::<Handle>();
        (&mut *w.buf, w.real, &*(*w.real).pMethods, w.kind)
    }
}

/// Write the buffer to the file behind it; the buffer keeps its bytes.
///
/// # Safety
/// `real` must be the open default-VFS handle the buffer belongs to, `m` its methods.
unsafe fn write_out(
    buf: &Buffer,
    real: *mut ffi::sqlite3_file,
    m: &ffi::sqlite3_io_methods,
) -> c_int {
    if buf.data.is_empty() {
        return ffi::SQLITE_OK;
    }
    match (c_int::try_from(buf.data.len()), m.xWrite) {
        // SAFETY: `real` is open (contract); the bytes are valid for `len` during the call.
        (Ok(len), Some(w)) => unsafe { w(real, buf.data.as_ptr().cast(), len, buf.start) },
        _ => ffi::SQLITE_IOERR_WRITE,
    }
}

/// Pass the buffer on to the file behind it. The buffer is empty afterwards, whatever the
/// outcome.
///
/// # Safety
/// As for [`write_out`].
unsafe fn flush_to(
    buf: &mut Buffer,
    real: *mut ffi::sqlite3_file,
    m: &ffi::sqlite3_io_methods,
) -> c_int {
    // SAFETY: per the contract.
    let rc = unsafe { write_out(buf, real, m) };
    buf.data.clear();
    rc
}

/// [`flush_to`] for SQLite's handle.
///
/// # Safety
/// As for [`parts`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: per the contract.
    let (buf, real, m, _) = unsafe { parts(file) };
    // SAFETY: `real` and `m` belong to `buf`'s handle.
    unsafe { flush_to(buf, real, m) }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a handle `open` initialised, once.
    let rc = unsafe { flush(file) };
    // SAFETY: as above; after this the handle is not used again. Its peer, if any, is open
    // (each unlinks itself here when it closes).
    unsafe {
        let w = &mut *file.cast::<Handle>();
        if !w.peer.is_null() {
            (*w.peer).peer = std::ptr::null_mut();
        }
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
    // SAFETY: SQLite calls this on an open handle.
    let (buf, real, m, kind) = unsafe { parts(file) };
    if n >= CAP || (kind == Kind::Db && COPYING.with(Cell::get) == 0) {
        // Larger than any frame, or a database write outside a gathered checkpoint: written as
        // it comes, after what is gathered.
        // SAFETY: SQLite calls this on an open handle with its own arguments.
        return unsafe {
            flushed(file, ffi::SQLITE_IOERR_WRITE, |real, m| {
                m.xWrite.map(|w| w(real, data, amt, offset))
            })
        };
    }
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
    if kind == Kind::Db {
        #[cfg(test)]
        GATHERED[0].fetch_add(1, Ordering::Relaxed);
        return ffi::SQLITE_OK;
    }
    if amt == FRAME_HEADER && bytes[4..8] != [0; 4] {
        // The header of a commit frame: it goes out now with the frames before it, and its
        // page right after it. SQLite may write nothing after such a header: the last write
        // of a commit that rewrote its frames' checksums (`walRewriteChecksums`, after the
        // transaction wrote again a page it had spilled) is the commit frame's header. So the
        // mark for the page may outlive its commit; it then costs the next write a flush.
        buf.commit_next = true;
        // SAFETY: as above.
        return unsafe { flush_to(buf, real, m) };
    }
    if buf.commit_next {
        // This write is the page of a commit frame: it goes out at once.
        buf.commit_next = false;
        // SAFETY: as above.
        return unsafe { flush_to(buf, real, m) };
    }
    ffi::SQLITE_OK
}

/// Make the call `call` describes on the default VFS's handle; `missing` when the method is
/// absent.
///
/// # Safety
/// As for [`parts`]; `call` gets the open default-VFS handle and its methods.
unsafe fn forward<T>(
    file: *mut ffi::sqlite3_file,
    missing: T,
    call: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> Option<T>,
) -> T {
    // SAFETY: per the contract.
    let (_, real, m, _) = unsafe { parts(file) };
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
    if unsafe { flush(file) } != ffi::SQLITE_OK {
        // The bytes are gone: an I/O error, never one SQLite might answer by undoing only the
        // statement (a full disk), so the whole transaction they belonged to is undone.
        return ffi::SQLITE_IOERR_WRITE;
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
    let copying = COPYING.with(Cell::get);
    // SAFETY: SQLite calls this on an open handle.
    if copying != 0 && unsafe { parts(file) }.3 == Kind::Wal {
        // SAFETY: as above, with SQLite's own arguments.
        return unsafe { read_ahead(file, data, amt, offset, copying) };
    }
    // SAFETY: SQLite calls this on an open handle with its own arguments, passed on as they are.
    unsafe {
        flushed(file, ffi::SQLITE_IOERR_READ, |real, m| {
            m.xRead.map(|f| f(real, data, amt, offset))
        })
    }
}

/// A checkpoint's read of a frame's page from the WAL: served from the read-ahead, which is
/// filled with the [`CAP`] bytes from `offset` when it does not hold them and the read
/// continues the checkpoint's previous one in the file (the next frame's page); a checkpoint
/// whose pages' frames lie scattered reads each as it is asked for. The frames a checkpoint
/// copies do not change while it runs: it holds the WAL's read lock 0 exclusively, which a
/// writer must share to start the WAL over, and writers append only past the last frame;
/// only bytes read during this checkpoint are served, and none past its last frame are asked
/// for. Near the end of the file (a short read-ahead) the page is read as it is asked for.
///
/// # Safety
/// As for [`parts`]; `data` has `amt` writable bytes.
unsafe fn read_ahead(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amt: c_int,
    offset: i64,
    copying: u64,
) -> c_int {
    // SAFETY: per the contract.
    if unsafe { flush(file) } != ffi::SQLITE_OK {
        // As in `flushed`.
        return ffi::SQLITE_IOERR_WRITE;
    }
    // SAFETY: per the contract.
    let (buf, real, m, _) = unsafe { parts(file) };
    let (Ok(n), Some(xread)) = (usize::try_from(amt), m.xRead) else {
        return ffi::SQLITE_IOERR_READ;
    };
    let held = |b: &Buffer| {
        b.ahead_of == copying
            && offset >= b.ahead_start
            && offset - b.ahead_start + n as i64 <= b.ahead_len as i64
    };
    let in_order = buf.next_of == copying && buf.next_read == offset;
    (buf.next_of, buf.next_read) = (copying, offset + i64::from(amt) + i64::from(FRAME_HEADER));
    if !held(buf) && in_order && n < CAP {
        buf.ahead.resize(CAP, 0);
        buf.ahead_of = 0;
        // SAFETY: `real` is open; `ahead` has CAP writable bytes.
        let rc = unsafe { xread(real, buf.ahead.as_mut_ptr().cast(), CAP as c_int, offset) };
        if rc == ffi::SQLITE_OK {
            (buf.ahead_start, buf.ahead_len, buf.ahead_of) = (offset, CAP, copying);
        } else if rc != ffi::SQLITE_IOERR_SHORT_READ {
            return rc;
        }
    }
    if !held(buf) {
        // SAFETY: as SQLite would have called it.
        return unsafe { xread(real, data, amt, offset) };
    }
    #[cfg(test)]
    GATHERED[1].fetch_add(1, Ordering::Relaxed);
    let at = (offset - buf.ahead_start) as usize;
    // SAFETY: `data` has `amt` writable bytes (contract), `ahead` holds them at `at` (held).
    unsafe { std::ptr::copy_nonoverlapping(buf.ahead.as_ptr().add(at), data.cast::<u8>(), n) };
    ffi::SQLITE_OK
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
    // SAFETY: as in `read`.
    let h = unsafe { &*file.cast::<Handle>() };
    let kind = h.kind;
    if kind == Kind::Db && op == ffi::SQLITE_FCNTL_SIZE_HINT && COPYING.with(Cell::get) != 0 {
        // Before the first copy: what the copies add to the file is reserved, or they go out
        // one by one as SQLite writes them, each failure its own.
        // SAFETY: SQLite passes the size it needs as an i64 with this control.
        let want = unsafe { arg.cast::<i64>().read() };
        if !reserve(h, want) {
            COPYING.with(|c| c.set(0));
        }
    } else if kind == Kind::Db
        && op == ffi::SQLITE_FCNTL_CKPT_START
        && h.copy_fd >= 0
        && ASKED.with(Cell::get)
    {
        let n = COPIES
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        COPYING.with(|c| c.set(n));
    } else if kind == Kind::Db && op == ffi::SQLITE_FCNTL_CKPT_DONE {
        COPYING.with(|c| c.set(0));
        // SAFETY: as in `read`.
        unsafe { copied(file) };
    }
    // SAFETY: as in `read`; `arg` is whatever SQLite passes for `op`.
    unsafe {
        flushed(file, ffi::SQLITE_NOTFOUND, |real, m| {
            m.xFileControl.map(|f| f(real, op, arg))
        })
    }
}

/// The end of a checkpoint's copies: its gathered pages go to the database file before SQLite
/// publishes the backfill. SQLite does not look at this call's result, so a failure must not
/// return: one more try, then the process ends as in a crash (see the module documentation).
///
/// # Safety
/// As for [`parts`].
unsafe fn copied(file: *mut ffi::sqlite3_file) {
    // SAFETY: per the contract.
    let (buf, real, m, _) = unsafe { parts(file) };
    if buf.data.is_empty() {
        return;
    }
    // SAFETY: `real` and `m` belong to `buf`'s handle.
    let mut rc = unsafe { write_out(buf, real, m) };
    if rc != ffi::SQLITE_OK {
        // SAFETY: as above.
        rc = unsafe { write_out(buf, real, m) };
    }
    let bytes = buf.data.len();
    buf.data.clear();
    if rc != ffi::SQLITE_OK {
        tracing::error!(
            "a WAL checkpoint's last {bytes} bytes could not be written to the database file \
             (SQLite error {rc}); stopping before SQLite records them as copied, as a crash \
             would: the WAL keeps them"
        );
        std::process::abort();
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

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: as in `lock`; `out` is SQLite's out pointer.
    unsafe {
        forward(file, ffi::SQLITE_IOERR_SHMMAP, |real, m| {
            m.xShmMap.map(|f| f(real, region, size, extend, out))
        })
    }
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as in `lock`.
    let peer = unsafe { &*file.cast::<Handle>() }.peer;
    if !peer.is_null() && offset == 0 && flags == ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE
    {
        // The connection gives up the WAL's write lock (slot 0): its write transaction is
        // over. A committed one left nothing in the WAL's buffer; what a rolled-back one
        // spilled is written now, as SQLite would have written it, before another writer may
        // append frames where those bytes would land.
        // SAFETY: the peer is this connection's open WAL handle (unlinked when it closes).
        if unsafe { flush(peer.cast()) } != ffi::SQLITE_OK {
            tracing::debug!("a rolled-back transaction's spilled WAL frames were not written");
        }
        // SAFETY: as above.
        if let Some(b) = unsafe { (*peer).buf.as_mut() } {
            b.commit_next = false;
        }
    }
    // SAFETY: as in `lock`.
    unsafe {
        forward(file, ffi::SQLITE_IOERR_SHMLOCK, |real, m| {
            m.xShmLock.map(|f| f(real, offset, n, flags))
        })
    }
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: as in `lock`.
    unsafe { forward(file, (), |real, m| m.xShmBarrier.map(|f| f(real))) }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: as in `lock`.
    unsafe {
        forward(file, ffi::SQLITE_OK, |real, m| {
            m.xShmUnmap.map(|f| f(real, delete))
        })
    }
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amt: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: as in `read`; a mapping must see the gathered bytes. `out` is SQLite's.
    unsafe {
        flushed(file, ffi::SQLITE_OK, |real, m| {
            m.xFetch.map(|f| f(real, offset, amt, out))
        })
    }
}

unsafe extern "C" fn unfetch(file: *mut ffi::sqlite3_file, offset: i64, p: *mut c_void) -> c_int {
    // SAFETY: as in `lock`.
    unsafe {
        forward(file, ffi::SQLITE_OK, |real, m| {
            m.xUnfetch.map(|f| f(real, offset, p))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use rusqlite::{Connection, OpenFlags};

    /// A database in a new directory, its path, this VFS's name, and a connection of it in WAL
    /// mode (the directory goes with the first).
    fn wal_writer() -> (
        tempfile::TempDir,
        std::path::PathBuf,
        &'static std::ffi::CStr,
        Connection,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let vfs = super::register().expect("the VFS registers");
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let w = Connection::open_with_flags_and_vfs(&path, flags, vfs).unwrap();
        let _: String = w
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        (dir, path, vfs, w)
    }

    fn assert_intact(c: &Connection) {
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// Every committed transaction is visible to a connection of the default VFS as soon as
    /// the commit returns, also one whose pages spilled to the WAL before it committed.
    #[test]
    fn committed_frames_are_in_the_file_when_the_commit_returns() {
        let (_dir, path, _, w) = wal_writer();
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
        assert_intact(&again);
    }

    fn rows(c: &Connection) -> Vec<(i64, Vec<u8>)> {
        let mut st = c.prepare("SELECT rowid, x FROM t ORDER BY rowid").unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn checkpoint(c: &Connection) -> (i64, i64) {
        c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap()
    }

    /// A gathered checkpoint's pages are in the database file when SQLite records them as
    /// copied: a reader that starts after a partial checkpoint (an older reader kept the rest
    /// in the WAL) reads the copied pages from the file, and sees every row.
    #[test]
    fn a_gathered_checkpoint_copies_every_page_before_readers_use_the_database_file() {
        let (_dir, path, vfs, w) = wal_writer();
        w.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (x BLOB)",
        )
        .unwrap();
        let insert = |from: u8, to: u8| {
            for i in from..to {
                w.execute("INSERT INTO t VALUES (?1)", [vec![i; 20 * 1024]])
                    .unwrap();
            }
        };
        let expect = |c: &Connection, n: u8| {
            let got = rows(c);
            assert_eq!(got.len(), usize::from(n));
            for (i, (_, x)) in got.iter().enumerate() {
                assert!(x.len() == 20 * 1024 && x.iter().all(|b| usize::from(*b) == i));
            }
        };
        insert(0, 100);
        // An older reader keeps its snapshot: the checkpoint may copy only the frames before it.
        let old = Connection::open(&path).unwrap();
        old.execute_batch("BEGIN").unwrap();
        expect(&old, 100);
        insert(100, 200);
        let ck = Connection::open_with_flags_and_vfs(&path, OpenFlags::SQLITE_OPEN_READ_WRITE, vfs)
            .unwrap();
        let before = super::GATHERED
            .each_ref()
            .map(|g| g.load(Ordering::Relaxed));
        let (log, done) = super::gathered_checkpoint(|| checkpoint(&ck));
        let after = super::GATHERED
            .each_ref()
            .map(|g| g.load(Ordering::Relaxed));
        assert!(
            after[0] > before[0],
            "the checkpoint's writes were gathered"
        );
        assert!(after[1] > before[1], "the checkpoint read the WAL ahead");
        assert!(
            0 < done && done < log,
            "a partial checkpoint: {done} of {log} frames"
        );
        let new = Connection::open(&path).unwrap();
        expect(&new, 200);
        expect(&old, 100);
        old.execute_batch("COMMIT").unwrap();
        let (log, done) = super::gathered_checkpoint(|| checkpoint(&ck));
        assert_eq!(done, log, "the whole WAL copied once no reader holds it");
        // A reader of the database file alone (the WAL starts over at the next write).
        insert(200, 201);
        expect(&Connection::open(&path).unwrap(), 201);
        drop((old, new, ck, w));
        let again = Connection::open(&path).unwrap();
        expect(&again, 201);
        assert_intact(&again);
    }

    /// A transaction that writes pages again after SQLite spilled them to the WAL ends with
    /// SQLite rewriting its frames' headers (`walRewriteChecksums`), the commit frame's last,
    /// with nothing after it: that header is in the file when the commit returns, so a copy of
    /// the files taken then (what a crash after the barrier's sync leaves) has the transaction.
    #[test]
    fn a_commit_that_rewrote_spilled_frames_is_whole_in_the_file() {
        let (dir, path, _, w) = wal_writer();
        w.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT);
             PRAGMA cache_size = 16;
             BEGIN;
             WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < 5000)
               INSERT INTO t SELECT k, printf('%.200c', 'x') FROM n;
             UPDATE t SET v = printf('%.200c', 'y') WHERE k <= 300;
             COMMIT;",
        )
        .unwrap();
        let copy = tempfile::tempdir().unwrap();
        for f in ["db.sqlite", "db.sqlite-wal"] {
            std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
        }
        let c = Connection::open(copy.path().join("db.sqlite")).unwrap();
        let got: (i64, i64) = c
            .query_row(
                "SELECT count(*), sum(v = printf('%.200c', 'y')) FROM t",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            got,
            (5000, 300),
            "the committed transaction, recovered from a copy"
        );
        // The commits after it, each of one page, are in the file when they return too.
        let r = Connection::open(&path).unwrap();
        for i in 1..=20 {
            w.execute(
                "UPDATE t SET v = printf('%.200c', 'z') WHERE k = ?1",
                [i * 200],
            )
            .unwrap();
            let seen: i64 = r
                .query_row(
                    "SELECT count(*) FROM t WHERE v = printf('%.200c', 'z')",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(seen, i, "one-page commit {i} after the rewrite");
        }
        drop(w);
    }

    /// Frames a rolled-back transaction spilled are overwritten by the next transactions
    /// (SQLite appends again from the last committed frame): each of those commits is in the
    /// file when it returns, like any other.
    #[test]
    fn commits_after_a_rolled_back_spill_are_in_the_file_when_they_return() {
        let (_dir, path, _, w) = wal_writer();
        w.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = 16;
             CREATE TABLE t (x BLOB)",
        )
        .unwrap();
        let r = Connection::open(&path).unwrap();
        let blob = vec![5u8; 20 * 1024];
        for round in 0..3 {
            w.execute_batch("BEGIN").unwrap();
            for _ in 0..100 {
                w.execute("INSERT INTO t VALUES (?1)", [&blob]).unwrap();
            }
            w.execute_batch("ROLLBACK").unwrap();
            for i in 1..=20 {
                w.execute("INSERT INTO t VALUES (?1)", [&blob]).unwrap();
                assert_eq!(
                    count(&r),
                    round * 20 + i,
                    "commit {i} after rollback {round}"
                );
            }
        }
        assert_intact(&r);
    }

    /// What a rolled-back transaction spilled is written when it gives up the write lock, not
    /// later over the frames another writer committed in the meantime at the same place.
    #[test]
    fn a_rolled_back_spill_never_lands_on_another_writers_frames() {
        let (_dir, path, _, w) = wal_writer();
        w.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = 16;
             CREATE TABLE t (x BLOB)",
        )
        .unwrap();
        // Another writer, as an offline command in another process would be.
        let other = Connection::open(&path).unwrap();
        other
            .execute_batch("PRAGMA wal_autocheckpoint = 0")
            .unwrap();
        // An empty WAL: undoing the transaction then reads nothing from it (which would write
        // the buffer out first).
        let _: (i64, i64, i64) = w
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        let blob = vec![6u8; 20 * 1024];
        w.execute_batch("BEGIN").unwrap();
        for _ in 0..30 {
            w.execute("INSERT INTO t VALUES (?1)", [&blob]).unwrap();
        }
        w.execute_batch("ROLLBACK").unwrap();
        for _ in 0..40 {
            other
                .execute("INSERT INTO t VALUES (?1)", [vec![8u8; 20 * 1024]])
                .unwrap();
        }
        // The first connection reads (and then writes) again.
        assert_eq!(count(&w), 40);
        w.execute("INSERT INTO t VALUES (?1)", [&blob]).unwrap();
        assert_eq!(count(&other), 41);
        assert_intact(&other);
    }
}
