//! The overlay delta as the mount changes it: copy-up of base objects (fs_origin,
//! fs_partial_origin), whiteouts written in the same transaction as the namespace change that
//! needs them, and partial-origin chunk overrides. The merged view itself is built in
//! `crate::overlay`; everything here is one write transaction per call.

use std::collections::{HashMap, HashSet};

use rusqlite::{Connection, OptionalExtension};

use super::inode::{self, bytes_of, sql_ino, Name};
use super::{data, namespace, Ino, Store, Timespec};
use crate::errno::Errno;

/// Whiteout changes that must commit atomically with a namespace operation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Effects<'a> {
    /// Hide the base entry at this absolute path.
    pub whiteout: Option<&'a [u8]>,
    /// Forget the whiteout at this path (a new entry is created there).
    pub unwhiteout: Option<&'a [u8]>,
    /// Drop the whiteouts of this directory's children (the directory is removed).
    pub clear_children: Option<&'a [u8]>,
}

impl Effects<'_> {
    pub const NONE: Effects<'static> = Effects {
        whiteout: None,
        unwhiteout: None,
        clear_children: None,
    };
}

/// The parent path of an absolute path ("/" for top-level names and for "/" itself).
pub fn parent_path(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(0) | None => b"/",
        Some(i) => &path[..i],
    }
}

/// Apply `fx` inside the caller's transaction.
pub fn apply_effects(c: &Connection, fx: &Effects<'_>, now: Timespec) -> Result<(), Errno> {
    if let Some(dir) = fx.clear_children {
        c.prepare_cached("DELETE FROM fs_whiteout WHERE parent_path = ?1")?
            .execute([Name(dir)])?;
    }
    if let Some(p) = fx.unwhiteout {
        c.prepare_cached("DELETE FROM fs_whiteout WHERE path = ?1")?
            .execute([Name(p)])?;
    }
    if let Some(p) = fx.whiteout {
        c.prepare_cached(
            "INSERT INTO fs_whiteout (path, parent_path, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(path) DO UPDATE SET created_at = excluded.created_at",
        )?
        .execute((Name(p), Name(parent_path(p)), now.sec))?;
    }
    Ok(())
}

