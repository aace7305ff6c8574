//! Building blocks of the lifecycle tools (migrate, backup, materialize, fsck): consistent
//! snapshots through SQLite's online backup API, staging files that disappear on failure,
//! schema introspection and the re-chunker that lays bytes out in fixed-size rows.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::progress::Progress;

/// Attach context to an error and make it the one-line message the CLI prints.
pub trait Ctx<T> {
    fn ctx(self, what: impl Display) -> Result<T, String>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: impl Display) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Open a connection with the knob's busy timeout, so a mounted server's short write
/// transactions are waited for instead of failing with SQLITE_BUSY.
pub fn open_conn(path: &Path, readonly: bool) -> Result<Connection, String> {
    let flags = if readonly {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let c = Connection::open_with_flags(path, flags).ctx(path.display())?;
    c.busy_timeout(Duration::from_millis(
        crate::knobs::get().sqlite_busy_timeout_ms,
    ))
    .ctx(path.display())?;
    Ok(c)
}

/// Whether `schema.table` exists.
pub fn has_table(c: &Connection, schema: &str, table: &str) -> rusqlite::Result<bool> {
    c.query_row(
        &format!("SELECT EXISTS(SELECT 1 FROM \"{schema}\".sqlite_master WHERE type = 'table' AND name = ?1)"),
        [table],
        |r| r.get(0),
    )
}

/// The column names of `schema.table` (empty if the table does not exist).
pub fn columns(c: &Connection, schema: &str, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut st = c.prepare("SELECT name FROM pragma_table_info(?1, ?2)")?;
    let names = st.query_map([table, schema], |r| r.get(0))?;
    names.collect()
}

/// A file that is removed when dropped unless [`Staged::keep`] was called: staging copies and
/// half-built targets never outlive a failure. SQLite's `-wal`/`-shm`/`-journal` go with it.
pub struct Staged {
    pub path: PathBuf,
    keep: bool,
}

impl Staged {
    /// A fresh name next to `near` (same directory, so a final rename is atomic).
    pub fn next_to(near: &Path, tag: &str) -> Staged {
        let dir = match near.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = near
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "db".into());
        let path = dir.join(format!(".{name}.agentfs-{tag}-{}", std::process::id()));
        remove_db_files(&path);
        Staged { path, keep: false }
    }

    /// Keep the file (it was renamed into place or is wanted).
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.keep {
            remove_db_files(&self.path);
        }
    }
}

/// Remove a database file and its SQLite sidecars, ignoring absent ones.
pub fn remove_db_files(path: &Path) {
    let _ = std::fs::remove_file(path);
    remove_db_files_sidecars(path);
}

/// Remove only the `-wal`/`-shm`/`-journal` of a database no connection has open (after a
/// checkpoint they carry nothing).
pub fn remove_db_files_sidecars(path: &Path) {
    for ext in ["-wal", "-shm", "-journal"] {
        let mut s = path.as_os_str().to_os_string();
        s.push(ext);
        let _ = std::fs::remove_file(PathBuf::from(s));
    }
}

/// Copy a consistent snapshot of `src` into the new file `dst` with the online backup API.
///
/// A read transaction is held on the source for the whole copy, so every step reads the same
/// snapshot even while a mounted server keeps committing (WAL readers never block writers and
/// are never restarted by them). The result is a single main file: the copy is checkpointed
/// and switched to `journal_mode=DELETE`, so no `-wal` is needed next to it.
pub fn snapshot(src: &Path, dst: &Path, progress: &dyn Progress) -> Result<(), String> {
    let from = open_conn(src, true)?;
    from.execute_batch("BEGIN DEFERRED; SELECT count(*) FROM sqlite_master;")
        .ctx(src.display())?;
    let mut to = Connection::open(dst).ctx(dst.display())?;
    {
        let backup = rusqlite::backup::Backup::new(&from, &mut to).ctx(dst.display())?;
        let mut started = false;
        let mut done_prev = 0u64;
        loop {
            let step = backup
                .step(1024)
                .ctx(format!("backup of {}", src.display()))?;
            let p = backup.progress();
            let total = u64::try_from(p.pagecount).unwrap_or(0);
            let done = total.saturating_sub(u64::try_from(p.remaining).unwrap_or(0));
            if !started {
                progress.start("copying pages", total);
                started = true;
            }
            progress.advance(done.saturating_sub(done_prev));
            done_prev = done;
            match step {
                rusqlite::backup::StepResult::Done => break,
                rusqlite::backup::StepResult::More => {}
                rusqlite::backup::StepResult::Busy | rusqlite::backup::StepResult::Locked => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {}
            }
        }
    }
    from.execute_batch("COMMIT").ctx(src.display())?;
    drop(from);
    let _: String = to
        .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
        .ctx(dst.display())?;
    drop(to);
    sync_file(dst)
}

/// fdatasync a file and fsync its directory (a freshly created name must survive a crash).
pub fn sync_file(path: &Path) -> Result<(), String> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .ctx(path.display())?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .ctx(dir.display())
}

/// Lays a file's bytes out in fixed-size rows of `main.fs_data`: bytes are pushed in ascending
/// offset order; each row holds the stored bytes of one chunk up to the last byte pushed into
/// it (so holes stay missing rows or short rows, and nothing at or past EOF is stored).
pub struct Rechunker<'c> {
    insert: rusqlite::CachedStatement<'c>,
    ino: i64,
    chunk: u64,
    size: u64,
    cur: Option<(u64, Vec<u8>)>,
}

impl<'c> Rechunker<'c> {
    pub fn new(c: &'c Connection, ino: i64, chunk: u64, size: u64) -> rusqlite::Result<Self> {
        Ok(Rechunker {
            insert: c.prepare_cached(
                "INSERT INTO main.fs_data (ino, chunk_index, data) VALUES (?1, ?2, ?3)
                 ON CONFLICT(ino, chunk_index) DO UPDATE SET data = excluded.data",
            )?,
            ino,
            chunk,
            size,
            cur: None,
        })
    }

    /// Bytes stored at `off` (clipped at EOF).
    pub fn push(&mut self, off: u64, bytes: &[u8]) -> rusqlite::Result<()> {
        let end = off.saturating_add(bytes.len() as u64).min(self.size);
        let mut pos = off;
        while pos < end {
            let idx = pos / self.chunk;
            let chunk_end = ((idx + 1) * self.chunk).min(end);
            let piece = &bytes[(pos - off) as usize..(chunk_end - off) as usize];
            if self.cur.as_ref().map(|(i, _)| *i) != Some(idx) {
                self.flush()?;
                self.cur = Some((idx, Vec::new()));
            }
            if let Some((_, buf)) = self.cur.as_mut() {
                let rel = (pos - idx * self.chunk) as usize;
                if buf.len() < rel + piece.len() {
                    buf.resize(rel + piece.len(), 0);
                }
                buf[rel..rel + piece.len()].copy_from_slice(piece);
            }
            pos = chunk_end;
        }
        Ok(())
    }

    fn flush(&mut self) -> rusqlite::Result<()> {
        if let Some((idx, buf)) = self.cur.take() {
            if !buf.is_empty() {
                let idx = i64::try_from(idx).unwrap_or(i64::MAX);
                self.insert.execute(rusqlite::params![self.ino, idx, buf])?;
            }
        }
        Ok(())
    }

    /// Write the last row.
    pub fn finish(mut self) -> rusqlite::Result<()> {
        self.flush()
    }
}
