//! The overlay tables: which base directory a delta database belongs to (`fs_overlay_config`)
//! and the rows that tie the delta tree to it (`fs_origin`, `fs_whiteout`,
//! `fs_partial_origin`, `fs_chunk_override`). SPEC.md, "Overlay delta", describes the model.
//!
//! Grouped by user: the configuration API (written by `agentfs init --base`, read by the
//! mount and the CLI), the row-level reads of `agentfs diff`/`agentfs apply`, then the changes
//! an overlay mount makes (copy-up, whiteouts that commit with a namespace change, partial-
//! origin chunk takeover), each one write transaction.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use super::backup::PartialOrigin;
use super::copy::has_table;
use super::inode::{self, bytes_of, meta_cols, meta_from_row, sql_ino, Meta, Name};
use super::{data, namespace, FsConfig, Ino, Store, Timespec};
use crate::errno::Errno;

// ---------------------------------------------------------------------------------------------
// Configuration (fs_overlay_config)
// ---------------------------------------------------------------------------------------------

/// When a copy-up keeps reading unchanged chunks from the base file instead of copying it whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PartialOriginPolicy {
    /// Always copy the whole file.
    #[default]
    Off,
    /// Always record a partial origin.
    On,
    /// Partial origin for base files of at least the threshold size.
    Auto,
}

impl PartialOriginPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On => "on",
            Self::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Self::Off),
            "on" => Some(Self::On),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

/// Default `partial_origin_threshold_bytes`: 8 MiB.
pub const DEFAULT_PARTIAL_ORIGIN_THRESHOLD: u64 = 8 << 20;

/// The overlay configuration of a delta database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlayConfig {
    /// Canonical absolute path of the read-only base directory.
    pub base_path: PathBuf,
    pub partial_origin: PartialOriginPolicy,
    pub partial_origin_threshold_bytes: u64,
}

impl OverlayConfig {
    /// A configuration with the default policy (partial origin off, 8 MiB threshold).
    pub fn new(base_path: PathBuf) -> Self {
        Self {
            base_path,
            partial_origin: PartialOriginPolicy::Off,
            partial_origin_threshold_bytes: DEFAULT_PARTIAL_ORIGIN_THRESHOLD,
        }
    }

    /// Whether a copy-up of a base file of `size` bytes records a partial origin.
    pub fn partial_origin_for(&self, size: u64) -> bool {
        match self.partial_origin {
            PartialOriginPolicy::Off => false,
            PartialOriginPolicy::On => true,
            PartialOriginPolicy::Auto => size >= self.partial_origin_threshold_bytes,
        }
    }
}

/// The overlay configuration, `Ok(None)` for an ordinary (non-overlay) database. A present
/// table without `base_path`, or a malformed policy or threshold, is an error naming the key.
pub fn read_config(c: &Connection) -> Result<Option<OverlayConfig>, String> {
    let err = |e: rusqlite::Error| format!("fs_overlay_config: {e}");
    if !has_table(c, "main", "fs_overlay_config").map_err(err)? {
        return Ok(None);
    }
    let get = |key: &str| -> Result<Option<String>, String> {
        c.query_row(
            "SELECT value FROM fs_overlay_config WHERE key = ?1",
            [key],
            |r| r.get::<_, String>(0),
        )
        .optional()
        .map_err(err)
    };
    let Some(base) = get("base_path")? else {
        return Ok(None);
    };
    let base_path = PathBuf::from(base);
    if !base_path.is_absolute() {
        return Err(format!(
            "fs_overlay_config base_path {} is not absolute",
            base_path.display()
        ));
    }
    let mut cfg = OverlayConfig::new(base_path);
    if let Some(v) = get("partial_origin")? {
        cfg.partial_origin = PartialOriginPolicy::parse(v.trim()).ok_or_else(|| {
            format!("fs_overlay_config partial_origin {v:?} is not off, on or auto")
        })?;
    }
    if let Some(v) = get("partial_origin_threshold_bytes")? {
        cfg.partial_origin_threshold_bytes = v.trim().parse().map_err(|_| {
            format!("fs_overlay_config partial_origin_threshold_bytes {v:?} is not a number")
        })?;
    }
    Ok(Some(cfg))
}

