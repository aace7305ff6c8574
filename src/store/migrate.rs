//! `agentfs migrate`: land a database of any supported older format at v0.5.
//!
//! In place ([`migrate_in_place`]): the format is read from `PRAGMA user_version` (or, for a
//! never-stamped file, from `fs_config.schema_version` and the tables present), and the steps
//! after it run in ONE immediate transaction that ends by stamping `user_version = 5`. Every
//! step looks before it acts (a column or table that exists is left alone), so a step is
//! idempotent and a second run finds nothing to do. Contents keep their recorded chunk_size.
//!
//! By copy ([`migrate_copy`]): the source is snapshotted into a staging file (the source is
//! only ever read), the staging file is migrated in place, and a new database with the current
//! layout (64 KiB chunks, inline threshold 4096) is built from it: inode numbers, names,
//! symlinks, xattrs, KV rows, tool calls, whiteouts, origins and overlay config are copied
//! verbatim; file bytes are re-chunked (small dense files become inline; holes stay holes).
//! With `verify`, the target is checked and compared with the staging copy before it is
//! renamed into place. SPEC.md "Migration" records how each old format is read.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::check::whiteout_parent;
use super::copy::{columns, has_table, open_conn, snapshot, sync_file, Ctx, Rechunker, Staged};
use super::progress::Progress;
use super::schema::{self, USER_VERSION_V05};
use super::{FsConfig, InitOptions, Ino, Store};

/// The formats `migrate` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    /// v0.0 and v0.1 (user_version 1): no nlink; v0.0 has variable extents in fs_data.
    V00,
    /// v0.2 (user_version 2): nlink and fs_whiteout added.
    V02,
    /// v0.3 (user_version 3): fs_origin added.
    V03,
    /// v0.4 (user_version 4): rdev and nanosecond columns added.
    V04,
    /// v0.5 (user_version 5): current.
    V05,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::V00 => "0.0",
            Format::V02 => "0.2",
            Format::V03 => "0.3",
            Format::V04 => "0.4",
            Format::V05 => "0.5",
        }
    }
}

/// What a migration found and did (or, in a dry run, would do).
#[derive(Clone, Debug, Default)]
pub struct MigrateReport {
    /// The format found.
    pub from: Option<Format>,
    /// One line per change, in order; empty when the database was already current.
    pub steps: Vec<String>,
}

/// The chunk size given to a v0.0 database, which records none: v0.1's fixed-chunk default.
pub const V00_CHUNK_SIZE: u64 = 4096;
/// The inline threshold a migrated database gets (never above its chunk size).
pub const DEFAULT_INLINE_THRESHOLD: u64 = 4096;

/// Classify a database by `user_version`, falling back to fs_config and the tables present.
pub fn detect(c: &Connection) -> Result<Format, String> {
    let uv: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .ctx("PRAGMA user_version")?;
    match uv {
        1 => return Ok(Format::V00),
        2 => return Ok(Format::V02),
        3 => return Ok(Format::V03),
        4 => return Ok(Format::V04),
        USER_VERSION_V05 => return Ok(Format::V05),
        0 => {}
        other => return Err(format!("unknown user_version {other}")),
    }
    if !has_table(c, "main", "fs_inode").ctx("schema")? {
        return Err("not an AgentFS database (no fs_inode table)".into());
    }
    let version: Option<String> = if has_table(c, "main", "fs_config").ctx("schema")? {
        rusqlite::OptionalExtension::optional(c.query_row(
            "SELECT value FROM fs_config WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        ))
        .ctx("fs_config")?
    } else {
        None
    };
    match version.as_deref() {
        None | Some("0.0" | "0.1") => Ok(Format::V00),
        Some("0.2") => Ok(Format::V02),
        Some("0.3") => Ok(Format::V03),
        Some("0.4") => Ok(Format::V04),
        Some("0.5") => Ok(Format::V05),
        Some(v) => Err(format!("unknown schema_version {v}")),
    }
}

fn has_col(c: &Connection, table: &str, col: &str) -> rusqlite::Result<bool> {
    Ok(columns(c, "main", table)?.iter().any(|n| n == col))
}

fn config(c: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    rusqlite::OptionalExtension::optional(c.query_row(
        "SELECT value FROM fs_config WHERE key = ?1",
        [key],
        |r| r.get(0),
    ))
}

/// Create a table (and what goes with it) when it is missing; says so in `steps`.
/// Create `table` as the current schema defines it (schema.rs), if it is missing.
fn ensure_table(c: &Connection, table: &str, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    if !has_table(c, "main", table)? {
        let ddl = super::schema::table_ddl(table)
            .ok_or_else(|| rusqlite::Error::InvalidParameterName(table.to_string()))?;
        c.execute_batch(ddl)?;
        steps.push(format!("create table {table}"));
    }
    Ok(())
}

fn ensure_column(
    c: &Connection,
    table: &str,
    col: &str,
    decl: &str,
    steps: &mut Vec<String>,
) -> rusqlite::Result<bool> {
    if has_col(c, table, col)? {
        return Ok(false);
    }
    c.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {col} {decl}"))?;
    steps.push(format!("add column {table}.{col}"));
    Ok(true)
}

fn ensure_index(
    c: &Connection,
    name: &str,
    ddl: &str,
    steps: &mut Vec<String>,
) -> rusqlite::Result<()> {
    let exists: bool = c.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?1)",
        [name],
        |r| r.get(0),
    )?;
    if !exists {
        c.execute_batch(ddl)?;
        steps.push(format!("create index {name}"));
    }
    Ok(())
}

