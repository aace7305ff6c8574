//! File contents: inline and chunked layouts, reads, writes, truncation, fallocate, lseek.
//!
//! Invariants every function keeps (see SPEC.md "Storage layout"):
//! - inline (storage_kind 1): all bytes in data_inline, length == size, no fs_data rows, and
//!   size <= inline_threshold;
//! - chunked (storage_kind 0): data_inline NULL; row `i` holds bytes from `i * chunk_size`,
//!   never more than chunk_size bytes and never bytes at or past EOF. Missing rows and the
//!   tail of a short row read as zeros, so stale bytes cannot reappear when a file grows.

use rusqlite::blob::Blob;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, MAIN_DB};

use super::inode::{meta_cols, meta_from_row, sql_ino, touch_mc, Meta, MAX_FILE_SIZE};
use super::{FsConfig, Ino, Timespec};
use crate::errno::Errno;

/// A regular file's row with its inline bytes (`None` when chunked).
struct File {
    meta: Meta,
    inline: Option<Vec<u8>>,
}

/// Load a regular file: EISDIR for directories, EINVAL for other non-regular inodes.
fn load(c: &Connection, ino: Ino) -> Result<File, Errno> {
    let mut st = c.prepare_cached(concat!(
        "SELECT ",
        meta_cols!(),
        ", data_inline FROM fs_inode WHERE ino = ?1"
    ))?;
    let f = st
        .query_row([sql_ino(ino)?], |r| {
            let meta = meta_from_row(r)?;
            let inline = match r.get_ref(14)? {
                ValueRef::Blob(b) | ValueRef::Text(b) if meta.storage_kind == 1 => Some(b.to_vec()),
                _ if meta.storage_kind == 1 => Some(Vec::new()),
                _ => None,
            };
            Ok(File { meta, inline })
        })
        .optional()?
        .ok_or(Errno::ENOENT)?;
    if f.meta.is_dir() {
        return Err(Errno::EISDIR);
    }
    if !f.meta.is_reg() {
        return Err(Errno::EINVAL);
    }
    Ok(f)
}

fn usize_of(n: u64) -> Result<usize, Errno> {
    usize::try_from(n).map_err(|_| Errno::EFBIG)
}

/// Copy the stored rows overlapping [off, off + buf.len()) into `buf` (pre-zeroed).
fn read_chunks(c: &Connection, cs: u64, ino: Ino, off: u64, buf: &mut [u8]) -> Result<(), Errno> {
    if buf.is_empty() {
        return Ok(());
    }
    let end = off + buf.len() as u64;
    let mut st = c.prepare_cached(
        "SELECT chunk_index, data FROM fs_data
         WHERE ino = ?1 AND chunk_index BETWEEN ?2 AND ?3 ORDER BY chunk_index",
    )?;
    let mut rows = st.query((sql_ino(ino)?, (off / cs) as i64, ((end - 1) / cs) as i64))?;
    while let Some(r) = rows.next()? {
        let idx = r.get::<_, i64>(0)?.max(0) as u64;
        let data = match r.get_ref(1)? {
            ValueRef::Blob(b) | ValueRef::Text(b) => b,
            _ => continue,
        };
        let base = idx * cs;
        let row_end = base + (data.len() as u64).min(cs);
        let lo = base.max(off);
        let hi = row_end.min(end);
        if lo < hi {
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&data[(lo - base) as usize..(hi - base) as usize]);
        }
    }
    Ok(())
}

/// Read up to `len` bytes at `off`: short at EOF, holes as zeros.
pub fn read(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    off: u64,
    len: u64,
) -> Result<Vec<u8>, Errno> {
    let f = load(c, ino)?;
    let size = f.meta.size;
    if off >= size || len == 0 {
        return Ok(Vec::new());
    }
    let end = off.saturating_add(len).min(size);
    let mut buf = crate::memory::pool::buffers().zeroed(usize_of(end - off)?);
    match &f.inline {
        Some(bytes) => {
            let have = (bytes.len() as u64).min(end);
            if off < have {
                buf[..(have - off) as usize].copy_from_slice(&bytes[off as usize..have as usize]);
            }
        }
        None => read_chunks(c, cfg.chunk_size, ino, off, &mut buf)?,
    }
    Ok(buf)
}

