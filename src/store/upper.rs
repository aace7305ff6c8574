//! The upper layer of a database as one unit, for snapshots: read whole inside one read
//! transaction (a consistent cut, also beside a running server, which only ever commits whole
//! transactions), and replaced whole inside one write transaction (a restore).
//!
//! "The upper layer" is every row a mount reaches from the root: inodes with their names,
//! contents (partial-origin files with their base bytes folded in), symlink targets, extended
//! attributes, `fs_origin` rows, and the whiteouts. The history module decides what to keep of
//! it; this module only knows the tables.

use std::collections::{HashMap, HashSet};

use rusqlite::Connection;

use super::backup::PartialOrigin;
use super::inode::{bytes_of, delete_rows, Name};
use super::overlay::{join, parent_path, partial_origins_by_ino, read_content, read_delta};
use super::{data, namespace, xattr, FsConfig, Ino, Store, Timespec};
use crate::errno::Errno;

/// Extended attributes as (name, value) pairs.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// One named object of the upper layer (or the root, with an empty name).
#[derive(Clone, Debug)]
pub struct Node {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub rdev: u32,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

/// A read-only view of the upper layer inside one read transaction.
pub struct UpperCut<'a> {
    c: &'a Connection,
    cfg: FsConfig,
    pub root: Node,
    /// Every name by directory inode, read in one scan.
    children: HashMap<i64, Vec<Node>>,
    /// Every whiteout path.
    pub whiteouts: Vec<Vec<u8>>,
    partial: HashMap<i64, PartialOrigin>,
    origins: HashMap<i64, i64>,
    /// Every attribute by inode, read up front (most inodes have none).
    xattrs: HashMap<i64, Xattrs>,
}

impl UpperCut<'_> {
    /// The entries of directory `ino` (in no particular order).
    pub fn children(&self, ino: Ino) -> &[Node] {
        i64::try_from(ino.0)
            .ok()
            .and_then(|i| self.children.get(&i))
            .map_or(&[], Vec::as_slice)
    }

    /// The whole content of regular file `ino` (a partial-origin file with its base bytes).
    pub fn content(&self, ino: Ino) -> Result<Vec<u8>, String> {
        let po = i64::try_from(ino.0).ok().and_then(|i| self.partial.get(&i));
        read_content(self.c, &self.cfg, ino, po)
    }

    /// The target of symlink `ino`.
    pub fn symlink(&self, ino: Ino) -> Result<Vec<u8>, String> {
        super::overlay::read_symlink(self.c, ino).map_err(|e| format!("inode {}: {e}", ino.0))
    }

    /// Every extended attribute of `ino` as (name, value), sorted by name.
    pub fn xattrs(&self, ino: Ino) -> Xattrs {
        i64::try_from(ino.0)
            .ok()
            .and_then(|i| self.xattrs.get(&i))
            .cloned()
            .unwrap_or_default()
    }

    /// The base inode number a copy-up keeps reporting (its `fs_origin` row).
    pub fn origin(&self, ino: Ino) -> Option<u64> {
        let id = i64::try_from(ino.0).ok()?;
        self.origins.get(&id).map(|b| *b as u64)
    }
}

/// What a restored object is.
#[derive(Clone, Copy, Debug)]
pub enum Body<'a> {
    Dir,
    File(&'a [u8]),
    Symlink(&'a [u8]),
    /// FIFO, socket or device (the type is in the mode, the device in `rdev`).
    Special,
}

/// One object to create in the upper layer.
#[derive(Clone, Copy, Debug)]
pub struct NewNode<'a> {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Content time; atime is set to it too, ctime is the time of the restore.
    pub mtime: Timespec,
    /// The base inode number it reports (an `fs_origin` row; a directory with one merges with
    /// the base directory at its path).
    pub origin: Option<u64>,
    pub xattrs: &'a [(Vec<u8>, Vec<u8>)],
    pub body: Body<'a>,
}

/// Builds the new upper layer inside the replacing transaction.
pub struct UpperWriter<'a> {
    c: &'a Connection,
    cfg: FsConfig,
    now: Timespec,
    /// The directories made so far by path, for putting kept subtrees back.
    dirs: HashMap<Vec<u8>, Ino>,
}

/// Why building or replacing the upper layer failed, and whether the database ran out of
/// space (SQLITE_FULL or ENOSPC): a capacity failure, which more space undoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpperError {
    pub message: String,
    pub full: bool,
}

impl UpperError {
    /// A failure whose cause is `errno`.
    pub fn of_errno(message: String, errno: Errno) -> UpperError {
        UpperError {
            message,
            full: errno == Errno::ENOSPC,
        }
    }