/// The **extension** table of what a delta saw of each base object it hid or replaced (copied
/// up, whited out, or renamed over), keyed by overlay path; `agentfs apply` compares the base
/// with it. Created with a new delta only (see [`create`]): its presence promises a row for
/// every such object, which a delta written before it existed cannot keep.
pub const BASE_SEEN_DDL: &str = "CREATE TABLE fs_base_seen (
  path TEXT PRIMARY KEY,
  base_ino INTEGER NOT NULL,
  mode INTEGER NOT NULL,
  size INTEGER NOT NULL,
  mtime INTEGER NOT NULL,
  mtime_nsec INTEGER NOT NULL,
  ctime INTEGER NOT NULL,
  ctime_nsec INTEGER NOT NULL,
  sha256 TEXT
);";

/// `fs_base_seen` rows to write by path (None: no row).
pub type SeenRows = Vec<(Vec<u8>, Option<BaseSeen>)>;

/// One `fs_base_seen` row: the base object at a path as the delta first saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseSeen {
    pub ino: u64,
    /// st_mode: type and permission bits.
    pub mode: u32,
    pub size: u64,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// sha256 (hex) of a regular file's bytes or a symlink's target, when the delta read them
    /// whole (a full copy-up); None otherwise.
    pub sha256: Option<String>,
}

impl BaseSeen {
    /// The stat part of a record (no content hash).
    pub fn of_stat(st: &libc::stat) -> BaseSeen {
        let ts = |s: i64, n: i64| Timespec {
            sec: s,
            nsec: u32::try_from(n).unwrap_or(0),
        };
        BaseSeen {
            ino: st.st_ino,
            mode: st.st_mode,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime: ts(st.st_mtime, st.st_mtime_nsec),
            ctime: ts(st.st_ctime, st.st_ctime_nsec),
            sha256: None,
        }
    }
}

/// Record `seen` for `path` unless the path already has a row (the first sighting is the
/// version the delta's view is based on) or the delta has no `fs_base_seen` table.
pub fn record_seen(c: &Connection, path: &[u8], seen: &BaseSeen) -> Result<(), Errno> {
    if !has_table(c, "main", "fs_base_seen")? {
        return Ok(());
    }
    let i = |v: u64| i64::try_from(v).map_err(|_| Errno::EOVERFLOW);
    c.prepare_cached(
        "INSERT OR IGNORE INTO fs_base_seen (path, base_ino, mode, size, mtime, mtime_nsec,
                                            ctime, ctime_nsec, sha256)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(rusqlite::params![
        Name(path),
        i(seen.ino)?,
        seen.mode,
        i(seen.size)?,
        seen.mtime.sec,
        seen.mtime.nsec,
        seen.ctime.sec,
        seen.ctime.nsec,
        seen.sha256
    ])?;
    Ok(())
}

/// Every `fs_base_seen` row by path; None when the delta has no such table (it predates it).
pub fn read_seen(c: &Connection) -> rusqlite::Result<Option<HashMap<Vec<u8>, BaseSeen>>> {
    if !has_table(c, "main", "fs_base_seen")? {
        return Ok(None);
    }
    let mut st = c.prepare(
        "SELECT path, base_ino, mode, size, mtime, mtime_nsec, ctime, ctime_nsec, sha256
         FROM fs_base_seen",
    )?;
    let rows = st.query_map([], |r| {
        let ts = |s: i64, n: i64| Timespec {
            sec: s,
            nsec: u32::try_from(n).unwrap_or(0),
        };
        Ok((
            bytes_of(r.get_ref(0)?),
            BaseSeen {
                ino: r.get::<_, i64>(1)? as u64,
                mode: r.get(2)?,
                size: r.get::<_, i64>(3)? as u64,
                mtime: ts(r.get(4)?, r.get(5)?),
                ctime: ts(r.get(6)?, r.get(7)?),
                sha256: r.get(8)?,
            },
        ))
    })?;
    rows.collect::<rusqlite::Result<HashMap<_, _>>>().map(Some)
}

