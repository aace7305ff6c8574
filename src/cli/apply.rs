//! `agentfs apply DB [--dry-run] [--force]`

use std::path::PathBuf;

use super::{CliError, Code};
use crate::delta::apply::Op;
use crate::delta::{apply, journal, Overlay};
use crate::sys::lock::{lock_db, LockError};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The overlay delta database or a project name (not while it is mounted or its sandbox
    /// runs, except with --dry-run).
    pub db: PathBuf,
    /// Take the argument as a project name even where a file of that name exists here.
    #[arg(long)]
    pub project: bool,
    /// Print the steps and any conflicts, and write nothing (also while DB is mounted: it
    /// only reads, and sees what the server has committed).
    #[arg(long)]
    pub dry_run: bool,
    /// Overwrite base objects that changed since the delta saw them (apply otherwise refuses
    /// with an apply_conflict error listing them).
    #[arg(long)]
    pub force: bool,
    /// Apply a project's snapshot (a tag, a commit, HEAD, HEAD~N) instead of its delta as it
    /// stands; works while the project's sandbox runs (its delta is copied in one transaction
    /// and the snapshot applied from the copy).
    #[arg(long, value_name = "REF")]
    pub from: Option<String>,
    /// Apply only the changes at P or beneath it (a path in the project, `/src` or `src`),
    /// with the new parent directories they need; repeatable.
    #[arg(long = "path", value_name = "P")]
    pub paths: Vec<String>,
}

pub fn run(mut a: Args, knobs: &crate::knobs::Knobs) -> super::CliResult {
    let arg = a.db.clone();
    a.db = crate::project::delta_path(&a.db, a.project, knobs)?;
    // An earlier apply of this delta that stopped halfway is finished first (before a
    // snapshot's copy takes the delta's base records), so this one starts from what it wrote.
    if !a.dry_run {
        if let Some(f) = journal::finish(&a.db)? {
            println!(
                "finished the apply of pid {} that stopped halfway: base records of {} path(s) \
                 refreshed, {} temporary file(s) removed",
                f.pid,
                f.paths,
                f.temps.len()
            );
        }
    }
    // A dry run cannot take in an upper directory a run left (it changes nothing): it would
    // show less than the run did. An apply takes it in first, holding the lock.
    if a.dry_run && a.from.is_none() {
        if let Some(dir) = crate::sandbox::upper_waiting(&a.db) {
            return Err(super::history::upper_waits(dir));
        }
    }
    let result = match a.from.clone() {
        Some(reference) => from_snapshot(&a, &arg, &reference, knobs),
        None => apply(&a, &a.db, knobs),
    };
    // Promoting is the decision the mark of a full disk waits for.
    if result.is_ok() && !a.dry_run {
        crate::store::space::clear_full(&a.db)
            .map_err(|e| CliError::new(Code::of_io(&e), e.to_string()).at(&a.db))?;
    }
    result
}

/// `--from REF`: a private copy of the project's delta (taken in one transaction, so a running
/// sandbox may keep writing the original) whose upper layer is made the snapshot, applied as
/// a delta; the base records go to the project's delta, so its later applies know the base.
fn from_snapshot(
    a: &Args,
    arg: &std::path::Path,
    reference: &str,
    knobs: &crate::knobs::Knobs,
) -> super::CliResult {
    let project = match crate::project::classify(arg.as_os_str(), a.project)? {
        crate::project::Target::Project(name) => {
            crate::project::Project::open(&crate::project::root(knobs)?, &name)?
        }
        crate::project::Target::Database(_) => {
            return Err(CliError::new(
                Code::Usage,
                "--from takes a project name: snapshots belong to projects",
            ))
        }
    };
    let copy = project
        .dir
        .join(format!("{APPLY_COPY}{}.db", std::process::id()));
    let result = (|| {
        crate::store::backup::backup(
            &a.db,
            &copy,
            crate::store::backup::BackupOptions {
                verify: false,
                materialize: true,
            },
            &crate::store::progress::Quiet,
        )?;
        crate::history::History::open(&project.dir.join(crate::project::HISTORY))?
            .materialize(&copy, reference)?;
        apply(a, &copy, knobs)
    })();
    for end in ["", "-wal", "-shm"] {
        let mut p = copy.clone().into_os_string();
        p.push(end);
        let _ = std::fs::remove_file(p);
    }
    result
}

/// The start of the name of `apply --from`'s private copy in the project's directory
/// (`<prefix><pid>.db`): one left behind is an orphan of a killed apply.
pub const APPLY_COPY: &str = "apply-copy-";

