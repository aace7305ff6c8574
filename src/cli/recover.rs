//! `agentfs recover [--json]`: find and fix what a crash leaves behind, for the calling user.
//! Safe to run any number of times; a second run finds nothing. It never touches a live sandbox,
//! a server that runs, or another user's mount, and signals one kind of process only: a
//! Litestream whose owner was killed, recognised by its own configuration file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{CliError, Code};
use crate::knobs::Knobs;
use crate::project::{self, Project};
use crate::sys::{mount, mounts, ns, registry};

/// How long a mount may take to answer the probe that tells a dead server from a live one.
const PROBE_WAIT: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the findings as one JSON array.
    #[arg(long)]
    pub json: bool,
}

/// One thing a crash left behind and what was done about it.
#[derive(Debug, Serialize)]
struct Finding {
    kind: &'static str,
    path: String,
    /// The process that left it, when known.
    pid: Option<u32>,
    action: String,
    /// Whether the fix worked.
    ok: bool,
}

impl Finding {
    fn new(kind: &'static str, path: &Path, pid: Option<u32>) -> Finding {
        Finding {
            kind,
            path: crate::delta::escaped(path.as_os_str().as_encoded_bytes()),
            pid,
            action: String::new(),
            ok: true,
        }
    }

    /// Record the outcome of the fix: `done` on success, else the error.
    fn fixed(mut self, done: &str, r: Result<(), String>) -> Finding {
        match r {
            Ok(()) => self.action = done.to_string(),
            Err(e) => {
                self.action = format!("failed: {e}");
                self.ok = false;
            }
        }
        self
    }
}

pub fn run(a: Args, knobs: &Knobs) -> super::CliResult {
    let mut found = dead_mounts();
    found.extend(stale_server_records());
    found.extend(orphaned_replications());
    if let Ok(root) = project::root(knobs) {
        found.extend(projects(&root));
    }
    if a.json {
        let text = serde_json::to_string(&found).map_err(|e| e.to_string())?;
        super::say(format_args!("{text}"));
    } else {
        for f in &found {
            let pid = f.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
            println!("{} {}{pid}: {}", f.kind, f.path, f.action);
        }
        if found.is_empty() {
            println!("nothing to recover");
        }
    }
    let failed = found.iter().filter(|f| !f.ok).count();
    if failed > 0 {
        return Err(CliError::new(
            Code::Io,
            format!("{failed} of {} finding(s) could not be fixed", found.len()),
        ));
    }
    Ok(0)
}

/// The caller's agentfs mounts whose server is gone: no live server record names them and the
/// kernel answers ENOTCONN. Their connection is aborted and the mount detached, as
/// `agentfs umount --force` does.
fn dead_mounts() -> Vec<Finding> {
    let me = crate::sys::ids::effective().0;
    let served: Vec<PathBuf> = registry::live()
        .into_iter()
        .map(|r| r.mount_point)
        .collect();
    mounts::agentfs_mounts()
        .into_iter()
        .filter(|m| m.owner == Some(me) && !served.contains(&m.mount_point))
        .filter(|m| disconnected(&m.mount_point))
        .map(|m| {
            let r = mounts::abort_connection(&m)
                .and_then(|()| mount::unmount(&m.mount_point, true))
                .map_err(|e| e.to_string());
            Finding::new("dead_mount", &m.mount_point, None)
                .fixed("aborted the connection and detached the mount", r)
        })
        .collect()
}

/// Whether a stat of the mount's root fails with ENOTCONN (its server is gone). Asked on a
/// thread of its own: a server that lives but does not answer would hold it, and is then left
/// alone.
fn disconnected(mnt: &Path) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mnt.to_path_buf();
    let _ = std::thread::Builder::new()
        .name("probe".into())
        .spawn(move || {
            let r = std::fs::symlink_metadata(&path).err();
            let _ = tx.send(r.and_then(|e| e.raw_os_error()));
        });
    matches!(rx.recv_timeout(PROBE_WAIT), Ok(Some(libc::ENOTCONN)))
}

/// Server records whose process is gone.
fn stale_server_records() -> Vec<Finding> {
    registry::stale()
        .into_iter()
        .map(|(path, pid)| {
            let r = std::fs::remove_file(&path).map_err(|e| e.to_string());
            Finding::new("server_record", &path, pid).fixed("removed", r)
        })
        .collect()
}

/// Replications whose owner was killed: the Litestream it left running is ended, its record,
/// configuration and log removed.
fn orphaned_replications() -> Vec<Finding> {
    crate::replica::reap_orphans()
        .into_iter()
        .map(|(path, r, ended)| {
            let done = match ended {
                Ok(true) => "ended the Litestream its killed owner left and removed the record",
                _ => "removed the record",
            };
            Finding::new("orphaned_replication", &path, Some(r.litestream_pid))
                .fixed(done, ended.map(|_| ()))
        })
        .collect()
}

/// What crashes left in the projects under `root`.
fn projects(root: &Path) -> Vec<Finding> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().to_str()?.to_string(), e.path())))
        .filter(|(n, _)| project::valid_name(n))
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for (name, dir) in dirs {
        if !dir.join(project::CONFIG).exists() {
            out.extend(orphan(&dir));
            continue;
        }
        let Ok(p) = Project::open(root, &name) else {
            continue;
        };
        // The record first: a recovery killed in between finds the marker again.
        out.extend(unfinished_runs(&p));
        out.extend(dead_sandbox(&p));
        out.extend(unimported_upper(&p));
        out.extend(apply_copies(&p));
        out.extend(probe_scratch(&p));
        out.extend(interrupted_apply(&p));
    }
    out
}

