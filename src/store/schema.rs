//! The on-disk format: the SPEC v0.5 DDL (plus our documented extensions), the
//! `PRAGMA user_version` numbering, database creation and the checks `open` makes before it
//! touches anything.
//!
//! SPEC.md carries the same DDL in its "Schema (DDL)" section; a unit test fails if the two
//! drift apart.

use std::fs::OpenOptions;
use std::io::Read;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::{FsConfig, InitOptions, StoreError};

/// `PRAGMA user_version` of a SPEC v0.5 database written by this implementation.
pub const USER_VERSION_V05: i64 = 5;
/// `PRAGMA user_version` values assigned to the older supported formats (for `agentfs migrate`):
/// v0.0 = 1, v0.2 = 2, v0.3 = 3, v0.4 = 4. Zero means "never stamped" (older writers did not
/// stamp at all); such a database is classified by its fs_config.schema_version row.
pub const USER_VERSION_V00: i64 = 1;
pub const USER_VERSION_V02: i64 = 2;
pub const USER_VERSION_V03: i64 = 3;
pub const USER_VERSION_V04: i64 = 4;

/// The `schema_version` value in fs_config.
pub const SCHEMA_VERSION: &str = "0.5";

/// Smallest and largest chunk size `create` accepts (power of two required).
pub const MIN_CHUNK: u64 = 512;
pub const MAX_CHUNK: u64 = 1 << 20;
/// Largest chunk size `open` accepts from a database written by another implementation.
pub const MAX_FOREIGN_CHUNK: u64 = 64 << 20;

/// Every CREATE statement of a new database, in execution order. Must equal the ```sql block
/// under "## Schema (DDL)" in SPEC.md (checked by a test).
pub const DDL: &str = r#"
CREATE TABLE tool_calls (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  parameters TEXT,
  result TEXT,
  error TEXT,
  started_at INTEGER NOT NULL,
  completed_at INTEGER NOT NULL,
  duration_ms INTEGER NOT NULL
);
CREATE INDEX idx_tool_calls_name ON tool_calls(name);
CREATE INDEX idx_tool_calls_started_at ON tool_calls(started_at);