    /// The same failure, its message prefixed with `context`.
    pub fn context(self, context: impl std::fmt::Display) -> UpperError {
        UpperError {
            message: format!("{context}: {}", self.message),
            ..self
        }
    }
}

impl std::fmt::Display for UpperError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for UpperError {
    fn from(message: String) -> Self {
        UpperError {
            message,
            full: false,
        }
    }
}

impl From<&str> for UpperError {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

impl From<UpperError> for String {
    fn from(e: UpperError) -> Self {
        e.message
    }
}

fn sql(what: &str) -> impl Fn(rusqlite::Error) -> UpperError + '_ {
    move |e| {
        let message = format!("{what}: {e}");
        UpperError::of_errno(message, Errno::from(e))
    }
}

fn errno(what: &str) -> impl Fn(Errno) -> UpperError + '_ {
    move |e| UpperError::of_errno(format!("{what}: {e}"), e)
}

/// Largest piece of a file written at once (data::write takes a u32 length).
const WRITE_PIECE: usize = 1 << 20;

impl UpperWriter<'_> {
    /// Give the root directory `n`'s mode bits, owner, time, origin and attributes.
    pub fn root(&mut self, n: &NewNode<'_>) -> Result<(), UpperError> {
        self.c
            .execute(
                "UPDATE fs_inode SET mode = ?1, uid = ?2, gid = ?3, atime = ?4, atime_nsec = ?5,
                   mtime = ?4, mtime_nsec = ?5, ctime = ?6, ctime_nsec = ?7 WHERE ino = 1",
                (
                    libc::S_IFDIR | (n.mode & 0o7777),
                    n.uid,
                    n.gid,
                    n.mtime.sec,
                    n.mtime.nsec,
                    self.now.sec,
                    self.now.nsec,
                ),
            )
            .map_err(sql("root"))?;
        self.extras(Ino::ROOT, n, "/")
    }

    fn extras(&self, ino: Ino, n: &NewNode<'_>, path: &str) -> Result<(), UpperError> {
        xattr::copy_in(self.c, ino, n.xattrs).map_err(errno(path))?;
        if let Some(base) = n.origin {
            self.c
                .prepare_cached(
                    "INSERT OR REPLACE INTO fs_origin (delta_ino, base_ino) VALUES (?1, ?2)",
                )
                .and_then(|mut st| st.execute((ino.0 as i64, base as i64)))
                .map_err(sql(path))?;
        }
        Ok(())
    }

    /// Create `n` as `name` in the directory at `parent_path` (made before, or "/").
    /// Returns the new inode.
    pub fn add(
        &mut self,
        parent_path: &[u8],
        name: &[u8],
        n: &NewNode<'_>,
    ) -> Result<Ino, UpperError> {
        let path = join(parent_path, name);
        let shown = String::from_utf8_lossy(&path).into_owned();
        let parent = *self
            .dirs
            .get(parent_path)
            .ok_or_else(|| format!("{shown}: parent directory missing"))?;
        let (size, inline) = match n.body {
            Body::Symlink(t) => (t.len(), false),
            Body::File(_) => (0, true),
            Body::Dir | Body::Special => (0, false),
        };
        let ino: i64 = self
            .c
            .prepare_cached(
                "INSERT INTO fs_inode (mode, nlink, uid, gid, size, atime, mtime, ctime, rdev,
                                       atime_nsec, mtime_nsec, ctime_nsec, data_inline,
                                       storage_kind)
                 VALUES (?1, 1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8, ?8, ?9,
                         CASE WHEN ?10 THEN x'' END, CASE WHEN ?10 THEN 1 ELSE 0 END)
                 RETURNING ino",
            )
            .and_then(|mut st| {
                st.query_row(
                    (
                        n.mode,
                        n.uid,
                        n.gid,
                        size as i64,
                        n.mtime.sec,
                        self.now.sec,
                        n.rdev,
                        n.mtime.nsec,
                        self.now.nsec,
                        inline,
                    ),
                    |r| r.get(0),
                )
            })
            .map_err(sql(&shown))?;
        let ino = Ino(ino as u64);
        namespace::insert_dentry(self.c, parent, name, ino).map_err(errno(&shown))?;
        match n.body {
            Body::File(bytes) => {
                for (i, piece) in bytes.chunks(WRITE_PIECE).enumerate() {
                    let off = (i * WRITE_PIECE) as u64;
                    data::write(self.c, &self.cfg, ino, off, piece, None).map_err(errno(&shown))?;
                }
            }
            Body::Symlink(target) => {
                self.c
                    .prepare_cached("INSERT INTO fs_symlink (ino, target) VALUES (?1, ?2)")
                    .and_then(|mut st| st.execute((ino.0 as i64, Name(target))))
                    .map_err(sql(&shown))?;
            }
            Body::Dir => {
                self.dirs.insert(path.clone(), ino);
            }
            Body::Special => {}
        }
        self.extras(ino, n, &shown)?;
        Ok(ino)
    }

    /// Give regular file `ino` (made by [`UpperWriter::add`]) one more name: `name` in the
    /// directory at `parent_path`.
    pub fn link(&mut self, parent_path: &[u8], name: &[u8], ino: Ino) -> Result<(), UpperError> {
        let shown = String::from_utf8_lossy(&join(parent_path, name)).into_owned();
        let parent = *self
            .dirs
            .get(parent_path)
            .ok_or_else(|| format!("{shown}: parent directory missing"))?;
        namespace::insert_dentry(self.c, parent, name, ino).map_err(errno(&shown))?;
        self.c
            .prepare_cached("UPDATE fs_inode SET nlink = nlink + 1 WHERE ino = ?1")
            .and_then(|mut st| st.execute([ino.0 as i64]))
            .map_err(sql(&shown))?;
        Ok(())
    }

    /// Record what the base held at absolute `path` when the delta changed it (the first
    /// sighting wins), as a copy-up or whiteout of the server does: `apply` checks it.
    pub fn seen(&mut self, path: &[u8], st: &libc::stat) -> Result<(), UpperError> {
        super::overlay::record_seen(self.c, path, &super::overlay::BaseSeen::of_stat(st))
            .map_err(errno(&String::from_utf8_lossy(path)))
    }

    /// The ctime every restored object gets.
    pub fn now(&self) -> Timespec {
        self.now
    }

    /// Hide the base entry at absolute `path`.
    pub fn whiteout(&mut self, path: &[u8]) -> Result<(), UpperError> {
        self.c
            .prepare_cached(
                "INSERT OR REPLACE INTO fs_whiteout (path, parent_path, created_at)
                 VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut st| st.execute((Name(path), Name(parent_path(path)), self.now.sec)))
            .map_err(sql(&String::from_utf8_lossy(path)))?;
        Ok(())
    }
}