/// Apply the delta `db` to its base; the base records are refreshed in `a.db`, and the journal
/// of `a.db` names the paths while the base is written.
fn apply(a: &Args, db: &std::path::Path, knobs: &crate::knobs::Knobs) -> super::CliResult {
    // Held for the whole apply, so no mount of this database can start meanwhile. A dry run
    // writes nothing and may look at a mounted delta.
    let lock = if a.dry_run {
        None
    } else {
        Some(lock_db(db).map_err(|e| {
            match e {
                LockError::HeldBy { path, pid } => CliError::new(
                    Code::AlreadyMounted,
                    format!(
                        "{path} is mounted (server pid {pid}); unmount it before apply (--dry-run \
                     works while mounted)"
                    ),
                )
                .at(path),
                LockError::Held { path } => CliError::new(
                    Code::AlreadyMounted,
                    format!("{path} is mounted; unmount it before apply"),
                )
                .at(path),
                e => e.into(),
            }
        })?)
    };
    if let Some(lock) = &lock {
        if let Some(i) = super::history::settle_upper(lock, db)? {
            println!("{}", super::history::imported_line(&i));
        }
    }
    let overlay = Overlay::open(db)?;
    let stale = overlay.stale_partials();
    if !stale.is_empty() {
        for c in &stale {
            println!("{}", c.describe());
        }
        return Err(conflict(apply::conflict_error(&stale, a.force)));
    }
    let changes = selected(overlay.changes()?, &a.paths);
    let base = overlay.snap.config.base_path.display().to_string();
    if changes.is_empty() {
        println!("nothing to do: {base} already matches the delta");
        return Ok(0);
    }
    if overlay.snap.seen.is_none() {
        println!(
            "note: {} was made before deltas recorded the base objects they copy; \
             changes made to the base since cannot be detected",
            a.db.display()
        );
    }
    let conflicts = overlay.conflicts(&changes)?;
    for c in &conflicts {
        println!("{}", c.describe());
    }
    if !conflicts.is_empty() && !a.force {
        if a.dry_run {
            for op in &apply::plan(&changes, false)? {
                println!("{}", op.describe());
            }
        }
        return Err(conflict(apply::conflict_error(&conflicts, false)));
    }
    let ops = apply::plan(&changes, !a.force)?;
    if a.dry_run {
        overlay.check_plan(&ops)?;
        for op in &ops {
            println!("{}", op.describe());
        }
        println!("dry run: {} step(s) not applied to {base}", ops.len());
        return Ok(0);
    }
    let intent = journal::begin(&a.db, ops.iter().map(Op::path))?;
    use crate::store::progress::Progress as _;
    let bar = super::progress::Bar::new();
    bar.start("apply", ops.len() as u64);
    let mut ran: u64 = 0;
    overlay.execute(&ops, |op| {
        if ran == knobs.apply_stop_after && ran > 0 {
            crate::sys::signals::stop_self();
        }
        ran += 1;
        println!("{}", op.describe());
        bar.advance(1);
    })?;
    drop(bar);
    println!("applied {} step(s) to {base}", ops.len());
    // The records now describe the base the delta matches, so a later apply of more work in
    // this delta does not see its own earlier apply as a change of the base.
    if overlay.snap.seen.is_some() {
        let seen = overlay.seen_after(ops.iter().map(Op::path))?;
        crate::store::overlay::refresh_seen(&a.db, &seen).map_err(|e| {
            format!(
                "applied, but recording the new base state failed ({e}); a later apply of this \
                 delta may report these paths as conflicts"
            )
        })?;
    }
    intent.done()?;
    Ok(0)
}

/// The changes at or beneath one of `paths` and the additions of their parent directories;
/// all of them when `paths` is empty.
fn selected(changes: Vec<crate::delta::Entry>, paths: &[String]) -> Vec<crate::delta::Entry> {
    if paths.is_empty() {
        return changes;
    }
    let wanted: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| format!("/{}", p.trim_matches('/')).into_bytes())
        .collect();
    let beneath = |path: &[u8], top: &[u8]| {
        top == b"/" || path == top || (path.starts_with(top) && path.get(top.len()) == Some(&b'/'))
    };
    changes
        .into_iter()
        .filter(|e| {
            wanted.iter().any(|w| {
                beneath(&e.path, w)
                    || (e.change != crate::delta::Change::Modified && beneath(w, &e.path))
            })
        })
        .collect()
}

/// Base objects changed since the delta saw them: the apply_conflict refusal.
fn conflict(message: String) -> CliError {
    CliError::new(Code::ApplyConflict, message)
}