fn ensure_config(
    c: &Connection,
    key: &str,
    value: &str,
    steps: &mut Vec<String>,
) -> rusqlite::Result<()> {
    if config(c, key)?.is_none() {
        c.execute(
            "INSERT INTO fs_config (key, value) VALUES (?1, ?2)",
            [key, value],
        )?;
        steps.push(format!("fs_config {key} = {value}"));
    }
    Ok(())
}

const FS_DATA_DDL: &str = "CREATE TABLE fs_data (
  ino INTEGER NOT NULL,
  chunk_index INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (ino, chunk_index)
);";

/// v0.0 → v0.1: fs_config, and fixed-size chunks in place of v0.0's variable extents
/// `fs_data(ino, offset, size, data)`. The one step that rewrites rows: v0.0 extents have no
/// chunk index to add, so fs_data is rebuilt with v0.1's default chunk size (4096).
fn step_v01(c: &Connection, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    ensure_table(c, "fs_config", steps)?;
    ensure_config(c, "chunk_size", &V00_CHUNK_SIZE.to_string(), steps)?;
    if has_table(c, "main", "fs_data")?
        && !has_col(c, "fs_data", "chunk_index")?
        && has_col(c, "fs_data", "offset")?
    {
        let cs = config(c, "chunk_size")?
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(V00_CHUNK_SIZE);
        c.execute_batch(&FS_DATA_DDL.replace("fs_data", "fs_data_v01"))?;
        let mut rows = 0u64;
        {
            let mut st = c.prepare(
                "SELECT d.ino, d.offset, d.data, coalesce(i.size, 0) FROM fs_data d
                 LEFT JOIN fs_inode i ON i.ino = d.ino ORDER BY d.ino, d.offset",
            )?;
            let mut q = st.query([])?;
            let mut insert = c.prepare(
                "INSERT INTO fs_data_v01 (ino, chunk_index, data) VALUES (?1, ?2, ?3)
                 ON CONFLICT(ino, chunk_index) DO UPDATE SET data = excluded.data",
            )?;
            // (ino, chunk index, bytes) of the row being assembled.
            let mut cur: Option<(i64, u64, Vec<u8>)> = None;
            while let Some(r) = q.next()? {
                let ino: i64 = r.get(0)?;
                let off = u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0);
                let data = super::inode::bytes_of(r.get_ref(2)?);
                let size = u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
                let end = off.saturating_add(data.len() as u64).min(size);
                let mut pos = off;
                while pos < end {
                    let idx = pos / cs;
                    let stop = ((idx + 1) * cs).min(end);
                    if cur.as_ref().map(|(i, x, _)| (*i, *x)) != Some((ino, idx)) {
                        if let Some((i, x, b)) = cur.take() {
                            insert.execute(rusqlite::params![i, x as i64, b])?;
                            rows += 1;
                        }
                        cur = Some((ino, idx, Vec::new()));
                    }
                    if let Some((_, _, buf)) = cur.as_mut() {
                        let rel = (pos - idx * cs) as usize;
                        let piece = &data[(pos - off) as usize..(stop - off) as usize];
                        if buf.len() < rel + piece.len() {
                            buf.resize(rel + piece.len(), 0);
                        }
                        buf[rel..rel + piece.len()].copy_from_slice(piece);
                    }
                    pos = stop;
                }
            }
            if let Some((i, x, b)) = cur.take() {
                insert.execute(rusqlite::params![i, x as i64, b])?;
                rows += 1;
            }
        }
        c.execute_batch("DROP TABLE fs_data; ALTER TABLE fs_data_v01 RENAME TO fs_data;")?;
        steps.push(format!(
            "rebuild fs_data: variable extents -> {rows} fixed chunks of {cs} bytes"
        ));
    }
    Ok(())
}