/// What a replacement kept of the old upper layer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// Kept subtrees put back at their path.
    pub subtrees: Vec<Vec<u8>>,
    /// Kept subtrees dropped because their parent directory is gone or the name is taken.
    pub dropped: Vec<Vec<u8>>,
}

impl Store {
    /// Run `f` on the upper layer inside one read transaction.
    pub fn upper_cut<T>(
        &self,
        f: impl FnOnce(&UpperCut<'_>) -> Result<T, String>,
    ) -> Result<T, String> {
        self.upper_cut_then(&|| {}, f)
    }

    /// [`Store::upper_cut`], calling `on_cut` as soon as the transaction holds its snapshot
    /// (its first read), before the rest is read.
    pub fn upper_cut_then<T>(
        &self,
        on_cut: &dyn Fn(),
        f: impl FnOnce(&UpperCut<'_>) -> Result<T, String>,
    ) -> Result<T, String> {
        let cfg = self.config();
        let has_xattrs = self.xattrs;
        let mut out = None;
        self.read_tx(|c| {
            out = Some((|| {
                let (root, children) = read_nodes(c).map_err(sql("reading the tree"))?;
                on_cut();
                let whiteouts = read_whiteouts(c).map_err(sql("fs_whiteout"))?;
                let partial = partial_origins_by_ino(c).map_err(sql("fs_partial_origin"))?;
                let origins = read_origins(c).map_err(sql("fs_origin"))?;
                let xattrs = if has_xattrs {
                    read_xattrs(c).map_err(sql("fs_xattr"))?
                } else {
                    HashMap::new()
                };
                f(&UpperCut {
                    c,
                    cfg,
                    root,
                    children,
                    whiteouts,
                    partial,
                    origins,
                    xattrs,
                })
            })());
            Ok(())
        })
        .map_err(|e| format!("{}: {e}", self.path().display()))?;
        out.unwrap_or_else(|| Err(format!("{}: read failed", self.path().display())))
    }

    /// Replace the upper layer in one write transaction: everything goes except the subtrees
    /// whose path `keep` accepts (and the whiteouts it accepts), then `fill` builds the new
    /// layer, then each kept subtree is put back at its path when its parent directory exists
    /// and the name is free (otherwise it goes too). The caller must hold the server lock.
    pub fn replace_upper(
        &self,
        keep: &dyn Fn(&[u8]) -> bool,
        fill: impl FnOnce(&mut UpperWriter<'_>) -> Result<(), UpperError>,
    ) -> Result<Kept, UpperError> {
        let cfg = self.config();
        let shown = self.path().display().to_string();
        let mut failed = None;
        // Its own transaction, not a savepoint of a namespace batch: a savepoint would copy
        // every page the replacement changes to a statement journal, statement by statement.
        let w = self
            .writer
            .as_ref()
            .ok_or_else(|| format!("{shown}: opened read-only"))?;
        self.admit(super::space::Need::Free)
            .map_err(errno(&shown))?;
        let out = w.transact_alone(|c| {
            let r = replace_in(c, cfg, keep, fill);
            match r {
                Ok(k) => Ok(k),
                Err(e) => {
                    failed = Some(e);
                    Err(Errno::EIO)
                }
            }
        });
        self.invalidate_all();
        let kept = match (out, failed) {
            (_, Some(e)) => return Err(e),
            (Err(e), None) => return Err(errno(&shown)(e)),
            (Ok(k), None) => k,
        };
        self.sync().map_err(errno(&format!("{shown}: commit")))?;
        Ok(kept)
    }
}

const NODE_COLS: &str = "i.ino, i.mode, i.uid, i.gid, i.size, i.rdev, i.mtime, i.mtime_nsec, \
                         i.ctime, i.ctime_nsec";

fn node(r: &rusqlite::Row<'_>, name: Vec<u8>, at: usize) -> rusqlite::Result<Node> {
    let t = |s: usize| -> rusqlite::Result<Timespec> {
        Ok(Timespec {
            sec: r.get(at + s)?,
            nsec: r.get::<_, i64>(at + s + 1)?.clamp(0, 999_999_999) as u32,
        })
    };
    Ok(Node {
        name,
        ino: Ino(r.get::<_, i64>(at)? as u64),
        mode: r.get::<_, i64>(at + 1)? as u32,
        uid: r.get::<_, i64>(at + 2)? as u32,
        gid: r.get::<_, i64>(at + 3)? as u32,
        size: r.get::<_, i64>(at + 4)?.max(0) as u64,
        rdev: r.get::<_, i64>(at + 5)? as u32,
        mtime: t(6)?,
        ctime: t(8)?,
    })
}

/// The root and every name by directory, in one scan of the names (cheaper than a query per
/// directory; what the root does not reach is never visited by a walk from it).
fn read_nodes(c: &Connection) -> rusqlite::Result<(Node, HashMap<i64, Vec<Node>>)> {
    let root = c.query_row(
        &format!("SELECT {NODE_COLS} FROM fs_inode i WHERE i.ino = 1"),
        [],
        |r| node(r, Vec::new(), 0),
    )?;
    let mut st = c.prepare(&format!(
        "SELECT d.parent_ino, d.name, {NODE_COLS} FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino"
    ))?;
    let rows = st.query_map([], |r| {
        let name = bytes_of(r.get_ref(1)?);
        Ok((r.get::<_, i64>(0)?, node(r, name, 2)?))
    })?;
    let mut out: HashMap<i64, Vec<Node>> = HashMap::new();
    for row in rows {
        let (parent, n) = row?;
        out.entry(parent).or_default().push(n);
    }
    Ok((root, out))
}

fn read_whiteouts(c: &Connection) -> rusqlite::Result<Vec<Vec<u8>>> {
    let mut st = c.prepare("SELECT path FROM fs_whiteout")?;
    let rows = st.query_map([], |r| Ok(bytes_of(r.get_ref(0)?)))?;
    rows.collect()
}

fn read_xattrs(c: &Connection) -> rusqlite::Result<HashMap<i64, Xattrs>> {
    let mut st = c.prepare("SELECT ino, name, value FROM fs_xattr ORDER BY ino, name")?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            bytes_of(r.get_ref(1)?),
            bytes_of(r.get_ref(2)?),
        ))
    })?;
    let mut out: HashMap<i64, Xattrs> = HashMap::new();
    for row in rows {
        let (ino, name, value) = row?;
        out.entry(ino).or_default().push((name, value));
    }
    for v in out.values_mut() {
        v.sort();
    }
    Ok(out)
}

