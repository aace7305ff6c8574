//! `agentfs backup` and `agentfs materialize`: consistent single-file copies, and the
//! partial-origin dependency on the overlay base.
//!
//! A backup is an online-backup-API snapshot taken inside one read transaction (see
//! [`super::copy::snapshot`]), so it is consistent while a server keeps writing, and needs no
//! `-wal` next to it. A database with `fs_partial_origin` rows is not portable on its own: its
//! files read unchanged chunks from the base directory. Such a database is refused unless the
//! base bytes are folded in ([`fold_base`]): for each partial-origin file, every chunk not in
//! `fs_chunk_override` gets the base file's bytes (after the recorded fingerprint is checked),
//! and the `fs_partial_origin`/`fs_chunk_override` rows are removed. `fs_origin` rows stay: they
//! only keep inode numbers stable and read nothing from the base.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::copy::{open_conn, snapshot, sync_file, Ctx, Staged};
use super::progress::Progress;
use super::Store;

/// One `fs_partial_origin` row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialOrigin {
    pub delta_ino: i64,
    pub base_ino: i64,
    pub base_path: String,
    pub base_size: i64,
    pub base_fingerprint_size: i64,
    pub base_mtime: i64,
    pub base_mtime_nsec: i64,
    pub base_ctime: i64,
    pub base_ctime_nsec: i64,
}

/// Every partial-origin row of the database behind `c` (none if the table is missing).
pub fn partial_origins(c: &Connection) -> rusqlite::Result<Vec<PartialOrigin>> {
    partial_origins_of(c, None)
}

/// The partial-origin rows of the database, or of one inode.
pub fn partial_origins_of(
    c: &Connection,
    ino: Option<super::Ino>,
) -> rusqlite::Result<Vec<PartialOrigin>> {
    if !super::copy::has_table(c, "main", "fs_partial_origin")? {
        return Ok(Vec::new());
    }
    let mut st = c.prepare_cached(
        "SELECT delta_ino, base_ino, base_path, base_size, base_fingerprint_size, base_mtime,
                base_mtime_nsec, base_ctime, base_ctime_nsec FROM fs_partial_origin
         WHERE ?1 IS NULL OR delta_ino = ?1 ORDER BY delta_ino",
    )?;
    let filter = ino.map(|i| i.0 as i64);
    let rows = st.query_map([filter], |r| {
        Ok(PartialOrigin {
            delta_ino: r.get(0)?,
            base_ino: r.get(1)?,
            base_path: r.get(2)?,
            base_size: r.get(3)?,
            base_fingerprint_size: r.get(4)?,
            base_mtime: r.get(5)?,
            base_mtime_nsec: r.get(6)?,
            base_ctime: r.get(7)?,
            base_ctime_nsec: r.get(8)?,
        })
    })?;
    rows.collect()
}

impl PartialOrigin {
    /// The size the base file must have: the fingerprint size when recorded (>= 0), else
    /// `base_size`.
    pub fn expected_size(&self) -> i64 {
        if self.base_fingerprint_size >= 0 {
            self.base_fingerprint_size
        } else {
            self.base_size
        }
    }

    /// An I/O error on the base file, as a message naming it.
    fn base_err(&self, e: std::io::Error) -> String {
        format!(
            "inode {}: base file {}: {e}",
            self.delta_ino, self.base_path
        )
    }

    /// Open the base file and compare the recorded fingerprint with it; the file returned is
    /// the one checked, for reading.
    pub fn check_base(&self) -> Result<std::fs::File, String> {
        // The file itself, never what a symlink put in its place (or in place of one of its
        // directories) points to.
        let f = crate::sys::beneath::open_no_symlinks(
            Path::new(&self.base_path),
            libc::O_RDONLY | libc::O_NONBLOCK,
        )
        .map_err(|e| self.base_err(e))?;
        let md = f.metadata().map_err(|e| self.base_err(e))?;
        self.check_fingerprint(&md)?;
        Ok(f)
    }

