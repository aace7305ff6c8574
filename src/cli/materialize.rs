//! `agentfs materialize DB --output OUT [--verify]`

use std::path::PathBuf;

use crate::store::backup::{self, BackupOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database (may be mounted).
    pub db: PathBuf,
    /// The portable copy to write (must not exist): partial-origin files become full files,
    /// with the base bytes read after checking each recorded fingerprint.
    #[arg(long, short)]
    pub output: PathBuf,
    /// Check the copy (integrity, every rule, no base dependency) before keeping it.
    #[arg(long)]
    pub verify: bool,
}

pub fn run(a: Args) -> super::CliResult {
    let bar = super::progress::Bar::new();
    let opts = BackupOptions {
        verify: a.verify,
        materialize: true,
    };
    let r = backup::backup(&a.db, &a.output, opts, &bar)?;
    drop(bar);
    println!(
        "{}: materialized to {} ({} partial-origin file(s) folded, {} bytes{})",
        a.db.display(),
        a.output.display(),
        r.materialized,
        r.bytes,
        if r.verified { ", verified" } else { "" }
    );
    Ok(0)
}
