//! `agentfs backup DB OUT [--verify] [--materialize]`

use std::path::PathBuf;

use crate::store::backup::{self, BackupOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database (may be mounted: the copy is one consistent snapshot).
    pub db: PathBuf,
    /// The new single-file copy (must not exist).
    pub out: PathBuf,
    /// Check the copy (SQLite integrity and every consistency rule) before keeping it.
    #[arg(long)]
    pub verify: bool,
    /// Fold base-file bytes into partial-origin files so the copy stands alone (without it, a
    /// database with partial-origin files is refused).
    #[arg(long)]
    pub materialize: bool,
}

pub fn run(a: Args) -> super::CliResult {
    let bar = super::progress::Bar::new();
    let opts = BackupOptions {
        verify: a.verify,
        materialize: a.materialize,
    };
    let r = backup::backup(&a.db, &a.out, opts, &bar)?;
    drop(bar);
    println!(
        "{}: backed up to {} ({} bytes{}{})",
        a.db.display(),
        a.out.display(),
        r.bytes,
        if r.materialized > 0 {
            format!(", {} partial-origin file(s) materialized", r.materialized)
        } else {
            String::new()
        },
        if r.verified { ", verified" } else { "" }
    );
    Ok(0)
}
