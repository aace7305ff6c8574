//! `agentfs fsck --repair`: fix what can be fixed without guessing and without touching the
//! bytes of any live file. Each repair is a query that only removes rows nothing can reach, or
//! recomputes a value that is fully determined by other rows:
//!
//! * names that point at a missing inode are dropped (`dentry_inode`);
//! * `nlink` is recounted from the names (`nlink`; the root stays 1);
//! * inodes with no name are reclaimed with all their rows (`orphan`) — only safe when no
//!   server holds the database, which the caller guarantees by holding the mount lock;
//! * data, symlink, xattr, origin, partial-origin and chunk-override rows of missing (or
//!   wrong-kind) inodes are dropped, as are chunk rows wholly past EOF (which never read back);
//! * a whiteout's `parent_path` is recomputed from its `path`.
//!
//! Everything else (a bad root, bad modes, broken inline rows, duplicate names, config, the
//! tool-call log, which is insert-only) is reported for a human. The repairs run in one
//! transaction; a second run finds nothing to do.

use super::check::{whiteout_parent, Finding};
use super::inode::delete_rows;
use super::{Ino, Store};
use crate::errno::Errno;

/// The repair `fsck` applies for a finding's rule, or `None` when it needs a human.
pub fn repair_for(rule: &str) -> Option<&'static str> {
    Some(match rule {
        "dentry_inode" => "drop the name",
        "nlink" => "recount nlink from names",
        "orphan" => "reclaim the unnamed inode",
        "data_inode" => "drop the rows",
        "nonfile_data" => "drop the rows",
        "chunk_past_eof" => "drop the rows past EOF",
        "symlink_row" => "drop the row",
        "xattr_inode" => "drop the rows",
        "origin_inode" => "drop the row",
        "chunk_override" => "drop the row",
        "whiteout_parent" => "recompute parent_path",
        "dir_stats" => "recount subdirectories",
        _ => return None,
    })
}

/// Row-dropping repairs: (what, SQL). Table-guarded: missing tables are skipped.
const DROPS: &[(&str, &str, &str)] = &[
    (
        "names of missing inodes",
        "fs_dentry",
        "DELETE FROM fs_dentry WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_dentry.ino)",
    ),
    (
        "data rows of missing inodes",
        "fs_data",
        "DELETE FROM fs_data WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_data.ino)",
    ),
    (
        "data rows of non-regular inodes",
        "fs_data",
        "DELETE FROM fs_data WHERE EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_data.ino
                                             AND (i.mode & 61440) != 32768)",
    ),
    (
        "symlink rows of missing or non-symlink inodes",
        "fs_symlink",
        "DELETE FROM fs_symlink WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_symlink.ino
                                                    AND (i.mode & 61440) = 40960)",
    ),
    (
        "xattr rows of missing inodes",
        "fs_xattr",
        "DELETE FROM fs_xattr WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_xattr.ino)",
    ),
    (
        "origin rows of missing inodes",
        "fs_origin",
        "DELETE FROM fs_origin WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_origin.delta_ino)",
    ),
    (
        "partial-origin rows of missing inodes",
        "fs_partial_origin",
        "DELETE FROM fs_partial_origin
         WHERE NOT EXISTS (SELECT 1 FROM fs_inode i WHERE i.ino = fs_partial_origin.delta_ino)",
    ),
    (
        "chunk overrides without a partial origin",
        "fs_chunk_override",
        "DELETE FROM fs_chunk_override WHERE chunk_index < 0 OR NOT EXISTS
           (SELECT 1 FROM fs_partial_origin p WHERE p.delta_ino = fs_chunk_override.delta_ino)",
    ),
];

impl Store {
    /// Apply every safe repair in one transaction; returns one line per kind of change made
    /// (empty when there was nothing to do). The caller must ensure no server has the
    /// database mounted (orphans are reclaimed).
    pub fn repair(&self) -> Result<Vec<String>, Errno> {
        let cs = i64::try_from(self.config.chunk_size).unwrap_or(i64::MAX);
        let out = self.write_tx(|c| {
            let mut done = Vec::new();
            let has = |t: &str| super::copy::has_table(c, "main", t);
            for (what, table, sql) in DROPS {
                if has(table)? {
                    let n = c.execute(sql, [])?;
                    if n > 0 {
                        done.push(format!("dropped {n} {what}"));
                    }
                }
            }
            let n = c.execute(
                "DELETE FROM fs_data WHERE chunk_index < 0 OR chunk_index * ?1 >=
                   (SELECT i.size FROM fs_inode i WHERE i.ino = fs_data.ino)",
                [cs],
            )?;
            if n > 0 {
                done.push(format!("dropped {n} data rows past EOF"));
            }
            let n = c.execute(
                "UPDATE fs_inode SET nlink = CASE WHEN ino = 1 THEN 1 ELSE
                   (SELECT count(*) FROM fs_dentry d WHERE d.ino = fs_inode.ino) END
                 WHERE nlink != CASE WHEN ino = 1 THEN 1 ELSE
                   (SELECT count(*) FROM fs_dentry d WHERE d.ino = fs_inode.ino) END",
                [],
            )?;
            if n > 0 {
                done.push(format!("recounted nlink of {n} inodes"));
            }
            if super::check::has_table(c, "fs_dir_stats")? {
                c.execute_batch(super::schema::DIR_STATS_REBUILD)?;
            }
            let orphans: Vec<i64> = {
                let mut st = c.prepare(
                    "SELECT ino FROM fs_inode i WHERE ino != 1
                       AND NOT EXISTS (SELECT 1 FROM fs_dentry d WHERE d.ino = i.ino)",
                )?;
                let it = st.query_map([], |r| r.get(0))?;
                it.collect::<rusqlite::Result<_>>()?
            };
            for ino in &orphans {
                delete_rows(c, Ino(u64::try_from(*ino).unwrap_or(0)))?;
            }
            if !orphans.is_empty() {
                done.push(format!("reclaimed {} unnamed inodes", orphans.len()));
            }
            let wrong: Vec<(String, String)> = {
                let mut st = c.prepare("SELECT path, parent_path FROM fs_whiteout")?;
                let it =
                    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
                it.collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .filter(|(p, pp)| whiteout_parent(p) != *pp)
                    .collect()
            };
            for (path, _) in &wrong {
                c.execute(
                    "UPDATE fs_whiteout SET parent_path = ?2 WHERE path = ?1",
                    [path.as_str(), whiteout_parent(path).as_str()],
                )?;
            }
            if !wrong.is_empty() {
                done.push(format!(
                    "recomputed parent_path of {} whiteouts",
                    wrong.len()
                ));
            }
            Ok(done)
        });
        self.invalidate_all();
        out
    }
}

/// Split findings into (repairable, needs a human).
pub fn classify(findings: &[Finding]) -> (Vec<&Finding>, Vec<&Finding>) {
    findings.iter().partition(|f| repair_for(f.rule).is_some())
}
