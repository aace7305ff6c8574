//! The history database (`<store dir>/history.db`): objects, their links, tags, HEAD and the
//! file cache. docs/history.md specifies the tables; every update is one transaction.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::object::{children_of, decode_commit, hex, Hash, ObjKind};
use crate::errors::Code;

/// The file name of the history database inside a store directory.
pub const DB_NAME: &str = "history.db";

/// `history_meta.format` of this layout.
pub const FORMAT: &str = "1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS history_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
  hash BLOB PRIMARY KEY,
  kind INTEGER NOT NULL,
  size INTEGER NOT NULL,
  body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_objects_kind ON objects(kind);
CREATE TABLE IF NOT EXISTS links (
  parent BLOB NOT NULL,
  child BLOB NOT NULL,
  PRIMARY KEY (parent, child)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tags (name TEXT PRIMARY KEY, hash BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS head (id INTEGER PRIMARY KEY CHECK (id = 1), hash BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS file_cache (
  ino INTEGER PRIMARY KEY,
  size INTEGER NOT NULL,
  mtime INTEGER NOT NULL,
  mtime_nsec INTEGER NOT NULL,
  ctime INTEGER NOT NULL,
  ctime_nsec INTEGER NOT NULL,
  blob BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pruned (hash BLOB PRIMARY KEY);
";

/// Tables added to format 1 after its first release (created when absent on open).
const ADDED: &str = "CREATE TABLE IF NOT EXISTS pruned (hash BLOB PRIMARY KEY);";

/// zstd level of object bodies.
const ZSTD_LEVEL: i32 = 3;

/// What identifies an unchanged file between snapshots: its inode row's size and times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub ino: i64,
    pub size: i64,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
}

/// The history database.
pub struct Db {
    c: Connection,
    path: PathBuf,
}

/// An SQLite error while doing `what`, named by its code (`CODE: WHAT: ERROR`): a full disk is
/// `capacity_exhausted`, a lock held too long `db_busy`, damage `db_corrupt` (Code::of_sqlite).
pub fn sql<W: std::fmt::Display>(what: W) -> impl Fn(rusqlite::Error) -> String {
    move |err| format!("{}: {what}: {err}", Code::of_sqlite(&err))
}

/// An SQLite error of the database at `path`.
fn e(path: &Path) -> impl Fn(rusqlite::Error) -> String + '_ {
    move |err| sql(path.display())(err)
}

/// One object gc would delete (or deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreachable {
    pub hash: Hash,
    pub kind: &'static str,
    /// Bytes of the stored (compressed) body.
    pub stored: u64,
}

impl Db {
    /// Open (creating when absent) the history database of store directory `dir`.
    pub fn open(dir: &Path) -> Result<Db, String> {
        std::fs::create_dir_all(dir)
            .map_err(|err| format!("{}: {}: {err}", Code::of_io(&err), dir.display()))?;
        let path = dir.join(DB_NAME);
        let c = Connection::open(&path).map_err(e(&path))?;
        c.busy_timeout(std::time::Duration::from_millis(
            crate::knobs::get().sqlite_busy_timeout_ms,
        ))
        .map_err(e(&path))?;
        c.pragma_update(None, "journal_mode", "WAL")
            .map_err(e(&path))?;
        c.pragma_update(None, "synchronous", "FULL")
            .map_err(e(&path))?;
        // A replicated history's WAL is Litestream's to checkpoint (src/replica.rs).
        if crate::replica::leaves_checkpoints(&path) {
            c.pragma_update(None, "wal_autocheckpoint", 0)
                .map_err(e(&path))?;
        }
        let format: Option<String> = c
            .query_row(
                "SELECT value FROM history_meta WHERE key = 'format'",
                [],
                |r| r.get(0),
            )
            .optional()
            .or_else(|err| match err {
                rusqlite::Error::SqliteFailure(_, Some(m)) if m.contains("no such table") => {
                    Ok(None)
                }
                other => Err(other),
            })
            .map_err(e(&path))?;
        match format.as_deref() {
            Some(FORMAT) => c.execute_batch(ADDED).map_err(e(&path))?,
            Some(other) => {
                return Err(format!(
                    "{}: unknown history format {other} (this build reads {FORMAT})",
                    path.display()
                ))
            }
            None => {
                c.execute_batch(&format!(
                    "BEGIN IMMEDIATE; {SCHEMA}
                     INSERT OR IGNORE INTO history_meta (key, value) VALUES ('format', '{FORMAT}');
                     COMMIT;"
                ))
                .map_err(e(&path))?;
            }
        }
        Ok(Db { c, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` as one IMMEDIATE write transaction (committed only when `f` succeeds).
    pub fn write<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, String>,
    ) -> Result<T, String> {
        let path = self.path.clone();
        let tx = self
            .c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(e(&path))?;
        let out = codec::reused(|| f(&tx))?;
        tx.commit().map_err(e(&path))?;
        Ok(out)
    }

    /// Run `f` inside one read transaction.
    pub fn read<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, String>,
    ) -> Result<T, String> {
        let path = self.path.clone();
        let tx = self
            .c
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(e(&path))?;
        let out = codec::reused(|| f(&tx))?;
        tx.commit().map_err(e(&path))?;
        Ok(out)
    }
}

/// Whether object `h` exists.
pub fn has(c: &Connection, h: &Hash) -> rusqlite::Result<bool> {
    c.prepare_cached("SELECT 1 FROM objects WHERE hash = ?1")?
        .query_row([&h[..]], |_| Ok(()))
        .optional()
        .map(|o| o.is_some())
}

/// Store `raw` as an object of `kind` (children: the objects it refers to); returns its key
/// and the stored bytes added (0 when it was there already).
pub fn put(
    c: &Connection,
    kind: ObjKind,
    raw: &[u8],
    children: &[Hash],
) -> Result<(Hash, u64), String> {
    let h = super::object::hash_of(raw);
    let sqle = |err| sql(format_args!("storing {} {}", kind.name(), hex(&h)))(err);
    let existing: Option<i64> = c
        .prepare_cached("SELECT kind FROM objects WHERE hash = ?1")
        .and_then(|mut st| st.query_row([&h[..]], |r| r.get(0)).optional())
        .map_err(sqle)?;
    let mut added = 0;
    match existing {
        Some(k) if k == kind as i64 => return Ok((h, 0)),
        Some(_) => {}
        None => {
            let body = codec::compress(raw)
                .map_err(|err| format!("{}: compressing {}: {err}", Code::of_io(&err), hex(&h)))?;
            added = body.len() as u64;
            c.prepare_cached(
                "INSERT INTO objects (hash, kind, size, body) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut st| st.execute((&h[..], kind as i64, raw.len() as i64, &body)))
            .map_err(sqle)?;
        }
    }
    // Links are written even for an object already stored as another kind (the same bytes
    // can be a file and a tree), so reachability never misses a child.
    let mut st = c
        .prepare_cached("INSERT OR IGNORE INTO links (parent, child) VALUES (?1, ?2)")
        .map_err(sqle)?;
    for ch in children {
        st.execute((&h[..], &ch[..])).map_err(sqle)?;
    }
    Ok((h, added))
}

/// One finding of the store's check, or why an object cannot be read: a code of the closed
/// set (`bad_object`, `corrupt_object`, `missing_object`, `bad_link`, `missing_link`, or the
/// SQLite error's own) and what it concerns. Shown as `CODE: WHAT`, which is how a command
/// failing on it names its code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub code: Code,
    pub what: String,
}

impl Finding {
    fn new(code: Code, what: impl Into<String>) -> Finding {
        Finding {
            code,
            what: what.into(),
        }
    }

    fn sqlite(what: &str, err: &rusqlite::Error) -> Finding {
        Finding::new(Code::of_sqlite(err), format!("{what}: {err}"))
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.what)
    }
}

/// The raw bytes of object `h` and its kind, checked against the key (the error is a
/// [`Finding`] as text: `CODE: WHAT`).
pub fn get(c: &Connection, h: &Hash) -> Result<(ObjKind, Vec<u8>), String> {
    read(c, h).map_err(|f| f.to_string())
}

/// [`get`], failing with the finding.
fn read(c: &Connection, h: &Hash) -> Result<(ObjKind, Vec<u8>), Finding> {
    let row: Option<(i64, i64, Vec<u8>)> = c
        .prepare_cached("SELECT kind, size, body FROM objects WHERE hash = ?1")
        .and_then(|mut st| {
            st.query_row([&h[..]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .map_err(|err| Finding::sqlite(&format!("object {}", hex(h)), &err))?;
    let (kind, size, body) = row.ok_or_else(|| Finding::new(Code::MissingObject, hex(h)))?;
    let kind = ObjKind::from_i64(kind)
        .ok_or_else(|| Finding::new(Code::BadObject, format!("{}: unknown kind {kind}", hex(h))))?;
    let raw = codec::decompress(&body, size.max(0) as usize).map_err(|err| {
        Finding::new(
            Code::BadObject,
            format!(
                "{} {}: its body does not decompress: {err}",
                kind.name(),
                hex(h)
            ),
        )
    })?;
    if super::object::hash_of(&raw) != *h || raw.len() as i64 != size {
        return Err(Finding::new(
            Code::CorruptObject,
            format!("{} does not match its key", hex(h)),
        ));
    }
    Ok((kind, raw))
}

pub fn head(c: &Connection) -> rusqlite::Result<Option<Hash>> {
    c.query_row("SELECT hash FROM head WHERE id = 1", [], |r| r.get(0))
        .optional()
        .map(|o: Option<Vec<u8>>| o.and_then(|v| v.try_into().ok()))
}

pub fn set_head(c: &Connection, h: &Hash) -> rusqlite::Result<()> {
    c.execute(
        "INSERT INTO head (id, hash) VALUES (1, ?1) ON CONFLICT(id) DO UPDATE SET hash = excluded.hash",
        [&h[..]],
    )
    .map(|_| ())
}

pub fn tags(c: &Connection) -> rusqlite::Result<Vec<(String, Hash)>> {
    let mut st = c.prepare("SELECT name, hash FROM tags ORDER BY name")?;
    let it = st.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    let mut out = Vec::new();
    for row in it {
        let (n, h) = row?;
        if let Ok(h) = h.try_into() {
            out.push((n, h));
        }
    }
    Ok(out)
}

/// The file cache: inode row identity -> blob.
pub fn load_cache(c: &Connection) -> rusqlite::Result<HashMap<i64, (FileKey, Hash)>> {
    let mut st =
        c.prepare("SELECT ino, size, mtime, mtime_nsec, ctime, ctime_nsec, blob FROM file_cache")?;
    let it = st.query_map([], |r| {
        Ok((
            FileKey {
                ino: r.get(0)?,
                size: r.get(1)?,
                mtime: (r.get(2)?, r.get(3)?),
                ctime: (r.get(4)?, r.get(5)?),
            },
            r.get::<_, Vec<u8>>(6)?,
        ))
    })?;
    let mut out = HashMap::new();
    for row in it {
        let (k, b) = row?;
        if let Ok(b) = b.try_into() {
            out.insert(k.ino, (k, b));
        }
    }
    Ok(out)
}

pub fn cache_put(c: &Connection, k: &FileKey, blob: &Hash) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT OR REPLACE INTO file_cache (ino, size, mtime, mtime_nsec, ctime, ctime_nsec, blob)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute((
        k.ino,
        k.size,
        k.mtime.0,
        k.mtime.1,
        k.ctime.0,
        k.ctime.1,
        &blob[..],
    ))
    .map(|_| ())
}

pub fn cache_drop(c: &Connection, ino: i64) -> rusqlite::Result<()> {
    c.prepare_cached("DELETE FROM file_cache WHERE ino = ?1")?
        .execute([ino])
        .map(|_| ())
}

/// Objects no tag or HEAD reaches (through links), in key order.
pub fn unreachable(c: &Connection) -> rusqlite::Result<Vec<Unreachable>> {
    let mut st = c.prepare(
        "WITH RECURSIVE r(h) AS (
           SELECT hash FROM tags UNION SELECT hash FROM head
           UNION SELECT l.child FROM links l JOIN r ON l.parent = r.h)
         SELECT hash, kind, length(body) FROM objects
         WHERE hash NOT IN (SELECT h FROM r) ORDER BY hash",
    )?;
    let it = st.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in it {
        let (h, k, n) = row?;
        out.push(Unreachable {
            hash: h.try_into().unwrap_or([0; 32]),
            kind: ObjKind::from_i64(k).map_or("unknown", ObjKind::name),
            stored: n.max(0) as u64,
        });
    }
    Ok(out)
}

/// Prune the checkpoint commit `h` whose parent is `parent`: the commit stays (the chain of
/// parents is whole, `log` shows it) but its links to its state go, so gc deletes what only
/// it reached.
pub fn prune(c: &Connection, h: &Hash, parent: Option<&Hash>) -> rusqlite::Result<()> {
    c.execute("INSERT OR IGNORE INTO pruned (hash) VALUES (?1)", [&h[..]])?;
    match parent {
        Some(p) => c.execute(
            "DELETE FROM links WHERE parent = ?1 AND child != ?2",
            (&h[..], &p[..]),
        )?,
        None => c.execute("DELETE FROM links WHERE parent = ?1", [&h[..]])?,
    };
    Ok(())
}

/// Whether the commit `h` was pruned.
pub fn is_pruned(c: &Connection, h: &Hash) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT EXISTS(SELECT 1 FROM pruned WHERE hash = ?1)",
        [&h[..]],
        |r| r.get(0),
    )
}

/// Delete `gone` with their links and the cache rows naming them.
pub fn delete(c: &Connection, gone: &[Unreachable]) -> rusqlite::Result<()> {
    let mut o = c.prepare_cached("DELETE FROM objects WHERE hash = ?1")?;
    let mut l = c.prepare_cached("DELETE FROM links WHERE parent = ?1")?;
    let mut f = c.prepare_cached("DELETE FROM file_cache WHERE blob = ?1")?;
    let mut p = c.prepare_cached("DELETE FROM pruned WHERE hash = ?1")?;
    for u in gone {
        o.execute([&u.hash[..]])?;
        l.execute([&u.hash[..]])?;
        f.execute([&u.hash[..]])?;
        p.execute([&u.hash[..]])?;
    }
    Ok(())
}

/// References to objects that are not stored (`missing_object`): links, tags, HEAD and cache
/// rows.
pub fn dangling(c: &Connection) -> rusqlite::Result<Vec<Finding>> {
    let mut out = Vec::new();
    let queries = [
        (
            "link",
            "SELECT hex(parent) || ' -> ' || hex(child) FROM links
             WHERE child NOT IN (SELECT hash FROM objects)",
        ),
        (
            "tag",
            "SELECT name FROM tags WHERE hash NOT IN (SELECT hash FROM objects WHERE kind = 3)",
        ),
        (
            "HEAD",
            "SELECT 'HEAD' FROM head WHERE hash NOT IN (SELECT hash FROM objects WHERE kind = 3)",
        ),
        (
            "file cache",
            "SELECT 'inode ' || ino FROM file_cache WHERE blob NOT IN (SELECT hash FROM objects)",
        ),
    ];
    for (what, sql) in queries {
        let mut st = c.prepare(sql)?;
        let it = st.query_map([], |r| r.get::<_, String>(0))?;
        for row in it {
            out.push(Finding::new(
                Code::MissingObject,
                format!("dangling {what}: {}", row?.to_lowercase()),
            ));
        }
    }
    Ok(out)
}

/// The store's own integrity check: SQLite's (`db_corrupt`), every object against its key
/// (`bad_object`, `corrupt_object`), every object's links against its decoded references
/// (`bad_object`, `missing_link`), every link's keys (`bad_link`), and no dangling reference
/// (`missing_object`). An error is a store that could not be read at all (`CODE: WHAT`).
pub fn check(c: &Connection) -> Result<Vec<Finding>, String> {
    let sqle = |err: rusqlite::Error| Finding::sqlite("check", &err).to_string();
    let mut out = Vec::new();
    {
        let mut st = c.prepare("PRAGMA integrity_check").map_err(sqle)?;
        let it = st.query_map([], |r| r.get::<_, String>(0)).map_err(sqle)?;
        for row in it {
            let line = row.map_err(sqle)?;
            if line != "ok" {
                out.push(Finding::new(Code::DbCorrupt, format!("sqlite: {line}")));
            }
        }
    }
    let mut links: HashMap<Hash, HashSet<Hash>> = HashMap::new();
    {
        let mut st = c.prepare("SELECT parent, child FROM links").map_err(sqle)?;
        let it = st
            .query_map([], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .map_err(sqle)?;
        for row in it {
            let (p, ch) = row.map_err(sqle)?;
            let shown = format!("{} -> {}", hex(&p), hex(&ch));
            match (Hash::try_from(p), Hash::try_from(ch)) {
                (Ok(p), Ok(ch)) => {
                    links.entry(p).or_default().insert(ch);
                }
                _ => out.push(Finding::new(
                    Code::BadLink,
                    format!("{shown}: a key is not 32 bytes"),
                )),
            }
        }
    }
    let hashes: Vec<Vec<u8>> = {
        let mut st = c.prepare("SELECT hash FROM objects").map_err(sqle)?;
        let it = st.query_map([], |r| r.get(0)).map_err(sqle)?;
        it.collect::<rusqlite::Result<_>>().map_err(sqle)?
    };
    for h in hashes {
        let shown = hex(&h);
        let Ok(h) = Hash::try_from(h) else {
            out.push(Finding::new(
                Code::BadObject,
                format!("{shown}: its key is not 32 bytes"),
            ));
            continue;
        };
        let (kind, raw) = match read(c, &h) {
            Ok(x) => x,
            Err(f) => {
                out.push(f);
                continue;
            }
        };
        // A pruned commit keeps only the link to its parent.
        let children = if is_pruned(c, &h).map_err(sqle)? {
            decode_commit(&raw).map(|cm| cm.parent.into_iter().collect())
        } else {
            children_of(kind, &raw)
        };
        match children {
            Ok(children) => {
                let have = links.get(&h);
                for ch in children {
                    if !have.is_some_and(|s| s.contains(&ch)) {
                        out.push(Finding::new(
                            Code::MissingLink,
                            format!("{} -> {}", hex(&h), hex(&ch)),
                        ));
                    }
                }
            }
            Err(m) => out.push(Finding::new(
                Code::BadObject,
                format!("{} {}: {m}", kind.name(), hex(&h)),
            )),
        }
    }
    out.extend(dangling(c).map_err(sqle)?);
    Ok(out)
}

/// The objects' zstd contexts. Making a context costs more than compressing a small file
/// with it (a cold snapshot of 10,000 files spent a third of its time there), so one
/// transaction of the history database reuses one of each; they are freed when it ends, so
/// an idle sandbox holds none. Outside a transaction each call makes its own.
mod codec {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static DEPTH: Cell<u32> = const { Cell::new(0) };
        static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { RefCell::new(None) };
        static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { RefCell::new(None) };
    }

    /// Run `f` with the contexts kept between calls (freed when the outermost call ends).
    pub fn reused<T>(f: impl FnOnce() -> T) -> T {
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                let depth = DEPTH.with(|d| {
                    d.set(d.get().saturating_sub(1));
                    d.get()
                });
                if depth == 0 {
                    COMPRESSOR.with(|c| c.borrow_mut().take());
                    DECOMPRESSOR.with(|c| c.borrow_mut().take());
                }
            }
        }
        DEPTH.with(|d| d.set(d.get() + 1));
        let _leave = Leave;
        f()
    }

    fn kept() -> bool {
        DEPTH.with(|d| d.get() > 0)
    }

    /// Run `f` with the context in `slot` (made by `make` when it has none), or, outside a
    /// transaction, with a fresh one that goes when `f` returns.
    fn with_context<C, T>(
        slot: &'static std::thread::LocalKey<RefCell<Option<C>>>,
        make: impl FnOnce() -> std::io::Result<C>,
        f: impl FnOnce(&mut C) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        if !kept() {
            return f(&mut make()?);
        }
        slot.with(|s| {
            let mut s = s.borrow_mut();
            let ctx = match s.as_mut() {
                Some(ctx) => ctx,
                None => s.insert(make()?),
            };
            f(ctx)
        })
    }

    pub fn compress(raw: &[u8]) -> std::io::Result<Vec<u8>> {
        with_context(
            &COMPRESSOR,
            || zstd::bulk::Compressor::new(super::ZSTD_LEVEL),
            |c| c.compress(raw),
        )
    }

    pub fn decompress(body: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
        with_context(&DECOMPRESSOR, zstd::bulk::Decompressor::new, |d| {
            d.decompress(body, capacity)
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Inside a transaction the contexts are kept between objects and give the same bytes
        /// as fresh ones; they are gone once it ends (an idle process holds none).
        #[test]
        fn contexts_live_for_one_transaction() {
            let a = b"the same bytes, compressed twice".repeat(50);
            let b = b"other bytes".repeat(80);
            let fresh = (
                zstd::bulk::compress(&a, super::super::ZSTD_LEVEL).unwrap(),
                zstd::bulk::compress(&b, super::super::ZSTD_LEVEL).unwrap(),
            );
            let kept_between = reused(|| {
                let x = compress(&a).unwrap();
                let y = compress(&b).unwrap();
                assert!(COMPRESSOR.with(|c| c.borrow().is_some()));
                assert_eq!(decompress(&x, a.len()).unwrap(), a);
                assert_eq!(decompress(&y, b.len()).unwrap(), b);
                assert!(DECOMPRESSOR.with(|c| c.borrow().is_some()));
                (x, y)
            });
            assert_eq!(kept_between, fresh);
            assert!(COMPRESSOR.with(|c| c.borrow().is_none()));
            assert!(DECOMPRESSOR.with(|c| c.borrow().is_none()));
            assert!(!kept());
        }
    }
}