/// v0.1 → v0.2: the stored link count and the whiteout table.
fn step_v02(c: &Connection, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    if ensure_column(c, "fs_inode", "nlink", "INTEGER NOT NULL DEFAULT 0", steps)? {
        c.execute_batch(
            "UPDATE fs_inode SET nlink = CASE WHEN ino = 1 THEN 1 ELSE
               (SELECT count(*) FROM fs_dentry d WHERE d.ino = fs_inode.ino) END",
        )?;
        steps.push("fs_inode.nlink counted from fs_dentry".into());
    }
    ensure_table(c, "fs_whiteout", steps)?;
    Ok(())
}

/// Every older writer that kept nlink did not count it our way: the published AgentFS up to
/// 0.6.x stores a directory's the POSIX way (2 plus its subdirectories; a fresh root 2, or 3
/// with one subdirectory). The stored count is derived data, so it is recomputed from
/// fs_dentry for every inode (the root 1), as SPEC.md "Namespace semantics" counts it. A
/// source without nlink gets it in its own step (v0.2), after this one.
fn normalise_nlink(c: &Connection, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    if !has_col(c, "fs_inode", "nlink")? {
        return Ok(());
    }
    let fixed = c.execute(
        "UPDATE fs_inode SET nlink = derived.n FROM
           (SELECT i.ino AS ino, CASE WHEN i.ino = 1 THEN 1 ELSE
              (SELECT count(*) FROM fs_dentry d WHERE d.ino = i.ino) END AS n
            FROM fs_inode i) AS derived
         WHERE fs_inode.ino = derived.ino AND fs_inode.nlink != derived.n",
        [],
    )?;
    if fixed > 0 {
        steps.push(format!(
            "fs_inode.nlink recounted from fs_dentry for {fixed} inodes"
        ));
    }
    Ok(())
}

/// v0.2 → v0.3: copy-up origins.
fn step_v03(c: &Connection, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    ensure_table(c, "fs_origin", steps)
}

/// v0.3 → v0.4: device numbers and nanoseconds.
fn step_v04(c: &Connection, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    for col in ["rdev", "atime_nsec", "mtime_nsec", "ctime_nsec"] {
        ensure_column(c, "fs_inode", col, "INTEGER NOT NULL DEFAULT 0", steps)?;
    }
    Ok(())
}