    /// Compare the recorded fingerprint with `md`, the metadata of an open base file. A time
    /// of 0 s and 0 ns means "not recorded" (the column default) and is not compared.
    pub fn check_fingerprint(&self, md: &std::fs::Metadata) -> Result<(), String> {
        let what = |field: &str, want: String, got: String| {
            format!(
                "inode {}: base file {} changed: {field} recorded {want}, now {got}",
                self.delta_ino, self.base_path
            )
        };
        if !md.is_file() {
            return Err(format!(
                "inode {}: base file {} is not a regular file",
                self.delta_ino, self.base_path
            ));
        }
        let size = i64::try_from(md.len()).unwrap_or(i64::MAX);
        if size != self.expected_size() {
            return Err(what(
                "size",
                self.expected_size().to_string(),
                size.to_string(),
            ));
        }
        if (self.base_mtime, self.base_mtime_nsec) != (0, 0)
            && (md.mtime(), md.mtime_nsec()) != (self.base_mtime, self.base_mtime_nsec)
        {
            return Err(what(
                "mtime",
                format!("{}.{:09}", self.base_mtime, self.base_mtime_nsec),
                format!("{}.{:09}", md.mtime(), md.mtime_nsec()),
            ));
        }
        if (self.base_ctime, self.base_ctime_nsec) != (0, 0)
            && (md.ctime(), md.ctime_nsec()) != (self.base_ctime, self.base_ctime_nsec)
        {
            return Err(what(
                "ctime",
                format!("{}.{:09}", self.base_ctime, self.base_ctime_nsec),
                format!("{}.{:09}", md.ctime(), md.ctime_nsec()),
            ));
        }
        Ok(())
    }

    /// Visit every chunk of this file that reads from the base, in order: `f(k, bytes)` with
    /// the base file's bytes [k*cs, min((k+1)*cs, size, base length)) for each chunk k below
    /// `size` that has no `fs_chunk_override` row. The part of the chunk that `bytes` does not
    /// cover (possibly all of it) reads as zeros. The fingerprint is checked first.
    pub fn for_each_base_chunk(
        &self,
        c: &Connection,
        cs: u64,
        size: u64,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        let base = self.check_base()?;
        let base_len = u64::try_from(self.expected_size()).unwrap_or(0);
        let overrides: std::collections::HashSet<i64> = {
            let mut st = c
                .prepare("SELECT chunk_index FROM fs_chunk_override WHERE delta_ino = ?1")
                .ctx("fs_chunk_override")?;
            let it = st
                .query_map([self.delta_ino], |r| r.get(0))
                .ctx("fs_chunk_override")?;
            it.collect::<rusqlite::Result<_>>()
                .ctx("fs_chunk_override")?
        };
        let mut buf = Vec::new();
        for idx in 0..size.div_ceil(cs) {
            if overrides.contains(&i64::try_from(idx).unwrap_or(i64::MAX)) {
                continue;
            }
            let start = idx * cs;
            let end = ((idx + 1) * cs).min(size).min(base_len);
            buf.resize(end.saturating_sub(start) as usize, 0);
            base.read_exact_at(&mut buf, start)
                .map_err(|e| self.base_err(e))?;
            f(idx, &buf)?;
        }
        Ok(())
    }
}

/// Fold the base bytes of every partial-origin file of `db` (a private copy) into it, in one
/// transaction. Returns the number of files made self-contained.
pub fn fold_base(db: &Path, progress: &dyn Progress) -> Result<u64, String> {
    let mut c = open_conn(db, false)?;
    let p = db.display().to_string();
    let cs: u64 = c
        .query_row(
            "SELECT value FROM fs_config WHERE key = 'chunk_size'",
            [],
            |r| r.get::<_, String>(0),
        )
        .ctx(&p)?
        .trim()
        .parse()
        .map_err(|_| format!("{p}: fs_config chunk_size is not a number"))?;
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .ctx(&p)?;
    let origins = partial_origins(&tx).ctx(&p)?;
    progress.start("folding base files", origins.len() as u64);
    for po in &origins {
        let size: i64 = tx
            .query_row(
                "SELECT size FROM fs_inode WHERE ino = ?1",
                [po.delta_ino],
                |r| r.get(0),
            )
            .ctx(format!("inode {}", po.delta_ino))?;
        let size = u64::try_from(size).unwrap_or(0);
        let chunks = size.div_ceil(cs);
        po.for_each_base_chunk(&tx, cs, size, |idx, bytes| {
            let i = i64::try_from(idx).unwrap_or(i64::MAX);
            if bytes.is_empty() {
                tx.execute(
                    "DELETE FROM fs_data WHERE ino = ?1 AND chunk_index = ?2",
                    [po.delta_ino, i],
                )
                .ctx(&p)?;
            } else {
                tx.execute(
                    "INSERT INTO fs_data (ino, chunk_index, data) VALUES (?1, ?2, ?3)
                     ON CONFLICT(ino, chunk_index) DO UPDATE SET data = excluded.data",
                    rusqlite::params![po.delta_ino, i, bytes],
                )
                .ctx(&p)?;
            }
            Ok(())
        })?;
        tx.execute(
            "DELETE FROM fs_data WHERE ino = ?1 AND chunk_index >= ?2",
            [po.delta_ino, i64::try_from(chunks).unwrap_or(i64::MAX)],
        )
        .ctx(&p)?;
        tx.execute(
            "DELETE FROM fs_chunk_override WHERE delta_ino = ?1",
            [po.delta_ino],
        )
        .ctx(&p)?;
        tx.execute(
            "DELETE FROM fs_partial_origin WHERE delta_ino = ?1",
            [po.delta_ino],
        )
        .ctx(&p)?;
        progress.advance(1);
    }
    tx.commit().ctx(&p)?;
    Ok(origins.len() as u64)
}