/// The rowid of chunk `idx` when it is stored as a blob of exactly `len` bytes (its length
/// read from the record header, without its overflow pages).
fn stored_blob(c: &Connection, ino: Ino, idx: u64, len: usize) -> Result<Option<i64>, Errno> {
    let mut st = c.prepare_cached(
        "SELECT rowid FROM fs_data WHERE ino = ?1 AND chunk_index = ?2
           AND typeof(data) = 'blob' AND length(data) = ?3",
    )?;
    Ok(st
        .query_row((sql_ino(ino)?, idx as i64, len as i64), |r| r.get(0))
        .optional()?)
}

fn get_chunk(c: &Connection, ino: Ino, idx: u64) -> Result<Option<Vec<u8>>, Errno> {
    let mut st =
        c.prepare_cached("SELECT data FROM fs_data WHERE ino = ?1 AND chunk_index = ?2")?;
    Ok(st
        .query_row((sql_ino(ino)?, idx as i64), |r| {
            Ok(super::inode::bytes_of(r.get_ref(0)?))
        })
        .optional()?)
}

pub(super) fn put_chunk(c: &Connection, ino: Ino, idx: u64, data: &[u8]) -> Result<(), Errno> {
    c.prepare_cached(
        "INSERT INTO fs_data (ino, chunk_index, data) VALUES (?1, ?2, ?3)
         ON CONFLICT (ino, chunk_index) DO UPDATE SET data = excluded.data",
    )?
    .execute((sql_ino(ino)?, idx as i64, data))?;
    Ok(())
}

fn del_chunks(c: &Connection, ino: Ino, from: u64, to: u64) -> Result<(), Errno> {
    if from > to {
        return Ok(());
    }
    c.prepare_cached("DELETE FROM fs_data WHERE ino = ?1 AND chunk_index BETWEEN ?2 AND ?3")?
        .execute((sql_ino(ino)?, from as i64, to.min(i64::MAX as u64) as i64))?;
    Ok(())
}

/// Write `data` at `off` into chunk rows: whole chunks are written blind, partial ones
/// read-modify-written (a missing or short row is zero-extended).
fn write_chunks(c: &Connection, cs: u64, ino: Ino, off: u64, data: &[u8]) -> Result<(), Errno> {
    let mut pos = off;
    let mut rest = data;
    while !rest.is_empty() {
        let idx = pos / cs;
        let at = (pos % cs) as usize;
        let n = rest.len().min(cs as usize - at);
        if at == 0 && n == cs as usize {
            put_chunk(c, ino, idx, &rest[..n])?;
        } else {
            let mut chunk = get_chunk(c, ino, idx)?.unwrap_or_default();
            chunk.truncate(cs as usize);
            if chunk.len() < at + n {
                chunk.resize(at + n, 0);
            }
            chunk[at..at + n].copy_from_slice(&rest[..n]);
            put_chunk(c, ino, idx, &chunk)?;
        }
        pos += n as u64;
        rest = &rest[n..];
    }
    Ok(())
}

/// Move an inline file to chunks: its (dense) bytes become rows, the inode storage_kind 0.
fn spill(c: &Connection, cs: u64, ino: Ino, bytes: &[u8], size: u64) -> Result<(), Errno> {
    let dense = &bytes[..(bytes.len() as u64).min(size) as usize];
    for (i, piece) in dense.chunks(cs as usize).enumerate() {
        put_chunk(c, ino, i as u64, piece)?;
    }
    c.prepare_cached("UPDATE fs_inode SET storage_kind = 0, data_inline = NULL WHERE ino = ?1")?
        .execute([sql_ino(ino)?])?;
    Ok(())
}