/// A project directory without its config.toml that holds our files: what a discard or an
/// init killed midway leaves. Removed unless a server still holds its delta.
fn orphan(dir: &Path) -> Option<Finding> {
    let ours = [
        project::DELTA,
        project::HISTORY,
        project::RUNS,
        project::LIVE,
    ]
    .iter()
    .any(|f| dir.join(f).exists());
    if !ours {
        return None;
    }
    let db = dir.join(project::DELTA);
    let held = crate::sys::lock::holder_pid(&db);
    if held.is_some() {
        return None;
    }
    let r = std::fs::remove_dir_all(dir).map_err(|e| e.to_string());
    Some(Finding::new("orphaned_project", dir, None).fixed("removed", r))
}

/// A live marker whose sandbox is gone (its supervisor or pid 1 died, or the pids are now
/// other processes').
fn dead_sandbox(p: &Project) -> Option<Finding> {
    let m = crate::sandbox::record::marker(&p.dir)?;
    if m.running() {
        return None;
    }
    let path = p.live_path();
    let r = std::fs::remove_file(&path).map_err(|e| e.to_string());
    Some(
        Finding::new("dead_sandbox", &path, u32::try_from(m.supervisor).ok())
            .fixed("removed the live marker", r),
    )
}

/// Run records a killed supervisor left unfinished: ended now, outcome `killed`.
fn unfinished_runs(p: &Project) -> Vec<Finding> {
    crate::sandbox::record::unfinished(&p.dir)
        .into_iter()
        .map(|mut rec| {
            rec.ended = Some(crate::sandbox::record::now());
            rec.outcome = Some("killed".into());
            let r = rec.write(&p.dir).map_err(|e| e.to_string());
            Finding::new(
                "unfinished_run",
                &rec.path(&p.dir),
                u32::try_from(rec.supervisor).ok(),
            )
            .fixed("recorded its end (outcome killed)", r)
        })
        .collect()
}

/// The upper directory of an overlayfs run that ended before importing it: imported into the
/// delta and removed, unless the project's sandbox still runs or a server holds the delta.
fn unimported_upper(p: &Project) -> Option<Finding> {
    if !crate::sandbox::upper_left_over(&p.dir) || crate::sandbox::live(&p.dir).is_some() {
        return None;
    }
    let db = p.db();
    if crate::sys::lock::holder_pid(&db).is_some() {
        return None;
    }
    let upper = crate::sandbox::upper_dir(&p.dir);
    let r = crate::sys::lock::lock_db(&db)
        .map_err(CliError::from)
        .and_then(|lock| super::history::settle_upper(&lock, &db))
        .map(|_| ())
        .map_err(|e| format!("{}: {}", e.code.as_str(), e.message));
    Some(Finding::new("unimported_upper", &upper, None).fixed("imported into the delta", r))
}

/// Private copies `apply --from` made whose process is gone.
fn apply_copies(p: &Project) -> Vec<Finding> {
    let Ok(rd) = std::fs::read_dir(&p.dir) else {
        return Vec::new();
    };
    let mut out: Vec<Finding> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let rest = name.strip_prefix(super::apply::APPLY_COPY)?;
            let pid: u32 = ["", "-wal", "-shm", "-journal"]
                .iter()
                .find_map(|end| rest.strip_suffix(&format!(".db{end}"))?.parse().ok())?;
            (!ns::running(pid as i32)).then(|| (e.path(), pid))
        })
        .map(|(path, pid)| {
            let r = std::fs::remove_file(&path).map_err(|e| e.to_string());
            Finding::new("apply_copy", &path, Some(pid)).fixed("removed", r)
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Scratch directories of `--mount-backend auto` probes killed before they removed them.
fn probe_scratch(p: &Project) -> Vec<Finding> {
    crate::sandbox::probe::leftover_scratch(&p.dir)
        .into_iter()
        .map(|(path, pid)| {
            let r = crate::sandbox::probe::remove_scratch(&path).map_err(|e| e.to_string());
            Finding::new("probe_scratch", &path, Some(pid)).fixed("removed", r)
        })
        .collect()
}

/// The journal of an apply that stopped halfway: finished (see [`crate::delta::journal`]).
fn interrupted_apply(p: &Project) -> Vec<Finding> {
    let journal = crate::delta::journal::path(&p.db());
    if !journal.exists() {
        return Vec::new();
    }
    match crate::delta::journal::finish(&p.db()) {
        Ok(None) => Vec::new(),
        // Its apply still runs: not a leftover.
        Err(crate::delta::journal::JournalError::Running { .. }) => Vec::new(),
        Ok(Some(f)) => {
            let base = p.source().unwrap_or(Path::new(""));
            let mut out: Vec<Finding> = f
                .temps
                .iter()
                .map(|t| {
                    let path =
                        base.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(t));
                    Finding::new("apply_temp", &path, Some(f.pid)).fixed("removed", Ok(()))
                })
                .collect();
            out.push(
                Finding::new("interrupted_apply", &f.journal, Some(f.pid)).fixed(
                    &format!(
                        "recorded what the base holds at its {} path(s); the next apply \
                         continues it",
                        f.paths
                    ),
                    Ok(()),
                ),
            );
            out
        }
        Err(e) => vec![Finding::new("interrupted_apply", &journal, None)
            .fixed("", Err(CliError::from(e).message))],
    }
}