fn read_origins(c: &Connection) -> rusqlite::Result<HashMap<i64, i64>> {
    if !super::copy::has_table(c, "main", "fs_origin")? {
        return Ok(HashMap::new());
    }
    let mut st = c.prepare("SELECT delta_ino, base_ino FROM fs_origin")?;
    let it = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    it.collect()
}

fn replace_in(
    c: &Connection,
    cfg: FsConfig,
    keep: &dyn Fn(&[u8]) -> bool,
    fill: impl FnOnce(&mut UpperWriter<'_>) -> Result<(), UpperError>,
) -> Result<Kept, UpperError> {
    let old = read_delta(c).map_err(errno("reading the tree"))?;
    // Kept subtrees: every entry at or beneath an accepted path; the tops are put back later.
    let mut keep_inos: HashSet<i64> = HashSet::new();
    let mut tops: Vec<(Vec<u8>, Ino)> = Vec::new();
    for (path, e) in &old.entries {
        if path.as_slice() == b"/" || !keep(path) {
            continue;
        }
        keep_inos.insert(e.meta.ino.0 as i64);
        if !keep(parent_path(path)) {
            tops.push((path.clone(), e.meta.ino));
        }
    }
    tops.sort();
    c.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS upper_keep (ino INTEGER PRIMARY KEY);
         DELETE FROM temp.upper_keep;",
    )
    .map_err(sql("temp table"))?;
    {
        let mut ins = c
            .prepare("INSERT OR IGNORE INTO temp.upper_keep (ino) VALUES (?1)")
            .map_err(sql("temp table"))?;
        for ino in keep_inos.iter().chain(std::iter::once(&1)) {
            ins.execute([ino]).map_err(sql("temp table"))?;
        }
    }
    // Names first (the subdirectory-count triggers look at the inode), then the inodes.
    c.execute(
        "DELETE FROM fs_dentry WHERE parent_ino NOT IN (SELECT ino FROM temp.upper_keep)
           OR parent_ino = 1",
        [],
    )
    .map_err(sql("fs_dentry"))?;
    drop_unkept(c)?;
    c.execute("DELETE FROM fs_xattr WHERE ino = 1", [])
        .map_err(sql("fs_xattr"))?;
    c.execute("DELETE FROM fs_origin WHERE delta_ino = 1", [])
        .map_err(sql("fs_origin"))?;
    let mut gone = Vec::new();
    for paths in old.whiteouts.values() {
        gone.extend(paths.iter().filter(|p| !keep(p)).cloned());
    }
    for p in &gone {
        c.prepare_cached("DELETE FROM fs_whiteout WHERE path = ?1")
            .and_then(|mut st| st.execute([Name(p)]))
            .map_err(sql("fs_whiteout"))?;
    }
    let mut w = UpperWriter {
        c,
        cfg,
        now: super::inode::now(),
        dirs: HashMap::from([(b"/".to_vec(), Ino::ROOT)]),
    };
    fill(&mut w)?;
    let mut kept = Kept::default();
    for (path, ino) in tops {
        let name = super::overlay::last_name(&path);
        let parent = w.dirs.get(parent_path(&path)).copied();
        let placed = match parent {
            Some(p) => match namespace::insert_dentry(c, p, name, ino) {
                Ok(_) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(errno(&String::from_utf8_lossy(&path))(e)),
            },
            None => false,
        };
        if placed {
            kept.subtrees.push(path);
        } else {
            kept.dropped.push(path);
        }
    }
    // Kept subtrees that found no place: everything the root no longer reaches goes.
    c.execute_batch(
        "DELETE FROM temp.upper_keep;
         INSERT INTO temp.upper_keep (ino)
           WITH RECURSIVE r(ino) AS (SELECT 1 UNION SELECT d.ino FROM fs_dentry d JOIN r
                                     ON d.parent_ino = r.ino)
           SELECT ino FROM r;
         DELETE FROM fs_dentry WHERE parent_ino NOT IN (SELECT ino FROM temp.upper_keep);",
    )
    .map_err(sql("unreached subtrees"))?;
    drop_unkept(c)?;
    c.execute(
        "UPDATE fs_inode SET nlink = (SELECT count(*) FROM fs_dentry d WHERE d.ino = fs_inode.ino)
         WHERE ino != 1",
        [],
    )
    .map_err(sql("nlink"))?;
    c.execute_batch("DROP TABLE temp.upper_keep")
        .map_err(sql("temp table"))?;
    Ok(kept)
}

/// Delete every inode (with its rows) not listed in temp.upper_keep.
fn drop_unkept(c: &Connection) -> Result<(), UpperError> {
    let gone: Vec<i64> = (|| {
        let mut st = c.prepare(
            "SELECT ino FROM fs_inode WHERE ino NOT IN (SELECT ino FROM temp.upper_keep)",
        )?;
        let it = st.query_map([], |r| r.get(0))?;
        it.collect::<rusqlite::Result<_>>()
    })()
    .map_err(sql("fs_inode"))?;
    for ino in gone {
        delete_rows(c, Ino(ino as u64)).map_err(errno(&format!("inode {ino}")))?;
    }
    Ok(())
}
