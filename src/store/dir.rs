//! Directory listing and path resolution.
//!
//! readdir cookies: 1 resumes after ".", 2 after "..", and `id + 2` after the entry whose
//! fs_dentry.id is `id`. Entries are listed in id order through idx_fs_dentry_parent_id, so a
//! listing resumed at a cookie never repeats or skips an entry that survived in between
//! (new entries get larger ids; a renamed entry keeps its id).

use rusqlite::Connection;

use super::inode::{
    attr, bytes_of, dentry, dir_meta, meta, meta_cols, meta_from_row, parent_of_dir, sql_ino, Meta,
    NAME_MAX, S_IFMT,
};
use super::{Attr, DirEntry, FsConfig, Ino};
use crate::errno::Errno;

pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;

/// The cookie that resumes a listing after the entry whose fs_dentry.id is `id`.
pub fn cookie(id: i64) -> u64 {
    id as u64 + COOKIE_DOTDOT
}

/// The start of a page: "." and ".." as far as the cookie and the page size leave room for
/// them, and what the query for the real entries needs.
struct Start {
    dots: Vec<(DirEntry, Meta)>,
    /// The dentry id to resume after.
    after: i64,
    /// How many rows to ask for.
    want: i64,
}

fn start(c: &Connection, ino: Ino, offset: u64, max: usize) -> Result<Start, Errno> {
    let me = dir_meta(c, ino)?;
    let mut out = Vec::new();
    if max == 0 {
        return Ok(Start {
            dots: out,
            after: 0,
            want: 0,
        });
    }
    if offset < COOKIE_DOT {
        out.push((entry(&me, b".", COOKIE_DOT), me.clone()));
    }
    if offset < COOKIE_DOTDOT && out.len() < max {
        let up = meta(c, parent_of_dir(c, ino)?)?;
        out.push((entry(&up, b"..", COOKIE_DOTDOT), up));
    }
    let after = offset.saturating_sub(COOKIE_DOTDOT).min(i64::MAX as u64) as i64;
    let want = (max - out.len()) as i64;
    Ok(Start {
        dots: out,
        after,
        want,
    })
}

/// Up to `max` entries after cookie `offset`, each with its inode row.
pub fn list(
    c: &Connection,
    ino: Ino,
    offset: u64,
    max: usize,
) -> Result<Vec<(DirEntry, Meta)>, Errno> {
    let Start {
        dots: mut out,
        after,
        want,
    } = start(c, ino, offset, max)?;
    if want == 0 {
        return Ok(out);
    }
    let mut st = c.prepare_cached(concat!(
        "SELECT ",
        meta_cols!("i."),
        ", d.id, d.name FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino
         WHERE d.parent_ino = ?1 AND d.id > ?2 ORDER BY d.id LIMIT ?3"
    ))?;
    let rows = st.query_map((sql_ino(ino)?, after, want), |r| {
        let m = meta_from_row(r)?;
        let id: i64 = r.get(14)?;
        let name = bytes_of(r.get_ref(15)?);
        Ok((id, name, m))
    })?;
    for row in rows {
        let (id, name, m) = row?;
        let e = entry(&m, &name, cookie(id));
        out.push((e, m));
    }
    Ok(out)
}

/// [`list`] without the inode rows: only what a READDIR reply carries (name, inode number,
/// file type), read with four columns instead of sixteen.
pub fn names(c: &Connection, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>, Errno> {
    let Start { dots, after, want } = start(c, ino, offset, max)?;
    let mut out: Vec<DirEntry> = dots.into_iter().map(|(e, _)| e).collect();
    if want == 0 {
        return Ok(out);
    }
    let mut st = c.prepare_cached(
        "SELECT d.id, d.name, d.ino, i.mode FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino
         WHERE d.parent_ino = ?1 AND d.id > ?2 ORDER BY d.id LIMIT ?3",
    )?;
    let rows = st.query_map((sql_ino(ino)?, after, want), |r| {
        Ok(DirEntry {
            offset: cookie(r.get(0)?),
            name: bytes_of(r.get_ref(1)?),
            ino: Ino(r.get::<_, i64>(2)? as u64),
            kind: r.get::<_, i64>(3)? as u32 & S_IFMT,
        })
    })?;
    for row in rows {
        out.push(row?);
    }
    Ok(out)
}

fn entry(m: &Meta, name: &[u8], offset: u64) -> DirEntry {
    DirEntry {
        ino: m.ino,
        name: name.to_vec(),
        kind: m.mode & S_IFMT,
        offset,
    }
}

/// readdirplus: the listing plus each entry's attributes.
pub fn list_plus(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    offset: u64,
    max: usize,
) -> Result<Vec<(DirEntry, Attr)>, Errno> {
    list(c, ino, offset, max)?
        .into_iter()
        .map(|(e, m)| Ok((e, attr(c, cfg, &m)?)))
        .collect()
}

/// The inode `name` names in directory `parent`, or None: ENOENT/ENOTDIR for the parent,
/// ENAMETOOLONG. Only real names ("." and ".." are [`lookup`]'s).
pub fn child(c: &Connection, parent: Ino, name: &[u8]) -> Result<Option<Ino>, Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    // A name is only ever stored under a directory, so a hit needs no look at the parent;
    // a miss reads it for the errno (ENOTDIR, or ENOENT for a parent that is gone).
    if let Some((_, ino)) = dentry(c, parent, name)? {
        return Ok(Some(ino));
    }
    dir_meta(c, parent)?;
    Ok(None)
}

/// lookup: "." and ".." are answered from the directory itself.
pub fn lookup(c: &Connection, cfg: &FsConfig, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    dir_meta(c, parent)?;
    let ino = match name {
        b"." => parent,
        b".." => parent_of_dir(c, parent)?,
        _ => dentry(c, parent, name)?.ok_or(Errno::ENOENT)?.1,
    };
    attr(c, cfg, &meta(c, ino)?)
}

/// Resolve an absolute path without following symlinks ("." and ".." are understood).
pub fn resolve(c: &Connection, path: &[u8]) -> Result<Ino, Errno> {
    if path.first() != Some(&b'/') {
        return Err(Errno::EINVAL);
    }
    let mut cur = Ino::ROOT;
    for comp in path.split(|b| *b == b'/') {
        if comp.is_empty() || comp == b"." {
            dir_meta(c, cur)?;
            continue;
        }
        if comp.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        dir_meta(c, cur)?;
        cur = if comp == b".." {
            parent_of_dir(c, cur)?
        } else {
            dentry(c, cur, comp)?.ok_or(Errno::ENOENT)?.1
        };
    }
    Ok(cur)
}
