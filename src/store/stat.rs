//! setattr and statfs.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use super::inode::{attr, attr_of, meta, sql_ino, S_IFMT};
use super::{Attr, FsConfig, Ino, SetAttr, StatFs, TimeSet, Timespec};
use crate::errno::Errno;

pub(super) fn resolve_time(t: TimeSet, now: Timespec) -> Result<Timespec, Errno> {
    match t {
        TimeSet::Now => Ok(now),
        TimeSet::At(ts) if ts.nsec < 1_000_000_000 => Ok(ts),
        TimeSet::At(_) => Err(Errno::EINVAL),
    }
}

/// Apply a SETATTR in the caller's transaction.
pub fn setattr(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    set: &SetAttr,
    now: Timespec,
) -> Result<Attr, Errno> {
    let mut m = meta(c, ino)?;
    let id = sql_ino(ino)?;
    let nothing = set.mode.is_none()
        && set.uid.is_none()
        && set.gid.is_none()
        && set.size.is_none()
        && set.atime.is_none()
        && set.mtime.is_none()
        && set.ctime.is_none();
    if nothing {
        return attr(c, cfg, &m);
    }
    let mode = set.mode.map(|mode| (m.mode & S_IFMT) | (mode & 0o7777));
    let atime = set.atime.map(|t| resolve_time(t, now)).transpose()?;
    let mtime = set.mtime.map(|t| resolve_time(t, now)).transpose()?;
    let ctime = resolve_time(set.ctime.map_or(TimeSet::Now, TimeSet::At), now)?;
    if let Some(size) = set.size {
        if m.is_dir() {
            return Err(Errno::EISDIR);
        }
        if !m.is_reg() {
            return Err(Errno::EINVAL);
        }
        super::data::truncate(c, cfg, ino, size, now)?;
    }
    // Every other field in one statement, after the truncate (whose mtime an explicit one
    // overrides).
    c.prepare_cached(
        "UPDATE fs_inode SET mode = coalesce(?2, mode), uid = coalesce(?3, uid),
                             gid = coalesce(?4, gid),
                             atime = coalesce(?5, atime), atime_nsec = coalesce(?6, atime_nsec),
                             mtime = coalesce(?7, mtime), mtime_nsec = coalesce(?8, mtime_nsec),
                             ctime = ?9, ctime_nsec = ?10
         WHERE ino = ?1",
    )?
    .execute((
        id,
        mode,
        set.uid,
        set.gid,
        atime.map(|t| t.sec),
        atime.map(|t| t.nsec),
        mtime.map(|t| t.sec),
        mtime.map(|t| t.nsec),
        ctime.sec,
        ctime.nsec,
    ))?;
    if set.size.is_some() {
        // The truncate changed the size, the data and the times: read them back.
        return attr_of(c, cfg, ino);
    }
    m.mode = mode.unwrap_or(m.mode);
    m.uid = set.uid.unwrap_or(m.uid);
    m.gid = set.gid.unwrap_or(m.gid);
    m.atime = atime.unwrap_or(m.atime);
    m.mtime = mtime.unwrap_or(m.mtime);
    m.ctime = ctime;
    attr(c, cfg, &m)
}

/// Block size statfs reports.
const BSIZE: u64 = 4096;

/// statfs from page counts and the inode sequence: no table scans. Capacity is the database's
/// used pages plus its free pages plus what the host filesystem can still give it.
pub fn statfs(c: &Connection, path: &Path) -> Result<StatFs, Errno> {
    let page_size: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = c.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    let seq: i64 = c
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'fs_inode'",
            [],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(1);
    let ps = page_size.max(0) as u64;
    let used = (pages - free).max(0) as u64 * ps;
    let (host_free, _) = crate::sys::space::host_space(path).unwrap_or((0, 0));
    let free_bytes = free.max(0) as u64 * ps + host_free;
    let blocks = (used + free_bytes) / BSIZE;
    let bfree = free_bytes / BSIZE;
    // One inode costs at least a row of a few dozen bytes; estimate one per 512 free bytes.
    let ffree = free_bytes / 512;
    Ok(StatFs {
        blocks,
        bfree,
        bavail: bfree,
        files: seq.max(1) as u64 + ffree,
        ffree,
        bsize: BSIZE as u32,
        namelen: super::inode::NAME_MAX as u32,
        frsize: BSIZE as u32,
    })
}
