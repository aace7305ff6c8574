//! Inode rows: loading, attributes as stat(2) reports them, times, and the name encoding.
//!
//! Names and symlink targets are byte strings. They are stored as TEXT when they are valid
//! UTF-8 (what every other SPEC implementation writes and reads) and as a BLOB otherwise. Each
//! byte string maps to exactly one storage class, so UNIQUE(parent_ino, name) still rejects
//! duplicates and lookups bind the same class the writer used.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, ToSql};

use super::{Attr, FsConfig, Ino, Timespec};
use crate::errno::Errno;

pub const S_IFMT: u32 = libc::S_IFMT;
pub const S_IFDIR: u32 = libc::S_IFDIR;
pub const S_IFREG: u32 = libc::S_IFREG;
pub const S_IFLNK: u32 = libc::S_IFLNK;
pub const S_ISGID: u32 = libc::S_ISGID;
/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
/// Largest file size (bytes) we accept: SQLite integers are signed 64-bit.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// The current time with nanoseconds.
pub fn now() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nsec: d.subsec_nanos(),
    }
}

/// A name bound as TEXT if it is UTF-8, else as a BLOB (see the module docs).
pub struct Name<'a>(pub &'a [u8]);

impl ToSql for Name<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match std::str::from_utf8(self.0) {
            Ok(_) => ValueRef::Text(self.0),
            Err(_) => ValueRef::Blob(self.0),
        }))
    }
}

/// The bytes of a TEXT or BLOB column (anything else reads as empty).
pub fn bytes_of(v: ValueRef<'_>) -> Vec<u8> {
    match v {
        ValueRef::Text(b) | ValueRef::Blob(b) => b.to_vec(),
        _ => Vec::new(),
    }
}

/// Validate a name for a new entry: ENAMETOOLONG over 255 bytes; EINVAL for empty names and
/// names containing '/' or NUL; EEXIST for "." and "..".
pub fn check_new_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if name == b"." || name == b".." {
        return Err(Errno::EEXIST);
    }
    Ok(())
}

/// One fs_inode row without its inline bytes.
#[derive(Clone, Debug)]
pub struct Meta {
    pub ino: Ino,
    pub mode: u32,
    pub nlink: i64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub rdev: u32,
    pub storage_kind: i64,
}

impl Meta {
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }
}

/// The columns `meta_from_row` expects, in order, as a string literal (so hot queries are
/// `concat!`ed at compile time, not formatted per call); `meta_cols!("i.")` qualifies each.
macro_rules! meta_cols {
    ($p:literal) => {
        concat!(
            $p,
            "ino, ",
            $p,
            "mode, ",
            $p,
            "nlink, ",
            $p,
            "uid, ",
            $p,
            "gid, ",
            $p,
            "size, ",
            $p,
            "atime, ",
            $p,
            "atime_nsec, ",
            $p,
            "mtime, ",
            $p,
            "mtime_nsec, ",
            $p,
            "ctime, ",
            $p,
            "ctime_nsec, ",
            $p,
            "rdev, ",
            $p,
            "storage_kind"
        )
    };
    () => {
        meta_cols!("")
    };
}
pub(crate) use meta_cols;

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

/// Decode the first 14 columns (`meta_cols!`) of a row.
pub fn meta_from_row(r: &Row<'_>) -> rusqlite::Result<Meta> {
    Ok(Meta {
        ino: Ino(r.get::<_, i64>(0)? as u64),
        mode: r.get::<_, i64>(1)? as u32,
        nlink: r.get(2)?,
        uid: r.get::<_, i64>(3)? as u32,
        gid: r.get::<_, i64>(4)? as u32,
        size: r.get::<_, i64>(5)?.max(0) as u64,
        atime: ts(r.get(6)?, r.get(7)?),
        mtime: ts(r.get(8)?, r.get(9)?),
        ctime: ts(r.get(10)?, r.get(11)?),
        rdev: r.get::<_, i64>(12)? as u32,
        storage_kind: r.get(13)?,
    })
}

/// An inode number as SQLite binds it.
pub fn sql_ino(ino: Ino) -> Result<i64, Errno> {
    i64::try_from(ino.0).map_err(|_| Errno::ENOENT)
}

/// The inode row, or None.
pub fn meta_opt(c: &Connection, ino: Ino) -> Result<Option<Meta>, Errno> {
    let Ok(id) = i64::try_from(ino.0) else {
        return Ok(None);
    };
    let mut st = c.prepare_cached(concat!(
        "SELECT ",
        meta_cols!(),
        " FROM fs_inode WHERE ino = ?1"
    ))?;
    Ok(st.query_row([id], meta_from_row).optional()?)
}

/// The inode row; ENOENT if missing.
pub fn meta(c: &Connection, ino: Ino) -> Result<Meta, Errno> {
    meta_opt(c, ino)?.ok_or(Errno::ENOENT)
}

/// A directory's row: ENOENT if missing, ENOTDIR if not a directory.
pub fn dir_meta(c: &Connection, ino: Ino) -> Result<Meta, Errno> {
    let m = meta(c, ino)?;
    if !m.is_dir() {
        return Err(Errno::ENOTDIR);
    }
    Ok(m)
}

/// The entry `name` in `parent`: (dentry id, inode), or None.
pub fn dentry(c: &Connection, parent: Ino, name: &[u8]) -> Result<Option<(i64, Ino)>, Errno> {
    let mut st =
        c.prepare_cached("SELECT id, ino FROM fs_dentry WHERE parent_ino = ?1 AND name = ?2")?;
    Ok(st
        .query_row((sql_ino(parent)?, Name(name)), |r| {
            Ok((r.get::<_, i64>(0)?, Ino(r.get::<_, i64>(1)? as u64)))
        })
        .optional()?)
}