/// Replace the `fs_base_seen` rows of the given paths (None: drop the row), in one
/// transaction on `db` — after `agentfs apply` wrote those paths, so the records describe the
/// base the delta now matches. Nothing to do for a delta without the table.
pub fn refresh_seen(db: &Path, rows: &SeenRows) -> Result<(), String> {
    let c = super::copy::open_conn(db, false)?;
    let err = |e: Errno| format!("{}: fs_base_seen: {e}", db.display());
    let run = || -> Result<(), Errno> {
        if !has_table(&c, "main", "fs_base_seen")? {
            return Ok(());
        }
        let tx = c.unchecked_transaction()?;
        for (path, seen) in rows {
            tx.prepare_cached("DELETE FROM fs_base_seen WHERE path = ?1")?
                .execute([Name(path)])?;
            if let Some(seen) = seen {
                record_seen(&tx, path, seen)?;
            }
        }
        tx.commit()?;
        Ok(())
    };
    run().map_err(err)
}

/// Store `cfg` (replacing any earlier configuration) in one transaction.
pub fn write_config(c: &Connection, cfg: &OverlayConfig) -> rusqlite::Result<()> {
    let tx = c.unchecked_transaction()?;
    tx.execute("DELETE FROM fs_overlay_config", [])?;
    let base = cfg.base_path.to_string_lossy();
    for (k, v) in [
        ("base_path", base.as_ref()),
        ("partial_origin", cfg.partial_origin.as_str()),
        (
            "partial_origin_threshold_bytes",
            &cfg.partial_origin_threshold_bytes.to_string(),
        ),
    ] {
        tx.execute(
            "INSERT INTO fs_overlay_config (key, value) VALUES (?1, ?2)",
            (k, v),
        )?;
    }
    tx.commit()
}

/// Check a base directory for `agentfs init DB --base DIR` and return its canonical path:
/// DIR must exist and be a directory, and the database must not lie inside it (the server
/// would then see its own database through the mount).
pub fn check_base(db: &Path, base: &Path) -> Result<PathBuf, String> {
    let canon = std::fs::canonicalize(base).map_err(|e| format!("base {}: {e}", base.display()))?;
    if !canon.is_dir() {
        return Err(format!("base {} is not a directory", base.display()));
    }
    let db_dir = match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let db_dir = std::fs::canonicalize(&db_dir)
        .map_err(|e| format!("{}: directory {}: {e}", db.display(), db_dir.display()))?;
    if db_dir.starts_with(&canon) {
        return Err(format!(
            "{} is inside the base directory {}: the mount would show its own database; \
             keep the database outside the base",
            db.display(),
            canon.display()
        ));
    }
    Ok(canon)
}

/// Create a new overlay delta database: [`Store::create`] plus `cfg`. Nothing is left behind
/// on failure.
pub fn create(db: &Path, opts: &super::InitOptions, cfg: &OverlayConfig) -> Result<(), String> {
    Store::create(db, opts).map_err(|e| e.to_string())?;
    let r = super::copy::open_conn(db, false).and_then(|c| {
        write_config(&c, cfg)
            .and_then(|()| c.execute_batch(BASE_SEEN_DDL))
            .map_err(|e| format!("{}: {e}", db.display()))
    });
    if r.is_err() {
        super::copy::remove_db_files(db);
    }
    r
}

impl Store {
    /// One read transaction whose closure reports its own one-line errors.
    fn overlay_read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut out = None;
        self.read_tx(|c| {
            out = Some(f(c));
            Ok(())
        })
        .map_err(|e| format!("{}: {e}", self.path().display()))?;
        out.unwrap_or_else(|| Err(format!("{}: read failed", self.path().display())))
    }

    /// The overlay configuration (`None` for an ordinary database).
    pub fn overlay_config(&self) -> Result<Option<OverlayConfig>, String> {
        self.overlay_read(read_config)
    }
}

// ---------------------------------------------------------------------------------------------
// Delta rows for diff and apply
// ---------------------------------------------------------------------------------------------

