//! The consistency checker: every SPEC v0.5 rule plus our extension rules, as findings.
//!
//! Rule names (stable, for callers and tests): `root`, `dentry_inode`, `dentry_parent`,
//! `duplicate_name`, `nlink`, `orphan`, `dir_links`, `mode`, `inline`, `chunked`,
//! `storage_kind`, `nonfile_data`, `chunk_past_eof`, `chunk_too_long`, `data_inode`,
//! `symlink_target`, `symlink_row`, `config`, `whiteout_parent`, `xattr_inode`,
//! `sqlite_integrity` (PRAGMA integrity_check), `tool_call_outcome`, `tool_call_duration`,
//! `tool_call_json`, `kv_json`, `origin_inode`, `partial_origin_inode`, `chunk_override`,
//! `base_seen`.
//! `orphan` (an inode with nlink 0 and no names) is legal while the kernel still references
//! it; callers that know no mount is live treat it as garbage for `reap_orphans`.

use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use rusqlite::Connection;

use super::FsConfig;
use crate::errno::Errno;

/// One violated rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub rule: &'static str,
    pub detail: String,
}

/// A rule expressed as a query whose rows are violations (each row: one detail column).
struct SqlRule {
    rule: &'static str,
    sql: &'static str,
}

fn sql_rules() -> Vec<SqlRule> {
    // 61440 = S_IFMT, 16384 = S_IFDIR, 32768 = S_IFREG, 40960 = S_IFLNK.
    vec![
        SqlRule {
            rule: "root",
            sql: "SELECT 'root inode 1 is missing' WHERE NOT EXISTS (SELECT 1 FROM fs_inode WHERE ino = 1)
                  UNION ALL
                  SELECT 'root inode 1 is not a directory (mode ' || mode || ')' FROM fs_inode
                   WHERE ino = 1 AND (mode & 61440) != 16384",
        },
        SqlRule {
            rule: "dentry_inode",
            sql: "SELECT 'dentry ' || d.id || ' names missing inode ' || d.ino FROM fs_dentry d
                  WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = d.ino)",
        },
        SqlRule {
            rule: "dentry_parent",
            sql: "SELECT 'dentry ' || d.id || ' has parent ' || d.parent_ino ||
                         ' which is missing or not a directory' FROM fs_dentry d
                  WHERE NOT EXISTS (SELECT 1 FROM fs_inode p WHERE p.ino = d.parent_ino
                                    AND (p.mode & 61440) = 16384)",
        },
        SqlRule {
            rule: "duplicate_name",
            sql: "SELECT 'directory ' || parent_ino || ' has ' || count(*) || ' entries named ' ||
                         quote(CAST(name AS BLOB)) FROM fs_dentry
                  GROUP BY parent_ino, CAST(name AS BLOB) HAVING count(*) > 1",
        },
        SqlRule {
            rule: "nlink",
            sql: "SELECT 'inode ' || i.ino || ' has nlink ' || i.nlink || ' but ' ||
                         (SELECT count(*) FROM fs_dentry d WHERE d.ino = i.ino) || ' names'
                  FROM fs_inode i
                  WHERE (i.ino = 1 AND i.nlink != 1)
                     OR (i.ino != 1 AND NOT (i.nlink = 0 AND NOT EXISTS
                           (SELECT 1 FROM fs_dentry d WHERE d.ino = i.ino))
                         AND i.nlink != (SELECT count(*) FROM fs_dentry d WHERE d.ino = i.ino))",
        },
        SqlRule {
            rule: "orphan",
            sql: "SELECT 'inode ' || ino || ' has no names (nlink 0)' FROM fs_inode i
                  WHERE ino != 1 AND nlink = 0
                    AND NOT EXISTS (SELECT 1 FROM fs_dentry d WHERE d.ino = i.ino)",
        },
        SqlRule {
            rule: "dir_stats",
            sql: "SELECT 'directory ' || i.ino || ' records ' || coalesce(s.subdirs, 0) ||
                         ' subdirectories but has ' || n.real FROM fs_inode i
                  LEFT JOIN fs_dir_stats s ON s.ino = i.ino
                  JOIN (SELECT p.ino AS ino,
                          (SELECT count(*) FROM fs_dentry d JOIN fs_inode c ON c.ino = d.ino
                            WHERE d.parent_ino = p.ino AND (c.mode & 61440) = 16384) AS real
                        FROM fs_inode p WHERE (p.mode & 61440) = 16384) n ON n.ino = i.ino
                  WHERE coalesce(s.subdirs, 0) != n.real",
        },
        SqlRule {
            rule: "dir_links",
            sql: "SELECT 'directory ' || i.ino || ' has ' || count(*) || ' names' FROM fs_inode i
                  JOIN fs_dentry d ON d.ino = i.ino WHERE (i.mode & 61440) = 16384
                  GROUP BY i.ino HAVING count(*) > 1",
        },
        SqlRule {
            rule: "mode",
            sql: "SELECT 'inode ' || ino || ' has invalid file type in mode ' || mode FROM fs_inode
                  WHERE (mode & 61440) NOT IN (32768, 16384, 40960, 4096, 8192, 24576, 49152)",
        },
        SqlRule {
            rule: "inline",
            sql: "SELECT 'inline inode ' || i.ino || ': ' ||
                     CASE WHEN (i.mode & 61440) != 32768 THEN 'not a regular file'
                          WHEN i.data_inline IS NULL THEN 'data_inline is NULL'
                          WHEN length(CAST(i.data_inline AS BLOB)) != i.size THEN
                            'data_inline has ' || length(CAST(i.data_inline AS BLOB)) ||
                            ' bytes, size ' || i.size
                          ELSE 'has fs_data rows' END
                  FROM fs_inode i WHERE i.storage_kind = 1 AND (
                     (i.mode & 61440) != 32768 OR i.data_inline IS NULL
                     OR length(CAST(i.data_inline AS BLOB)) != i.size
                     OR EXISTS (SELECT 1 FROM fs_data d WHERE d.ino = i.ino))",
        },
        SqlRule {
            rule: "chunked",
            sql: "SELECT 'chunked inode ' || ino || ' has data_inline' FROM fs_inode
                  WHERE storage_kind = 0 AND data_inline IS NOT NULL",
        },
        SqlRule {
            rule: "storage_kind",
            sql: "SELECT 'inode ' || ino || ' has storage_kind ' || quote(storage_kind)
                  FROM fs_inode WHERE storage_kind NOT IN (0, 1)",
        },
        SqlRule {
            rule: "nonfile_data",
            sql: "SELECT 'non-regular inode ' || i.ino || ' has ' || count(*) || ' data rows'
                  FROM fs_inode i JOIN fs_data d ON d.ino = i.ino
                  WHERE (i.mode & 61440) != 32768 GROUP BY i.ino",
        },
        SqlRule {
            rule: "data_inode",
            sql: "SELECT 'fs_data rows for missing inode ' || d.ino FROM fs_data d
                  WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = d.ino)
                  GROUP BY d.ino",
        },
        SqlRule {
            rule: "symlink_target",
            sql: "SELECT 'symlink ' || ino || ' has no fs_symlink row' FROM fs_inode i
                  WHERE (mode & 61440) = 40960
                    AND NOT EXISTS (SELECT 1 FROM fs_symlink s WHERE s.ino = i.ino)",
        },
        SqlRule {
            rule: "symlink_row",
            sql: "SELECT 'fs_symlink row for ' || s.ino || ', which is not a symlink' FROM fs_symlink s
                  WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = s.ino
                                    AND (i.mode & 61440) = 40960)",
        },
        SqlRule {
            rule: "xattr_inode",
            sql: "SELECT 'fs_xattr rows for missing inode ' || x.ino FROM fs_xattr x
                  WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = x.ino)
                  GROUP BY x.ino",
        },
    ]
}