CREATE TABLE fs_config (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

CREATE TABLE fs_inode (
  ino INTEGER PRIMARY KEY AUTOINCREMENT,
  mode INTEGER NOT NULL,
  nlink INTEGER NOT NULL DEFAULT 0,
  uid INTEGER NOT NULL DEFAULT 0,
  gid INTEGER NOT NULL DEFAULT 0,
  size INTEGER NOT NULL DEFAULT 0,
  atime INTEGER NOT NULL,
  mtime INTEGER NOT NULL,
  ctime INTEGER NOT NULL,
  rdev INTEGER NOT NULL DEFAULT 0,
  atime_nsec INTEGER NOT NULL DEFAULT 0,
  mtime_nsec INTEGER NOT NULL DEFAULT 0,
  ctime_nsec INTEGER NOT NULL DEFAULT 0,
  data_inline BLOB,
  storage_kind INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE fs_dentry (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  parent_ino INTEGER NOT NULL,
  ino INTEGER NOT NULL,
  UNIQUE(parent_ino, name)
);
CREATE INDEX idx_fs_dentry_parent ON fs_dentry(parent_ino, name);

CREATE TABLE fs_data (
  ino INTEGER NOT NULL,
  chunk_index INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (ino, chunk_index)
);

CREATE TABLE fs_symlink (
  ino INTEGER PRIMARY KEY,
  target TEXT NOT NULL
);

CREATE TABLE fs_whiteout (
  path TEXT PRIMARY KEY,
  parent_path TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX idx_fs_whiteout_parent ON fs_whiteout(parent_path);

CREATE TABLE fs_overlay_config (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

CREATE TABLE fs_origin (
  delta_ino INTEGER PRIMARY KEY,
  base_ino INTEGER NOT NULL
);

CREATE TABLE fs_partial_origin (
  delta_ino INTEGER PRIMARY KEY,
  base_ino INTEGER NOT NULL,
  base_path TEXT NOT NULL,
  base_size INTEGER NOT NULL,
  base_fingerprint_size INTEGER NOT NULL DEFAULT -1,
  base_mtime INTEGER NOT NULL DEFAULT 0,
  base_mtime_nsec INTEGER NOT NULL DEFAULT 0,
  base_ctime INTEGER NOT NULL DEFAULT 0,
  base_ctime_nsec INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL
);

CREATE TABLE fs_chunk_override (
  delta_ino INTEGER NOT NULL,
  chunk_index INTEGER NOT NULL,
  PRIMARY KEY (delta_ino, chunk_index)
);

CREATE TABLE kv_store (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL,
  created_at INTEGER DEFAULT (unixepoch()),
  updated_at INTEGER DEFAULT (unixepoch())
);
CREATE INDEX idx_kv_store_created_at ON kv_store(created_at);

CREATE INDEX idx_fs_dentry_parent_id ON fs_dentry(parent_ino, id);
CREATE INDEX idx_fs_dentry_ino ON fs_dentry(ino);
CREATE INDEX idx_fs_inode_orphan ON fs_inode(ino) WHERE nlink = 0;
CREATE TABLE fs_xattr (
  ino INTEGER NOT NULL,
  name BLOB NOT NULL,
  value BLOB NOT NULL,
  PRIMARY KEY (ino, name)
);
CREATE TABLE fs_dir_stats (
  ino INTEGER PRIMARY KEY,
  subdirs INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER fs_dir_stats_link AFTER INSERT ON fs_dentry
WHEN (SELECT mode & 61440 FROM fs_inode WHERE ino = NEW.ino) = 16384
BEGIN
  INSERT INTO fs_dir_stats (ino, subdirs) VALUES (NEW.parent_ino, 1)
    ON CONFLICT(ino) DO UPDATE SET subdirs = subdirs + 1;
END;
CREATE TRIGGER fs_dir_stats_unlink AFTER DELETE ON fs_dentry
WHEN (SELECT mode & 61440 FROM fs_inode WHERE ino = OLD.ino) = 16384
BEGIN
  UPDATE fs_dir_stats SET subdirs = subdirs - 1 WHERE ino = OLD.parent_ino;
END;
CREATE TRIGGER fs_dir_stats_move AFTER UPDATE OF parent_ino, ino ON fs_dentry
BEGIN
  UPDATE fs_dir_stats SET subdirs = subdirs - 1
    WHERE ino = OLD.parent_ino
      AND (SELECT mode & 61440 FROM fs_inode WHERE ino = OLD.ino) = 16384;
  INSERT INTO fs_dir_stats (ino, subdirs)
    SELECT NEW.parent_ino, 1
    WHERE (SELECT mode & 61440 FROM fs_inode WHERE ino = NEW.ino) = 16384
    ON CONFLICT(ino) DO UPDATE SET subdirs = subdirs + 1;
END;
CREATE TRIGGER fs_dir_stats_reap AFTER DELETE ON fs_inode
BEGIN
  DELETE FROM fs_dir_stats WHERE ino = OLD.ino;
END;
CREATE TABLE fs_change (
  id INTEGER PRIMARY KEY CHECK (id = 0),
  seq INTEGER NOT NULL
);
CREATE TRIGGER fs_change_inode_i AFTER INSERT ON fs_inode
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_inode_u AFTER UPDATE ON fs_inode
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_inode_d AFTER DELETE ON fs_inode
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_dentry_i AFTER INSERT ON fs_dentry
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_dentry_u AFTER UPDATE ON fs_dentry
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_dentry_d AFTER DELETE ON fs_dentry
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_data_i AFTER INSERT ON fs_data
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_data_u AFTER UPDATE ON fs_data
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_data_d AFTER DELETE ON fs_data
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_symlink_i AFTER INSERT ON fs_symlink
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_symlink_u AFTER UPDATE ON fs_symlink
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_symlink_d AFTER DELETE ON fs_symlink
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_xattr_i AFTER INSERT ON fs_xattr
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_xattr_u AFTER UPDATE ON fs_xattr
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_xattr_d AFTER DELETE ON fs_xattr
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_whiteout_i AFTER INSERT ON fs_whiteout
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_whiteout_u AFTER UPDATE ON fs_whiteout
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_whiteout_d AFTER DELETE ON fs_whiteout
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_origin_i AFTER INSERT ON fs_origin
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_origin_u AFTER UPDATE ON fs_origin
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_origin_d AFTER DELETE ON fs_origin
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_partial_i AFTER INSERT ON fs_partial_origin
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_partial_u AFTER UPDATE ON fs_partial_origin
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_partial_d AFTER DELETE ON fs_partial_origin
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_override_i AFTER INSERT ON fs_chunk_override
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_override_u AFTER UPDATE ON fs_chunk_override
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
CREATE TRIGGER fs_change_override_d AFTER DELETE ON fs_chunk_override
BEGIN INSERT INTO fs_change VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; END;
"#;

/// The `CREATE TABLE` statement of `table` exactly as [`DDL`] has it (for migrations that add
/// a table an older format lacked).
pub fn table_ddl(table: &str) -> Option<&'static str> {
    let start = DDL.find(&format!("CREATE TABLE {table} ("))?;
    let len = DDL[start..].find(");")? + 2;
    Some(&DDL[start..start + len])
}

/// The extension objects (indexes and fs_xattr) created on a writable open of a v0.5 database
/// written by another implementation that lacks them. Additive and idempotent.
const EXTENSIONS_IF_MISSING: &str = r#"
CREATE INDEX IF NOT EXISTS idx_fs_dentry_parent_id ON fs_dentry(parent_ino, id);
CREATE INDEX IF NOT EXISTS idx_fs_dentry_ino ON fs_dentry(ino);
CREATE INDEX IF NOT EXISTS idx_fs_inode_orphan ON fs_inode(ino) WHERE nlink = 0;
CREATE TABLE IF NOT EXISTS fs_xattr (
  ino INTEGER NOT NULL,
  name BLOB NOT NULL,
  value BLOB NOT NULL,
  PRIMARY KEY (ino, name)
);
CREATE TABLE IF NOT EXISTS fs_dir_stats (
  ino INTEGER PRIMARY KEY,
  subdirs INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER IF NOT EXISTS fs_dir_stats_link AFTER INSERT ON fs_dentry
WHEN (SELECT mode & 61440 FROM fs_inode WHERE ino = NEW.ino) = 16384
BEGIN
  INSERT INTO fs_dir_stats (ino, subdirs) VALUES (NEW.parent_ino, 1)
    ON CONFLICT(ino) DO UPDATE SET subdirs = subdirs + 1;
END;
CREATE TRIGGER IF NOT EXISTS fs_dir_stats_unlink AFTER DELETE ON fs_dentry
WHEN (SELECT mode & 61440 FROM fs_inode WHERE ino = OLD.ino) = 16384
BEGIN
  UPDATE fs_dir_stats SET subdirs = subdirs - 1 WHERE ino = OLD.parent_ino;
END;
CREATE TRIGGER IF NOT EXISTS fs_dir_stats_move AFTER UPDATE OF parent_ino, ino ON fs_dentry
BEGIN
  UPDATE fs_dir_stats SET subdirs = subdirs - 1
    WHERE ino = OLD.parent_ino
      AND (SELECT mode & 61440 FROM fs_inode WHERE ino = OLD.ino) = 16384;
  INSERT INTO fs_dir_stats (ino, subdirs)
    SELECT NEW.parent_ino, 1
    WHERE (SELECT mode & 61440 FROM fs_inode WHERE ino = NEW.ino) = 16384
    ON CONFLICT(ino) DO UPDATE SET subdirs = subdirs + 1;
END;
CREATE TRIGGER IF NOT EXISTS fs_dir_stats_reap AFTER DELETE ON fs_inode
BEGIN
  DELETE FROM fs_dir_stats WHERE ino = OLD.ino;
END;
"#;

/// Fills fs_dir_stats from the dentries, for a database that did not maintain it.
pub const DIR_STATS_REBUILD: &str = "DELETE FROM fs_dir_stats;
INSERT INTO fs_dir_stats (ino, subdirs)
  SELECT d.parent_ino, count(*) FROM fs_dentry d JOIN fs_inode i ON i.ino = d.ino
  WHERE (i.mode & 61440) = 16384 GROUP BY d.parent_ino;";

/// Every extension object by name (what [`ensure_extensions`] looks for).
const EXTENSION_NAMES: [&str; 9] = [
    "idx_fs_dentry_parent_id",
    "idx_fs_dentry_ino",
    "idx_fs_inode_orphan",
    "fs_xattr",
    "fs_dir_stats",
    "fs_dir_stats_link",
    "fs_dir_stats_unlink",
    "fs_dir_stats_move",
    "fs_dir_stats_reap",
];

fn sqlite_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sqlite {
        path: path.display().to_string(),
        source,
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn invalid(path: &Path, why: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// Check `opts` as `agentfs init` takes them.
pub fn validate_options(path: &Path, opts: &InitOptions) -> Result<(), StoreError> {
    let cs = opts.chunk_size;
    if !cs.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&cs) {
        return Err(invalid(
            path,
            format!("chunk_size {cs} must be a power of two in {MIN_CHUNK}..={MAX_CHUNK}"),
        ));
    }
    if opts.inline_threshold > cs {
        return Err(invalid(
            path,
            format!(
                "inline_threshold {} must not exceed chunk_size {cs}",
                opts.inline_threshold
            ),
        ));
    }
    Ok(())
}

/// Create a new database: the file must not exist (checked atomically with O_EXCL). Runs the
/// DDL, the config rows and the root inode in one transaction, stamps user_version, and
/// switches the file to WAL. On failure the half-made file is removed.
pub fn create(path: &Path, opts: &InitOptions) -> Result<(), StoreError> {
    validate_options(path, opts)?;
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(StoreError::Exists {
                path: path.display().to_string(),
            })
        }
        Err(e) => return Err(io_err(path)(e)),
    }
    let r = create_in(path, opts);
    if r.is_err() {
        let _ = std::fs::remove_file(path);
    }
    r
}

fn create_in(path: &Path, opts: &InitOptions) -> Result<(), StoreError> {
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err(path))?;
    // Before the first table: free pages can then be handed back without a full VACUUM.
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
        .map_err(sqlite_err(path))?;
    let tx = conn.transaction().map_err(sqlite_err(path))?;
    tx.execute_batch(DDL).map_err(sqlite_err(path))?;
    let now = super::inode::now();
    {
        let mut cfg = tx
            .prepare("INSERT INTO fs_config (key, value) VALUES (?1, ?2)")
            .map_err(sqlite_err(path))?;
        for (k, v) in [
            ("schema_version", SCHEMA_VERSION.to_string()),
            ("chunk_size", opts.chunk_size.to_string()),
            ("inline_threshold", opts.inline_threshold.to_string()),
        ] {
            cfg.execute((k, v)).map_err(sqlite_err(path))?;
        }
    }
    tx.execute(
        "INSERT INTO fs_inode (ino, mode, nlink, uid, gid, size, atime, mtime, ctime,
                               atime_nsec, mtime_nsec, ctime_nsec)
         VALUES (1, ?1, 1, ?4, ?5, 0, ?2, ?2, ?2, ?3, ?3, ?3)",
        (
            0o040755i64,
            now.sec,
            now.nsec,
            opts.root_owner.uid,
            opts.root_owner.gid,
        ),
    )
    .map_err(sqlite_err(path))?;
    tx.pragma_update(None, "user_version", USER_VERSION_V05)
        .map_err(sqlite_err(path))?;
    tx.commit().map_err(sqlite_err(path))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(sqlite_err(path))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(invalid(path, format!("could not enable WAL (got {mode})")));
    }
    Ok(())
}

/// Whether the file starts with the SQLite header. Missing or unreadable files are Io errors.
fn looks_like_sqlite(path: &Path) -> Result<bool, StoreError> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut head = [0u8; 16];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(path)(e)),
        }
    }
    Ok(got == head.len() && &head == b"SQLite format 3\0")
}