/// v0.4 → v0.5: inline storage columns, whiteout parent_path, partial-origin tables, the
/// inline_threshold, the indexes of the v0.5 DDL and our extension objects.
fn step_v05(c: &Connection, steps: &mut Vec<String>) -> rusqlite::Result<()> {
    ensure_column(c, "fs_inode", "data_inline", "BLOB", steps)?;
    ensure_column(
        c,
        "fs_inode",
        "storage_kind",
        "INTEGER NOT NULL DEFAULT 0",
        steps,
    )?;
    if has_table(c, "main", "fs_whiteout")? && !has_col(c, "fs_whiteout", "parent_path")? {
        let ddl = super::schema::table_ddl("fs_whiteout")
            .ok_or_else(|| rusqlite::Error::InvalidParameterName("fs_whiteout".into()))?;
        c.execute_batch(&ddl.replace("fs_whiteout", "fs_whiteout_v05"))?;
        let rows: Vec<(rusqlite::types::Value, i64)> = {
            let mut st = c.prepare("SELECT path, coalesce(created_at, 0) FROM fs_whiteout")?;
            let it = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            it.collect::<rusqlite::Result<_>>()?
        };
        let mut ins = c.prepare(
            "INSERT INTO fs_whiteout_v05 (path, parent_path, created_at) VALUES (?1, ?2, ?3)",
        )?;
        for (path, at) in &rows {
            let text = match path {
                rusqlite::types::Value::Text(t) => t.clone(),
                rusqlite::types::Value::Blob(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            };
            ins.execute(rusqlite::params![path, whiteout_parent(&text), at])?;
        }
        drop(ins);
        c.execute_batch(
            "DROP TABLE fs_whiteout; ALTER TABLE fs_whiteout_v05 RENAME TO fs_whiteout;",
        )?;
        steps.push(format!(
            "rebuild fs_whiteout with parent_path ({} legacy rows)",
            rows.len()
        ));
    }
    ensure_table(c, "fs_whiteout", steps)?;
    ensure_index(
        c,
        "idx_fs_whiteout_parent",
        "CREATE INDEX idx_fs_whiteout_parent ON fs_whiteout(parent_path);",
        steps,
    )?;
    ensure_table(c, "fs_overlay_config", steps)?;
    ensure_table(c, "fs_partial_origin", steps)?;
    ensure_table(c, "fs_chunk_override", steps)?;
    ensure_table(c, "tool_calls", steps)?;
    ensure_table(c, "kv_store", steps)?;
    for (name, ddl) in [
        (
            "idx_tool_calls_name",
            "CREATE INDEX idx_tool_calls_name ON tool_calls(name);",
        ),
        (
            "idx_tool_calls_started_at",
            "CREATE INDEX idx_tool_calls_started_at ON tool_calls(started_at);",
        ),
        (
            "idx_fs_dentry_parent",
            "CREATE INDEX idx_fs_dentry_parent ON fs_dentry(parent_ino, name);",
        ),
        (
            "idx_kv_store_created_at",
            "CREATE INDEX idx_kv_store_created_at ON kv_store(created_at);",
        ),
        (
            "idx_fs_dentry_parent_id",
            "CREATE INDEX idx_fs_dentry_parent_id ON fs_dentry(parent_ino, id);",
        ),
        (
            "idx_fs_dentry_ino",
            "CREATE INDEX idx_fs_dentry_ino ON fs_dentry(ino);",
        ),
        (
            "idx_fs_inode_orphan",
            "CREATE INDEX idx_fs_inode_orphan ON fs_inode(ino) WHERE nlink = 0;",
        ),
    ] {
        ensure_index(c, name, ddl, steps)?;
    }
    ensure_table(c, "fs_xattr", steps)?;
    // The inline threshold is defaulted, never above the recorded chunk size (which is kept).
    let cs = config(c, "chunk_size")?
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(V00_CHUNK_SIZE);
    ensure_config(
        c,
        "inline_threshold",
        &DEFAULT_INLINE_THRESHOLD.min(cs).to_string(),
        steps,
    )?;
    if config(c, "schema_version")?.as_deref() != Some(schema::SCHEMA_VERSION) {
        c.execute(
            "INSERT INTO fs_config (key, value) VALUES ('schema_version', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [schema::SCHEMA_VERSION],
        )?;
        steps.push(format!(
            "fs_config schema_version = {}",
            schema::SCHEMA_VERSION
        ));
    }
    Ok(())
}

/// One migration step: applies its changes and appends a line per change made.
type Step = fn(&Connection, &mut Vec<String>) -> rusqlite::Result<()>;

/// Run every step after `from` on `c` in one immediate transaction that stamps user_version.
fn run_steps(c: &mut Connection, from: Format) -> Result<Vec<String>, String> {
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx("begin")?;
    let mut steps = Vec::new();
    if from < Format::V05 {
        normalise_nlink(&tx, &mut steps).ctx("normalise nlink")?;
    }
    let all: [(Format, Step, &str); 5] = [
        (Format::V00, step_v01, "0.1"),
        (Format::V02, step_v02, "0.2"),
        (Format::V03, step_v03, "0.3"),
        (Format::V04, step_v04, "0.4"),
        (Format::V05, step_v05, "0.5"),
    ];
    for (target, step, name) in all {
        // V00 names the step that turns v0.0 into v0.1: it runs for a v0.0/v0.1 source only.
        let needed = if target == Format::V00 {
            from == Format::V00
        } else {
            from < target
        };
        if needed || target == Format::V05 {
            step(&tx, &mut steps).ctx(format!("step to v{name}"))?;
        }
    }
    let uv: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .ctx("PRAGMA user_version")?;
    if uv != USER_VERSION_V05 {
        tx.pragma_update(None, "user_version", USER_VERSION_V05)
            .ctx("stamp user_version")?;
        steps.push(format!("user_version {uv} -> {USER_VERSION_V05}"));
    }
    tx.commit().ctx("commit")?;
    Ok(steps)
}

/// Migrate `path` in place (or, with `dry_run`, a private in-memory copy of it, leaving the
/// file untouched). Refuses a mounted database.
pub fn migrate_in_place(path: &Path, dry_run: bool) -> Result<MigrateReport, String> {
    let p = path.display().to_string();
    if !path.exists() {
        return Err(format!("{p}: no such file"));
    }
    if dry_run {
        let src = open_conn(path, true)?;
        let mut mem = Connection::open_in_memory().ctx("memory")?;
        {
            let b = rusqlite::backup::Backup::new(&src, &mut mem).ctx(&p)?;
            b.run_to_completion(4096, std::time::Duration::from_millis(10), None)
                .ctx(&p)?;
        }
        let from = detect(&mem).map_err(|e| format!("{p}: {e}"))?;
        let steps = run_steps(&mut mem, from).map_err(|e| format!("{p}: {e}"))?;
        return Ok(MigrateReport {
            from: Some(from),
            steps,
        });
    }
    let _lock = crate::sys::lock::lock_db(path).map_err(|e| e.to_string())?;
    let mut c = open_conn(path, false)?;
    let from = detect(&c).map_err(|e| format!("{p}: {e}"))?;
    let steps = run_steps(&mut c, from).map_err(|e| format!("{p}: {e}"))?;
    if !steps.is_empty() {
        let _: String = c
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .ctx(&p)?;
    }
    Ok(MigrateReport {
        from: Some(from),
        steps,
    })
}

/// Options of a copy migration.
#[derive(Clone, Copy, Debug)]
pub struct CopyOptions {
    pub overwrite: bool,
    pub verify: bool,
    pub chunk_size: u64,
    pub inline_threshold: u64,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            overwrite: false,
            verify: false,
            chunk_size: 65536,
            inline_threshold: 4096,
        }
    }
}