/// What a copied-up object is made of.
pub enum Content<'a> {
    Dir,
    Symlink(&'a [u8]),
    /// A device, FIFO or socket: no data.
    Special,
    /// A regular file whose bytes are read in order from `read` (which returns 0 at EOF).
    File(&'a mut dyn FnMut(&mut [u8]) -> Result<usize, Errno>),
    /// A partial-origin regular file: no bytes, the base file stays the source of unchanged
    /// chunks (the row's fingerprint guards it).
    Partial(&'a super::backup::PartialOrigin),
}

/// A base object's metadata, kept by its copy.
#[derive(Clone, Copy, Debug)]
pub struct BaseMeta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// The base st_ino, recorded in fs_origin.
    pub ino: u64,
}

impl Store {
    /// A value of fs_overlay_config (None when absent, or when the table is missing).
    pub fn overlay_setting(&self, key: &str) -> Result<Option<String>, Errno> {
        self.read_tx(|c| {
            if !super::copy::has_table(c, "main", "fs_overlay_config")? {
                return Ok(None);
            }
            Ok(
                c.prepare_cached("SELECT value FROM fs_overlay_config WHERE key = ?1")?
                    .query_row([key], |r| r.get(0))
                    .optional()?,
            )
        })
    }

    /// Whether any file is partial-origin.
    pub fn has_partial_origins(&self) -> Result<bool, Errno> {
        self.read_tx(|c| {
            if !super::copy::has_table(c, "main", "fs_partial_origin")? {
                return Ok(false);
            }
            Ok(c.prepare_cached("SELECT 1 FROM fs_partial_origin LIMIT 1")?
                .query_row([], |_| Ok(()))
                .optional()?
                .is_some())
        })
    }

    /// fs_origin: delta inode -> base st_ino, all rows.
    pub fn origins(&self) -> Result<HashMap<Ino, u64>, Errno> {
        self.read_tx(|c| {
            let mut st = c.prepare("SELECT delta_ino, base_ino FROM fs_origin")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = HashMap::new();
            for r in rows {
                let (d, b) = r?;
                out.insert(Ino(d as u64), b as u64);
            }
            Ok(out)
        })
    }

    /// Whether the base entry at `path` is hidden.
    pub fn is_whiteout(&self, path: &[u8]) -> Result<bool, Errno> {
        self.read_tx(|c| {
            Ok(
                c.prepare_cached("SELECT 1 FROM fs_whiteout WHERE path = ?1")?
                    .query_row([Name(path)], |_| Ok(()))
                    .optional()?
                    .is_some(),
            )
        })
    }

    /// Names of the hidden base entries of directory `dir`.
    pub fn whiteouts_in(&self, dir: &[u8]) -> Result<HashSet<Vec<u8>>, Errno> {
        self.read_tx(|c| {
            let mut st = c.prepare_cached("SELECT path FROM fs_whiteout WHERE parent_path = ?1")?;
            let rows = st.query_map([Name(dir)], |r| Ok(bytes_of(r.get_ref(0)?)))?;
            let mut out = HashSet::new();
            for r in rows {
                let p = r?;
                let name = match p.iter().rposition(|&b| b == b'/') {
                    Some(i) => p[i + 1..].to_vec(),
                    None => p,
                };
                out.insert(name);
            }
            Ok(out)
        })
    }

    /// The absolute path of directory `ino` ("/" for the root).
    pub fn dir_path(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        self.read_tx(|c| {
            let mut parts = Vec::new();
            let mut cur = ino;
            while cur != Ino::ROOT {
                let (name, parent): (Vec<u8>, i64) = c
                    .prepare_cached(
                        "SELECT name, parent_ino FROM fs_dentry WHERE ino = ?1 LIMIT 1",
                    )?
                    .query_row([sql_ino(cur)?], |r| {
                        Ok((bytes_of(r.get_ref(0)?), r.get(1)?))
                    })
                    .optional()?
                    .ok_or(Errno::ENOENT)?;
                parts.push(name);
                cur = Ino(parent as u64);
                if parts.len() > 4096 {
                    return Err(Errno(libc::ELOOP));
                }
            }
            let mut out = Vec::new();
            for p in parts.iter().rev() {
                out.push(b'/');
                out.extend_from_slice(p);
            }
            if out.is_empty() {
                out.push(b'/');
            }
            Ok(out)
        })
    }

    /// Copy a base object into the delta as `name` in `parent` (a delta directory), all in one
    /// transaction: the inode with the base metadata, its name, its content, the fs_origin row
    /// and, for a partial-origin file, its fs_partial_origin row. `verify` runs last, before
    /// the commit: an error there (the base changed while it was read) rolls everything back.
    pub fn copy_up(
        &self,
        parent: Ino,
        name: &[u8],
        meta: &BaseMeta,
        content: Content<'_>,
        verify: &dyn Fn() -> Result<(), Errno>,
    ) -> Result<Ino, Errno> {
        let cfg = self.config;
        self.write_tx(|c| {
            let (inline, kind) = match content {
                Content::File(_) => (true, 1),
                _ => (false, 0),
            };
            let size = match content {
                Content::Symlink(t) => t.len() as u64,
                Content::Partial(_) => meta.size,
                _ => 0,
            };
            let ino: i64 = c
                .prepare_cached(
                    "INSERT INTO fs_inode (mode, nlink, uid, gid, size, atime, mtime, ctime, rdev,
                                           atime_nsec, mtime_nsec, ctime_nsec, data_inline,
                                           storage_kind)
                     VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
                             CASE WHEN ?12 THEN x'' END, ?13)
                     RETURNING ino",
                )?
                .query_row(
                    rusqlite::params![
                        meta.mode,
                        meta.uid,
                        meta.gid,
                        i64::try_from(size).map_err(|_| Errno::EFBIG)?,
                        meta.atime.sec,
                        meta.mtime.sec,
                        meta.ctime.sec,
                        meta.rdev,
                        meta.atime.nsec,
                        meta.mtime.nsec,
                        meta.ctime.nsec,
                        inline,
                        kind
                    ],
                    |r| r.get(0),
                )?;
            let ino = Ino(ino as u64);
            namespace::insert_dentry(c, parent, name, ino)?;
            let base_ino = i64::try_from(meta.ino).map_err(|_| Errno::EOVERFLOW)?;
            c.prepare_cached(
                "INSERT OR REPLACE INTO fs_origin (delta_ino, base_ino) VALUES (?1, ?2)",
            )?
            .execute((sql_ino(ino)?, base_ino))?;
            match content {
                Content::Dir | Content::Special => {}
                Content::Symlink(t) => {
                    c.prepare_cached("INSERT INTO fs_symlink (ino, target) VALUES (?1, ?2)")?
                        .execute((sql_ino(ino)?, Name(t)))?;
                }
                Content::File(read) => {
                    let mut buf = vec![0u8; cfg.chunk_size as usize];
                    let mut off = 0u64;
                    loop {
                        let mut have = 0;
                        while have < buf.len() {
                            let n = read(&mut buf[have..])?;
                            if n == 0 {
                                break;
                            }
                            have += n;
                        }
                        if have == 0 {
                            break;
                        }
                        data::write(c, &cfg, ino, off, &buf[..have], None)?;
                        off += have as u64;
                        if have < buf.len() {
                            break;
                        }
                    }
                }
                Content::Partial(po) => {
                    c.prepare_cached(
                        "INSERT INTO fs_partial_origin (delta_ino, base_ino, base_path, base_size,
                             base_fingerprint_size, base_mtime, base_mtime_nsec, base_ctime,
                             base_ctime_nsec, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    )?
                    .execute(rusqlite::params![
                        sql_ino(ino)?,
                        base_ino,
                        po.base_path,
                        po.base_size,
                        po.base_fingerprint_size,
                        po.base_mtime,
                        po.base_mtime_nsec,
                        po.base_ctime,
                        po.base_ctime_nsec,
                        inode::now().sec
                    ])?;
                }
            }
            verify()?;
            Ok(ino)
        })
    }

    /// Hide the base entry `path` of delta directory `parent` (which gets the new mtime and
    /// ctime), in one transaction.
    pub fn whiteout(&self, parent: Ino, path: &[u8], clear_children: bool) -> Result<(), Errno> {
        self.write_tx(|c| {
            let now = inode::now();
            let fx = Effects {
                whiteout: Some(path),
                clear_children: clear_children.then_some(path),
                ..Effects::NONE
            };
            apply_effects(c, &fx, now)?;
            inode::touch_mc(c, parent, now)
        })
    }

    /// The partial-origin row of `ino`, if it has one.
    pub fn partial_origin(&self, ino: Ino) -> Result<Option<super::backup::PartialOrigin>, Errno> {
        self.read_tx(|c| {
            Ok(super::backup::partial_origins_of(c, Some(ino))?
                .into_iter()
                .next())
        })
    }

    /// Chunk indexes of `ino` that the delta owns.
    pub fn overrides(&self, ino: Ino) -> Result<HashSet<u64>, Errno> {
        self.read_tx(|c| {
            let mut st =
                c.prepare_cached("SELECT chunk_index FROM fs_chunk_override WHERE delta_ino = ?1")?;
            let rows = st.query_map([sql_ino(ino)?], |r| r.get::<_, i64>(0))?;
            let mut out = HashSet::new();
            for r in rows {
                out.insert(r? as u64);
            }
            Ok(out)
        })
    }

    /// Make the delta own chunks of a partial-origin file, in one transaction: each
    /// `(index, bytes)` stores `bytes` as the chunk (None: a hole) and records the override.
    /// Pending writes of the inode stay pending and land on top.
    pub fn own_chunks(&self, ino: Ino, chunks: &[(u64, Option<Vec<u8>>)]) -> Result<(), Errno> {
        self.write_tx(|c| {
            for (idx, bytes) in chunks {
                let i = i64::try_from(*idx).map_err(|_| Errno::EFBIG)?;
                if let Some(b) = bytes {
                    data::put_chunk(c, ino, *idx, b)?;
                } else {
                    c.prepare_cached("DELETE FROM fs_data WHERE ino = ?1 AND chunk_index = ?2")?
                        .execute((sql_ino(ino)?, i))?;
                }
                c.prepare_cached(
                    "INSERT OR IGNORE INTO fs_chunk_override (delta_ino, chunk_index) VALUES (?1, ?2)",
                )?
                .execute((sql_ino(ino)?, i))?;
            }
            Ok(())
        })
    }
}
