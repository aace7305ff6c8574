//! Namespace operations: each function runs inside the caller's single write transaction.

use rusqlite::{Connection, OptionalExtension};

use super::inode::{
    attr, attr_of, check_new_name, delete_rows, dentry, dir_meta, meta, parent_of_dir, sql_ino,
    touch_c, touch_mc, Meta, Name, NAME_MAX, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, S_ISGID,
};
use super::{Attr, Caller, FsConfig, Ino, Liveness, RenameFlags, Timespec};
use crate::errno::Errno;

/// Longest symlink target accepted (PATH_MAX).
const TARGET_MAX: usize = 4096;

/// What a new inode is.
pub enum NewKind<'a> {
    /// A regular file or special file with this full mode and rdev.
    Node {
        mode: u32,
        rdev: u32,
    },
    Dir {
        perm: u32,
    },
    Symlink {
        target: &'a [u8],
    },
    /// An unnamed regular file (O_TMPFILE): nlink 0 from the start, no entry, the parent
    /// untouched; it lives while the kernel references it, or gets a name by link.
    Tmpfile {
        perm: u32,
    },
}

/// A parent that can receive a new entry: exists, is a directory and has not been removed.
fn live_parent(c: &Connection, parent: Ino) -> Result<super::inode::Meta, Errno> {
    let p = dir_meta(c, parent)?;
    if p.nlink <= 0 {
        return Err(Errno::ENOENT);
    }
    Ok(p)
}

pub(super) fn insert_dentry(
    c: &Connection,
    parent: Ino,
    name: &[u8],
    ino: Ino,
) -> Result<i64, Errno> {
    let mut st = c.prepare_cached(
        "INSERT INTO fs_dentry (name, parent_ino, ino) VALUES (?1, ?2, ?3) RETURNING id",
    )?;
    match st.query_row((Name(name), sql_ino(parent)?, sql_ino(ino)?), |r| r.get(0)) {
        Ok(id) => Ok(id),
        // UNIQUE(parent_ino, name): the one constraint that is an answer, a duplicate name.
        Err(rusqlite::Error::SqliteFailure(f, _))
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE =>
        {
            Err(Errno::EEXIST)
        }
        Err(e) => Err(e.into()),
    }
}

/// Create a new inode named `name` in `parent` (mknod, mkdir, symlink, create). Returns its
/// attributes and the id of its entry (None for an unnamed file).
pub fn create(
    c: &Connection,
    cfg: &FsConfig,
    parent: Ino,
    name: &[u8],
    kind: NewKind<'_>,
    caller: Caller,
    now: Timespec,
) -> Result<(Attr, Option<i64>), Errno> {
    let named = !matches!(kind, NewKind::Tmpfile { .. });
    if named {
        check_new_name(name)?;
    }
    let p = live_parent(c, parent)?;
    if named && dentry(c, parent, name)?.is_some() {
        return Err(Errno::EEXIST);
    }
    let setgid = p.mode & S_ISGID != 0;
    let gid = if setgid { p.gid } else { caller.gid };
    let (mode, rdev, size, target) = match kind {
        NewKind::Node { mode, rdev } => {
            let mode = if mode & S_IFMT == 0 {
                mode | S_IFREG
            } else {
                mode
            };
            match mode & S_IFMT {
                libc::S_IFREG | libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFSOCK => {}
                _ => return Err(Errno::EINVAL),
            }
            (mode & (S_IFMT | 0o7777), rdev, 0usize, None)
        }
        NewKind::Dir { perm } => {
            let sgid = if setgid { S_ISGID } else { 0 };
            (S_IFDIR | (perm & 0o7777) | sgid, 0, 0, None)
        }
        NewKind::Symlink { target } => {
            if target.is_empty() {
                return Err(Errno::ENOENT);
            }
            if target.len() > TARGET_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            (S_IFLNK | 0o777, 0, target.len(), Some(target))
        }
        NewKind::Tmpfile { perm } => (S_IFREG | (perm & 0o7777), 0, 0, None),
    };
    // New regular files start inline (empty and dense); everything else is storage_kind 0.
    let inline = mode & S_IFMT == S_IFREG;
    let ino: i64 = c
        .prepare_cached(
            "INSERT INTO fs_inode (mode, nlink, uid, gid, size, atime, mtime, ctime, rdev,
                                   atime_nsec, mtime_nsec, ctime_nsec, data_inline, storage_kind)
             VALUES (?1, ?9, ?2, ?3, ?4, ?5, ?5, ?5, ?6, ?7, ?7, ?7,
                     CASE WHEN ?8 THEN x'' END, CASE WHEN ?8 THEN 1 ELSE 0 END)
             RETURNING ino",
        )?
        .query_row(
            (
                mode,
                caller.uid,
                gid,
                size as i64,
                now.sec,
                rdev,
                now.nsec,
                inline,
                u32::from(named),
            ),
            |r| r.get(0),
        )?;
    let ino = Ino(ino as u64);
    // The row as just inserted (no triggers change fs_inode), so it is not read back.
    let made = Meta {
        ino,
        mode,
        nlink: i64::from(named),
        uid: caller.uid,
        gid,
        size: size as u64,
        atime: now,
        mtime: now,
        ctime: now,
        rdev,
        storage_kind: i64::from(inline),
    };
    let mut id = None;
    if named {
        id = Some(insert_dentry(c, parent, name, ino)?);
        if let Some(t) = target {
            c.prepare_cached("INSERT INTO fs_symlink (ino, target) VALUES (?1, ?2)")?
                .execute((sql_ino(ino)?, Name(t)))?;
        }
        touch_mc(c, parent, now)?;
    }
    Ok((attr(c, cfg, &made)?, id))
}