fn set_inline(c: &Connection, ino: Ino, bytes: &[u8]) -> Result<(), Errno> {
    c.prepare_cached(
        "UPDATE fs_inode SET storage_kind = 1, data_inline = ?2, size = ?3 WHERE ino = ?1",
    )?
    .execute((sql_ino(ino)?, bytes, bytes.len() as i64))?;
    Ok(())
}

fn set_size(c: &Connection, ino: Ino, size: u64) -> Result<(), Errno> {
    c.prepare_cached("UPDATE fs_inode SET size = ?2 WHERE ino = ?1")?
        .execute((sql_ino(ino)?, size as i64))?;
    Ok(())
}

/// Grow `ino` to at least `end` bytes (the new range reads as zeros); never shrinks.
pub fn extend_to(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    end: u64,
    now: Timespec,
) -> Result<(), Errno> {
    if load(c, ino)?.meta.size < end {
        truncate(c, cfg, ino, end, now)?;
    }
    Ok(())
}

/// Write `data` at `off`; extends the size; mtime and ctime become `now` (None: the kernel
/// keeps them, see [`super::Store::set_kernel_owns_write_times`]).
pub fn write(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    off: u64,
    data: &[u8],
    now: Option<Timespec>,
) -> Result<u32, Errno> {
    let n = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
    let end = off
        .checked_add(data.len() as u64)
        .filter(|e| *e <= MAX_FILE_SIZE)
        .ok_or(Errno::EFBIG)?;
    let f = load(c, ino)?;
    if data.is_empty() {
        return Ok(0);
    }
    let size = f.meta.size;
    let new_size = size.max(end);
    match f.inline {
        Some(mut bytes) if off <= size && new_size <= cfg.inline_threshold => {
            bytes.resize(usize_of(size)?, 0);
            if bytes.len() < end as usize {
                bytes.resize(end as usize, 0);
            }
            bytes[off as usize..end as usize].copy_from_slice(data);
            set_inline(c, ino, &bytes)?;
        }
        Some(bytes) => {
            spill(c, cfg.chunk_size, ino, &bytes, size)?;
            write_chunks(c, cfg.chunk_size, ino, off, data)?;
            set_size(c, ino, new_size)?;
        }
        None => {
            write_chunks(c, cfg.chunk_size, ino, off, data)?;
            if new_size != size {
                set_size(c, ino, new_size)?;
            }
        }
    }
    if let Some(t) = now {
        touch_mc(c, ino, t)?;
    }
    Ok(n)
}

/// Drop rows past `new_size` and trim the last one, so no stored byte lies at or past EOF.
fn trim_chunks(c: &Connection, cs: u64, ino: Ino, new_size: u64) -> Result<(), Errno> {
    if new_size == 0 {
        c.prepare_cached("DELETE FROM fs_data WHERE ino = ?1")?
            .execute([sql_ino(ino)?])?;
        return Ok(());
    }
    let last = (new_size - 1) / cs;
    del_chunks(c, ino, last + 1, i64::MAX as u64)?;
    let keep = new_size - last * cs;
    c.prepare_cached(
        "UPDATE fs_data SET data = substr(data, 1, ?3)
         WHERE ino = ?1 AND chunk_index = ?2 AND length(data) > ?3",
    )?
    .execute((sql_ino(ino)?, last as i64, keep as i64))?;
    Ok(())
}