/// Rules over the tool-call log, the KV store and the overlay tables: (rule, table it needs,
/// query whose rows are violations). A table that is missing skips its rule.
const TABLE_RULES: &[(&str, &str, &str)] = &[
    (
        "tool_call_outcome",
        "tool_calls",
        "SELECT 'tool call ' || id || ' (' || name || ') has ' ||
                CASE WHEN result IS NULL THEN 'neither result nor error' ELSE 'both result and error' END
         FROM tool_calls WHERE (result IS NULL) = (error IS NULL)",
    ),
    (
        "tool_call_duration",
        "tool_calls",
        "SELECT 'tool call ' || id || ' (' || name || ') has duration_ms ' || quote(duration_ms) ||
                ', expected ' || ((completed_at - started_at) * 1000)
         FROM tool_calls WHERE duration_ms IS NOT (completed_at - started_at) * 1000",
    ),
    (
        "tool_call_json",
        "tool_calls",
        "SELECT 'tool call ' || id || ' (' || name || '): ' || what || ' is not valid JSON'
         FROM (SELECT id, name, 'parameters' AS what FROM tool_calls
                WHERE parameters IS NOT NULL AND NOT json_valid(parameters)
               UNION ALL
               SELECT id, name, 'result' FROM tool_calls
                WHERE result IS NOT NULL AND NOT json_valid(result))
         ORDER BY id",
    ),
    (
        "kv_json",
        "kv_store",
        "SELECT 'kv key ' || quote(key) || ' has a value that is not valid JSON'
         FROM kv_store WHERE NOT json_valid(value)",
    ),
    (
        "origin_inode",
        "fs_origin",
        "SELECT 'fs_origin row for missing inode ' || o.delta_ino FROM fs_origin o
         WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = o.delta_ino)",
    ),
    (
        "partial_origin_inode",
        "fs_partial_origin",
        "SELECT 'fs_partial_origin row for inode ' || p.delta_ino || ': ' ||
                CASE WHEN i.ino IS NULL THEN 'inode is missing'
                     WHEN (i.mode & 61440) != 32768 THEN 'not a regular file'
                     ELSE 'inline storage (partial-origin files are chunked)' END
         FROM fs_partial_origin p LEFT JOIN fs_inode i ON i.ino = p.delta_ino
         WHERE i.ino IS NULL OR (i.mode & 61440) != 32768 OR i.storage_kind != 0",
    ),
    (
        "chunk_override",
        "fs_chunk_override",
        "SELECT 'fs_chunk_override row (' || o.delta_ino || ', ' || o.chunk_index || '): ' ||
                CASE WHEN o.chunk_index < 0 THEN 'negative chunk index'
                     ELSE 'inode has no fs_partial_origin row' END
         FROM fs_chunk_override o
         WHERE o.chunk_index < 0
            OR NOT EXISTS (SELECT 1 FROM fs_partial_origin p WHERE p.delta_ino = o.delta_ino)",
    ),
    (
        "base_seen",
        "fs_base_seen",
        "SELECT 'fs_base_seen row ' || quote(path) || ': ' ||
                CASE WHEN substr(CAST(path AS TEXT), 1, 1) != '/' OR path = '/'
                       THEN 'not an absolute path below the root'
                     ELSE 'sha256 is not 64 lowercase hex digits' END
         FROM fs_base_seen
         WHERE substr(CAST(path AS TEXT), 1, 1) != '/' OR path = '/'
            OR (sha256 IS NOT NULL
                AND (length(sha256) != 64 OR sha256 GLOB '*[^0-9a-f]*'))",
    ),
];