/// A new name for an existing non-directory inode. Returns its attributes and the id of the
/// new entry.
pub fn link(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    newparent: Ino,
    newname: &[u8],
    now: Timespec,
) -> Result<(Attr, i64), Errno> {
    let m = meta(c, ino)?;
    if m.is_dir() {
        return Err(Errno::EPERM);
    }
    // An unnamed regular file may get a name: an O_TMPFILE file (the kernel lets only those
    // be linked once their last name is gone).
    if m.nlink <= 0 && m.mode & S_IFMT != S_IFREG {
        return Err(Errno::ENOENT);
    }
    check_new_name(newname)?;
    live_parent(c, newparent)?;
    if dentry(c, newparent, newname)?.is_some() {
        return Err(Errno::EEXIST);
    }
    let id = insert_dentry(c, newparent, newname, ino)?;
    c.prepare_cached("UPDATE fs_inode SET nlink = nlink + 1 WHERE ino = ?1")?
        .execute([sql_ino(ino)?])?;
    touch_c(c, ino, now)?;
    touch_mc(c, newparent, now)?;
    Ok((attr_of(c, cfg, ino)?, id))
}

/// Take one name away from `ino` (its dentry is already gone): decrement nlink and, when the
/// last name went, either keep the rows as an orphan (the kernel still references it) or
/// delete them now. Returns the names left and whether the rows were deleted.
fn drop_name(
    c: &Connection,
    ino: Ino,
    live: &dyn Liveness,
    now: Timespec,
) -> Result<(i64, bool), Errno> {
    let left: i64 = c
        .prepare_cached(
            "UPDATE fs_inode SET nlink = max(nlink - 1, 0), ctime = ?2, ctime_nsec = ?3
             WHERE ino = ?1 RETURNING nlink",
        )?
        .query_row((sql_ino(ino)?, now.sec, now.nsec), |r| r.get(0))?;
    let dead = left == 0 && !live.retain_orphan(ino);
    if dead {
        delete_rows(c, ino)?;
    }
    Ok((left, dead))
}

fn has_children(c: &Connection, dir: Ino) -> Result<bool, Errno> {
    Ok(
        c.prepare_cached("SELECT EXISTS(SELECT 1 FROM fs_dentry WHERE parent_ino = ?1)")?
            .query_row([sql_ino(dir)?], |r| r.get(0))?,
    )
}

