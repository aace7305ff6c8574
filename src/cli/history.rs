//! The history verbs of a project: `snap`, `list`, `log`, `restore`, `undo`, `gc`, and
//! `diff NAME A B` (reached from the diff verb when it gets three arguments). Each takes
//! `--json`. The store is `<project dir>/store/`; docs/history.md describes it.

use std::path::Path;

use serde_json::json;

use super::say;
use super::{CliError, Code};
use crate::history::db::Finding;
use crate::history::object::hex;
use crate::history::{CommitInfo, History, Ignore, RestoreReport, SnapOptions};
use crate::project::Project;
use crate::sandbox::Imported;
use crate::sys::lock::{lock_db, LockError};

#[derive(clap::Args, Debug)]
pub struct SnapArgs {
    /// The project.
    pub name: String,
    /// A name to restore by (without one the snapshot is known by its hash).
    pub tag: Option<String>,
    /// A message recorded with the snapshot.
    #[arg(short, long)]
    pub message: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct NameArgs {
    /// The project.
    pub name: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// The project.
    pub name: String,
    /// A tag, a commit hash (or a unique prefix of 4+ digits), HEAD, HEAD^ or HEAD~N.
    pub reference: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// The project.
    pub name: String,
    /// List what a real run deletes, and delete nothing.
    #[arg(long, conflicts_with = "check")]
    pub dry_run: bool,
    /// Check the store instead: every object against its key, every reference resolves
    /// (exit 0 sound, 1 findings).
    #[arg(long)]
    pub check: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    #[arg(long)]
    pub json: bool,
}

/// A project (`agentfs init` or `quick` made it) whose delta exists.
pub(super) fn project(name: &str) -> Result<Project, String> {
    let root = crate::project::root(crate::knobs::get()).map_err(|e| e.to_string())?;
    let p = Project::open(&root, name).map_err(|e| e.to_string())?;
    if !p.db().is_file() {
        return Err(format!("no_project: {name} (no {})", p.db().display()));
    }
    Ok(p)
}

/// The ignore patterns: config.toml's `[project] ignore` array, else the defaults.
fn ignore_of(p: &Project) -> Result<Ignore, String> {
    Ignore::configured(p.config.project.ignore.as_deref())
}

fn open(dir: &Path) -> Result<History, String> {
    History::open(&dir.join(crate::project::HISTORY))
}

fn short(h: &[u8; 32]) -> String {
    hex(h)[..12].to_string()
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub(super) fn utc(secs: i64) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Refuse while a sandbox runs on the project (live.json names a live process) or a server
/// has the delta mounted; returns the server lock, held for the change (`doing`, for the
/// message: "restoring"), and what an upper directory a run left brought into the delta
/// first ([`settle_upper`]).
pub(super) fn offline(
    dir: &Path,
    delta: &Path,
    doing: &str,
) -> Result<(crate::sys::lock::DbLock, Option<Imported>), CliError> {
    if let Some(m) = crate::sandbox::live(dir) {
        return Err(CliError::new(
            Code::SandboxLive,
            format!(
                "a sandbox runs on this project (supervisor pid {}); {doing} under a running \
                 sandbox is not supported, stop it first",
                m.supervisor
            ),
        ));
    }
    let lock = lock_db(delta).map_err(|e| match e {
        LockError::HeldBy { path, pid } => CliError::new(
            Code::SandboxLive,
            format!("{path} is mounted (server pid {pid}); unmount it first"),
        ),
        LockError::Held { path } => CliError::new(
            Code::SandboxLive,
            format!("{path} is mounted; unmount it first"),
        ),
        e => e.into(),
    })?;
    let imported = settle_upper(&lock, delta)?;
    Ok((lock, imported))
}

/// Before a command changes the delta `delta` (its lock held): the upper directory an
/// overlayfs run left goes in first ([`crate::sandbox::settle_upper`]). Its failure is named
/// `capacity_exhausted` when the delta has no room for it, `upper_failed` otherwise; nothing
/// was changed then.
pub(super) fn settle_upper(
    lock: &crate::sys::lock::DbLock,
    delta: &Path,
) -> Result<Option<Imported>, CliError> {
    let upper = || {
        delta
            .parent()
            .map(crate::sandbox::upper_dir)
            .unwrap_or_default()
    };
    crate::sandbox::settle_upper(lock, delta).map_err(|e| {
        let (code, then) = match e.full {
            true => (Code::CapacityExhausted, "free space first"),
            false => (Code::UpperFailed, "see the cause"),
        };
        CliError::new(
            code,
            format!(
                "the changes of the project's last run are still in {}, and taking them into \
                 the delta failed: {e}; {then}, nothing was changed",
                upper().display()
            ),
        )
        .at(upper())
    })
}

fn print_json(v: &serde_json::Value) -> Result<(), String> {
    let s = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    say(format_args!("{s}"));
    Ok(())
}

pub fn snap(a: SnapArgs) -> super::CliResult {
    let p = project(&a.name)?;
    let ignore = ignore_of(&p)?;
    let (dir, delta) = (p.dir.clone(), p.db());
    let mut h = open(&dir)?;
    let o = SnapOptions {
        tag: a.tag.as_deref(),
        ..SnapOptions::manual(a.message.as_deref().unwrap_or(""), &ignore)
    };
    let r = h.snapshot(&delta, &o)?;
    let commit = r.commit.map(|c| hex(&c)).unwrap_or_default();
    if a.json {
        print_json(&json!({
            "commit": commit,
            "tag": a.tag,
            "tree": hex(&r.tree),
            "entries": r.entries,
            "whiteouts": r.whiteouts,
            "ignored": r.ignored,
            "files_hashed": r.files_hashed,
            "files_cached": r.files_cached,
            "objects_added": r.objects_added,
            "bytes_added": r.bytes_added,
        }))?;
    } else {
        let tag = a.tag.map(|t| format!(" ({t})")).unwrap_or_default();
        say(format_args!(
            "snapshot {}{tag}: {} entries, {} whiteouts, {} files read, {} unchanged, {} ignored, \
             {} new objects ({} bytes)",
            &commit[..12.min(commit.len())],
            r.entries,
            r.whiteouts,
            r.files_hashed,
            r.files_cached,
            r.ignored,
            r.objects_added,
            r.bytes_added
        ));
    }
    Ok(0)
}

fn commit_json(i: &CommitInfo) -> serde_json::Value {
    json!({
        "commit": hex(&i.hash),
        "parent": i.commit.parent.map(|p| hex(&p)),
        "kind": i.commit.kind.name(),
        "time": i.commit.time_sec,
        "time_nsec": i.commit.time_nsec,
        "message": i.commit.message,
        "tags": i.tags,
        "head": i.head,
        "pruned": i.pruned,
        "tree": hex(&i.commit.state.tree()),
    })
}

fn commit_line(i: &CommitInfo) -> String {
    let tags = if i.tags.is_empty() {
        String::new()
    } else {
        format!(" ({})", i.tags.join(", "))
    };
    format!(
        "{} {} {:<10} {}{tags}{}{}",
        if i.head { '*' } else { ' ' },
        short(&i.hash),
        i.commit.kind.name(),
        utc(i.commit.time_sec),
        if i.pruned { " [pruned]" } else { "" },
        if i.commit.message.is_empty() {
            String::new()
        } else {
            format!("  {}", i.commit.message)
        }
    )
}

fn commits(list: &[CommitInfo], json: bool) -> super::CliResult {
    if json {
        print_json(&serde_json::Value::Array(
            list.iter().map(commit_json).collect(),
        ))?;
    } else {
        for i in list {
            say(format_args!("{}", commit_line(i)));
        }
    }
    Ok(0)
}

/// `agentfs list NAME`: every snapshot, oldest first, the current one (HEAD) marked `*`.
pub fn list(a: NameArgs) -> super::CliResult {
    let dir = project(&a.name)?.dir;
    let list = open(&dir)?.list()?;
    commits(&list, a.json)
}

/// `agentfs log NAME`: the history back from HEAD, newest first.
pub fn log(a: NameArgs) -> super::CliResult {
    let dir = project(&a.name)?.dir;
    let list = open(&dir)?.log()?;
    commits(&list, a.json)
}

/// `agentfs diff NAME A B`.
pub fn diff(name: &str, a: &str, b: &str, json: bool) -> super::CliResult {
    let dir = project(name)?.dir;
    let changes = open(&dir)?.diff(a, b)?;
    if json {
        print_json(&serde_json::Value::Array(
            changes
                .iter()
                .map(|c| {
                    json!({
                        "path": String::from_utf8_lossy(&c.path),
                        "change": c.change.to_string(),
                        "kind": c.kind,
                    })
                })
                .collect(),
        ))?;
    } else {
        for c in &changes {
            say(format_args!(
                "{} {}",
                c.change,
                String::from_utf8_lossy(&c.path)
            ));
        }
    }
    Ok(0)
}

/// Changes wait in the upper directory of the project at `dir`, not in its delta: said as
/// `unapplied_changes`.
pub(super) fn upper_waits(dir: &Path) -> CliError {
    let why = match crate::sandbox::live(dir) {
        Some(_) => "its sandbox runs on overlayfs, whose changes reach the delta at its end",
        None => "its last run's changes wait there; `agentfs recover` takes them into the delta",
    };
    CliError::new(
        Code::UnappliedChanges,
        format!(
            "changes are in {}, not in the delta: {why}",
            crate::sandbox::upper_dir(dir).display()
        ),
    )
    .at(crate::sandbox::upper_dir(dir))
}

/// The line said when an upper directory a run left went into the delta before a command.
pub(super) fn imported_line(i: &Imported) -> String {
    format!("took the upper directory the project's last run left into the delta first ({i})")
}

fn restored(
    r: &RestoreReport,
    imported: Option<Imported>,
    json: bool,
    verb: &str,
) -> super::CliResult {
    let paths = |v: &[Vec<u8>]| -> Vec<String> {
        v.iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    };
    if json {
        print_json(&json!({
            "commit": hex(&r.commit),
            "target": hex(&r.target),
            "saved": r.saved.map(|s| hex(&s)),
            "files": r.files,
            "kept": paths(&r.kept),
            "dropped": paths(&r.dropped),
            "imported": imported,
        }))?;
    } else {
        if let Some(i) = &imported {
            say(format_args!("{}", imported_line(i)));
        }
        if let Some(s) = &r.saved {
            say(format_args!("saved the current state as {}", short(s)));
        }
        say(format_args!(
            "{verb}: the upper layer now equals {} ({} files); recorded as {}",
            short(&r.target),
            r.files,
            short(&r.commit)
        ));
        for p in paths(&r.kept) {
            say(format_args!("kept ignored {p}"));
        }
        for p in paths(&r.dropped) {
            say(format_args!(
                "dropped ignored {p} (its directory is not in the snapshot)"
            ));
        }
    }
    Ok(0)
}

/// `agentfs restore NAME REF`.
pub fn restore(a: RestoreArgs) -> super::CliResult {
    let p = project(&a.name)?;
    let ignore = ignore_of(&p)?;
    let (dir, delta) = (p.dir.clone(), p.db());
    crate::replica::refuse_if_replicated(&delta, "restoring a snapshot into it")
        .map_err(|e| e.to_string())?;
    let (_lock, imported) = offline(&dir, &delta, "restoring")?;
    let r = open(&dir)?.restore(&delta, &a.reference, &ignore)?;
    restored(&r, imported, a.json, "restored")
}

/// `agentfs undo NAME`.
pub fn undo(a: NameArgs) -> super::CliResult {
    let p = project(&a.name)?;
    let ignore = ignore_of(&p)?;
    let (dir, delta) = (p.dir.clone(), p.db());
    crate::replica::refuse_if_replicated(&delta, "undoing into it").map_err(|e| e.to_string())?;
    let (_lock, imported) = offline(&dir, &delta, "undoing")?;
    let r = open(&dir)?.undo(&delta, &ignore)?;
    restored(&r, imported, a.json, "undone")
}

/// A finding of the store's check as JSON: its code and what it concerns.
fn finding_json(f: &Finding) -> serde_json::Value {
    json!({"code": f.code.as_str(), "what": f.what})
}

/// `agentfs gc NAME [--dry-run | --check]`.
pub fn gc(a: GcArgs) -> super::CliResult {
    let dir = project(&a.name)?.dir;
    let mut h = open(&dir)?;
    if a.check {
        let findings = h.check()?;
        if a.json {
            print_json(
                &json!({ "findings": findings.iter().map(finding_json).collect::<Vec<_>>() }),
            )?;
        } else if findings.is_empty() {
            say(format_args!("{}: sound", h.db_path().display()));
        } else {
            for f in &findings {
                say(format_args!("{f}"));
            }
        }
        return Ok(i32::from(!findings.is_empty()));
    }
    let r = h.gc(a.dry_run)?;
    if a.json {
        print_json(&json!({
            "dry_run": a.dry_run,
            "count": r.objects.len(),
            "bytes": r.bytes,
            "objects": r.objects.iter().map(|u| json!({
                "hash": hex(&u.hash),
                "kind": u.kind,
                "stored": u.stored,
            })).collect::<Vec<_>>(),
            "dangling": r.dangling.iter().map(finding_json).collect::<Vec<_>>(),
        }))?;
    } else {
        let verb = if a.dry_run { "would delete" } else { "deleted" };
        for u in &r.objects {
            say(format_args!("{verb} {} {}", u.kind, hex(&u.hash)));
        }
        say(format_args!(
            "{verb} {} objects ({} bytes)",
            r.objects.len(),
            r.bytes
        ));
        for d in &r.dangling {
            say(format_args!("{d}"));
        }
    }
    Ok(i32::from(!r.dangling.is_empty()))
}

/// `agentfs checkpoint`: inside a sandbox, ask its watcher for a checkpoint and wait for it.
pub fn checkpoint(a: CheckpointArgs) -> super::CliResult {
    let reply = crate::history::checkpoint::request()?;
    if a.json {
        print_json(&json!({
            "sandbox": reply.is_some(),
            "commit": reply.as_ref().map(|r| &r.commit),
            "frozen_ms": reply.as_ref().and_then(|r| r.frozen_us).map(|us| us as f64 / 1000.0),
        }))?;
    } else if let Some(r) = &reply {
        match r.frozen_us {
            Some(us) => say(format_args!(
                "checkpoint {} (frozen {:.1} ms)",
                r.commit,
                us as f64 / 1000.0
            )),
            None => say(format_args!("checkpoint {} (unfrozen)", r.commit)),
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_709_251_199), "2024-02-29 23:59:59");
    }
}
