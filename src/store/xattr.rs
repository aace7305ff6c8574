//! Extended attributes, stored in the fs_xattr extension table (see SPEC.md).
//! Namespace permissions (trusted., security., ...) are the kernel's business.

use rusqlite::{Connection, OptionalExtension};

use super::inode::{meta, sql_ino, touch_c};
use super::{Ino, Timespec};
use crate::errno::Errno;

/// Longest attribute name.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest attribute value.
pub const XATTR_SIZE_MAX: usize = 65536;

pub fn check_name(name: &[u8]) -> Result<(), Errno> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    Ok(())
}

fn exists(c: &Connection, ino: Ino, name: &[u8]) -> Result<bool, Errno> {
    Ok(
        c.prepare_cached("SELECT EXISTS(SELECT 1 FROM fs_xattr WHERE ino = ?1 AND name = ?2)")?
            .query_row((sql_ino(ino)?, name), |r| r.get(0))?,
    )
}

/// setxattr with XATTR_CREATE (EEXIST if present) / XATTR_REPLACE (ENODATA if absent).
pub fn set(
    c: &Connection,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    flags: u32,
    now: Timespec,
) -> Result<(), Errno> {
    check_name(name)?;
    if value.len() > XATTR_SIZE_MAX {
        return Err(Errno::E2BIG);
    }
    meta(c, ino)?;
    let create = flags & libc::XATTR_CREATE as u32 != 0;
    let replace = flags & libc::XATTR_REPLACE as u32 != 0;
    if create || replace {
        let present = exists(c, ino, name)?;
        if create && present {
            return Err(Errno::EEXIST);
        }
        if replace && !present {
            return Err(Errno::ENODATA);
        }
    }
    c.prepare_cached(
        "INSERT INTO fs_xattr (ino, name, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
    )?
    .execute((sql_ino(ino)?, name, value))?;
    touch_c(c, ino, now)
}

/// Give new inode `ino` the attributes of the object it copies, leaving its times alone.
pub fn copy_in(c: &Connection, ino: Ino, attrs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), Errno> {
    let mut st =
        c.prepare_cached("INSERT OR REPLACE INTO fs_xattr (ino, name, value) VALUES (?1, ?2, ?3)")?;
    for (name, value) in attrs {
        check_name(name)?;
        st.execute((sql_ino(ino)?, name, value))?;
    }
    Ok(())
}

pub fn get(c: &Connection, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
    check_name(name)?;
    meta(c, ino)?;
    c.prepare_cached("SELECT value FROM fs_xattr WHERE ino = ?1 AND name = ?2")?
        .query_row((sql_ino(ino)?, name), |r| r.get::<_, Vec<u8>>(0))
        .optional()?
        .ok_or(Errno::ENODATA)
}

/// Every name, each followed by a NUL, in name order.
pub fn list(c: &Connection, ino: Ino) -> Result<Vec<u8>, Errno> {
    meta(c, ino)?;
    let mut out = Vec::new();
    let mut st = c.prepare_cached("SELECT name FROM fs_xattr WHERE ino = ?1 ORDER BY name")?;
    let mut rows = st.query([sql_ino(ino)?])?;
    while let Some(r) = rows.next()? {
        out.extend_from_slice(&super::inode::bytes_of(r.get_ref(0)?));
        out.push(0);
    }
    Ok(out)
}

pub fn remove(c: &Connection, ino: Ino, name: &[u8], now: Timespec) -> Result<(), Errno> {
    check_name(name)?;
    meta(c, ino)?;
    let n = c
        .prepare_cached("DELETE FROM fs_xattr WHERE ino = ?1 AND name = ?2")?
        .execute((sql_ino(ino)?, name))?;
    if n == 0 {
        return Err(Errno::ENODATA);
    }
    touch_c(c, ino, now)
}