/// The parent of a directory (its only dentry's parent); the root is its own parent, and so
/// is a removed (orphaned) directory.
pub fn parent_of_dir(c: &Connection, ino: Ino) -> Result<Ino, Errno> {
    if ino == Ino::ROOT {
        return Ok(ino);
    }
    let mut st = c.prepare_cached("SELECT parent_ino FROM fs_dentry WHERE ino = ?1 LIMIT 1")?;
    let p: Option<i64> = st.query_row([sql_ino(ino)?], |r| r.get(0)).optional()?;
    Ok(p.map_or(ino, |p| Ino(p as u64)))
}

/// Number of subdirectories of a directory: one row of fs_dir_stats, which triggers keep
/// current in the same transaction as every dentry change. A read-only open of a foreign
/// database without that table counts the entries instead (O(entries)).
fn subdirs(c: &Connection, ino: Ino) -> Result<u64, Errno> {
    let id = sql_ino(ino)?;
    if let Ok(mut st) = c.prepare_cached("SELECT subdirs FROM fs_dir_stats WHERE ino = ?1") {
        let n: Option<i64> = st.query_row([id], |r| r.get(0)).optional()?;
        return Ok(n.unwrap_or(0).max(0) as u64);
    }
    let mut st = c.prepare_cached(
        "SELECT count(*) FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino
         WHERE d.parent_ino = ?1 AND (i.mode & ?2) = ?3",
    )?;
    let n: i64 = st.query_row((id, S_IFMT, S_IFDIR), |r| r.get(0))?;
    Ok(n.max(0) as u64)
}

/// 512-byte blocks: for a chunked file the smaller of its stored rows (counted on the primary
/// key index, never reading the blobs) times chunk_size and its size; inline bytes rounded up.
fn blocks(c: &Connection, cfg: &FsConfig, m: &Meta) -> Result<u64, Errno> {
    // Counted chunks never exceed the size, so an empty file needs no count.
    if !m.is_reg() || m.size == 0 {
        return Ok(0);
    }
    let bytes = if m.storage_kind == 1 {
        m.size
    } else {
        let mut st = c.prepare_cached("SELECT count(*) FROM fs_data WHERE ino = ?1")?;
        let rows: i64 = st.query_row([sql_ino(m.ino)?], |r| r.get(0))?;
        (rows.max(0) as u64)
            .saturating_mul(cfg.chunk_size)
            .min(m.size)
    };
    Ok(bytes.div_ceil(512))
}

/// The attributes as stat(2) reports them: POSIX nlink for directories (2 + subdirectories,
/// 0 once removed), the stored nlink otherwise.
pub fn attr(c: &Connection, cfg: &FsConfig, m: &Meta) -> Result<Attr, Errno> {
    let nlink = if m.is_dir() && m.nlink > 0 {
        2 + subdirs(c, m.ino)?
    } else {
        m.nlink.max(0) as u64
    };
    Ok(Attr {
        ino: m.ino,
        mode: m.mode,
        nlink: u32::try_from(nlink).unwrap_or(u32::MAX),
        uid: m.uid,
        gid: m.gid,
        size: m.size,
        blocks: blocks(c, cfg, m)?,
        atime: m.atime,
        mtime: m.mtime,
        ctime: m.ctime,
        rdev: m.rdev,
    })
}

/// Load and report one inode.
pub fn attr_of(c: &Connection, cfg: &FsConfig, ino: Ino) -> Result<Attr, Errno> {
    attr(c, cfg, &meta(c, ino)?)
}

/// Set mtime and ctime to `t`.
pub fn touch_mc(c: &Connection, ino: Ino, t: Timespec) -> Result<(), Errno> {
    let mut st = c.prepare_cached(
        "UPDATE fs_inode SET mtime = ?2, mtime_nsec = ?3, ctime = ?2, ctime_nsec = ?3
         WHERE ino = ?1",
    )?;
    st.execute((sql_ino(ino)?, t.sec, t.nsec))?;
    Ok(())
}

/// Set ctime to `t`.
pub fn touch_c(c: &Connection, ino: Ino, t: Timespec) -> Result<(), Errno> {
    let mut st =
        c.prepare_cached("UPDATE fs_inode SET ctime = ?2, ctime_nsec = ?3 WHERE ino = ?1")?;
    st.execute((sql_ino(ino)?, t.sec, t.nsec))?;
    Ok(())
}

/// Delete every row that belongs to an inode (data, symlink, xattrs, overlay bookkeeping and
/// the inode itself). Callers decide that the inode is dead.
pub fn delete_rows(c: &Connection, ino: Ino) -> Result<(), Errno> {
    let id = sql_ino(ino)?;
    for sql in [
        "DELETE FROM fs_data WHERE ino = ?1",
        "DELETE FROM fs_symlink WHERE ino = ?1",
        "DELETE FROM fs_xattr WHERE ino = ?1",
        "DELETE FROM fs_origin WHERE delta_ino = ?1",
        "DELETE FROM fs_partial_origin WHERE delta_ino = ?1",
        "DELETE FROM fs_chunk_override WHERE delta_ino = ?1",
        "DELETE FROM fs_inode WHERE ino = ?1",
    ] {
        c.prepare_cached(sql)?.execute([id])?;
    }
    Ok(())
}