fn delete_dentry(c: &Connection, id: i64) -> Result<(), Errno> {
    c.prepare_cached("DELETE FROM fs_dentry WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

fn check_lookup_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

/// What [`remove`] took away.
pub struct Removed {
    /// The inode the name led to.
    pub ino: Ino,
    /// A non-directory that keeps at least one other name.
    pub keeps_names: bool,
    /// Whether its rows were deleted (its last name, and nothing references it).
    pub deleted: bool,
}

/// unlink (`dir` false) or rmdir (`dir` true).
pub fn remove(
    c: &Connection,
    parent: Ino,
    name: &[u8],
    dir: bool,
    live: &dyn Liveness,
    now: Timespec,
) -> Result<Removed, Errno> {
    check_lookup_name(name)?;
    let found = dentry(c, parent, name)?;
    if found.is_none() {
        // A name is only ever stored under a directory (and never "." or ".."): only without
        // one does the parent need a look, ENOTDIR coming before every other errno.
        dir_meta(c, parent)?;
    }
    if dir && name == b"." {
        return Err(Errno::EINVAL);
    }
    if dir && name == b".." {
        return Err(Errno::ENOTEMPTY);
    }
    if !dir && (name == b"." || name == b"..") {
        return Err(Errno::EISDIR);
    }
    let found = found.ok_or(Errno::ENOENT)?;
    remove_found(c, parent, found, dir, live, now)
}

/// [`remove`] of the entry `found` (its dentry id and inode) of `parent`, a name already
/// checked: not ".", not "..", not too long.
pub fn remove_found(
    c: &Connection,
    parent: Ino,
    (id, ino): (i64, Ino),
    dir: bool,
    live: &dyn Liveness,
    now: Timespec,
) -> Result<Removed, Errno> {
    let m = meta(c, ino)?;
    match (dir, m.is_dir()) {
        (false, true) => return Err(Errno::EISDIR),
        (true, false) => return Err(Errno::ENOTDIR),
        (true, true) if has_children(c, ino)? => return Err(Errno::ENOTEMPTY),
        _ => {}
    }
    delete_dentry(c, id)?;
    let (left, deleted) = drop_name(c, ino, live, now)?;
    touch_mc(c, parent, now)?;
    Ok(Removed {
        ino,
        keeps_names: left > 0 && !m.is_dir(),
        deleted,
    })
}

/// Whether `dir` is `anc` or lies below it (walks parents up to the root).
fn is_within(c: &Connection, mut dir: Ino, anc: Ino) -> Result<bool, Errno> {
    for _ in 0..100_000 {
        if dir == anc {
            return Ok(true);
        }
        let up = parent_of_dir(c, dir)?;
        if up == dir {
            return Ok(false);
        }
        dir = up;
    }
    Err(Errno::EIO)
}

/// rename / RENAME2 with all POSIX rules (see [`super::Store::rename`]). Returns whether the
/// parents' only change is their times (`now`): no directory moved (their link counts) and
/// the rename was no no-op (two names of one inode).
#[allow(clippy::too_many_arguments)]
pub fn rename(
    c: &Connection,
    parent: Ino,
    name: &[u8],
    newparent: Ino,
    newname: &[u8],
    flags: RenameFlags,
    live: &dyn Liveness,
    now: Timespec,
) -> Result<bool, Errno> {
    if flags.noreplace && flags.exchange {
        return Err(Errno::EINVAL);
    }
    check_lookup_name(name)?;
    if newname.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    for n in [name, newname] {
        if n.is_empty() || n == b"." || n == b".." || n.contains(&b'/') || n.contains(&0) {
            return Err(Errno::EINVAL);
        }
    }
    let found = dentry(c, parent, name)?;
    let dst = dentry(c, newparent, newname)?;
    // A name is only ever stored under a directory: a parent is read only where no name was
    // found in it, for its errno (ENOTDIR for either parent before ENOENT for the source).
    if found.is_none() {
        dir_meta(c, parent)?;
    }
    if dst.is_none() {
        dir_meta(c, newparent)?;
    }
    let (src_id, src) = found.ok_or(Errno::ENOENT)?;
    let sm = meta(c, src)?;
    if flags.exchange {
        let (dst_id, dst) = dst.ok_or(Errno::ENOENT)?;
        return exchange(c, (parent, src_id, src), (newparent, dst_id, dst), now);
    }
    if sm.is_dir() && is_within(c, newparent, src)? {
        return Err(Errno::EINVAL);
    }
    if let Some((dst_id, dst)) = dst {
        if flags.noreplace {
            return Err(Errno::EEXIST);
        }
        if dst == src {
            return Ok(false);
        }
        let dm = meta(c, dst)?;
        match (sm.is_dir(), dm.is_dir()) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if has_children(c, dst)? => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        delete_dentry(c, dst_id)?;
        drop_name(c, dst, live, now)?;
    } else {
        live_parent(c, newparent)?;
    }
    c.prepare_cached("UPDATE fs_dentry SET parent_ino = ?2, name = ?3 WHERE id = ?1")?
        .execute((src_id, sql_ino(newparent)?, Name(newname)))?;
    touch_c(c, src, now)?;
    touch_mc(c, parent, now)?;
    if newparent != parent {
        touch_mc(c, newparent, now)?;
    }
    // A non-directory can only replace a non-directory.
    Ok(!sm.is_dir())
}

/// RENAME_EXCHANGE: the two entries swap inodes; directories may change parents, so neither
/// may be moved inside itself.
fn exchange(
    c: &Connection,
    (parent, src_id, src): (Ino, i64, Ino),
    (newparent, dst_id, dst): (Ino, i64, Ino),
    now: Timespec,
) -> Result<bool, Errno> {
    if src == dst {
        return Ok(false);
    }
    let src_dir = meta(c, src)?.is_dir();
    if src_dir && is_within(c, newparent, src)? {
        return Err(Errno::EINVAL);
    }
    let dst_dir = meta(c, dst)?.is_dir();
    if dst_dir && is_within(c, parent, dst)? {
        return Err(Errno::EINVAL);
    }
    let mut st = c.prepare_cached("UPDATE fs_dentry SET ino = ?2 WHERE id = ?1")?;
    st.execute((src_id, sql_ino(dst)?))?;
    st.execute((dst_id, sql_ino(src)?))?;
    touch_c(c, src, now)?;
    touch_c(c, dst, now)?;
    touch_mc(c, parent, now)?;
    if newparent != parent {
        touch_mc(c, newparent, now)?;
    }
    Ok(!src_dir && !dst_dir)
}

/// Delete an orphan's rows if it still has nlink 0 and no names; a no-op otherwise. Returns
/// whether the inode is gone now (deleted here, or not there at all).
pub fn reap(c: &Connection, ino: Ino) -> Result<bool, Errno> {
    if ino == Ino::ROOT {
        return Ok(false);
    }
    let orphan: Option<bool> = c
        .prepare_cached(
            "SELECT nlink = 0 AND NOT EXISTS(SELECT 1 FROM fs_dentry WHERE ino = ?1)
             FROM fs_inode WHERE ino = ?1",
        )?
        .query_row([sql_ino(ino)?], |r| r.get(0))
        .optional()?;
    match orphan {
        Some(true) => delete_rows(c, ino).map(|_| true),
        Some(false) => Ok(false),
        None => Ok(true),
    }
}

/// Every inode with nlink 0 (never the root), by the partial index `idx_fs_inode_orphan`.
pub fn orphans(c: &Connection) -> Result<Vec<Ino>, Errno> {
    let inos: Vec<i64> = c
        .prepare_cached("SELECT ino FROM fs_inode WHERE nlink = 0 AND ino != 1")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(inos.into_iter().map(|i| Ino(i as u64)).collect())
}

/// Delete every orphan (nlink 0, not the root). Returns how many were deleted.
pub fn reap_orphans(c: &Connection) -> Result<u64, Errno> {
    let mut n = 0;
    for ino in orphans(c)? {
        if reap(c, ino)? {
            n += 1;
        }
    }
    Ok(n)
}

/// readlink: the target bytes; EINVAL if `ino` is not a symlink.
pub fn readlink(c: &Connection, ino: Ino) -> Result<Vec<u8>, Errno> {
    if !meta(c, ino)?.is_symlink() {
        return Err(Errno::EINVAL);
    }
    let mut st = c.prepare_cached("SELECT target FROM fs_symlink WHERE ino = ?1")?;
    let t = st.query_row([sql_ino(ino)?], |r| {
        Ok(super::inode::bytes_of(r.get_ref(0)?))
    });
    match t {
        Ok(t) => Ok(t),
        Err(rusqlite::Error::QueryReturnedNoRows) => Err(Errno::EIO),
        Err(e) => Err(e.into()),
    }
}