/// What a copy migration did.
#[derive(Clone, Debug, Default)]
pub struct CopyReport {
    pub from: Option<Format>,
    pub inodes: u64,
    pub files: u64,
    pub inline_files: u64,
    pub bytes: u64,
    pub verified: bool,
}

/// Rebuild `src` (any supported format) as a new v0.5 database at `target` with the current
/// layout; `src` is only read. See the module docs.
pub fn migrate_copy(
    src: &Path,
    target: &Path,
    opts: CopyOptions,
    progress: &dyn Progress,
) -> Result<CopyReport, String> {
    let sp = src.display().to_string();
    let tp = target.display().to_string();
    if !src.exists() {
        return Err(format!("{sp}: no such file"));
    }
    if target.exists() {
        if !opts.overwrite {
            return Err(format!("{tp} already exists (use --overwrite-target)"));
        }
        if let (Ok(a), Ok(b)) = (std::fs::canonicalize(src), std::fs::canonicalize(target)) {
            if a == b {
                return Err(format!("{tp} is the source itself"));
            }
        }
        if let crate::sys::lock::Offline::Served =
            crate::sys::lock::offline(target).map_err(|e| e.to_string())?
        {
            let by = crate::sys::lock::holder_pid(target)
                .map_or_else(String::new, |pid| format!(" server pid {pid}"));
            return Err(format!("{tp} is mounted by agentfs{by}"));
        }
    }
    // 1. A private snapshot of the source, migrated in place.
    let staging = Staged::next_to(target, "source");
    snapshot(src, &staging.path, progress)?;
    let from = {
        let mut c = open_conn(&staging.path, false)?;
        let from = detect(&c).map_err(|e| format!("{sp}: {e}"))?;
        run_steps(&mut c, from).map_err(|e| format!("{sp}: {e}"))?;
        from
    };
    let src_cfg = schema::inspect(&staging.path).map_err(|e| format!("{sp}: {e}"))?;
    // 2. The new database.
    let built = Staged::next_to(target, "target");
    let init = InitOptions {
        chunk_size: opts.chunk_size,
        inline_threshold: opts.inline_threshold,
        ..InitOptions::default()
    };
    Store::create(&built.path, &init).map_err(|e| e.to_string())?;
    let dst_cfg = FsConfig {
        chunk_size: opts.chunk_size,
        inline_threshold: opts.inline_threshold,
    };
    let mut report = rebuild(&staging.path, &built.path, src_cfg, dst_cfg, progress)
        .map_err(|e| format!("{tp}: {e}"))?;
    report.from = Some(from);
    // 3. Verify against the staging copy.
    if opts.verify {
        verify_copy(&staging.path, &built.path, progress)
            .map_err(|e| format!("{tp}: verification failed: {e}"))?;
        report.verified = true;
    }
    // 4. Into place: the main file alone is complete. A read-write connection closing last
    // checkpoints the WAL into the main file and removes the sidecars.
    {
        let c = open_conn(&built.path, false)?;
        let (busy, _, _): (i64, i64, i64) = c
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .ctx(&tp)?;
        if busy != 0 {
            return Err(format!("{tp}: could not checkpoint the new database"));
        }
    }
    super::copy::remove_db_files_sidecars(&built.path);
    sync_file(&built.path)?;
    if target.exists() {
        super::copy::remove_db_files(target);
    }
    std::fs::rename(&built.path, target).ctx(&tp)?;
    built.keep();
    sync_file(target)?;
    Ok(report)
}

