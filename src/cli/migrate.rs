//! `agentfs migrate DB [--dry-run] [--copy TARGET [--verify] [--overwrite-target]]`

use std::path::PathBuf;

use crate::store::migrate::{self, CopyOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database to migrate (v0.0, v0.1, v0.2, v0.3, v0.4 or v0.5; never while mounted).
    pub db: PathBuf,
    /// Report the steps an in-place migration would take without changing the file.
    #[arg(long, conflicts_with = "copy")]
    pub dry_run: bool,
    /// Leave DB untouched and build a new v0.5 database at TARGET with the current layout
    /// (64 KiB chunks, small dense files inline), keeping inode numbers and every table.
    #[arg(long, value_name = "TARGET")]
    pub copy: Option<PathBuf>,
    /// With --copy: check the target and compare its metadata and file contents with the source
    /// before putting it in place.
    #[arg(long, requires = "copy")]
    pub verify: bool,
    /// With --copy: replace TARGET if it exists.
    #[arg(long, requires = "copy")]
    pub overwrite_target: bool,
}

pub fn run(a: Args) -> super::CliResult {
    let db = a.db.display().to_string();
    // Never replace a file Litestream is shipping: it would go on with a WAL of the old file.
    crate::replica::refuse_if_replicated(&a.db, "migrating it").map_err(|e| e.to_string())?;
    if let Some(target) = &a.copy {
        crate::replica::refuse_if_replicated(target, "replacing it").map_err(|e| e.to_string())?;
        let opts = CopyOptions {
            overwrite: a.overwrite_target,
            verify: a.verify,
            ..CopyOptions::default()
        };
        let bar = super::progress::Bar::new();
        let r = migrate::migrate_copy(&a.db, target, opts, &bar)?;
        drop(bar);
        println!(
            "{db}: v{} copied to {} as v0.5: {} inodes, {} files ({} inline), {} bytes{}",
            r.from.map(|f| f.name()).unwrap_or("?"),
            target.display(),
            r.inodes,
            r.files,
            r.inline_files,
            r.bytes,
            if r.verified { ", verified" } else { "" }
        );
        return Ok(0);
    }
    let r = migrate::migrate_in_place(&a.db, a.dry_run)?;
    let from = r.from.map(|f| f.name()).unwrap_or("?");
    if r.steps.is_empty() {
        println!("{db}: already v0.5, nothing to do");
        return Ok(0);
    }
    let verb = if a.dry_run {
        "would migrate"
    } else {
        "migrated"
    };
    println!("{db}: {verb} v{from} -> v0.5:");
    for s in &r.steps {
        println!("  {s}");
    }
    Ok(0)
}