pub fn has_table(c: &Connection, name: &str) -> Result<bool, Errno> {
    Ok(c.query_row(
        "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [name],
        |r| r.get(0),
    )?)
}

/// `PRAGMA integrity_check`: every line other than `ok` is a finding.
fn check_sqlite(c: &Connection, out: &mut Vec<Finding>) -> Result<(), Errno> {
    let mut st = c.prepare("PRAGMA integrity_check")?;
    let rows = st.query_map([], |r| r.get::<_, String>(0))?;
    for line in rows {
        let line = line?;
        if line != "ok" {
            out.push(Finding {
                rule: "sqlite_integrity",
                detail: line,
            });
        }
    }
    Ok(())
}

/// What [`quick_check`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuickCheck {
    Clean,
    /// The first problem SQLite reported.
    Damaged(String),
    /// The time budget ran out before the check finished.
    Stopped,
}

/// SQLite's `PRAGMA quick_check` (every page of every b-tree is read and its format checked,
/// without the index-against-table comparisons of integrity_check) on a read-only connection,
/// interrupted when `budget` runs out (unbounded in the unlikely case that no timer thread can
/// start).
pub fn quick_check(path: &Path, budget: Duration) -> rusqlite::Result<QuickCheck> {
    use rusqlite::ErrorCode;
    let c = super::conn::open(path, true)?;
    let handle = c.get_interrupt_handle();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::Builder::new()
        .name("quick-check".into())
        .spawn(move || {
            if wait.recv_timeout(budget) == Err(RecvTimeoutError::Timeout) {
                handle.interrupt();
            }
        })
        .ok();
    let first = c.query_row("PRAGMA quick_check(1)", [], |r| r.get::<_, String>(0));
    drop(done);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    match first {
        Ok(line) if line == "ok" => Ok(QuickCheck::Clean),
        // One line for the user: SQLite heads its report with "*** in database main ***".
        Ok(report) => Ok(QuickCheck::Damaged(
            report
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("***"))
                .collect::<Vec<_>>()
                .join("; "),
        )),
        Err(e) => match e.sqlite_error_code() {
            Some(ErrorCode::OperationInterrupted) => Ok(QuickCheck::Stopped),
            Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => {
                Ok(QuickCheck::Damaged(e.to_string()))
            }
            _ => Err(e),
        },
    }
}