/// One entry of the delta tree.
#[derive(Clone, Debug)]
pub struct DeltaEntry {
    pub meta: Meta,
    /// Whether the entry has an fs_origin row (a copy-up of the base object at its path).
    pub origin: bool,
    /// Children by name (directories only).
    pub children: Vec<Vec<u8>>,
}

/// The whole delta: its tree by absolute path ("/" for the root) and its whiteouts.
#[derive(Clone, Debug, Default)]
pub struct Delta {
    pub entries: HashMap<Vec<u8>, DeltaEntry>,
    /// Whiteout paths by parent path.
    pub whiteouts: HashMap<Vec<u8>, Vec<Vec<u8>>>,
    /// Every whiteout path.
    pub whiteout_set: HashSet<Vec<u8>>,
}

/// `parent` joined with `name` ("/" + "a" = "/a").
pub fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_vec();
    if p.last() != Some(&b'/') {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Read the delta tree from the root and the whiteouts.
pub fn read_delta(c: &Connection) -> Result<Delta, Errno> {
    let mut d = Delta::default();
    let mut children_of = c.prepare(concat!(
        "SELECT ",
        meta_cols!("i."),
        ", d.name FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino
         WHERE d.parent_ino = ?1 ORDER BY d.name"
    ))?;
    let origins: HashSet<i64> = {
        let mut st = c.prepare("SELECT delta_ino FROM fs_origin")?;
        let it = st.query_map([], |r| r.get(0))?;
        it.collect::<rusqlite::Result<_>>()?
    };
    let root = super::inode::meta(c, Ino::ROOT)?;
    let mut stack = vec![(b"/".to_vec(), root, true)];
    while let Some((path, meta, origin)) = stack.pop() {
        let mut names = Vec::new();
        if meta.is_dir() {
            let rows = children_of.query_map([meta.ino.0 as i64], |r| {
                Ok((bytes_of(r.get_ref(14)?), meta_from_row(r)?))
            })?;
            for row in rows {
                let (name, m) = row?;
                let o = origins.contains(&(m.ino.0 as i64));
                stack.push((join(&path, &name), m, o));
                names.push(name);
            }
        }
        d.entries.insert(
            path,
            DeltaEntry {
                meta,
                origin,
                children: names,
            },
        );
    }
    let mut st = c.prepare("SELECT path, parent_path FROM fs_whiteout")?;
    let rows = st.query_map([], |r| {
        Ok((bytes_of(r.get_ref(0)?), bytes_of(r.get_ref(1)?)))
    })?;
    for row in rows {
        let (path, parent) = row?;
        d.whiteouts.entry(parent).or_default().push(path.clone());
        d.whiteout_set.insert(path);
    }
    Ok(d)
}

/// The whole content of regular file `ino` of the delta. A partial-origin file (`po`) takes
/// its unchanged chunks from the base file, after its fingerprint is checked.
pub fn read_content(
    c: &Connection,
    cfg: &FsConfig,
    ino: Ino,
    po: Option<&PartialOrigin>,
) -> Result<Vec<u8>, String> {
    let what = |e: Errno| format!("inode {}: {e}", ino.0);
    let size = super::inode::meta(c, ino).map_err(what)?.size;
    let mut buf = super::data::read(c, cfg, ino, 0, size).map_err(what)?;
    if let Some(po) = po {
        let cs = cfg.chunk_size;
        po.for_each_base_chunk(c, cs, size, |idx, bytes| {
            let start = (idx * cs) as usize;
            let end = ((idx + 1) * cs).min(size) as usize;
            buf[start..end].fill(0);
            buf[start..start + bytes.len()].copy_from_slice(bytes);
            Ok(())
        })?;
    }
    Ok(buf)
}

/// Every partial-origin row by delta inode.
pub fn partial_origins_by_ino(c: &Connection) -> rusqlite::Result<HashMap<i64, PartialOrigin>> {
    Ok(super::backup::partial_origins(c)?
        .into_iter()
        .map(|po| (po.delta_ino, po))
        .collect())
}

/// The target of symlink `ino`.
pub fn read_symlink(c: &Connection, ino: Ino) -> Result<Vec<u8>, Errno> {
    super::namespace::readlink(c, ino)
}

/// Everything `diff` and `apply` read from a delta database, taken in one read transaction.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub config: OverlayConfig,
    pub delta: Delta,
    /// Partial-origin rows by delta inode.
    pub partial: HashMap<i64, PartialOrigin>,
    /// What the delta saw of the base objects it hid or replaced, by path (None: the delta
    /// predates these records).
    pub seen: Option<HashMap<Vec<u8>, BaseSeen>>,
}