/// Options of `backup` (and `materialize`, which is a backup that always folds).
#[derive(Clone, Copy, Debug, Default)]
pub struct BackupOptions {
    pub verify: bool,
    pub materialize: bool,
}

/// What a backup did.
#[derive(Clone, Debug, Default)]
pub struct BackupReport {
    pub bytes: u64,
    pub materialized: u64,
    pub verified: bool,
}

/// Copy `src` (v0.5, possibly mounted) to the new file `out` as one self-contained main file.
pub fn backup(
    src: &Path,
    out: &Path,
    opts: BackupOptions,
    progress: &dyn Progress,
) -> Result<BackupReport, String> {
    // Refuses old/unknown schemas with the usual messages (naming `agentfs migrate`).
    drop(Store::open(src, true).map_err(|e| e.to_string())?);
    if out.exists() {
        return Err(format!("{} already exists", out.display()));
    }
    let staged = Staged::next_to(out, "backup");
    snapshot(src, &staged.path, progress)?;
    let mut report = BackupReport::default();
    let partial = partial_origins(&open_conn(&staged.path, true)?)
        .ctx(src.display())?
        .len();
    if partial > 0 {
        if !opts.materialize {
            return Err(format!(
                "{}: {partial} partial-origin file(s) read unchanged chunks from the base directory; \
                 use --materialize (or `agentfs materialize`) for a portable copy",
                src.display()
            ));
        }
        report.materialized = fold_base(&staged.path, progress)?;
    }
    if opts.verify {
        verify_output(&staged.path)
            .map_err(|e| format!("{}: verification failed: {e}", out.display()))?;
        report.verified = true;
    }
    sync_file(&staged.path)?;
    if out.exists() {
        return Err(format!("{} already exists", out.display()));
    }
    std::fs::rename(&staged.path, out).ctx(out.display())?;
    staged.keep();
    sync_file(out)?;
    report.bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(report)
}

/// The output of backup/materialize: integrity and every rule hold (orphans, which a live
/// mount legitimately holds, are tolerated), and nothing depends on a base file.
pub fn verify_output(path: &Path) -> Result<(), String> {
    let store = Store::open(path, true).map_err(|e| e.to_string())?;
    let findings = store.check().map_err(|e| format!("check: {e}"))?;
    if let Some(f) = findings.iter().find(|f| f.rule != "orphan") {
        return Err(format!(
            "{} finding(s), first: {}: {}",
            findings.len(),
            f.rule,
            f.detail
        ));
    }
    let n = partial_origins(&open_conn(path, true)?)
        .ctx(path.display())?
        .len();
    if n > 0 {
        return Err(format!("{n} partial-origin row(s) remain"));
    }
    Ok(())
}

impl Store {
    /// Every partial-origin row (for `integrity --require-portable/--check-base`).
    pub fn partial_origins(&self) -> Result<Vec<PartialOrigin>, crate::errno::Errno> {
        self.read_tx(|c| Ok(partial_origins(c)?))
    }
}

#[cfg(test)]
mod tests {
    use super::PartialOrigin;
    use std::os::unix::fs::MetadataExt;

    fn origin_of(path: &std::path::Path) -> PartialOrigin {
        let md = std::fs::symlink_metadata(path).unwrap();
        PartialOrigin {
            delta_ino: 2,
            base_ino: md.ino() as i64,
            base_path: path.to_str().unwrap().to_string(),
            base_size: md.len() as i64,
            base_fingerprint_size: md.len() as i64,
            base_mtime: md.mtime(),
            base_mtime_nsec: md.mtime_nsec(),
            base_ctime: md.ctime(),
            base_ctime_nsec: md.ctime_nsec(),
        }
    }

    #[test]
    fn a_base_file_replaced_by_a_symlink_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().canonicalize().unwrap().join("f");
        std::fs::write(&f, b"base bytes").unwrap();
        let po = origin_of(&f);
        assert!(po.check_base().is_ok());
        // Same size, and its target carries the recorded times: only the file type differs.
        let outside = t.path().join("outside");
        std::fs::rename(&f, &outside).unwrap();
        std::os::unix::fs::symlink(&outside, &f).unwrap();
        let err = po.check_base().unwrap_err();
        assert!(err.contains("symbolic links"), "{err}");
    }
}