/// Run every rule, starting with SQLite's own `PRAGMA integrity_check`. Reads only; runs in
/// the caller's read transaction.
pub fn check(c: &Connection, cfg: &FsConfig) -> Result<Vec<Finding>, Errno> {
    let mut out = Vec::new();
    check_sqlite(c, &mut out)?;
    for r in sql_rules() {
        if r.rule == "xattr_inode" && !super::schema::has_xattr_table(c)? {
            continue;
        }
        if r.rule == "dir_stats" && !has_table(c, "fs_dir_stats")? {
            continue;
        }
        let mut st = c.prepare(r.sql)?;
        let rows = st.query_map([], |row| row.get::<_, String>(0))?;
        for d in rows {
            out.push(Finding {
                rule: r.rule,
                detail: d?,
            });
        }
    }
    check_chunks(c, cfg, &mut out)?;
    check_config(c, &mut out)?;
    check_whiteouts(c, &mut out)?;
    for (rule, table, sql) in TABLE_RULES {
        if !has_table(c, table)? {
            continue;
        }
        let mut st = c.prepare(sql)?;
        let rows = st.query_map([], |row| row.get::<_, String>(0))?;
        for d in rows {
            out.push(Finding { rule, detail: d? });
        }
    }
    Ok(out)
}

fn check_chunks(c: &Connection, cfg: &FsConfig, out: &mut Vec<Finding>) -> Result<(), Errno> {
    let cs = i64::try_from(cfg.chunk_size).unwrap_or(i64::MAX);
    let mut st = c.prepare(
        "SELECT d.ino, d.chunk_index, length(d.data), i.size FROM fs_data d
         JOIN fs_inode i ON i.ino = d.ino
         WHERE d.chunk_index < 0 OR d.chunk_index * ?1 >= i.size OR length(d.data) > ?1",
    )?;
    let mut rows = st.query([cs])?;
    while let Some(r) = rows.next()? {
        let (ino, idx, len, size): (i64, i64, i64, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
        if len > cs {
            out.push(Finding {
                rule: "chunk_too_long",
                detail: format!("inode {ino} chunk {idx} has {len} bytes > chunk_size {cs}"),
            });
        }
        if idx < 0 || idx.saturating_mul(cs) >= size {
            out.push(Finding {
                rule: "chunk_past_eof",
                detail: format!("inode {ino} chunk {idx} lies wholly past EOF {size}"),
            });
        }
    }
    Ok(())
}

fn check_config(c: &Connection, out: &mut Vec<Finding>) -> Result<(), Errno> {
    let mut st = c.prepare("SELECT value FROM fs_config WHERE key = ?1")?;
    for key in ["schema_version", "chunk_size", "inline_threshold"] {
        let v: Option<String> =
            rusqlite::OptionalExtension::optional(st.query_row([key], |r| r.get::<_, String>(0)))?;
        let bad = match (key, v.as_deref()) {
            (_, None) => Some("missing".to_string()),
            ("schema_version", Some(v)) if v != super::schema::SCHEMA_VERSION => {
                Some(format!("is {v:?}"))
            }
            ("chunk_size" | "inline_threshold", Some(v)) if v.trim().parse::<u64>().is_err() => {
                Some(format!("{v:?} is not a number"))
            }
            _ => None,
        };
        if let Some(why) = bad {
            out.push(Finding {
                rule: "config",
                detail: format!("fs_config {key} {why}"),
            });
        }
    }
    Ok(())
}

/// The parent path SPEC derives from a whiteout path: "/" for "/" and for top-level paths,
/// otherwise the path without its last component.
pub fn whiteout_parent(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) | None => "/".to_string(),
        Some(i) => trimmed[..i].to_string(),
    }
}

fn check_whiteouts(c: &Connection, out: &mut Vec<Finding>) -> Result<(), Errno> {
    let mut st = c.prepare("SELECT path, parent_path FROM fs_whiteout")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let path = String::from_utf8_lossy(&super::inode::bytes_of(r.get_ref(0)?)).into_owned();
        let parent = String::from_utf8_lossy(&super::inode::bytes_of(r.get_ref(1)?)).into_owned();
        let want = whiteout_parent(&path);
        if parent != want {
            out.push(Finding {
                rule: "whiteout_parent",
                detail: format!("whiteout {path:?} has parent_path {parent:?}, expected {want:?}"),
            });
        }
    }
    Ok(())
}
