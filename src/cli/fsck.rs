//! `agentfs fsck DB [--repair] [--json]`

use std::path::PathBuf;

use serde_json::json;

use crate::store::repair::repair_for;
use crate::store::Store;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database to check.
    pub db: PathBuf,
    /// Apply the safe repairs (recount nlink, reclaim unnamed inodes, drop rows of missing
    /// inodes, recompute whiteout parents). Refused while the database is mounted. File
    /// contents are never changed.
    #[arg(long)]
    pub repair: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Exit 0: clean (after repair, if asked); 1: findings remain; 2: could not check.
pub fn run(a: Args) -> super::CliResult {
    let db = a.db.display().to_string();
    // Could not check: the report says so, and the named error goes to stderr (exit 2).
    let fail = |e: super::CliError| {
        if a.json {
            println!("{}", json!({"db": db, "clean": false, "error": e.message}));
        }
        Err(e.exit_with(2))
    };
    // Holding the mount lock keeps a server from starting while rows are reclaimed.
    let _lock = if a.repair {
        if let Err(e) = crate::replica::refuse_if_replicated(&a.db, "repairing it") {
            return fail(e.into());
        }
        match crate::sys::lock::lock_db(&a.db) {
            Ok(l) => Some(l),
            Err(e) => {
                let mut e = super::CliError::from(e);
                e.message.push_str("; unmount it before --repair");
                return fail(e);
            }
        }
    } else {
        None
    };
    let store = match Store::open(&a.db, !a.repair) {
        Ok(s) => s,
        Err(e) => return fail(e.into()),
    };
    let found = match store.check() {
        Ok(f) => f,
        Err(e) => return fail(format!("{db}: cannot check: {e}").into()),
    };
    let damaged = found.iter().any(|f| f.rule == "sqlite_integrity");
    let mut repaired = Vec::new();
    let mut remaining = found.clone();
    if a.repair && found.iter().any(|f| repair_for(f.rule).is_some()) {
        if damaged {
            return fail(
                format!(
                "{db}: SQLite reports damage (sqlite_integrity); not repairing — restore a backup"
            )
                .into(),
            );
        }
        repaired = match store.repair() {
            Ok(r) => r,
            Err(e) => return fail(format!("{db}: repair failed: {e}").into()),
        };
        if let Err(e) = store.sync() {
            return fail(format!("{db}: {e}").into());
        }
        remaining = match store.check() {
            Ok(f) => f,
            Err(e) => return fail(format!("{db}: cannot check: {e}").into()),
        };
    }
    if a.json {
        let list: Vec<_> = found
            .iter()
            .map(|f| json!({"rule": f.rule, "detail": f.detail, "repair": repair_for(f.rule)}))
            .collect();
        let rest: Vec<_> = remaining
            .iter()
            .map(|f| json!({"rule": f.rule, "detail": f.detail}))
            .collect();
        println!(
            "{}",
            json!({"db": db, "clean": remaining.is_empty(), "findings": list,
                   "repaired": repaired, "remaining": rest})
        );
    } else {
        for f in &found {
            let action = repair_for(f.rule).unwrap_or("needs a human");
            println!("{}: {} [{}]", f.rule, f.detail, action);
        }
        for r in &repaired {
            println!("repaired: {r}");
        }
        if found.is_empty() {
            println!("{db}: clean, nothing to do");
        } else if a.repair {
            println!("{db}: {} finding(s) remain", remaining.len());
        } else {
            let fixable = found
                .iter()
                .filter(|f| repair_for(f.rule).is_some())
                .count();
            println!(
                "{db}: {} finding(s), {fixable} repairable with --repair",
                found.len()
            );
        }
    }
    Ok(if remaining.is_empty() { 0 } else { 1 })
}