/// Classify an existing file without modifying it and read its layout. Refusals:
/// `NotSqlite`, `OldSchema` (names `agentfs migrate`), `UnknownSchema`, `Invalid` (bad config).
pub fn inspect(path: &Path) -> Result<FsConfig, StoreError> {
    let p = path.display().to_string();
    if !looks_like_sqlite(path)? {
        return Err(StoreError::NotSqlite { path: p });
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err(path))?;
    let uv: i64 = match conn.query_row("PRAGMA user_version", [], |r| r.get(0)) {
        Ok(v) => v,
        Err(rusqlite::Error::SqliteFailure(f, _))
            if f.code == rusqlite::ErrorCode::NotADatabase =>
        {
            return Err(StoreError::NotSqlite { path: p })
        }
        Err(e) => return Err(sqlite_err(path)(e)),
    };
    let version = config_value(&conn, "schema_version").map_err(sqlite_err(path))?;
    match uv {
        USER_VERSION_V05 => {}
        1..=4 => {
            let found = match uv {
                USER_VERSION_V00 => "0.0",
                USER_VERSION_V02 => "0.2",
                USER_VERSION_V03 => "0.3",
                _ => "0.4",
            };
            return Err(StoreError::OldSchema {
                path: p,
                found: found.into(),
            });
        }
        0 => classify_unstamped(&conn, &p, version.as_deref())?,
        other => {
            return Err(StoreError::UnknownSchema {
                path: p,
                found: format!("user_version {other}"),
            })
        }
    }
    if version.as_deref() != Some(SCHEMA_VERSION) {
        return Err(StoreError::UnknownSchema {
            path: p,
            found: format!(
                "schema_version {}",
                version.unwrap_or_else(|| "(none)".into())
            ),
        });
    }
    read_config(&conn, path)
}

