//! `agentfs replicate <project|db> <url>` and `agentfs restore-replica <url> <project|db>`:
//! continuous replication with Litestream (src/replica.rs) and restores from a replica.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::errors::Code;
use crate::knobs::Knobs;
use crate::project::{self, Project, Target};
use crate::replica::{self, ReplicaUrl};
use crate::store::Store;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A project name (its delta and its history are replicated) or a database path.
    pub target: PathBuf,
    /// Where to: s3://BUCKET/PATH[?endpoint=URL&forcePathStyle=true&region=R] or file:///DIR.
    pub url: String,
    /// Take the first argument as a project name even where a file of that name exists here.
    #[arg(long)]
    pub project: bool,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// The replica: the URL given to `replicate` (or `--replicate`).
    pub url: String,
    /// A new project name (the project is made from the replica) or a new database path.
    pub target: PathBuf,
    /// Take the second argument as a project name even where a file of that name exists here.
    #[arg(long)]
    pub project: bool,
    /// Restore the newest state at or before this time (RFC 3339, e.g. 2026-01-02T15:04:05Z).
    #[arg(long)]
    pub timestamp: Option<String>,
    /// For a project: the directory it overlays on this machine (default: the directory it
    /// overlaid where it was replicated).
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
}

/// The database `replicate` and `--replicate` name: a project's delta or the path itself.
pub fn target_db(
    arg: &Path,
    force_project: bool,
    knobs: &Knobs,
) -> Result<PathBuf, super::CliError> {
    Ok(project::delta_path(arg, force_project, knobs)?)
}

/// `agentfs replicate`: in the foreground until SIGINT, SIGTERM or SIGHUP (or Litestream ends).
pub fn run(a: Args, knobs: &Knobs) -> super::CliResult {
    let url = ReplicaUrl::parse(&a.url)?;
    let db = target_db(&a.target, a.project, knobs)?;
    // Blocked before the replication is started (and can be seen): a shutdown signal sent as
    // soon as it shows waits for the thread below instead of killing us with Litestream
    // running. Litestream itself starts with an empty mask (the spawn resets it).
    crate::sys::signals::block_shutdown_signals();
    let mut rep = replica::start(&db, &url, knobs)?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(crate::sys::signals::wait_shutdown_signal());
    });
    for (d, u) in &rep.dbs {
        super::say(format_args!("replicating {} to {u}", d.display()));
    }
    super::say(format_args!(
        "stop with Ctrl-C or SIGTERM to pid {}",
        std::process::id()
    ));
    let died = loop {
        if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            break None;
        }
        if let Some(why) = rep.exited() {
            break Some(why);
        }
    };
    let stopped = rep.stop();
    if let Some(why) = died {
        return Err(super::CliError::new(Code::LitestreamFailed, why));
    }
    stopped?;
    super::say(format_args!(
        "replication stopped; the replica is up to date"
    ));
    Ok(0)
}

/// `agentfs restore-replica`.
pub fn restore(a: RestoreArgs, knobs: &Knobs) -> super::CliResult {
    let url = ReplicaUrl::parse(&a.url)?;
    let ts = a.timestamp.as_deref();
    match project::classify(a.target.as_os_str(), a.project)? {
        Target::Database(db) => {
            replica::restore(&url, &db, ts, knobs)?;
            if let Err(e) = check_delta(&db) {
                let _ = std::fs::remove_file(&db);
                return Err(e.into());
            }
            super::say(format_args!("{url} restored to {}: clean", db.display()));
            Ok(0)
        }
        Target::Project(name) => {
            let root = project::root(knobs)?;
            let mut p = Project::create(&root, &name).map_err(|e| match e.code {
                Code::ProjectExists => super::CliError::new(Code::RestoreTargetExists, e.message),
                _ => e.into(),
            })?;
            match restore_project(&mut p, &url, ts, a.source.as_deref(), knobs) {
                Ok(source) => {
                    super::say(format_args!(
                        "{url} restored as project {name} over {}: clean; enter it with: agentfs run {name}",
                        source.display()
                    ));
                    Ok(0)
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&p.dir);
                    Err(e.into())
                }
            }
        }
    }
}

/// Restore a project's two databases into the new project `p`, point it at its source and
/// check both; returns the source.
fn restore_project(
    p: &mut Project,
    url: &ReplicaUrl,
    ts: Option<&str>,
    source: Option<&Path>,
    knobs: &Knobs,
) -> Result<PathBuf, String> {
    let e = |e: project::Error| e.to_string();
    let store_dir = p.dir.join(project::HISTORY);
    std::fs::create_dir_all(&store_dir).map_err(|e| format!("{}: {e}", store_dir.display()))?;
    replica::restore(&url.child("delta"), &p.db(), ts, knobs).map_err(e)?;
    // A database replicated on its own is no project's delta: said before its history is
    // looked for.
    let recorded = Store::open(&p.db(), true)
        .map_err(|e| e.to_string())?
        .overlay_config()?
        .ok_or_else(|| format!("not_a_project: {url}/delta is not an overlay delta"))?;
    let history = store_dir.join(crate::history::db::DB_NAME);
    replica::restore(&url.child("history"), &history, ts, knobs).map_err(e)?;
    let source = match source {
        Some(dir) => {
            let base = crate::store::overlay::check_base(&p.db(), dir)?;
            let c = rusqlite::Connection::open(p.db()).map_err(|e| e.to_string())?;
            let mut cfg = recorded;
            cfg.base_path = base.clone();
            crate::store::overlay::write_config(&c, &cfg).map_err(|e| e.to_string())?;
            base
        }
        None => recorded.base_path,
    };
    p.config.project.source = Some(source.clone());
    p.save().map_err(e)?;
    check_delta(&p.db())?;
    let findings = crate::history::History::open(&store_dir)?.check()?;
    if !findings.is_empty() {
        return Err(format!(
            "restore_damaged: the restored history has {} finding(s), first: {}",
            findings.len(),
            findings[0]
        ));
    }
    Ok(source)
}

/// `agentfs integrity` of a restored database: a finding is a failed restore.
fn check_delta(db: &Path) -> Result<(), String> {
    let store = Store::open(db, true).map_err(|e| e.to_string())?;
    let found = super::integrity::findings(&store, false, false)?;
    match found.first() {
        None => Ok(()),
        Some(f) => Err(format!(
            "restore_damaged: {} has {} finding(s), first {}: {}",
            db.display(),
            found.len(),
            f.rule,
            f.detail
        )),
    }
}