/// One read transaction on an overlay database, open for as long as the value lives: every read
/// through it sees the database as of the first (the consistent cut `agentfs diff` and
/// `agentfs apply` read while a mount may still be writing).
pub struct PinnedRead {
    conn: Connection,
    cfg: FsConfig,
    db: String,
}

impl Store {
    /// Begin a [`PinnedRead`] on a connection of its own.
    pub fn overlay_pinned(&self) -> Result<PinnedRead, String> {
        let db = self.path().display().to_string();
        let conn = super::conn::open(self.path(), true).map_err(|e| format!("{db}: {e}"))?;
        conn.execute_batch("BEGIN DEFERRED")
            .map_err(|e| format!("{db}: {e}"))?;
        Ok(PinnedRead {
            conn,
            cfg: self.config(),
            db,
        })
    }
}

impl PinnedRead {
    /// The delta of an overlay database; an error for an ordinary one. The first read, so the
    /// one that fixes the cut.
    pub fn snapshot(&self) -> Result<Snapshot, String> {
        let (c, db) = (&self.conn, &self.db);
        let config = read_config(c)?.ok_or_else(|| {
            format!("{db} is not an overlay delta (no base directory; see agentfs init --base)")
        })?;
        let delta = read_delta(c).map_err(|e| format!("{db}: reading the delta tree: {e}"))?;
        let partial = partial_origins_by_ino(c).map_err(|e| format!("{db}: {e}"))?;
        let seen = read_seen(c).map_err(|e| format!("{db}: fs_base_seen: {e}"))?;
        Ok(Snapshot {
            config,
            delta,
            partial,
            seen,
        })
    }

    /// The whole content of delta file `ino` (see [`read_content`]).
    pub fn file(&self, ino: Ino, po: Option<&PartialOrigin>) -> Result<Vec<u8>, String> {
        read_content(&self.conn, &self.cfg, ino, po).map_err(|e| format!("{}: {e}", self.db))
    }

    /// The target of delta symlink `ino`.
    pub fn symlink(&self, ino: Ino) -> Result<Vec<u8>, String> {
        read_symlink(&self.conn, ino).map_err(|e| format!("{}: inode {}: {e}", self.db, ino.0))
    }
}

// ---------------------------------------------------------------------------------------------
// Changes made by an overlay mount
// ---------------------------------------------------------------------------------------------

/// Whiteout changes that must commit atomically with a namespace operation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Effects<'a> {
    /// Hide the base entry at this absolute path.
    pub whiteout: Option<&'a [u8]>,
    /// Forget the whiteout at this path (a new entry is created there).
    pub unwhiteout: Option<&'a [u8]>,
    /// Drop the whiteouts of this directory's children (the directory is removed).
    pub clear_children: Option<&'a [u8]>,
    /// The base object this operation hides or replaces at a path, for `fs_base_seen`.
    pub seen: Option<(&'a [u8], &'a BaseSeen)>,
}

impl Effects<'_> {
    pub const NONE: Effects<'static> = Effects {
        whiteout: None,
        unwhiteout: None,
        clear_children: None,
        seen: None,
    };
}