/// A database that was never stamped: older writers, or another v0.5 implementation that does
/// not stamp user_version. Accept only the latter (schema_version 0.5 with the v0.5 columns).
fn classify_unstamped(conn: &Connection, p: &str, version: Option<&str>) -> Result<(), StoreError> {
    let has_inode: bool = conn
        .query_row(
            "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND name='fs_inode')",
            [],
            |r| r.get(0),
        )
        .map_err(|source| StoreError::Sqlite {
            path: p.into(),
            source,
        })?;
    if !has_inode {
        return Err(StoreError::UnknownSchema {
            path: p.into(),
            found: "no AgentFS tables".into(),
        });
    }
    match version {
        Some(SCHEMA_VERSION) => Ok(()),
        Some(v @ ("0.0" | "0.1" | "0.2" | "0.3" | "0.4")) => Err(StoreError::OldSchema {
            path: p.into(),
            found: v.into(),
        }),
        None => Err(StoreError::OldSchema {
            path: p.into(),
            found: "0.0".into(),
        }),
        Some(v) => Err(StoreError::UnknownSchema {
            path: p.into(),
            found: format!("schema_version {v}"),
        }),
    }
}

/// One fs_config value; `None` if the key or the whole table is missing.
fn config_value(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND name='fs_config')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    conn.query_row("SELECT value FROM fs_config WHERE key = ?1", [key], |r| {
        r.get::<_, String>(0)
    })
    .optional()
}

