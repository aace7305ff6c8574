//! The overlay tables: which base directory a delta database belongs to (`fs_overlay_config`)
//! and the rows that tie the delta tree to it (`fs_origin`, `fs_whiteout`,
//! `fs_partial_origin`, `fs_chunk_override`). SPEC.md, "Overlay delta", describes the model.
//!
//! Grouped by user: the configuration API (written by `agentfs init --base`, read by the
//! mount and the CLI), then the row-level reads of `agentfs diff`/`agentfs apply`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};

use super::backup::PartialOrigin;
use super::copy::has_table;
use super::inode::{bytes_of, meta_from_row, Meta, META_COLS};
use super::{FsConfig, Ino, Store};
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
    let r = super::copy::open_conn(db, false)
        .and_then(|c| write_config(&c, cfg).map_err(|e| format!("{}: {e}", db.display())));
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
    let mut children_of = c.prepare(&format!(
        "SELECT {}, d.name FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino
         WHERE d.parent_ino = ?1 ORDER BY d.name",
        META_COLS
            .split(", ")
            .map(|col| format!("i.{}", col.trim()))
            .collect::<Vec<_>>()
            .join(", ")
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
}

impl Store {
    /// The delta of an overlay database; an error for an ordinary one.
    pub fn overlay_snapshot(&self) -> Result<Snapshot, String> {
        let db = self.path().display().to_string();
        self.overlay_read(|c| {
            let config = read_config(c)?.ok_or_else(|| {
                format!("{db} is not an overlay delta (no base directory; see agentfs init --base)")
            })?;
            let delta = read_delta(c).map_err(|e| format!("{db}: reading the delta tree: {e}"))?;
            let partial = partial_origins_by_ino(c).map_err(|e| format!("{db}: {e}"))?;
            Ok(Snapshot {
                config,
                delta,
                partial,
            })
        })
    }

    /// The whole content of delta file `ino` (see [`read_content`]).
    pub fn overlay_file(&self, ino: Ino, po: Option<&PartialOrigin>) -> Result<Vec<u8>, String> {
        let cfg = self.config();
        self.overlay_read(|c| read_content(c, &cfg, ino, po))
    }

    /// The target of delta symlink `ino`.
    pub fn overlay_symlink(&self, ino: Ino) -> Result<Vec<u8>, String> {
        self.overlay_read(|c| read_symlink(c, ino).map_err(|e| format!("inode {}: {e}", ino.0)))
    }
}