/// The last component of an absolute path ("" for "/").
pub fn last_name(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
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
    if let Some((path, seen)) = fx.seen {
        record_seen(c, path, seen)?;
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
#[derive(Clone, Debug)]
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
    /// Extended attributes (name, value).
    pub xattrs: crate::sys::beneath::Xattrs,
    /// The base object's stat as `fs_base_seen` records it, and its overlay path.
    pub seen: BaseSeen,
    pub path: Vec<u8>,
}

impl Store {
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
                out.insert(last_name(&r?).to_vec());
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

    /// Copy a base object into the delta as `name` in `parent` (a delta directory; None: an
    /// orphan with no name and nlink 0, for a base file unlinked while open), all in one
    /// transaction: the inode with the base metadata, its name, its content, the fs_origin row
    /// and, for a partial-origin file, its fs_partial_origin row. `verify` runs last: an error
    /// there (the base changed while it was read) rolls everything back. `publish` runs after
    /// it, still inside the transaction, so the caller can make the copy known before any
    /// reader of the store can see it.
    pub fn copy_up(
        &self,
        parent: Option<Ino>,
        name: &[u8],
        meta: &BaseMeta,
        content: Content<'_>,
        verify: &dyn Fn() -> Result<(), Errno>,
        publish: &dyn Fn(Ino),
    ) -> Result<Ino, Errno> {
        let cfg = self.config;
        let bytes = match content {
            Content::File(_) => usize::try_from(meta.size).unwrap_or(usize::MAX),
            _ => 0,
        };
        self.admit(super::space::Need::op(name.len().saturating_add(bytes)))?;
        let out = self.write_tx(|c| {
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
                     VALUES (?1, ?14, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,
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
                        kind,
                        u32::from(parent.is_some())
                    ],
                    |r| r.get(0),
                )?;
            let ino = Ino(ino as u64);
            if let Some(parent) = parent {
                namespace::insert_dentry(c, parent, name, ino)?;
            }
            let base_ino = i64::try_from(meta.ino).map_err(|_| Errno::EOVERFLOW)?;
            c.prepare_cached(
                "INSERT OR REPLACE INTO fs_origin (delta_ino, base_ino) VALUES (?1, ?2)",
            )?
            .execute((sql_ino(ino)?, base_ino))?;
            super::xattr::copy_in(c, ino, &meta.xattrs)?;
            let mut hash = None;
            match content {
                Content::Dir | Content::Special => {}
                Content::Symlink(t) => {
                    c.prepare_cached("INSERT INTO fs_symlink (ino, target) VALUES (?1, ?2)")?
                        .execute((sql_ino(ino)?, Name(t)))?;
                    hash = Some(crate::delta::sha256_hex(t));
                }
                Content::File(read) => {
                    let mut sha = Sha256::new();
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
                        sha.update(&buf[..have]);
                        off += have as u64;
                        if have < buf.len() {
                            break;
                        }
                    }
                    // Only a copy that read the whole file knows its content (a copy for a
                    // truncate to zero reads nothing).
                    if off == meta.size {
                        hash = Some(crate::delta::hex(&sha.finalize()));
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
            if parent.is_some() {
                let seen = BaseSeen {
                    sha256: hash,
                    ..meta.seen.clone()
                };
                record_seen(c, &meta.path, &seen)?;
            }
            publish(ino);
            Ok(ino)
        });
        if let Some(parent) = parent {
            self.caches.entry_changed(parent, name);
        }
        out
    }

    /// Hide the base entry `path` of delta directory `parent` (which gets the new mtime and
    /// ctime), recording what it was (`seen`), in one transaction.
    pub fn whiteout(
        &self,
        parent: Ino,
        path: &[u8],
        clear_children: bool,
        seen: &BaseSeen,
    ) -> Result<(), Errno> {
        let out = self.write_tx(|c| {
            let now = inode::now();
            let fx = Effects {
                whiteout: Some(path),
                clear_children: clear_children.then_some(path),
                seen: Some((path, seen)),
                ..Effects::NONE
            };
            apply_effects(c, &fx, now)?;
            inode::touch_mc(c, parent, now)
        });
        self.caches.inode_changed(parent);
        out
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
        let bytes: usize = chunks
            .iter()
            .filter_map(|(_, b)| b.as_ref())
            .map(Vec::len)
            .sum();
        self.admit(super::space::Need::op(bytes))?;
        let out = self.write_tx(|c| {
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
        });
        self.caches.inode_changed(ino);
        out
    }
}
