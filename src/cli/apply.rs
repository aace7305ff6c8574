//! `agentfs apply DB [--dry-run] [--force]`

use std::path::PathBuf;

use super::{CliError, Code};
use crate::delta::{apply, Overlay};
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
}

pub fn run(mut a: Args, knobs: &crate::knobs::Knobs) -> super::CliResult {
    a.db = crate::project::delta_path(&a.db, a.project, knobs)?;
    // Held for the whole apply, so no mount of this database can start meanwhile. A dry run
    // writes nothing and may look at a mounted delta.
    let _lock = if a.dry_run {
        None
    } else {
        Some(lock_db(&a.db).map_err(|e| {
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
    let overlay = Overlay::open(&a.db)?;
    let stale = overlay.stale_partials();
    if !stale.is_empty() {
        for c in &stale {
            println!("{}", c.describe());
        }
        return Err(conflict(apply::conflict_error(&stale, a.force)));
    }
    let changes = overlay.changes()?;
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
    overlay.execute(&ops, |op| println!("{}", op.describe()))?;
    println!("applied {} step(s) to {base}", ops.len());
    // The records now describe the base the delta matches, so a later apply of more work in
    // this delta does not see its own earlier apply as a change of the base.
    if overlay.snap.seen.is_some() {
        let seen = overlay.seen_after(&ops)?;
        crate::store::overlay::refresh_seen(&a.db, &seen).map_err(|e| {
            format!(
                "applied, but recording the new base state failed ({e}); a later apply of this \
                 delta may report these paths as conflicts"
            )
        })?;
    }
    Ok(0)
}

/// Base objects changed since the delta saw them: the apply_conflict refusal.
fn conflict(message: String) -> CliError {
    CliError::new(Code::ApplyConflict, message)
}