/// Copy every table of `src` into the freshly created `dst` and re-chunk the file bytes.
fn rebuild(
    src: &Path,
    dst: &Path,
    src_cfg: FsConfig,
    dst_cfg: FsConfig,
    progress: &dyn Progress,
) -> Result<CopyReport, String> {
    let mut c = open_conn(dst, false)?;
    c.execute("ATTACH DATABASE ?1 AS src", [src.display().to_string()])
        .ctx("attach source")?;
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx("begin")?;
    let partial: i64 = tx
        .query_row("SELECT count(*) FROM src.fs_chunk_override", [], |r| {
            r.get(0)
        })
        .ctx("fs_chunk_override")?;
    if partial > 0 && src_cfg.chunk_size != dst_cfg.chunk_size {
        return Err(format!(
            "partial-origin files cannot be re-chunked from {} to {} bytes; run `agentfs materialize` first",
            src_cfg.chunk_size, dst_cfg.chunk_size
        ));
    }
    let copies = [
        "DELETE FROM main.fs_inode",
        "INSERT INTO main.fs_inode (ino, mode, nlink, uid, gid, size, atime, mtime, ctime, rdev,
                                    atime_nsec, mtime_nsec, ctime_nsec, data_inline, storage_kind)
         SELECT ino, mode, nlink, uid, gid, size, atime, mtime, ctime, rdev,
                atime_nsec, mtime_nsec, ctime_nsec, NULL, 0 FROM src.fs_inode",
        "INSERT INTO main.fs_dentry (id, name, parent_ino, ino)
         SELECT id, name, parent_ino, ino FROM src.fs_dentry",
        "INSERT INTO main.fs_symlink (ino, target) SELECT ino, target FROM src.fs_symlink",
        "INSERT INTO main.fs_whiteout (path, parent_path, created_at)
         SELECT path, parent_path, created_at FROM src.fs_whiteout",
        "INSERT INTO main.fs_overlay_config (key, value) SELECT key, value FROM src.fs_overlay_config",
        "INSERT INTO main.fs_origin (delta_ino, base_ino) SELECT delta_ino, base_ino FROM src.fs_origin",
        "INSERT INTO main.fs_partial_origin SELECT * FROM src.fs_partial_origin",
        "INSERT INTO main.fs_chunk_override (delta_ino, chunk_index)
         SELECT delta_ino, chunk_index FROM src.fs_chunk_override",
        "INSERT INTO main.fs_xattr (ino, name, value) SELECT ino, name, value FROM src.fs_xattr",
        "INSERT INTO main.kv_store (key, value, created_at, updated_at)
         SELECT key, value, created_at, updated_at FROM src.kv_store",
        "INSERT INTO main.tool_calls (id, name, parameters, result, error, started_at, completed_at, duration_ms)
         SELECT id, name, parameters, result, error, started_at, completed_at, duration_ms FROM src.tool_calls",
    ];
    for sql in copies {
        tx.execute_batch(sql).ctx("copy")?;
    }
    // Base records exist only in deltas made with them (see fs_base_seen); the copy keeps
    // that: a table only when the source has one.
    if has_table(&tx, "src", "fs_base_seen").ctx("schema")? {
        tx.execute_batch(super::overlay::BASE_SEEN_DDL)
            .and_then(|()| {
                tx.execute_batch("INSERT INTO main.fs_base_seen SELECT * FROM src.fs_base_seen")
            })
            .ctx("fs_base_seen")?;
    }
    // AUTOINCREMENT counters: numbers the source ever handed out are never reused.
    if has_table(&tx, "src", "sqlite_sequence").ctx("schema")? {
        tx.execute_batch(
            "INSERT INTO main.sqlite_sequence (name, seq)
               SELECT s.name, s.seq FROM src.sqlite_sequence s
               WHERE s.name IN ('fs_inode', 'fs_dentry', 'tool_calls')
                 AND NOT EXISTS (SELECT 1 FROM main.sqlite_sequence m WHERE m.name = s.name);
             UPDATE main.sqlite_sequence SET seq =
               max(seq, coalesce((SELECT s.seq FROM src.sqlite_sequence s
                                   WHERE s.name = main.sqlite_sequence.name), 0))
             WHERE name IN ('fs_inode', 'fs_dentry', 'tool_calls');",
        )
        .ctx("sqlite_sequence")?;
    }
    let inodes: i64 = tx
        .query_row("SELECT count(*) FROM main.fs_inode", [], |r| r.get(0))
        .ctx("count")?;
    let mut report = CopyReport {
        inodes: u64::try_from(inodes).unwrap_or(0),
        ..CopyReport::default()
    };
    let files: Vec<(i64, u64, i64, bool)> = {
        let mut st = tx
            .prepare(
                "SELECT i.ino, i.size, i.storage_kind,
                        EXISTS(SELECT 1 FROM src.fs_partial_origin p WHERE p.delta_ino = i.ino)
                 FROM src.fs_inode i WHERE (i.mode & 61440) = 32768 ORDER BY i.ino",
            )
            .ctx("files")?;
        let it = st
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    r.get(2)?,
                    r.get(3)?,
                ))
            })
            .ctx("files")?;
        it.collect::<rusqlite::Result<_>>().ctx("files")?
    };
    progress.start("re-chunking", files.iter().map(|f| f.1).sum());
    for (ino, size, kind, partial) in files {
        report.files += 1;
        report.bytes += size;
        if partial {
            // Same chunk size (checked above): the delta rows keep their meaning verbatim.
            tx.execute(
                "INSERT INTO main.fs_data (ino, chunk_index, data)
                 SELECT ino, chunk_index, data FROM src.fs_data WHERE ino = ?1",
                [ino],
            )
            .ctx("copy partial-origin rows")?;
        } else if kind == 1 {
            let bytes: Vec<u8> = tx
                .query_row(
                    "SELECT data_inline FROM src.fs_inode WHERE ino = ?1",
                    [ino],
                    |r| Ok(super::inode::bytes_of(r.get_ref(0)?)),
                )
                .ctx("inline")?;
            let mut bytes = bytes;
            bytes.resize(usize::try_from(size).map_err(|e| e.to_string())?, 0);
            if size <= dst_cfg.inline_threshold {
                set_inline(&tx, ino, &bytes)?;
                report.inline_files += 1;
            } else {
                let mut rc = Rechunker::new(&tx, ino, dst_cfg.chunk_size, size).ctx("chunk")?;
                rc.push(0, &bytes).ctx("chunk")?;
                rc.finish().ctx("chunk")?;
            }
        } else {
            let cs = src_cfg.chunk_size;
            let mut st = tx
                .prepare_cached(
                    "SELECT chunk_index, data FROM src.fs_data WHERE ino = ?1 AND chunk_index >= 0
                     ORDER BY chunk_index",
                )
                .ctx("chunks")?;
            if size <= dst_cfg.inline_threshold {
                // Small: inline when every byte is stored (dense), else keep the holes chunked.
                let stored: Vec<(u64, Vec<u8>)> = {
                    let it = st
                        .query_map([ino], |r| {
                            Ok((
                                u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                                super::inode::bytes_of(r.get_ref(1)?),
                            ))
                        })
                        .ctx("chunks")?;
                    it.collect::<rusqlite::Result<_>>().ctx("chunks")?
                };
                let mut buf = vec![0u8; size as usize];
                let mut covered = 0u64;
                for (idx, data) in &stored {
                    let start = idx.saturating_mul(cs);
                    let end = start
                        .saturating_add(data.len().min(cs as usize) as u64)
                        .min(size);
                    if start < end {
                        buf[start as usize..end as usize]
                            .copy_from_slice(&data[..(end - start) as usize]);
                        covered += end - start;
                    }
                }
                if covered == size {
                    set_inline(&tx, ino, &buf)?;
                    report.inline_files += 1;
                } else {
                    // Sparse: store only what was stored.
                    let mut rc = Rechunker::new(&tx, ino, dst_cfg.chunk_size, size).ctx("chunk")?;
                    for (idx, data) in &stored {
                        let n = data.len().min(cs as usize);
                        rc.push(idx.saturating_mul(cs), &data[..n]).ctx("chunk")?;
                    }
                    rc.finish().ctx("chunk")?;
                }
            } else {
                let mut rows = st.query([ino]).ctx("chunks")?;
                let mut rc = Rechunker::new(&tx, ino, dst_cfg.chunk_size, size).ctx("chunk")?;
                while let Some(r) = rows.next().ctx("chunks")? {
                    let idx = u64::try_from(r.get::<_, i64>(0).ctx("chunks")?).unwrap_or(0);
                    let data = super::inode::bytes_of(r.get_ref(1).ctx("chunks")?);
                    let n = data.len().min(cs as usize);
                    rc.push(idx.saturating_mul(cs), &data[..n]).ctx("chunk")?;
                }
                rc.finish().ctx("chunk")?;
            }
        }
        progress.advance(size);
    }
    tx.commit().ctx("commit")?;
    c.execute_batch("DETACH DATABASE src").ctx("detach")?;
    let _: (i64, i64, i64) = c
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .ctx("checkpoint")?;
    Ok(report)
}

