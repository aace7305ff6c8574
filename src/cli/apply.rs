//! `agentfs apply DB [--dry-run]`

use std::path::PathBuf;

use crate::delta::{apply, Overlay};
use crate::sys::lock::{lock_db, LockError};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The overlay delta database (not while it is mounted; it is not changed).
    pub db: PathBuf,
    /// Print the steps and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(a: Args) -> super::CliResult {
    // Held for the whole apply, so no mount of this database can start meanwhile.
    let _lock = lock_db(&a.db).map_err(|e| match e {
        LockError::HeldBy { path, pid } => {
            format!("{path} is mounted (server pid {pid}); unmount it before apply")
        }
        LockError::Held { path } => format!("{path} is mounted; unmount it before apply"),
        e => e.to_string(),
    })?;
    let overlay = Overlay::open(&a.db)?;
    let changes = overlay.changes()?;
    let ops = apply::plan(&changes)?;
    let base = overlay.snap.config.base_path.display().to_string();
    if ops.is_empty() {
        println!("nothing to do: {base} already matches the delta");
        return Ok(0);
    }
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
    Ok(0)
}