/// Set a regular file's size (truncate or extend). Extension adds a hole (inline files stay
/// inline while they fit). A chunked file shrunk to <= inline_threshold goes back inline when
/// what remains is dense. mtime and ctime become `now` when the size changes.
pub fn truncate(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    new_size: u64,
    now: Timespec,
) -> Result<(), Errno> {
    if new_size > MAX_FILE_SIZE {
        return Err(Errno::EFBIG);
    }
    let f = load(c, ino)?;
    let size = f.meta.size;
    match f.inline {
        Some(mut bytes) if new_size <= cfg.inline_threshold => {
            bytes.resize(usize_of(new_size)?, 0);
            set_inline(c, ino, &bytes)?;
        }
        Some(bytes) => {
            spill(c, cfg.chunk_size, ino, &bytes, size.min(new_size))?;
            set_size(c, ino, new_size)?;
        }
        None => {
            if new_size < size {
                trim_chunks(c, cfg.chunk_size, ino, new_size)?;
            }
            set_size(c, ino, new_size)?;
            if new_size <= cfg.inline_threshold {
                maybe_inline(c, ino, new_size)?;
            }
        }
    }
    // Like ext4: any truncate, even to the same size (open with O_TRUNC of an empty file),
    // changes mtime and ctime. The kernel leaves this to us for O_TRUNC and ftruncate.
    touch_mc(c, ino, now)?;
    Ok(())
}

/// Fold a small chunked file back inline if its remaining bytes are dense (row 0 holds all
/// of them; new_size <= inline_threshold <= chunk_size, so no other row can exist).
fn maybe_inline(c: &Connection, ino: Ino, new_size: u64) -> Result<(), Errno> {
    let row0 = get_chunk(c, ino, 0)?.unwrap_or_default();
    if row0.len() as u64 != new_size {
        return Ok(());
    }
    c.prepare_cached("DELETE FROM fs_data WHERE ino = ?1")?
        .execute([sql_ino(ino)?])?;
    set_inline(c, ino, &row0)
}

/// Zero [off, off + len) within EOF: whole chunks are dropped, partial ones zeroed in place.
fn punch(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    off: u64,
    len: u64,
    now: Timespec,
) -> Result<(), Errno> {
    let f = load(c, ino)?;
    let end = off.saturating_add(len).min(f.meta.size);
    if off < end {
        match f.inline {
            Some(mut bytes) => {
                let hi = (end as usize).min(bytes.len());
                if (off as usize) < hi {
                    bytes[off as usize..hi].fill(0);
                }
                set_inline(c, ino, &bytes)?;
                set_size(c, ino, f.meta.size)?;
            }
            None => punch_chunks(c, cfg.chunk_size, ino, off, end)?,
        }
    }
    touch_mc(c, ino, now)
}

fn punch_chunks(c: &Connection, cs: u64, ino: Ino, off: u64, end: u64) -> Result<(), Errno> {
    let first = off / cs;
    let last = (end - 1) / cs;
    for idx in [first, last] {
        let base = idx * cs;
        let lo = off.max(base) - base;
        let hi = end.min(base + cs) - base;
        let Some(mut row) = get_chunk(c, ino, idx)? else {
            continue;
        };
        if lo == 0 && hi >= row.len() as u64 {
            del_chunks(c, ino, idx, idx)?;
        } else if lo < row.len() as u64 {
            let h = (hi as usize).min(row.len());
            row[lo as usize..h].fill(0);
            put_chunk(c, ino, idx, &row)?;
        }
        if first == last {
            break;
        }
    }
    del_chunks(c, ino, first + 1, last.saturating_sub(1))
}

/// fallocate: mode 0 extends the size and reserves the range, KEEP_SIZE reserves the part
/// within EOF (see [`reserve`]), PUNCH_HOLE|KEEP_SIZE zeroes a range; others EOPNOTSUPP.
pub fn fallocate(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    off: u64,
    len: u64,
    mode: u32,
    free: Option<u64>,
) -> Result<(), Errno> {
    const KEEP: u32 = libc::FALLOC_FL_KEEP_SIZE as u32;
    let now = super::inode::now();
    const PUNCH: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32;
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let end = off
        .checked_add(len)
        .filter(|e| *e <= MAX_FILE_SIZE)
        .ok_or(Errno::EFBIG)?;
    let f = load(c, ino)?;
    match mode {
        0 => {
            if end > f.meta.size {
                truncate(c, cfg, ino, end, now)?;
            }
            reserve(c, cfg.chunk_size, ino, off, end, free)
        }
        KEEP => reserve(c, cfg.chunk_size, ino, off, end.min(f.meta.size), free),
        m if m == PUNCH | KEEP => punch(c, cfg, ino, off, len, now),
        _ => Err(Errno::EOPNOTSUPP),
    }
}