fn set_inline(c: &Connection, ino: i64, bytes: &[u8]) -> Result<(), String> {
    c.execute(
        "UPDATE main.fs_inode SET data_inline = ?2, storage_kind = 1 WHERE ino = ?1",
        rusqlite::params![ino, bytes],
    )
    .ctx("inline")?;
    Ok(())
}

/// Tables compared row for row by [`verify_copy`] (columns listed so the order is fixed).
const COMPARED: &[(&str, &str)] = &[
    (
        "fs_inode",
        "ino, mode, nlink, uid, gid, size, atime, mtime, ctime, rdev, atime_nsec, mtime_nsec, ctime_nsec",
    ),
    ("fs_dentry", "id, name, parent_ino, ino"),
    ("fs_symlink", "ino, target"),
    ("fs_whiteout", "path, parent_path, created_at"),
    ("fs_overlay_config", "key, value"),
    ("fs_origin", "delta_ino, base_ino"),
    ("fs_partial_origin", "*"),
    ("fs_chunk_override", "delta_ino, chunk_index"),
    ("fs_xattr", "ino, name, value"),
    ("fs_base_seen", "*"),
    ("kv_store", "key, value, created_at, updated_at"),
    (
        "tool_calls",
        "id, name, parameters, result, error, started_at, completed_at, duration_ms",
    ),
];