fn read_config(conn: &Connection, path: &Path) -> Result<FsConfig, StoreError> {
    let num = |key: &str| -> Result<u64, StoreError> {
        let v = config_value(conn, key)
            .map_err(sqlite_err(path))?
            .ok_or_else(|| invalid(path, format!("fs_config has no {key}")))?;
        v.trim()
            .parse::<u64>()
            .map_err(|_| invalid(path, format!("fs_config {key}={v:?} is not a number")))
    };
    let chunk_size = num("chunk_size")?;
    let inline_threshold = num("inline_threshold")?;
    if chunk_size == 0 || chunk_size > MAX_FOREIGN_CHUNK {
        return Err(invalid(
            path,
            format!("unsupported chunk_size {chunk_size}"),
        ));
    }
    if inline_threshold > chunk_size {
        return Err(invalid(
            path,
            format!("inline_threshold {inline_threshold} exceeds chunk_size {chunk_size}"),
        ));
    }
    Ok(FsConfig {
        chunk_size,
        inline_threshold,
    })
}

/// The change counter and its triggers exactly as [`DDL`] has them (its last statements).
fn change_ddl() -> &'static str {
    DDL.find("CREATE TABLE fs_change (")
        .map_or("", |at| &DDL[at..])
}

/// The names of the objects [`change_ddl`] creates.
fn change_names() -> impl Iterator<Item = &'static str> {
    change_ddl().lines().filter_map(|l| {
        let rest = l
            .strip_prefix("CREATE TABLE ")
            .or_else(|| l.strip_prefix("CREATE TRIGGER "))?;
        rest.split_whitespace().next()
    })
}

/// Create our extension objects if a (foreign or older) v0.5 database lacks them. Writable
/// opens only.
pub fn ensure_extensions(conn: &Connection) -> rusqlite::Result<()> {
    let mut st = conn.prepare("SELECT name FROM sqlite_master")?;
    let existing = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<std::collections::HashSet<String>>>()?;
    let has = |name: &str| existing.contains(name);
    let missing = EXTENSION_NAMES.iter().any(|n| !has(n));
    let change_missing = change_names().any(|n| !has(n));
    if missing || change_missing {
        let tx = conn.unchecked_transaction()?;
        if missing {
            tx.execute_batch(EXTENSIONS_IF_MISSING)?;
            if !has("fs_dir_stats") {
                tx.execute_batch(DIR_STATS_REBUILD)?;
            }
        }
        if change_missing {
            tx.execute_batch(
                &change_ddl()
                    .replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
                    .replace("CREATE TRIGGER ", "CREATE TRIGGER IF NOT EXISTS "),
            )?;
        }
        tx.commit()?;
    }
    Ok(())
}

/// The change counter: how many rows of the tables that make up the filesystem any
/// connection inserted, updated or deleted (their triggers count them in the same
/// transaction). `None` when the database has no counter table (a read-only open of a
/// database no writable open of ours has touched).
pub fn change_seq(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    let mut st = match conn.prepare_cached("SELECT seq FROM fs_change WHERE id = 0") {
        Ok(st) => st,
        Err(_) if !super::copy::has_table(conn, "main", "fs_change")? => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(
        st.query_row([], |r| r.get(0)).optional()?.unwrap_or(0),
    ))
}

/// Whether the fs_xattr extension table exists (a read-only open of a foreign database may
/// lack it; xattr reads then answer "no attributes").
pub fn has_xattr_table(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type='table' AND name='fs_xattr')",
        [],
        |r| r.get(0),
    )
}