/// Store zeros wherever [off, end) (within EOF) has no stored bytes, so the range holds its
/// pages now: ENOSPC comes from fallocate, not from a later write, and st_blocks counts the
/// range. Existing bytes are never changed; an inline file is stored whole already, and a
/// partial-origin file (whose unstored chunks read from its base file) is left alone.
/// `free`: the host filesystem's free bytes, when known; more missing bytes than that is
/// ENOSPC before anything is written.
fn reserve(
    c: &Connection,
    cs: u64,
    ino: Ino,
    off: u64,
    end: u64,
    free: Option<u64>,
) -> Result<(), Errno> {
    let f = load(c, ino)?;
    if off >= end
        || f.inline.is_some()
        || !super::backup::partial_origins_of(c, Some(ino))?.is_empty()
    {
        return Ok(());
    }
    let size = f.meta.size;
    let (first, last) = (off / cs, (end - 1) / cs);
    let stored: std::collections::HashMap<i64, u64> = c
        .prepare_cached(
            "SELECT chunk_index, length(data) FROM fs_data
             WHERE ino = ?1 AND chunk_index BETWEEN ?2 AND ?3",
        )?
        .query_map((sql_ino(ino)?, first as i64, last as i64), |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let want = |idx: u64| cs.min(size - idx * cs);
    let have = |idx: u64| stored.get(&(idx as i64)).copied().unwrap_or(0);
    let missing: u64 = (first..=last)
        .map(|i| want(i).saturating_sub(have(i)))
        .sum();
    if free.is_some_and(|free| missing > free) {
        return Err(Errno::ENOSPC);
    }
    for idx in (first..=last).filter(|&i| have(i) < want(i)) {
        let mut bytes = get_chunk(c, ino, idx)?.unwrap_or_default();
        bytes.resize(usize_of(want(idx))?, 0);
        put_chunk(c, ino, idx, &bytes)?;
    }
    Ok(())
}

/// SEEK_DATA / SEEK_HOLE from the chunk map: stored bytes are data, missing rows and the
/// tail of short rows are holes, EOF is an implicit hole; inline files are all data.
pub fn lseek(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    off: u64,
    whence: u32,
) -> Result<u64, Errno> {
    let data = whence == libc::SEEK_DATA as u32;
    if !data && whence != libc::SEEK_HOLE as u32 {
        return Err(Errno::EINVAL);
    }
    let f = load(c, ino)?;
    let size = f.meta.size;
    if off >= size {
        return Err(Errno::ENXIO);
    }
    if f.inline.is_some() {
        return Ok(if data { off } else { size });
    }
    let cs = cfg.chunk_size;
    let mut st = c.prepare_cached(
        "SELECT chunk_index, length(data) FROM fs_data
         WHERE ino = ?1 AND chunk_index >= ?2 ORDER BY chunk_index",
    )?;
    let mut rows = st.query((sql_ino(ino)?, (off / cs) as i64))?;
    let mut pos = off;
    while let Some(r) = rows.next()? {
        let base = r.get::<_, i64>(0)?.max(0) as u64 * cs;
        let stored_end = base + (r.get::<_, i64>(1)?.max(0) as u64).min(cs);
        if base >= size {
            break;
        }
        if data {
            if pos < stored_end {
                return Ok(pos.max(base));
            }
        } else {
            if base > pos {
                return Ok(pos);
            }
            pos = pos.max(stored_end);
            if stored_end < base + cs {
                break;
            }
        }
    }
    if data {
        Err(Errno::ENXIO)
    } else {
        Ok(pos.min(size))
    }
}

/// Copy up to `len` bytes, short at the input's EOF; runs in the caller's transaction.
#[allow(clippy::too_many_arguments)]
pub fn copy_range(
    c: &Connection,
    cfg: &FsConfig,
    ino_in: Ino,
    off_in: u64,
    ino_out: Ino,
    off_out: u64,
    len: u64,
    now: Timespec,
) -> Result<u64, Errno> {
    let src = load(c, ino_in)?;
    load(c, ino_out)?;
    let n = len.min(src.meta.size.saturating_sub(off_in));
    if ino_in == ino_out && off_in < off_out.saturating_add(n) && off_out < off_in.saturating_add(n)
    {
        return Err(Errno::EINVAL);
    }
    off_out
        .checked_add(n)
        .filter(|e| *e <= MAX_FILE_SIZE)
        .ok_or(Errno::EFBIG)?;
    let step = cfg.chunk_size;
    let mut done = 0;
    while done < n {
        let piece = read(c, cfg, ino_in, off_in + done, step.min(n - done))?;
        if piece.is_empty() {
            break;
        }
        write(c, cfg, ino_out, off_out + done, &piece, Some(now))?;
        done += piece.len() as u64;
    }
    Ok(done)
}

/// Read up to `len` bytes at `off` as if the file were at least `min_size` long (pending
/// writes beyond the stored size): the part past the stored bytes reads as zeros, for the
/// caller to overlay.
pub fn read_sized(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    off: u64,
    len: u64,
    min_size: u64,
) -> Result<Vec<u8>, Errno> {
    let f = load(c, ino)?;
    let size = f.meta.size.max(min_size);
    if off >= size || len == 0 {
        return Ok(Vec::new());
    }
    let end = off.saturating_add(len).min(size);
    let mut buf = crate::memory::pool::buffers().zeroed(usize_of(end - off)?);
    match &f.inline {
        Some(bytes) => {
            let have = (bytes.len() as u64).min(f.meta.size).min(end);
            if off < have {
                buf[..(have - off) as usize].copy_from_slice(&bytes[off as usize..have as usize]);
            }
        }
        None => {
            let stored_end = f.meta.size.min(end);
            if off < stored_end {
                read_chunks(
                    c,
                    cfg.chunk_size,
                    ino,
                    off,
                    &mut buf[..(stored_end - off) as usize],
                )?;
            }
        }
    }
    Ok(buf)
}

/// Whether `pieces` (in offset order) together with the first `size` bytes leave no gap.
fn dense(size: u64, pieces: &[(u64, &[u8])]) -> bool {
    let mut covered = size;
    for (o, d) in pieces {
        if *o > covered {
            return false;
        }
        covered = covered.max(o + d.len() as u64);
    }
    true
}

/// Commit pending writes of one inode (the batcher's group commit): `pieces` are
/// non-overlapping and in offset order. Returns false, writing nothing, when the inode no
/// longer exists (reaped while its bytes were pending) or is not a regular file.
///
/// Layout: an inline file stays inline while the result is dense and within
/// inline_threshold; otherwise it spills to chunks. A chunk the pieces cover entirely (up to
/// EOF for the last one) is written blind, never read; a partly covered chunk is read once,
/// merged with every piece that touches it, and written once.
/// Times: mtime becomes `mtime` when given; ctime becomes at least `ctime`.
pub fn write_extents(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    pieces: &[(u64, &[u8])],
    mtime: Option<Timespec>,
    ctime: Timespec,
) -> Result<bool, Errno> {
    let f = match load(c, ino) {
        Ok(f) => f,
        Err(e) if e == Errno::ENOENT || e == Errno::EISDIR || e == Errno::EINVAL => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    };
    let size = f.meta.size;
    let mut max_end = size;
    for (o, d) in pieces {
        let e = o
            .checked_add(d.len() as u64)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        max_end = max_end.max(e);
    }
    let new_size = max_end;
    let cs = cfg.chunk_size;
    match f.inline {
        Some(mut bytes) if new_size <= cfg.inline_threshold && dense(size, pieces) => {
            bytes.resize(usize_of(size)?, 0);
            bytes.resize(usize_of(new_size)?, 0);
            for (o, d) in pieces {
                bytes[*o as usize..*o as usize + d.len()].copy_from_slice(d);
            }
            set_inline(c, ino, &bytes)?;
        }
        Some(bytes) => {
            spill(c, cs, ino, &bytes, size)?;
            write_pieces(c, cs, ino, pieces, new_size)?;
            set_size(c, ino, new_size)?;
        }
        None => {
            write_pieces(c, cs, ino, pieces, new_size)?;
            if new_size != size {
                set_size(c, ino, new_size)?;
            }
        }
    }
    c.prepare_cached(
        "UPDATE fs_inode SET
           mtime = coalesce(?2, mtime), mtime_nsec = coalesce(?3, mtime_nsec),
           ctime = CASE WHEN (ctime, ctime_nsec) < (?4, ?5) THEN ?4 ELSE ctime END,
           ctime_nsec = CASE WHEN (ctime, ctime_nsec) < (?4, ?5) THEN ?5 ELSE ctime_nsec END
         WHERE ino = ?1",
    )?
    .execute((
        sql_ino(ino)?,
        mtime.map(|t| t.sec),
        mtime.map(|t| t.nsec),
        ctime.sec,
        ctime.nsec,
    ))?;
    Ok(true)
}

/// Write pieces into chunk rows, one put per touched chunk (see [`write_extents`]).
fn write_pieces(
    c: &Connection,
    cs: u64,
    ino: Ino,
    pieces: &[(u64, &[u8])],
    new_size: u64,
) -> Result<(), Errno> {
    // (chunk index, offset within the chunk, bytes) in ascending order.
    let mut parts: Vec<(u64, usize, &[u8])> = Vec::new();
    for (o, d) in pieces {
        let mut pos = *o;
        let mut rest = *d;
        while !rest.is_empty() {
            let at = (pos % cs) as usize;
            let n = rest.len().min(cs as usize - at);
            parts.push((pos / cs, at, &rest[..n]));
            pos += n as u64;
            rest = &rest[n..];
        }
    }
    // One incremental-blob handle for the rows patched in place, moved from row to row.
    let mut blob: Option<Blob<'_>> = None;
    let mut i = 0;
    while i < parts.len() {
        let idx = parts[i].0;
        let mut j = i;
        while j < parts.len() && parts[j].0 == idx {
            j += 1;
        }
        let group = &parts[i..j];
        let limit = (new_size - idx * cs).min(cs) as usize;
        let mut covered = 0usize;
        for (_, at, d) in group {
            if *at > covered {
                break;
            }
            covered = covered.max(at + d.len());
        }
        if let [(_, 0, d)] = group {
            if d.len() == limit {
                // One piece is the whole row: stored as it is, without a copy.
                put_chunk(c, ino, idx, d)?;
                i = j;
                continue;
            }
        }
        let mut row = if covered >= limit {
            vec![0u8; limit]
        } else if let Some(rowid) = stored_blob(c, ino, idx, limit)? {
            // The row keeps its length: patch its bytes in place. Only the pages the pieces
            // touch are read and written; the whole row would be read, copied and compared.
            let b = match &mut blob {
                Some(b) => {
                    b.reopen(rowid)?;
                    b
                }
                None => blob.insert(c.blob_open(MAIN_DB, "fs_data", "data", rowid, false)?),
            };
            for (_, at, d) in group {
                b.write_at(d, *at)?;
            }
            i = j;
            continue;
        } else {
            let mut old = get_chunk(c, ino, idx)?.unwrap_or_default();
            old.truncate(limit);
            let need = group
                .iter()
                .map(|(_, at, d)| at + d.len())
                .max()
                .unwrap_or(0);
            if old.len() < need {
                old.resize(need, 0);
            }
            old
        };
        for (_, at, d) in group {
            row[*at..at + d.len()].copy_from_slice(d);
        }
        put_chunk(c, ino, idx, &row)?;
        i = j;
    }
    Ok(())
}