/// Check `dst` (integrity and every consistency rule; only `orphan` findings, which mirror the
/// source, are tolerated) and compare its metadata and every file's bytes with `src`.
pub fn verify_copy(src: &Path, dst: &Path, progress: &dyn Progress) -> Result<(), String> {
    let store = Store::open(dst, true).map_err(|e| e.to_string())?;
    let findings = store.check().map_err(|e| format!("check: {e}"))?;
    if let Some(f) = findings.iter().find(|f| f.rule != "orphan") {
        return Err(format!(
            "{} finding(s), first: {}: {}",
            findings.len(),
            f.rule,
            f.detail
        ));
    }
    drop(store);
    let c = open_conn(dst, true)?;
    c.execute("ATTACH DATABASE ?1 AS src", [src.display().to_string()])
        .ctx("attach")?;
    for (table, cols) in COMPARED {
        // An optional table (fs_base_seen) is compared when either side has it.
        if !has_table(&c, "src", table).ctx(table)? && !has_table(&c, "main", table).ctx(table)? {
            continue;
        }
        for (a, b) in [("src", "main"), ("main", "src")] {
            let n: i64 = c
                .query_row(
                    &format!(
                        "SELECT count(*) FROM (SELECT {cols} FROM {a}.{table} EXCEPT SELECT {cols} FROM {b}.{table})"
                    ),
                    [],
                    |r| r.get(0),
                )
                .ctx(table)?;
            if n != 0 {
                let side = if a == "src" {
                    "missing from the target"
                } else {
                    "not in the source"
                };
                return Err(format!("{table}: {n} row(s) {side}"));
            }
        }
    }
    drop(c);
    let sc = open_conn(src, true)?;
    let dc = open_conn(dst, true)?;
    let scfg = schema::inspect(src).map_err(|e| e.to_string())?;
    let dcfg = schema::inspect(dst).map_err(|e| e.to_string())?;
    let files: Vec<(i64, u64)> = {
        let mut st = sc
            .prepare("SELECT ino, size FROM fs_inode WHERE (mode & 61440) = 32768 ORDER BY ino")
            .ctx("files")?;
        let it = st
            .query_map([], |r| {
                Ok((r.get(0)?, u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)))
            })
            .ctx("files")?;
        it.collect::<rusqlite::Result<_>>().ctx("files")?
    };
    progress.start("verifying contents", files.iter().map(|f| f.1).sum());
    const PIECE: u64 = 1 << 20;
    for (ino, size) in files {
        let i = Ino(u64::try_from(ino).unwrap_or(0));
        let mut off = 0;
        while off < size {
            let a = super::data::read(&sc, &scfg, i, off, PIECE)
                .map_err(|e| format!("read inode {ino}: {e}"))?;
            let b = super::data::read(&dc, &dcfg, i, off, PIECE)
                .map_err(|e| format!("read inode {ino}: {e}"))?;
            if a != b {
                return Err(format!(
                    "inode {ino}: contents differ in bytes {off}..{}",
                    off + PIECE
                ));
            }
            if a.is_empty() {
                break;
            }
            off += a.len() as u64;
            progress.advance(a.len() as u64);
        }
    }
    Ok(())
}
