//! The apply journal, `<delta>-apply` beside the delta database: written and synced before an
//! apply's first write to the base, removed once the apply has recorded what the base now
//! holds. One left by an apply that no longer runs (killed, or failed halfway) names every
//! path where the base may hold part of that apply's work. [`finish`] removes the temporary
//! files that apply may have left beside those paths and records what the base holds there
//! now as what the delta saw, so the next apply takes up the steps that did not run instead
//! of refusing the finished ones as changes of the base.
//!
//! The journal is trusted for its own paths only: a change someone else made at one of them
//! between the kill and [`finish`] is taken for the apply's work.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{parent, rel, Overlay};

/// What the journal file holds.
#[derive(Serialize, Deserialize)]
struct Record {
    pid: u32,
    /// Unix seconds when it was written: with `pid`, it names the process.
    started: u64,
    /// The paths of the apply's steps, each its bytes in hex.
    paths: Vec<String>,
}

/// Why a journal could not be written or finished.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("an apply (pid {pid}) is writing the base of {} now; wait for it to end", db.display())]
    Running { pid: u32, db: PathBuf },
    #[error("apply journal {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("apply journal {}: {why}", path.display())]
    Unreadable { path: PathBuf, why: String },
    /// Opening the delta or recording the base failed (`CODE: message`, as the delta's
    /// readers report).
    #[error("{0}")]
    Delta(String),
}

/// The journal of the delta `db`.
pub fn path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-apply");
    PathBuf::from(p)
}

/// The journal of a running apply; [`Journal::done`] removes it.
#[must_use]
pub struct Journal(PathBuf);

impl Journal {
    pub fn done(self) -> Result<(), JournalError> {
        std::fs::remove_file(&self.0).map_err(|source| JournalError::Io {
            path: self.0.clone(),
            source,
        })
    }
}

/// Record, durably, that this process is about to write the base at `paths` for the delta
/// `db`.
pub fn begin<'a>(
    db: &Path,
    paths: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Journal, JournalError> {
    let file = path(db);
    let io = |source| JournalError::Io {
        path: file.clone(),
        source,
    };
    let rec = Record {
        pid: std::process::id(),
        started: crate::sandbox::record::now(),
        paths: paths
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(super::hex)
            .collect(),
    };
    let text = serde_json::to_vec(&rec).map_err(|e| io(std::io::Error::other(e)))?;
    let mut tmp = file.clone().into_os_string();
    tmp.push(".tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&text).and_then(|()| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, &file).map_err(io)?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(Journal(file))
}

/// What [`finish`] did with the journal of an apply that stopped halfway.
#[derive(Debug)]
pub struct Finished {
    /// The apply's process.
    pub pid: u32,
    pub journal: PathBuf,
    /// How many paths the base records were refreshed for.
    pub paths: usize,
    /// The temporary files it left in the base, removed (paths in the base).
    pub temps: Vec<Vec<u8>>,
}

/// Finish what an apply that no longer runs left of its work on the delta `db` (see the
/// module's text); None when there is no journal. Refuses while that apply still runs.
pub fn finish(db: &Path) -> Result<Option<Finished>, JournalError> {
    let file = path(db);
    let text = match std::fs::read(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(JournalError::Io { path: file, source }),
    };
    let unreadable = |why: String| JournalError::Unreadable {
        path: file.clone(),
        why,
    };
    let rec: Record = serde_json::from_slice(&text).map_err(|e| unreadable(e.to_string()))?;
    if rec.pid != std::process::id() && crate::sys::ns::same_process(rec.pid as i32, rec.started) {
        return Err(JournalError::Running {
            pid: rec.pid,
            db: db.to_path_buf(),
        });
    }
    let paths = rec
        .paths
        .iter()
        .map(|h| unhex(h).ok_or_else(|| unreadable(format!("bad path {h:?}"))))
        .collect::<Result<Vec<Vec<u8>>, _>>()?;
    let overlay = Overlay::open(db).map_err(JournalError::Delta)?;
    let mut temps = Vec::new();
    for p in &paths {
        let last = p.rsplit(|&b| b == b'/').next().unwrap_or(p);
        let mut tmp = rel(parent(p)).to_vec();
        if !tmp.is_empty() {
            tmp.push(b'/');
        }
        tmp.extend(crate::sys::beneath::temp_name(last, rec.pid));
        if temps.contains(&tmp) {
            continue;
        }
        match overlay.base().remove(&tmp, false) {
            Ok(()) => temps.push(tmp),
            Err(e) if crate::sys::beneath::is_missing(&e) => {}
            Err(e) => {
                return Err(JournalError::Delta(format!(
                    "{}: remove {}: {e}",
                    crate::errors::Code::of_io(&e),
                    String::from_utf8_lossy(&tmp)
                )))
            }
        }
    }
    if overlay.snap.seen.is_some() {
        let seen = overlay
            .seen_after(paths.iter().map(Vec::as_slice))
            .map_err(JournalError::Delta)?;
        crate::store::overlay::refresh_seen(db, &seen).map_err(JournalError::Delta)?;
    }
    std::fs::remove_file(&file).map_err(|source| JournalError::Io {
        path: file.clone(),
        source,
    })?;
    Ok(Some(Finished {
        pid: rec.pid,
        journal: file,
        paths: paths.len(),
        temps,
    }))
}

fn unhex(h: &str) -> Option<Vec<u8>> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_round_trip() {
        let p = b"/a b/\xff\x00z";
        assert_eq!(super::unhex(&crate::delta::hex(p)).as_deref(), Some(&p[..]));
        assert_eq!(super::unhex("0"), None);
        assert_eq!(super::unhex("zz"), None);
    }
}
